"""9.3.5-9.3.6 The encoder, the stateful decoder, and the encoder-decoder that joins them.

Two ways to call the decoder, one body of code:

* the chapter's stateful call ``decoder(X, state)`` with ``state = [enc_outputs,
  enc_valid_length, [cache of block 0, ...]]`` -> ``(logits, state)``. Each block appends X to
  ``state[2][i]`` (every past query position of block i) and attends over it. This is what
  training in the chapter and step-by-step prediction use.
* the graph call ``decoder(X, enc_outputs, enc_valid_length)`` -> logits, the whole target at
  once with the causal mask computed inside the graph. It keeps no state, so it hybridizes
  (``static_alloc=True, static_shape=True``) into one graph for fast training.

With ``exact_chapter=True`` the stateful call reproduces the book exactly, bugs included: causal
valid lengths only under ``autograd.is_training()``, no mask otherwise, ``np.tile`` head lengths,
and positional encoding restarting at row 0 on every prediction step.
"""

import math

from mxnet import autograd, np
from mxnet import name as mx_name
from mxnet.gluon import nn

from . import _graphs, kernels
from .attention import _F, MultiHeadAttention
from .layers import AddNorm, PositionalEncoding, PositionWiseFFN, make_norm


def _variant_kwargs(pre_norm, norm, embedding_size):
    """AddNorm's keyword arguments for the normalization variants."""
    return {"pre_norm": pre_norm, "norm": norm, "hidden_size": embedding_size}


def _embed(block, X):
    """Embedding * sqrt(d) (chapter); with FixNorm the embedding rows are unit-norm first."""
    F = _F(X)
    E = block.embed(X)  # (batch, seq_len, d)
    if block.fixnorm:
        E = E / F.np.maximum(F.np.sqrt(F.np.sum(E * E, axis=-1, keepdims=True)), 1e-5)
    return E * math.sqrt(block.embedding_size)


def _layer_mask(block, X):
    """LayerDrop: (1, 1, 1) of True (run the block) or False, drawn in-graph by a dropout op
    (identity at inference, so nothing is dropped there, hybridized or not)."""
    F = _F(X)
    one = F.np.ones_like(F.np.mean(X, axis=(0, 1, 2), keepdims=True))  # (1, 1, 1)
    return block.layerdrop(one) > 0


def every_other_layers(num_layers, r):
    """LayerDrop's "every other" pruning (Fan et al. 2019): keep r of N blocks, dropping
    evenly spaced ones; the matching training rate is p = 1 - r / N."""
    if not 0 < r <= num_layers:
        raise ValueError(f"keep r={r} blocks: need 0 < r <= num_layers={num_layers}")
    drop = {int(i * num_layers / (num_layers - r)) + 1 for i in range(num_layers - r)} \
        if r < num_layers else set()
    drop = {min(d, num_layers - 1) for d in drop}
    return [i for i in range(num_layers) if i not in drop]


class _BlockStack:
    """LayerDrop, inference pruning and pre-norm's final norm, shared by encoder and decoder."""

    def _init_variants(self, num_layers, layerdrop, layers_to_keep, pre_norm, norm, fixnorm):
        self.fixnorm = fixnorm
        self.layers_to_keep = None if layers_to_keep is None else list(layers_to_keep)
        self.layerdrop = nn.Dropout(layerdrop) if layerdrop > 0 else None
        self.final_norm = make_norm(norm, self.embedding_size) if pre_norm else None

    def prune(self, layers_to_keep):
        """Run only these block indices from now on (LayerDrop's inference pruning); None: all.
        Clears every cached graph that contains this stack (`_graphs.invalidate`)."""
        self.layers_to_keep = None if layers_to_keep is None else list(layers_to_keep)
        _graphs.invalidate(self)

    def _active_blocks(self):
        keep = self.layers_to_keep
        return [b for i, b in enumerate(self.blks) if keep is None or i in keep]

    def _run_block(self, blk, X, *args):
        """blk(X, *args), or with LayerDrop: skipped (X returned) with probability p."""
        Y = blk(X, *args)
        if self.layerdrop is None:
            return Y
        F = _F(X)
        return F.np.where(_layer_mask(self, X), Y, X)


class Encoder(nn.HybridBlock):
    """The base encoder interface for the encoder-decoder architecture (d2l 9.1).

    Subclasses implement ``hybrid_forward`` (HybridBlock's abstract method) instead of the
    chapter's ``forward``, so that they can be hybridized.
    """


