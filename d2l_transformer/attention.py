"""9.3.1 Multi-head attention, on top of d2l's masked softmax and dot-product attention.

Every function here works on both MXNet numpy arrays (imperative, the chapter's way) and numpy
symbols (inside a hybridized graph): the module to call (`mx.nd` or `mx.sym`) is taken from the
array itself, and no code reads a shape in Python, so ``hybridize()`` traces the same lines the
chapter runs.
"""

import math

import mxnet as mx
from mxnet.gluon import nn

from . import _graphs, kernels

MASK_VALUE = -1e6  # d2l fills masked scores with -1e6, whose exp underflows to 0


def _F(x):
    """The operator namespace for `x`: `mx.sym` for a symbol, else `mx.nd`."""
    return mx.sym if isinstance(x, mx.sym.Symbol) else mx.nd


def _length_mask(F, X, valid_length):
    """True where the key position is below the valid length; broadcastable to X.

    X: (batch, num_queries, num_keys); valid_length: (batch,) or (batch, num_queries).
    """
    # (batch,) -> (batch, 1); (batch, num_queries) stays: d2l's two accepted shapes
    valid_length = F.npx.reshape(valid_length, (-2, -1))
    valid_length = F.np.expand_dims(valid_length, axis=-1)  # (batch, 1 | num_queries, 1)
    key_pos = F.npx.arange_like(X, axis=-1)  # (num_keys,)
    return key_pos < valid_length.astype("float32")  # (batch, 1 | num_queries, num_keys)


def _causal_mask(F, X):
    """True where key j may be seen by query i, keys and queries aligned at the right end.

    X: (batch, num_queries, num_keys). The last query is the newest position; with
    ``num_keys - num_queries`` positions already cached, query i sits at absolute position
    ``num_keys - num_queries + i`` and sees keys 0..that position. Training (no cache) gives the
    chapter's causal valid lengths 1, 2, ..., num_queries; one query per step sees every key.
    """
    key_from_end = F.np.flip(F.npx.arange_like(X, axis=-1), axis=0)  # (num_keys,)
    query_from_end = F.np.flip(F.npx.arange_like(X, axis=-2), axis=0)  # (num_queries,)
    return F.np.expand_dims(key_from_end, 0) >= F.np.expand_dims(query_from_end, 1)  # (q, k)


def masked_softmax(X, valid_length, causal=False):
    """Softmax over the last axis of X, scores at masked key positions set to -1e6 first (d2l).

    X: (batch, num_queries, num_keys). valid_length: None, (batch,) or (batch, num_queries).
    ``causal=True`` additionally hides keys after each query's own position (see
    `_causal_mask`); the chapter expresses the same thing through valid lengths.
    """
    F = _F(X)
    if F is mx.sym:
        return _softmax_with_lengths(F, X, valid_length, causal)
    mask = None if valid_length is None else _length_mask(F, X, valid_length)
    if causal:
        causal_mask = _causal_mask(F, X)
        if mask is not None:  # both: MXNet 1.9's numpy module has no logical_and for arrays
            causal_mask = mask.astype("float32") * causal_mask.astype("float32")
        mask = causal_mask
    if mask is not None:
        # a full-size fill, not the scalar: MXNet 1.9's where(cond, x, scalar) sends the gradient
        # to the wrong side when cond broadcasts (measured; tests/test_attention.py guards it)
        X = F.np.where(mask, X, F.np.full_like(X, MASK_VALUE))
    return F.npx.softmax(X)


def _softmax_with_lengths(F, X, valid_length, causal):
    """`masked_softmax` inside a hybridized graph (fast path): one fused
    ``softmax(X, length=..., use_length=True)`` over the first `length` keys of every query.

    The same probabilities as the chapter's fill-with--1e6-then-softmax (exp(-1e6 - max) is
    exactly 0 in float32) to 1e-7 (tests/test_fast.py), with 2 fused operators instead of
    where + full_like + softmax and their broadcasting backward passes. The length of query i
    is the valid length, the causal ``num_keys - num_queries + i + 1``, or their minimum.
    """
    lengths = None
    if causal:
        shape = F.npx.shape_array(X)  # (3,): batch, num_queries, num_keys
        offset = (shape[2:3] - shape[1:2]).astype("float32")  # (1,) cached positions
        lengths = F.np.expand_dims(F.npx.arange_like(X, axis=-2) + offset + 1, 0)  # (1, q)
    if valid_length is not None:
        valid = F.npx.reshape(valid_length, (-2, -1)).astype("float32")  # (batch, 1 | q)
        lengths = valid if lengths is None else F.np.minimum(valid, lengths)
    if lengths is None:
        return F.npx.softmax(X)
    # (batch, num_queries): broadcast along the batch and query axes of X
    ref = F.np.zeros_like(X[:, :, 0])  # (batch, num_queries); zeros_like: no gradient
    lengths = (lengths + ref).astype("int32")
    return F.npx.softmax(X, length=lengths, use_length=True)


