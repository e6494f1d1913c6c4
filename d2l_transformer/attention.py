"""9.3.1 Multi-head attention, on d2l 9.1's masked softmax and scaled dot-product attention.

Written once for MXNet's two array APIs: `_F(x)` is the operator module of `x` (`mx.nd` for
an array, `mx.sym` for a symbol) and no line reads a shape, so the same code runs imperatively
(the chapter's way) and inside a hybridized graph (the fast path).
"""

import math

import mxnet as mx
from mxnet.gluon import nn


def _F(x):
    """The operator module of `x`: `mx.sym` for a symbol, else `mx.nd`."""
    return mx.sym if isinstance(x, mx.sym.Symbol) else mx.nd


def masked_softmax(X, valid_length):
    """d2l 9.1: softmax over the last axis, the keys at or past `valid_length` filled with -1e6.

    X: (batch, num_queries, num_keys); valid_length: None, (batch,) or (batch, num_queries).
    """
    F = _F(X)
    if valid_length is None:
        return F.npx.softmax(X)
    valid_length = F.np.expand_dims(F.npx.reshape(valid_length, (-2, -1)), -1)  # (batch, 1|q, 1)
    mask = F.npx.arange_like(X, axis=-1) < valid_length.astype("float32")  # (batch, 1|q, keys)
    # a full-size fill: MXNet 1.9's where(cond, x, scalar) sends the gradient to the wrong side
    return F.npx.softmax(F.np.where(mask, X, F.np.full_like(X, -1e6)))


class DotProductAttention(nn.HybridBlock):
    """d2l 9.1: scores q.k / sqrt(d), masked softmax, dropout on the weights, weighted values."""

    def __init__(self, dropout, **kwargs):
        super().__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        """query: (batch, q, d); key: (batch, k, d); value: (batch, k, d_v) -> (batch, q, d_v)."""
        sqrt_d = math.sqrt(query.shape[-1]) if F is mx.nd else \
            F.np.sqrt(F.npx.shape_array(query)[-1:].astype("float32"))  # read from the graph
        scores = F.npx.batch_dot(query, key, transpose_b=True) / sqrt_d  # (batch, q, k)
        self.attention_weights = masked_softmax(scores, valid_length)
        return F.npx.batch_dot(self.dropout(self.attention_weights), value)


class MultiHeadAttention(nn.HybridBlock):
    """9.3.1: project queries, keys and values, attend in `num_heads` heads, concatenate, project.

    ``tile_valid_lengths=True`` repeats the valid lengths with the chapter's ``np.tile`` (bug 2).
    """

    def __init__(self, hidden_size, num_heads, dropout, tile_valid_lengths=False, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.tile_valid_lengths = tile_valid_lengths
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Dense(hidden_size, use_bias=False, flatten=False)
        self.W_k = nn.Dense(hidden_size, use_bias=False, flatten=False)
        self.W_v = nn.Dense(hidden_size, use_bias=False, flatten=False)
        self.W_o = nn.Dense(hidden_size, use_bias=False, flatten=False)

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        """query: (batch, q, dim); key, value: (batch, k, dim); valid_length: None, (batch,) or
        (batch, q) -> (batch, q, hidden_size)."""
        query = transpose_qkv(self.W_q(query), self.num_heads)  # (batch * heads, q, d)
        key = transpose_qkv(self.W_k(key), self.num_heads)  # (batch * heads, k, d)
        value = transpose_qkv(self.W_v(value), self.num_heads)  # (batch * heads, k, d)
        if valid_length is not None:
            valid_length = repeat_valid_length(valid_length, self.num_heads, self.tile_valid_lengths)
        output = self.attention(query, key, value, valid_length)  # (batch * heads, q, d)
        return self.W_o(transpose_output(output, self.num_heads))  # (batch, q, hidden_size)


def repeat_valid_length(valid_length, num_heads, tile=False):
    """Each example's valid lengths once per head: (batch, ...) -> (batch * num_heads, ...).

    `transpose_qkv` puts head j of example b at row ``b * num_heads + j``, so each row is
    repeated in place. The chapter's ``np.tile`` (``tile=True``) repeats the whole batch instead
    (bug 2).
    """
    F = _F(valid_length)
    if tile:  # np.tile(v, h) for (batch,), np.tile(v, (h, 1)) for (batch, q)
        tiled = F.np.tile(F.npx.reshape(valid_length, (-2, -1)), (num_heads, 1))  # (h*batch, 1|q)
        return F.npx.reshape_like(tiled, F.np.repeat(valid_length, num_heads, axis=0))
    return F.np.repeat(valid_length, num_heads, axis=0)


def transpose_qkv(X, num_heads):
    """(batch, seq_len, hidden) -> (batch * num_heads, seq_len, hidden / num_heads)."""
    F = _F(X)
    X = F.npx.reshape(X, (-2, -2, num_heads, -1))  # (batch, seq_len, num_heads, d)
    X = F.np.swapaxes(X, 1, 2)  # (batch, num_heads, seq_len, d)
    return F.npx.reshape(X, (-5, -2, -2))  # (batch * num_heads, seq_len, d)


def transpose_output(X, num_heads):
    """The inverse of `transpose_qkv`: (batch * num_heads, seq_len, d) -> (batch, seq_len, hidden)."""
    F = _F(X)
    X = F.npx.reshape(X, (-6, -1, num_heads, -2, -2))  # (batch, num_heads, seq_len, d)
    X = F.np.swapaxes(X, 1, 2)  # (batch, seq_len, num_heads, d)
    return F.npx.reshape(X, (-2, -2, -5))  # (batch, seq_len, hidden)