class Decoder(nn.HybridBlock):
    """The base decoder interface for the encoder-decoder architecture (d2l 9.1)."""

    def init_state(self, enc_outputs, *args):
        raise NotImplementedError


class EncoderDecoder(nn.Block):
    """The base encoder-decoder: encode, initialise the decoder's state, decode (d2l 9.1)."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, enc_X, dec_X, *args):
        """The chapter's call: ``model(X, Y_input, X_valid_len, Y_valid_len) -> (Y_hat, state)``."""
        enc_outputs = self.encoder(enc_X, *args)
        dec_state = self.decoder.init_state(enc_outputs, *args)
        return self.decoder(dec_X, dec_state)


class EncoderBlock(nn.HybridBlock):
    """9.3.5: self-attention and FFN, each followed by add & norm."""

    def __init__(self, embedding_size, ffn_hidden_size, num_heads, dropout, exact_chapter=False,
                 *, pre_norm=False, norm="layer", drophead=0.0, fused_qkv=False, **kwargs):
        super().__init__(**kwargs)
        self.attention = MultiHeadAttention(embedding_size, num_heads, dropout, exact_chapter,
                                            drophead=drophead, fused_qkv=fused_qkv)
        an = _variant_kwargs(pre_norm, norm, embedding_size)
        self.addnorm_1 = AddNorm(dropout, **an)
        self.ffn = PositionWiseFFN(ffn_hidden_size, embedding_size)
        self.addnorm_2 = AddNorm(dropout, **an)

    def hybrid_forward(self, F, X, valid_length=None):
        """X: (batch, seq_len, embedding_size); valid_length: (batch,) -> same shape as X."""
        Xn = self.addnorm_1.prenorm(X)  # X itself unless pre-norm
        Y = self.addnorm_1(X, self.attention(Xn, Xn, Xn, valid_length))
        return self.addnorm_2(Y, self.ffn(self.addnorm_2.prenorm(Y)))


_VARIANTS_DOC = """
    Variants (keyword-only, defaults = the chapter): ``pre_norm`` (and a final norm after the
    last block), ``norm="scale"`` (ScaleNorm), ``fixnorm`` (unit-norm embeddings),
    ``layerdrop`` p (blocks skipped in training), ``layers_to_keep`` (indices run at inference,
    see `every_other_layers`), ``drophead`` p, ``fused_qkv`` (self-attention)."""