class DotProductAttention(nn.HybridBlock):
    """Scaled dot-product attention with dropout on the weights (d2l 9.1)."""

    def __init__(self, dropout, causal=False, *, query_size=None, **kwargs):
        super().__init__(**kwargs)
        self.causal = causal
        self.dropout = nn.Dropout(dropout)
        self.query_size = query_size  # d, when known: a scalar divide in graphs

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        """query: (batch, num_queries, d); key: (batch, num_keys, d); value: (batch, num_keys, d_v)."""
        scores = F.npx.batch_dot(query, key, transpose_b=True)  # (batch, q, k)
        if F is mx.nd or self.query_size is not None:  # the chapter's / math.sqrt(d)
            d = query.shape[-1] if F is mx.nd else self.query_size
            scores = scores / math.sqrt(d)
        else:  # sqrt(d) read from the graph (float32, the same value)
            scores = scores / F.np.sqrt(F.npx.shape_array(query)[-1:].astype("float32"))
        self.attention_weights = masked_softmax(scores, valid_length, self.causal)
        return F.npx.batch_dot(self.dropout(self.attention_weights), value)  # (batch, q, d_v)


def transpose_qkv(X, num_heads):
    """(batch, seq_len, hidden_size) -> (batch * num_heads, seq_len, hidden_size / num_heads)."""
    F = _F(X)
    X = F.npx.reshape(X, (-2, -2, num_heads, -1))  # (batch, seq_len, num_heads, d)
    X = F.np.swapaxes(X, 1, 2)  # (batch, num_heads, seq_len, d); swapaxes: 2x transpose's speed
    return F.npx.reshape(X, (-5, -2, -2))  # (batch * num_heads, seq_len, d)


def transpose_output(X, num_heads):
    """The inverse of `transpose_qkv`: (batch * num_heads, seq_len, d) -> (batch, seq_len, num_heads * d)."""
    F = _F(X)
    X = F.npx.reshape(X, (-6, -1, num_heads, -2, -2))  # (batch, num_heads, seq_len, d)
    X = F.np.swapaxes(X, 1, 2)  # (batch, seq_len, num_heads, d)
    return F.npx.reshape(X, (-2, -2, -5))  # (batch, seq_len, num_heads * d)


def repeat_valid_length(valid_length, num_heads, exact_chapter=False):
    """One valid length (row) per (example, head), matching `transpose_qkv`'s layout.

    valid_length: (batch,) or (batch, num_queries) -> (batch * num_heads,) or
    (batch * num_heads, num_queries). `transpose_qkv` puts head j of example b at row
    ``b * num_heads + j``, so each example's length is repeated `num_heads` times in place.

    ``exact_chapter=True`` reproduces the book's ``np.tile``, which repeats the whole batch
    instead, so row ``b * num_heads + j`` gets the length of example
    ``(b * num_heads + j) % batch`` (chapter bug 2; harmless only for a batch of one).
    """
    F = _F(valid_length)
    if exact_chapter:
        # np.tile(v, h) for (batch,), np.tile(v, (h, 1)) for (batch, q), with F and no ndim
        tiled = F.np.tile(F.npx.reshape(valid_length, (-2, -1)), (num_heads, 1))  # (h*batch, 1|q)
        return F.npx.reshape_like(tiled, F.np.repeat(valid_length, num_heads, axis=0))
    return F.np.repeat(valid_length, num_heads, axis=0)


