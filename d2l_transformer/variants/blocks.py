"""The literature's variants as subclasses of the chapter's blocks (docs/variants.md).

Pre-norm (Xiong et al. 2020), ScaleNorm and FixNorm (Nguyen & Salazar 2019), LayerDrop (Fan et
al. 2019), DropHead (Zhou et al. 2020) and a fused query/key/value projection; batch norms
(`variants.norm`) and other positional encodings (`variants.position`). `build.build_model`
builds these classes only for a config that asks for a variant; the chapter's classes do not
know them. Each subclass keeps the chapter's attribute names and Gluon's parameter names
(`_alias`), so a variant's model directory reads as before. Random choices are dropout
operators inside the graph: a hybridized model drops in training and nothing at inference.
"""

import math

from mxnet import init, np
from mxnet.gluon import nn

from .. import _gluon, _graphs
from ..attention import _F, DotProductAttention, MultiHeadAttention
from ..layers import AddNorm, PositionWiseFFN
from ..model import (
    DecoderBlock,
    EncoderBlock,
    TransformerDecoder,
    TransformerEncoder,
    causal_valid_length,
)
from .names import SameNames as _SameNames
from .norm import id_mask, make_batch_norm, token_mask
from .position import ALiBiAttention, make_pos_encoding


class ScaleNorm(nn.HybridBlock):
    """ScaleNorm: ``g * x / max(||x||, eps)`` over the last axis, g initialised to sqrt(d)."""

    def __init__(self, hidden_size=None, eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.eps = eps
        g0 = 1.0 if hidden_size is None else float(hidden_size) ** 0.5
        self.g = self.params.get("g", shape=(1,), init=init.Constant(g0))

    def hybrid_forward(self, F, X, g):
        """X: (batch, seq_len, d) -> X's shape."""
        norm = F.np.sqrt(F.np.sum(X * X, axis=-1, keepdims=True))  # (batch, seq_len, 1)
        return g * X / F.np.maximum(norm, self.eps)


NORMS = ("layer", "scale", "batch", "masked_batch")


def make_norm(norm="layer", hidden_size=None):
    """``"layer"``: the chapter's LayerNorm; ``"scale"``: ScaleNorm; ``"batch"``,
    ``"masked_batch"``: batch normalization (`variants.norm`, over `hidden_size` features)."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}: expected one of {', '.join(NORMS)}")
    if norm in ("batch", "masked_batch"):
        return make_batch_norm(norm, hidden_size)
    return nn.LayerNorm() if norm == "layer" else ScaleNorm(hidden_size)


class VariantAddNorm(_SameNames, AddNorm):
    """AddNorm with another norm (``norm``: `NORMS`) or pre-norm: ``X + dropout(Y)``, the
    sublayer's input normalized by `prenorm` instead. ``mask`` (batch, seq_len), 1 at the real
    tokens: what ``norm="masked_batch"`` takes its statistics over (the other norms take none)."""

    def __init__(self, dropout, *, pre_norm=False, norm="layer", hidden_size=None, **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        self.pre_norm = pre_norm
        self.dropout = nn.Dropout(dropout)
        self.norm = make_norm(norm, hidden_size)

    def prenorm(self, X, *mask):
        """The sublayer's input: ``norm(X)`` with pre-norm, else X."""
        return self.norm(X, *mask) if self.pre_norm else X

    def forward(self, X, Y, *mask):
        return super().forward(X, Y, *(() if self.pre_norm else mask))  # pre-norm: no norm here

    def hybrid_forward(self, F, X, Y, *mask):
        """X, Y: (batch, seq_len, d) -> X's shape."""
        return self.dropout(Y) + X if self.pre_norm else self.norm(self.dropout(Y) + X, *mask)


class DropHeadAttention(_SameNames, DotProductAttention):
    """Dot-product attention whose (example, head) rows are dropped whole in training, the
    survivors scaled by 1 / (1 - p) (DropHead)."""

    def __init__(self, dropout, drophead, **kwargs):
        super().__init__(dropout, **kwargs)
        self.drophead = nn.Dropout(drophead)

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        output = super().hybrid_forward(F, query, key, value, valid_length)  # (batch*h, q, d)
        ones = F.np.ones_like(F.np.mean(output, axis=(1, 2), keepdims=True))  # (batch*h, 1, 1)
        return output * self.drophead(ones)


class VariantMultiHeadAttention(_SameNames, MultiHeadAttention):
    """Multi-head attention with DropHead (``drophead`` p > 0, see `set_drophead`), ALiBi's
    bias on the scores (``alibi``, `variants.position.ALiBiAttention`) and/or one Dense
    ``W_qkv`` of width 3 * hidden_size (rows: W_q, W_k, W_v) for the projections."""

    def __init__(self, hidden_size, num_heads, dropout, *, drophead=0.0, fused_qkv=False,
                 alibi=False, **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        self.num_heads, self.tile_valid_lengths, self.fused_qkv = num_heads, False, fused_qkv
        if alibi:
            self.attention = ALiBiAttention(dropout, num_heads, drophead)
        else:
            self.attention = DropHeadAttention(dropout, drophead) if drophead > 0 else \
                DotProductAttention(dropout)
        if fused_qkv:  # W_q, W_k, W_v: the identity on W_qkv's thirds
            self.W_qkv = nn.Dense(3 * hidden_size, use_bias=False, flatten=False)
            self.W_q = self.W_k = self.W_v = nn.HybridLambda(lambda F, x: x)
        else:
            self.W_q = nn.Dense(hidden_size, use_bias=False, flatten=False)
            self.W_k = nn.Dense(hidden_size, use_bias=False, flatten=False)
            self.W_v = nn.Dense(hidden_size, use_bias=False, flatten=False)
        self.W_o = nn.Dense(hidden_size, use_bias=False, flatten=False)

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        if self.fused_qkv:
            projected = F.np.split(self.W_qkv(query), 3, axis=-1)  # 3 x (batch, q, hidden)
            if key is not query:  # cross-attention or a decoder's past: their own projections
                projected[1] = F.np.split(self.W_qkv(key), 3, axis=-1)[1]
                projected[2] = F.np.split(self.W_qkv(value), 3, axis=-1)[2]
            query, key, value = projected
        return super().hybrid_forward(F, query, key, value, valid_length)

    def set_drophead(self, rate):
        """Change the DropHead rate (scheduled DropHead); every cached graph holding this block
        is traced again (`_graphs.invalidate`)."""
        if getattr(self.attention, "drophead", None) is None:
            raise ValueError("this attention was built without drophead")
        _gluon.set_dropout_rate(self.attention.drophead, rate)
        _graphs.invalidate(self)


def drophead_schedule(step, total_steps, p_max):
    """Scheduled DropHead's V: p_max at the start and the end, 0 at mid-training."""
    half = total_steps / 2.0
    return p_max * abs(step - half) / half if half > 0 else p_max


def fuse_qkv_params(separate, fused):
    """Copy every parameter of `separate` into `fused` (same model, ``fused_qkv=True``): the
    fused ``W_qkv.weight`` (3 * hidden, in) gets W_q, W_k and W_v stacked row-wise."""
    src = {k: v.data() for k, v in _gluon.structural_params(separate).items()}
    for name, param in _gluon.structural_params(fused).items():
        if name.endswith("W_qkv.weight"):
            base = name[: -len("W_qkv.weight")]
            param.set_data(np.concatenate([src[base + w + ".weight"]
                                           for w in ("W_q", "W_k", "W_v")], axis=0))
        else:
            param.set_data(src[name])


class FixNormEmbedding(_SameNames, nn.Embedding):
    """FixNorm: word embeddings scaled to unit norm (the stack then multiplies by sqrt(d))."""

    def hybrid_forward(self, F, x, weight):
        E = super().hybrid_forward(F, x, weight)  # (batch, seq_len, d)
        return E / F.np.maximum(F.np.sqrt(F.np.sum(E * E, axis=-1, keepdims=True)), 1e-5)


class VariantEncoderBlock(_SameNames, EncoderBlock):
    """The encoder block with pre-norm, another norm, DropHead, fused QKV or ALiBi; with
    ``norm="masked_batch"`` its norms count the tokens before ``valid_length`` only."""

    def __init__(self, embedding_size, ffn_hidden_size, num_heads, dropout, *, pre_norm=False,
                 norm="layer", drophead=0.0, fused_qkv=False, alibi=False, **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        an = {"pre_norm": pre_norm, "norm": norm, "hidden_size": embedding_size}
        self.masked = norm == "masked_batch"
        self.attention = VariantMultiHeadAttention(embedding_size, num_heads, dropout,
                                                   drophead=drophead, fused_qkv=fused_qkv,
                                                   alibi=alibi)
        self.addnorm_1 = VariantAddNorm(dropout, **an)
        self.ffn = PositionWiseFFN(ffn_hidden_size, embedding_size)
        self.addnorm_2 = VariantAddNorm(dropout, **an)

    def hybrid_forward(self, F, X, valid_length):
        m = (token_mask(X, valid_length),) if self.masked else ()  # (batch, seq_len) real tokens
        Xn = self.addnorm_1.prenorm(X, *m)
        Y = self.addnorm_1(X, self.attention(Xn, Xn, Xn, valid_length), *m)
        return self.addnorm_2(Y, self.ffn(self.addnorm_2.prenorm(Y, *m)), *m)


class VariantDecoderBlock(_SameNames, DecoderBlock):
    """The decoder block with pre-norm (its state keeps the normalized inputs), another norm
    (``mask``: (batch, seq_len), the real tokens, for ``norm="masked_batch"``), DropHead, fused
    QKV or ALiBi (self-attention only)."""

    def __init__(self, embedding_size, ffn_hidden_size, num_heads, dropout, i, *,
                 pre_norm=False, norm="layer", drophead=0.0, fused_qkv=False, alibi=False,
                 **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        self.i, self.mask_in_training_only = i, False
        an = {"pre_norm": pre_norm, "norm": norm, "hidden_size": embedding_size}
        self.attention_1 = VariantMultiHeadAttention(embedding_size, num_heads, dropout,
                                                     drophead=drophead, fused_qkv=fused_qkv,
                                                     alibi=alibi)
        self.addnorm_1 = VariantAddNorm(dropout, **an)
        self.attention_2 = VariantMultiHeadAttention(embedding_size, num_heads, dropout,
                                                     drophead=drophead)
        self.addnorm_2 = VariantAddNorm(dropout, **an)
        self.ffn = PositionWiseFFN(ffn_hidden_size, embedding_size)
        self.addnorm_3 = VariantAddNorm(dropout, **an)

    def forward(self, X, state, *mask):
        Xn, past = self.addnorm_1.prenorm(X, *mask), state[2][self.i]  # past: (batch, past, d)
        state[2][self.i] = Xn if past is None else np.concatenate((past, Xn), axis=1)
        num_past = 0 if past is None else past.shape[1]
        X2 = self.attention_1(Xn, state[2][self.i], state[2][self.i],
                              causal_valid_length(X, num_past))
        Y = self.addnorm_1(X, X2, *mask)
        Y2 = self.attention_2(self.addnorm_2.prenorm(Y, *mask), state[0], state[0], state[1])
        Z = self.addnorm_2(Y, Y2, *mask)
        return self.addnorm_3(Z, self.ffn(self.addnorm_3.prenorm(Z, *mask)), *mask), state


class _VariantStack:
    """What the variant encoder and decoder share: the embedding, the positional encoding,
    LayerDrop, inference pruning (`prune`) and pre-norm's final norm."""

    def _build(self, vocab_size, embedding_size, dropout, num_layers, make_block, *, pre_norm,
               norm, fixnorm, layerdrop, pos_encoding):
        self.embedding_size, self.masked = embedding_size, norm == "masked_batch"
        self.embed = (FixNormEmbedding if fixnorm else nn.Embedding)(vocab_size, embedding_size)
        self.pos_encoding = make_pos_encoding(pos_encoding, embedding_size, dropout)
        self.blks = nn.HybridSequential()
        for i in range(num_layers):
            self.blks.add(make_block(i))
        self.layers_to_keep = None
        self.layerdrop = nn.Dropout(layerdrop) if layerdrop > 0 else None
        self.final_norm = make_norm(norm, embedding_size) if pre_norm else None

    def prune(self, layers_to_keep):
        """Run only these block indices from now on (LayerDrop's inference pruning; see
        `every_other_layers`); None: all. Cached graphs holding the stack are traced again."""
        self.layers_to_keep = None if layers_to_keep is None else list(layers_to_keep)
        _graphs.invalidate(self)

    def active_blocks(self):
        keep = self.layers_to_keep
        return [b for i, b in enumerate(self.blks) if keep is None or i in keep]

    def _layer_drop(self, Y, X):
        """Y, or with LayerDrop X (the block skipped) with probability p in training."""
        if self.layerdrop is None:
            return Y
        F = _F(X)
        one = F.np.ones_like(F.np.mean(X, axis=(0, 1, 2), keepdims=True))  # (1, 1, 1)
        return F.np.where(self.layerdrop(one) > 0, Y, X)

    def _final(self, X, *mask):
        return X if self.final_norm is None else self.final_norm(X, *mask)


def every_other_layers(num_layers, r):
    """LayerDrop's "every other" pruning: keep r of N blocks, dropping evenly spaced ones
    (train with p = 1 - r / N)."""
    if not 0 < r <= num_layers:
        raise ValueError(f"keep r={r} blocks: need 0 < r <= num_layers={num_layers}")
    drop = {min(int(i * num_layers / (num_layers - r)) + 1, num_layers - 1)
            for i in range(num_layers - r)}
    return [i for i in range(num_layers) if i not in drop]


class VariantTransformerEncoder(_SameNames, _VariantStack, TransformerEncoder):
    """The Transformer encoder with any of the variants (keyword-only; off = the chapter)."""

    def __init__(self, vocab_size, embedding_size, ffn_hidden_size, num_heads, num_layers,
                 dropout, *, pre_norm=False, norm="layer", fixnorm=False, layerdrop=0.0,
                 drophead=0.0, fused_qkv=False, pos_encoding="sincos", **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        kw = {"pre_norm": pre_norm, "norm": norm, "drophead": drophead, "fused_qkv": fused_qkv,
              "alibi": pos_encoding == "alibi"}
        self._build(vocab_size, embedding_size, dropout, num_layers,
                    lambda i: VariantEncoderBlock(embedding_size, ffn_hidden_size, num_heads,
                                                  dropout, **kw),
                    pre_norm=pre_norm, norm=norm, fixnorm=fixnorm, layerdrop=layerdrop,
                    pos_encoding=pos_encoding)

    def hybrid_forward(self, F, X, valid_length):
        m = (token_mask(X, valid_length),) if self.masked else ()  # (batch, seq_len) real tokens
        X = self.pos_encoding(self.embed(X) * math.sqrt(self.embedding_size))
        for blk in self.active_blocks():
            X = self._layer_drop(blk(X, valid_length), X)
        return self._final(X, *m)


class VariantTransformerDecoder(_SameNames, _VariantStack, TransformerDecoder):
    """The Transformer decoder with any of the variants (keyword-only; off = the chapter)."""

    def __init__(self, vocab_size, embedding_size, ffn_hidden_size, num_heads, num_layers,
                 dropout, *, pre_norm=False, norm="layer", fixnorm=False, layerdrop=0.0,
                 drophead=0.0, fused_qkv=False, pos_encoding="sincos", **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        self.num_layers, self.restart_positions = num_layers, False
        kw = {"pre_norm": pre_norm, "norm": norm, "drophead": drophead, "fused_qkv": fused_qkv,
              "alibi": pos_encoding == "alibi"}
        self._build(vocab_size, embedding_size, dropout, num_layers,
                    lambda i: VariantDecoderBlock(embedding_size, ffn_hidden_size, num_heads,
                                                  dropout, i, **kw),
                    pre_norm=pre_norm, norm=norm, fixnorm=fixnorm, layerdrop=layerdrop,
                    pos_encoding=pos_encoding)
        self.dense = nn.Dense(vocab_size, flatten=False)

    def forward(self, X, state):
        """X: (batch, seq_len) target ids; with ``norm="masked_batch"`` the norms count the
        positions whose id is not ``<pad>`` (`variants.norm.id_mask`)."""
        m = (id_mask(X),) if self.masked else ()  # (batch, seq_len) real tokens
        past = state[2][self.active_blocks()[0].i]  # the positions X continues after
        X = self.embed(X) * math.sqrt(self.embedding_size)
        X = self.pos_encoding(X) if past is None else \
            self.pos_encoding(X, np.array([past.shape[1]], ctx=X.context))
        for blk in self.active_blocks():  # a skipped block still keeps its input in state
            Y, state = blk(X, state, *m)
            X = self._layer_drop(Y, X)
        return self.dense(self._final(X, *m)), state