class TransformerEncoder(_BlockStack, Encoder):
    __doc__ = """9.3.5: embed * sqrt(d) + positional encoding, then `num_layers` encoder blocks.
    """ + _VARIANTS_DOC

    def __init__(self, vocab_size, embedding_size, ffn_hidden_size, num_heads, num_layers,
                 dropout, exact_chapter=False, *, pre_norm=False, norm="layer", fixnorm=False,
                 layerdrop=0.0, layers_to_keep=None, drophead=0.0, fused_qkv=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding_size = embedding_size
        self.embed = nn.Embedding(vocab_size, embedding_size)
        self.pos_encoding = PositionalEncoding(embedding_size, dropout)
        self.blks = nn.HybridSequential()
        for _ in range(num_layers):
            self.blks.add(EncoderBlock(embedding_size, ffn_hidden_size, num_heads, dropout,
                                       exact_chapter, pre_norm=pre_norm, norm=norm,
                                       drophead=drophead, fused_qkv=fused_qkv))
        self._init_variants(num_layers, layerdrop, layers_to_keep, pre_norm, norm, fixnorm)

    def forward(self, X, valid_length=None, *args):
        """The chapter accepts (and ignores) extra arguments after valid_length."""
        return super().forward(X, valid_length)

    def hybrid_forward(self, F, X, valid_length=None):
        """X: (batch, seq_len) token ids; valid_length: (batch,) -> (batch, seq_len, embedding_size)."""
        X = self.pos_encoding(_embed(self, X))
        for blk in self._active_blocks():
            X = self._run_block(blk, X, valid_length)
        return X if self.final_norm is None else self.final_norm(X)


def _is_state(args):
    """True for the chapter's stateful call ``(X, state)``, where state is a list."""
    return len(args) == 1 and isinstance(args[0], list)


class DecoderBlock(nn.HybridBlock):
    """9.3.6: causal self-attention, encoder-decoder attention, FFN, each with add & norm.

    ``i`` is the block's index in the decoder: its cache lives in ``state[2][i]``.
    """

    def __init__(self, embedding_size, ffn_hidden_size, num_heads, dropout, i,
                 exact_chapter=False, *, pre_norm=False, norm="layer", drophead=0.0,
                 fused_qkv=False, **kwargs):
        super().__init__(**kwargs)
        self.i = i
        self.exact_chapter = exact_chapter
        # corrected model: the causal mask lives inside the attention (valid lengths stay free)
        self.attention_1 = MultiHeadAttention(embedding_size, num_heads, dropout, exact_chapter,
                                              causal=not exact_chapter, drophead=drophead,
                                              fused_qkv=fused_qkv)
        an = _variant_kwargs(pre_norm, norm, embedding_size)
        self.addnorm_1 = AddNorm(dropout, **an)
        self.attention_2 = MultiHeadAttention(embedding_size, num_heads, dropout, exact_chapter,
                                              drophead=drophead)
        self.addnorm_2 = AddNorm(dropout, **an)
        self.ffn = PositionWiseFFN(ffn_hidden_size, embedding_size)
        self.addnorm_3 = AddNorm(dropout, **an)

    def _sublayers(self, X, Xn, key_values, self_valid_length, enc_outputs, enc_valid_length,
                   kv=None):
        """The block's arithmetic, shared by the stateful and the graph call.

        Xn is `addnorm_1.prenorm(X)` (X itself unless pre-norm); with pre-norm, `key_values`
        holds the normalized inputs (the cache stores them). ``kv`` (`DecoderStep`): the projected
        ``[self keys, self values, encoder keys, encoder values]`` replace the projections of
        `key_values` and `enc_outputs`."""
        if kv is None:
            X2 = self.attention_1(Xn, key_values, key_values, self_valid_length)
        else:
            X2 = self.attention_1.attend_cached(Xn, kv[0], kv[1], self_valid_length)
        Y = self.addnorm_1(X, X2)
        Yn = self.addnorm_2.prenorm(Y)
        if kv is None:
            Y2 = self.attention_2(Yn, enc_outputs, enc_outputs, enc_valid_length)
        else:
            Y2 = self.attention_2.attend_cached(Yn, kv[2], kv[3], enc_valid_length)
        Z = self.addnorm_2(Y, Y2)
        return self.addnorm_3(Z, self.ffn(self.addnorm_3.prenorm(Z)))

    def forward(self, X, *args):
        """``blk(X, state) -> (out, state)`` (chapter) or ``blk(X, enc_outputs, enc_valid_length)``."""
        if _is_state(args):
            return self._forward_with_state(X, args[0])
        return super().forward(X, *args)

    def hybrid_forward(self, F, X, enc_outputs, enc_valid_length=None):
        """Whole target at once, causal; X: (batch, seq_len, embedding_size) -> same shape."""
        if self.exact_chapter:
            raise ValueError("the graph call needs the corrected model (exact_chapter=False)")
        Xn = self.addnorm_1.prenorm(X)
        return self._sublayers(X, Xn, Xn, None, enc_outputs, enc_valid_length)

    def _forward_with_state(self, X, state):
        enc_outputs, enc_valid_length = state[0], state[1]
        # state[2][i]: every past query position of this block, (batch, num_past, d)
        Xn = self.addnorm_1.prenorm(X)  # X itself unless pre-norm
        if state[2][self.i] is None:
            key_values = Xn
        else:
            key_values = np.concatenate((state[2][self.i], Xn), axis=1)  # (batch, past + T, d)
        state[2][self.i] = key_values
        valid_length = None
        if self.exact_chapter and autograd.is_training():
            batch_size, seq_len, _ = X.shape
            # (batch_size, seq_len): the j-th column holds j + 1, the chapter's causal lengths
            valid_length = np.tile(np.arange(1, seq_len + 1, ctx=X.context), (batch_size, 1))
        return (self._sublayers(X, Xn, key_values, valid_length, enc_outputs, enc_valid_length),
                state)


class TransformerDecoder(_BlockStack, Decoder):
    __doc__ = """9.3.6: embed * sqrt(d) + positional encoding, decoder blocks, dense to vocabulary.
    """ + _VARIANTS_DOC

    def __init__(self, vocab_size, embedding_size, ffn_hidden_size, num_heads, num_layers,
                 dropout, exact_chapter=False, *, pre_norm=False, norm="layer", fixnorm=False,
                 layerdrop=0.0, layers_to_keep=None, drophead=0.0, fused_qkv=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding_size = embedding_size
        self.num_layers = num_layers
        self.exact_chapter = exact_chapter
        self.embed = nn.Embedding(vocab_size, embedding_size)
        self.pos_encoding = PositionalEncoding(embedding_size, dropout)
        self.blks = nn.HybridSequential()
        for i in range(num_layers):
            self.blks.add(DecoderBlock(embedding_size, ffn_hidden_size, num_heads, dropout, i,
                                       exact_chapter, pre_norm=pre_norm, norm=norm,
                                       drophead=drophead, fused_qkv=fused_qkv))
        self._init_variants(num_layers, layerdrop, layers_to_keep, pre_norm, norm, fixnorm)
        self.dense = nn.Dense(vocab_size, flatten=False)

    def init_state(self, enc_outputs, enc_valid_length, *args):
        """``[enc_outputs, enc_valid_length, [None] * num_layers]``: nothing cached yet."""
        return [enc_outputs, enc_valid_length, [None] * self.num_layers]

    def forward(self, X, *args):
        """``decoder(X, state) -> (logits, state)`` (chapter) or
        ``decoder(X, enc_outputs, enc_valid_length) -> logits`` (graph)."""
        if _is_state(args):
            return self._forward_with_state(X, args[0])
        return super().forward(X, *args)

    def hybrid_forward(self, F, X, enc_outputs, enc_valid_length=None):
        """X: (batch, seq_len) target ids -> (batch, seq_len, vocab_size), causal."""
        X = self.pos_encoding(_embed(self, X))
        for blk in self._active_blocks():
            X = self._run_block(blk, X, enc_outputs, enc_valid_length)
        return self.dense(X if self.final_norm is None else self.final_norm(X))

    def _forward_with_state(self, X, state):
        num_cached = 0 if state[2][0] is None else state[2][0].shape[1]
        if num_cached + X.shape[1] > self.pos_encoding.max_len:
            raise ValueError(f"a target of {num_cached + X.shape[1]} positions is longer than "
                             f"the model's {self.pos_encoding.max_len} positions")
        X = _embed(self, X)
        if self.exact_chapter:  # bug 3: every call adds rows 0, 1, ... of P
            X = self.pos_encoding(X)
        else:  # fixed: continue at the true position of X's first row
            X = self.pos_encoding(X, np.array([num_cached], ctx=X.context))
        for blk in self._active_blocks():
            if self.layerdrop is None:
                X, state = blk(X, state)
            else:  # the block's cache is still appended when it is skipped
                Y, state = blk(X, state)
                X = np.where(_layer_mask(self, X), Y, X)
        return self.dense(X if self.final_norm is None else self.final_norm(X)), state


class EncoderKV(nn.HybridBlock):
    """The source side of cached decoding as one graph: the encoder, then every active decoder
    block's encoder-decoder keys and values, projected once per sentence.

    ``graph(X, valid_length) -> (K_enc, V_enc) per active decoder block``; X: (batch, T) source
    ids, valid_length: (batch,); each output (batch, T, hidden). Holds no weights of its own.
    """

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.encoder = model.encoder
        self.decoder = model.decoder

    def hybrid_forward(self, F, X, valid_length):
        enc_outputs = self.encoder(X, valid_length)  # (batch, T, d)
        kv = []
        for blk in self.decoder._active_blocks():
            kv += blk.attention_2.project_kv(enc_outputs)  # 2 x (batch, T, hidden)
        return tuple(kv)


class DecoderStep(nn.HybridBlock):
    """One decoding step with a key/value cache, as ONE graph of fixed shapes.

    ``step(X, position, enc_valid_length, *caches) -> (log_probs, *self_caches)``. X: (rows, 1)
    the tokens at `position` (a (1,) array), one row per sentence (or per beam of a sentence);
    caches, per active block of `decoder`: self keys, self values, each (rows, max_len, hidden),
    newest position first (zeros at the start), then encoder keys, encoder values
    (rows, T, hidden) (`EncoderKV`). Only the new position is projected; the self caches shift
    by one row and take it in front, and the self-attention reads their first ``position + 1``
    rows (the order of the keys does not change the attention; with the fused kernels only
    those rows are written, the others hold whatever they held and are never read: the fused
    attention stops at the valid length), so the shapes never change and
    the step hybridizes (``static_alloc=True, static_shape=True``). log_probs: (rows, vocab),
    the log-softmax of the decoder's logits. The arithmetic is the decoder's own
    (`DecoderBlock._sublayers` with the projected keys/values); this block holds no weights.
    ``reorder=True`` (beam search): one more input after `enc_valid_length`, ``rows`` (rows,),
    the row of the given self caches each row continues (its beam's parent); the caches are
    taken by it before the new position goes in (in one copy with the fused kernels).
    ``log_softmax=False``: the logits (rows, vocab) instead of log_probs, for a caller that
    ranks them with their log-softmax in one operator (`kernels.row_topk`).
    """

    def __init__(self, decoder, *, reorder=False, log_softmax=True, **kwargs):
        super().__init__(**kwargs)
        self.decoder = decoder
        self.reorder = reorder
        self.log_softmax = log_softmax

    def hybrid_forward(self, F, X, position, enc_valid_length, *caches):
        rows = None
        if self.reorder:
            rows, caches = caches[0].astype("int32"), caches[1:]  # (rows,)
        dec = self.decoder
        X = dec.pos_encoding(_embed(dec, X), position)  # (rows, 1, d)
        self_length = F.np.zeros_like(enc_valid_length) + position + 1  # (rows,)
        new_caches = []
        for i, blk in enumerate(dec._active_blocks()):
            K, V, K_enc, V_enc = caches[4 * i:4 * i + 4]
            Xn = blk.addnorm_1.prenorm(X)
            k, v = blk.attention_1.project_kv(Xn)  # the new position only: (rows, 1, hidden)
            fused = blk.attention_1.fuses(F)  # reads only the rows 0..position: write only them
            if fused and rows is not None:  # take + shift: one copy
                K = kernels.take_shift_in(F, k, K, rows, position)  # writes only the rows
                V = kernels.take_shift_in(F, v, V, rows, position)  # 0..position it reads
            elif fused:  # one copy instead of slice + concatenate
                K, V = kernels.shift_in(F, k, K, position), kernels.shift_in(F, v, V, position)
            else:
                if rows is not None:
                    K, V = F.np.take(K, rows, axis=0), F.np.take(V, rows, axis=0)
                K = F.np.concatenate([k, K[:, :-1]], axis=1)  # (rows, max_len, hidden), newest first
                V = F.np.concatenate([v, V[:, :-1]], axis=1)
            X = blk._sublayers(X, Xn, None, self_length, None, enc_valid_length,
                               [K, V, K_enc, V_enc])
            new_caches += [K, V]
        logits = dec.dense(X if dec.final_norm is None else dec.final_norm(X))  # (rows, 1, V)
        logits = F.npx.reshape(logits, (-2, -3, -2))  # (rows, 1, V) -> (rows, V)
        return (F.npx.log_softmax(logits) if self.log_softmax else logits, *new_caches)


def build_model(cfg, src_vocab_size, tgt_vocab_size):
    """The chapter's EncoderDecoder; the only function that reads a config.

    ``cfg.exact_chapter`` builds the decoder with ``src_vocab_size`` as the book does (bug 1);
    otherwise its output layer has ``tgt_vocab_size`` entries.

    The model is built under a fresh `mx.name.NameManager`, so that its parameters have the
    names a fresh process gives them (``dense0_weight``, ...) whatever was built before in this
    process: `gluon.Trainer` orders the parameters by name, and the Adam state saved with a
    model is matched to the parameters by that order when a run resumes.
    """
    args = (cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_heads, cfg.num_layers, cfg.dropout)
    variants = {"pre_norm": cfg.pre_norm, "norm": cfg.norm, "fixnorm": cfg.fixnorm,
                "layerdrop": cfg.layerdrop, "drophead": cfg.drophead, "fused_qkv": cfg.fused_qkv}
    with mx_name.NameManager():
        encoder = TransformerEncoder(src_vocab_size, *args, exact_chapter=cfg.exact_chapter,
                                     **variants)
        decoder_vocab_size = src_vocab_size if cfg.exact_chapter else tgt_vocab_size
        decoder = TransformerDecoder(decoder_vocab_size, *args, exact_chapter=cfg.exact_chapter,
                                     **variants)
        return EncoderDecoder(encoder, decoder)
