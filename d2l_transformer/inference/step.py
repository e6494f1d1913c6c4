"""The decoder of d2l 9.3.6 one position at a time, with a key/value cache, as graphs of fixed
shapes (``static_alloc=True, static_shape=True``).

`EncoderKV` runs the encoder once per batch and projects each decoder block's encoder-decoder
keys and values once; `DecoderStep` feeds one new position per row through the chapter's
DecoderBlock sequence, projecting only that position's self-attention keys and values into
caches of a fixed length; `AttentionProbe` runs one teacher-forced pass for the attention
weights of a translation. The arithmetic is the chapter's blocks' own (their Dense layers,
`transpose_qkv`, `DotProductAttention`, AddNorm, FFN), written against the blocks' public
attributes only, with MXNet's operators; a step equals the chapter's full decoder call in
prediction mode (tests/test_translator.py).
"""

import math
import warnings

from mxnet.gluon import nn

from .. import _gluon
from ..attention import transpose_output, transpose_qkv


def active_blocks(stack):
    """The blocks an encoder or decoder runs: its `blks`, or the ones LayerDrop's pruning keeps."""
    active = getattr(stack, "active_blocks", None)
    return active() if active is not None else list(stack.blks)


def hybridized(graph, static=True):
    """`graph` hybridized alone: MXNet's ``hybridize`` recurses into the children, which would
    leave the user's own model hybridized; the graph is traced through them all the same."""
    return _gluon.hybridize_alone(graph, static_alloc=static, static_shape=static)


def call(graph, *args):
    """``graph(*args)``; its first call traces it, when the weights it does not use (the other
    side's) draw Gluon's "not used" warning: no news here."""
    if _gluon.has_graph(graph):
        return graph(*args)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Parameter .* is not used", UserWarning)
        return graph(*args)


def prenorm(addnorm, X):
    """The sublayer's input: a pre-norm variant's ``norm(X)``; X itself for the chapter's AddNorm."""
    norm = getattr(addnorm, "prenorm", None)
    return X if norm is None else norm(X)


def embed(decoder, X):
    """9.3.6: ``embed(X) * sqrt(d)`` (a FixNorm variant's `embed` gives unit rows)."""
    return decoder.embed(X) * math.sqrt(decoder.embedding_size)


def _queries(F, mha, X):
    """9.3.1's query projection of X (rows, T, d) -> (rows, T, hidden): W_q, or the first third
    of a fused W_qkv (rows W_q, W_k, W_v)."""
    if hasattr(mha, "W_qkv"):
        return F.np.split(mha.W_qkv(X), 3, axis=-1)[0]
    return mha.W_q(X)


def keys_values(F, mha, X):
    """9.3.1's key and value projections of X (rows, T, d), each (rows, T, hidden)."""
    if hasattr(mha, "W_qkv"):
        _, K, V = F.np.split(mha.W_qkv(X), 3, axis=-1)
        return K, V
    return mha.W_k(X), mha.W_v(X)


def _attend(F, mha, q, K, V, valid_length, distance=None):
    """9.3.1 on projected queries (rows, Tq, hidden) and keys/values (rows, Tk, hidden): heads
    split, the chapter's dot-product attention, heads merged, W_o -> (rows, Tq, hidden).
    `distance`: ALiBi's query-key distances (Tk,), for an attention with ALiBi only."""
    h = mha.num_heads
    q, K, V = (transpose_qkv(x, h) for x in (q, K, V))  # (rows * h, T, hidden / h) each
    valid_length = F.np.repeat(valid_length, h, axis=0)  # (rows * h,) or (rows * h, Tq)
    extra = () if distance is None else (distance,)
    return mha.W_o(transpose_output(mha.attention(q, K, V, valid_length, *extra), h))  # (rows, Tq, hidden)


def cache_distance(F, mha, K):
    """ALiBi's distances (Press et al. 2022) in a newest-first cache K (rows, max_len, hidden):
    row j holds the position j steps before the query's, so (max_len,) 0, 1, ...; None for an
    attention without ALiBi (`variants.position.ALiBiAttention`)."""
    if not getattr(mha.attention, "alibi", False):
        return None
    return F.npx.arange_like(K, axis=1)  # (max_len,)


def decoder_block(F, blk, X, Xn, K, V, self_length, K_enc, V_enc, enc_valid_length,
                  newest_first=False):
    """9.3.6's DecoderBlock with its keys and values projected: X (rows, Tq, d) and
    ``Xn = prenorm(X)``; K, V (rows, Tk, hidden) the self-attention's, `self_length` (rows,) or
    (rows, Tq) its valid lengths; K_enc, V_enc (rows, T, hidden) the encoder's -> (rows, Tq, d).
    ``newest_first``: K and V hold the newest position first (`DecoderStep`'s caches)."""
    distance = cache_distance(F, blk.attention_1, K) if newest_first else None
    Y = blk.addnorm_1(X, _attend(F, blk.attention_1, _queries(F, blk.attention_1, Xn), K, V,
                                 self_length, distance))
    Yn = prenorm(blk.addnorm_2, Y)
    Z = blk.addnorm_2(Y, _attend(F, blk.attention_2, _queries(F, blk.attention_2, Yn), K_enc,
                                 V_enc, enc_valid_length))
    return blk.addnorm_3(Z, blk.ffn(prenorm(blk.addnorm_3, Z)))


def output_layer(decoder, X):
    """The decoder's logits: a pre-norm decoder's `final_norm`, then `dense`."""
    final_norm = getattr(decoder, "final_norm", None)
    return decoder.dense(X if final_norm is None else final_norm(X))