class MultiHeadAttention(nn.HybridBlock):
    """9.3.1: project, split into heads, attend in parallel, concatenate, project (no biases).

    Variants (keyword-only, off by default): ``drophead`` > 0 drops whole heads in training,
    survivors scaled by 1 / (1 - p) like dropout (Zhou et al. 2020); ``fused_qkv=True`` uses one
    Dense ``W_qkv`` of width 3 * hidden_size (rows: W_q, W_k, W_v) — see `fuse_qkv_params`.
    """

    def __init__(self, hidden_size, num_heads, dropout, exact_chapter=False, causal=False,
                 *, drophead=0.0, fused_qkv=False, **kwargs):
        super().__init__(**kwargs)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.exact_chapter = exact_chapter
        self.fused_qkv = fused_qkv
        self.attention = DotProductAttention(dropout, causal=causal,
                                             query_size=hidden_size // num_heads)
        # in-graph random op: drops in training (also hybridized), identity at inference
        self.drophead = nn.Dropout(drophead) if drophead > 0 else None
        if fused_qkv:
            self.W_qkv = nn.Dense(3 * hidden_size, use_bias=False, flatten=False)
        else:
            self.W_q = nn.Dense(hidden_size, use_bias=False, flatten=False)
            self.W_k = nn.Dense(hidden_size, use_bias=False, flatten=False)
            self.W_v = nn.Dense(hidden_size, use_bias=False, flatten=False)
        self.W_o = nn.Dense(hidden_size, use_bias=False, flatten=False)

    def set_drophead(self, rate):
        """Change the DropHead rate (scheduled DropHead); clears every cached graph that
        contains this block (`_graphs.invalidate`)."""
        if self.drophead is None:
            raise ValueError("this attention was built without drophead")
        self.drophead._rate = rate
        _graphs.invalidate(self)

    def _project(self, F, query, key, value):
        """(query, key, value) projected: separate W_q/W_k/W_v, or one fused W_qkv."""
        if not self.fused_qkv:
            return self.W_q(query), self.W_k(key), self.W_v(value)
        q, k, v = F.np.split(self.W_qkv(query), 3, axis=-1)  # each (batch, q, hidden)
        if key is not query:  # cross-attention or a decoder cache: keys from key, values from value
            k = F.np.split(self.W_qkv(key), 3, axis=-1)[1]
            v = F.np.split(self.W_qkv(value), 3, axis=-1)[2]
        return q, k, v

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        """query: (batch, num_queries, dim); key, value: (batch, num_keys, dim);
        valid_length: None, (batch,) or (batch, num_queries). Returns (batch, num_queries, hidden_size)."""
        query, key, value = self._project(F, query, key, value)
        return self._attend(F, query, key, value, valid_length)

    def project_kv(self, X):
        """(keys, values) projected from X, each (batch, num_keys, hidden_size): what a
        decoder's key/value cache keeps so that each step projects only its new position."""
        _, key, value = self._project(_F(X), X, X, X)
        return key, value

    def attend_cached(self, query, key, value, valid_length=None):
        """The attention with `key` and `value` already projected (`project_kv`); imperative.
        query: (batch, num_queries, dim) -> (batch, num_queries, hidden_size)."""
        F = _F(query)
        query = self.W_q(query) if not self.fused_qkv else F.np.split(
            self.W_qkv(query), 3, axis=-1)[0]  # (batch, q, hidden)
        return self._attend(F, query, key, value, valid_length)

    def fuses(self, F):
        """True when a call with `F` runs the fused attention kernel (a graph traced under
        `kernels.fused`; not DropHead or the exact chapter), which reads no key past a row's
        valid length (`DecoderStep` relies on it)."""
        return F is mx.sym and kernels.active() and self.drophead is None \
            and not self.exact_chapter and 0 <= self.attention.dropout._rate < 1 \
            and bool(self.attention.query_size)

    def _attend(self, F, query, key, value, valid_length):
        """Split heads, attend, concatenate, project; query/key/value already projected."""
        rate = self.attention.dropout._rate
        if self.fuses(F):
            # the lines below as one CPU operator (heads read in place, same values; the
            # weights' dropout drawn inside it, with MXNet's Dropout distribution)
            output_concat = kernels.attention(F, query, key, value, valid_length, self.num_heads,
                                              self.attention.causal,
                                              math.sqrt(self.attention.query_size), rate)
            return self.W_o(output_concat)  # (batch, q, hidden)
        query = transpose_qkv(query, self.num_heads)  # (batch*h, q, hidden/h)
        key = transpose_qkv(key, self.num_heads)  # (batch*h, k, hidden/h)
        value = transpose_qkv(value, self.num_heads)  # (batch*h, k, hidden/h)
        if valid_length is not None:
            valid_length = repeat_valid_length(valid_length, self.num_heads, self.exact_chapter)
        output = self.attention(query, key, value, valid_length)  # (batch*h, q, hidden/h)
        if self.drophead is not None:
            # one 0 or 1/(1-p) per (example, head): (batch*h, 1, 1)
            head_mask = F.np.ones_like(F.np.mean(output, axis=(1, 2), keepdims=True))
            output = output * self.drophead(head_mask)
        output_concat = transpose_output(output, self.num_heads)  # (batch, q, hidden)
        return self.W_o(output_concat)


def drophead_schedule(step, total_steps, p_max):
    """Scheduled DropHead's V shape (Zhou et al. 2020): p_max -> 0 at mid-training -> p_max."""
    half = total_steps / 2.0
    return p_max * abs(step - half) / half if half > 0 else p_max


def fuse_qkv_params(separate, fused):
    """Copy every parameter of `separate` into `fused` (same architecture, ``fused_qkv=True``).

    Parameters are matched by structural name (``blks.0.attention.W_q.weight``); the fused
    ``W_qkv.weight`` (3*hidden, in) gets W_q, W_k, W_v stacked row-wise, so outputs are equal.
    """
    src = {k: v.data() for k, v in separate._collect_params_with_prefix().items()}
    for name, param in fused._collect_params_with_prefix().items():
        if name.endswith("W_qkv.weight"):
            base = name[: -len("W_qkv.weight")]
            parts = [src[base + w + ".weight"] for w in ("W_q", "W_k", "W_v")]
            param.set_data(mx.np.concatenate(parts, axis=0))  # (3*hidden, in)
        else:
            param.set_data(src[name])