class EncoderKV(nn.HybridBlock):
    """``graph(X (rows, T), valid_length (rows,)) -> (K_enc, V_enc) per decoder block``, each
    (rows, T, hidden): the encoder, then each block's encoder-decoder keys and values, projected
    once per sentence. Holds no weights of its own."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = model.encoder, model.decoder

    def hybrid_forward(self, F, X, valid_length):
        enc_outputs = self.encoder(X, valid_length)  # (rows, T, d)
        kv = []
        for blk in active_blocks(self.decoder):
            kv += keys_values(F, blk.attention_2, enc_outputs)  # 2 x (rows, T, hidden)
        return tuple(kv)


class DecoderStep(nn.HybridBlock):
    """``step(X, position, enc_valid_length, [rows,] *caches) -> (logits, *self_caches)``.

    X: (rows, 1) the tokens at `position` (a (1,) array; 0 for ``<bos>``); caches, per decoder
    block: self keys, self values (rows, max_len, hidden), newest position first (zeros at the
    start), then `EncoderKV`'s keys and values (rows, T, hidden). Only the new position is
    projected; it goes in front of the self caches, which drop their last row, and the
    self-attention reads their first ``position + 1`` rows, so the shapes never change.
    logits: (rows, V), the decoder's output layer.
    ``reorder=True`` (beam search): an input `rows` (rows,) after `enc_valid_length`, the row
    of the given self caches each row continues (its beam's parent), taken before the new
    position goes in. Holds no weights.
    """

    def __init__(self, decoder, *, reorder=False, **kwargs):
        super().__init__(**kwargs)
        self.decoder, self.reorder = decoder, reorder

    def hybrid_forward(self, F, X, position, enc_valid_length, *caches):
        if self.reorder:
            rows, caches = caches[0].astype("int32"), caches[1:]  # (rows,)
        dec = self.decoder
        X = dec.pos_encoding(embed(dec, X), position)  # (rows, 1, d)
        self_length = F.np.zeros_like(enc_valid_length) + position + 1  # (rows,)
        new_caches = []
        for i, blk in enumerate(active_blocks(dec)):
            K, V, K_enc, V_enc = caches[4 * i:4 * i + 4]
            if self.reorder:  # each row continues its parent's cache
                K, V = F.np.take(K, rows, axis=0), F.np.take(V, rows, axis=0)
            Xn = prenorm(blk.addnorm_1, X)
            k, v = keys_values(F, blk.attention_1, Xn)  # the new position: (rows, 1, hidden)
            K = F.np.concatenate([k, K[:, :-1]], axis=1)  # (rows, max_len, hidden), newest first
            V = F.np.concatenate([v, V[:, :-1]], axis=1)
            X = decoder_block(F, blk, X, Xn, K, V, self_length, K_enc, V_enc, enc_valid_length,
                              newest_first=True)
            new_caches += [K, V]
        logits = output_layer(dec, X)  # (rows, 1, V)
        return (F.npx.reshape(logits, (-2, -3, -2)), *new_caches)  # (rows, 1, V) -> (rows, V)


class AttentionProbe(nn.HybridBlock):
    """``graph(X (1, T), valid_length (1,), Y (1, m + 1), causal_length (1, m + 1))``: one
    teacher-forced pass, the encoder then the decoder blocks over ``<bos> y_1 ... y_m`` with
    the chapter's causal valid lengths (1, 2, ..., m + 1); its outputs are the attention
    weights of every block, encoder self, decoder self, then encoder-decoder, each (heads,
    queries, keys). Holds no weights."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = model.encoder, model.decoder

    def hybrid_forward(self, F, X, valid_length, Y, causal_length):
        enc_outputs = self.encoder(X, valid_length)  # (1, T, d)
        weights = [b.attention.attention.attention_weights for b in active_blocks(self.encoder)]
        dec, cross = self.decoder, []
        Z = dec.pos_encoding(embed(dec, Y))  # (1, m + 1, d)
        for blk in active_blocks(dec):
            Zn = prenorm(blk.addnorm_1, Z)
            Z = decoder_block(F, blk, Z, Zn, *keys_values(F, blk.attention_1, Zn), causal_length,
                              *keys_values(F, blk.attention_2, enc_outputs), valid_length)
            weights.append(blk.attention_1.attention.attention_weights)
            cross.append(blk.attention_2.attention.attention_weights)
        return tuple(weights + cross)  # each (heads, queries, keys)


class TeacherForced(nn.HybridBlock):
    """``graph(X (rows, T), valid_length (rows,), Y (rows, m + 1), causal_length (rows, m + 1))
    -> logits (rows, m + 1, V)``: one teacher-forced pass, the encoder then the decoder blocks
    over ``<bos> y_1 ... y_m`` (`AttentionProbe`'s arithmetic) and the output layer; each
    position predicts the next token. Holds no weights."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = model.encoder, model.decoder

    def hybrid_forward(self, F, X, valid_length, Y, causal_length):
        enc_outputs = self.encoder(X, valid_length)  # (rows, T, d)
        dec = self.decoder
        Z = dec.pos_encoding(embed(dec, Y))  # (rows, m + 1, d)
        for blk in active_blocks(dec):
            Zn = prenorm(blk.addnorm_1, Z)
            Z = decoder_block(F, blk, Z, Zn, *keys_values(F, blk.attention_1, Zn), causal_length,
                              *keys_values(F, blk.attention_2, enc_outputs), valid_length)
        return output_layer(dec, Z)  # (rows, m + 1, V)
