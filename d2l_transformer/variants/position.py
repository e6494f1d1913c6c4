"""Other positional encodings than 9.3.4's sin/cos table (exercise 9.3.9.2; docs/variants.md).

``pos_encoding`` of `TransformerConfig`: ``"sincos"`` (the chapter's), ``"none"`` (no position
at all: only the decoder's causal mask tells order), ``"learned"`` (a learned table of absolute
positions, Gehring et al. 2017, Devlin et al. 2019) and ``"alibi"`` (ALiBi, Press et al. 2022,
"Train Short, Test Long": no position added to the embeddings; each self-attention head
subtracts ``slope_h * distance`` from its scores). Subclasses of the chapter's blocks with its
attribute and parameter names; `variants.blocks` builds them.
"""

import math
import types

import mxnet as mx
from mxnet import init
from mxnet.gluon import nn

from ..attention import DotProductAttention, masked_softmax
from ..layers import PositionalEncoding
from .names import SameNames

POS_ENCODINGS = ("sincos", "none", "learned", "alibi")
MAX_LEN = 1000  # the chapter's max_len: the positions a sentence may have


class LearnedPositionalEncoding(SameNames, PositionalEncoding):
    """The chapter's table P (1, max_len, d) learned instead of fixed (Gehring et al. 2017,
    BERT: Devlin et al. 2019), initialised N(0, 0.02) as BERT's; the chapter's call: rows
    ``offset, offset + 1, ...`` added to X, then dropout. A position never seen in training
    keeps its random initial row."""

    def __init__(self, embedding_size, dropout, max_len=MAX_LEN, **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        self.dropout = nn.Dropout(dropout)
        self.P = self.params.get("P", shape=(1, max_len, embedding_size), init=init.Normal(0.02))


class NoPositionalEncoding(SameNames, PositionalEncoding):
    """No position added (``"none"``, and ALiBi's embeddings): 9.3.4's dropout only. ``P`` is
    a stand-in holding the chapter's table's shape (1, max_len, d), the positions the
    translator lets a sentence have; there are no weights."""

    def __init__(self, embedding_size, dropout, max_len=MAX_LEN, **kwargs):
        nn.HybridBlock.__init__(self, **kwargs)
        self.dropout = nn.Dropout(dropout)
        self.P = types.SimpleNamespace(shape=(1, max_len, embedding_size))

    def hybrid_forward(self, F, X, offset=None):
        """X: (batch, seq_len, d) -> X's shape; `offset` is ignored (no position)."""
        return self.dropout(X)


def make_pos_encoding(pos_encoding, embedding_size, dropout):
    """The block added to the embeddings for ``pos_encoding`` (`POS_ENCODINGS`)."""
    if pos_encoding not in POS_ENCODINGS:
        raise ValueError(f"unknown pos_encoding {pos_encoding!r}: expected one of "
                         f"{', '.join(POS_ENCODINGS)}")
    if pos_encoding == "sincos":
        return PositionalEncoding(embedding_size, dropout)
    if pos_encoding == "learned":
        return LearnedPositionalEncoding(embedding_size, dropout)
    return NoPositionalEncoding(embedding_size, dropout)


def alibi_slopes(F, head, num_heads):
    """ALiBi's head slopes (Press et al. 2022, section 3 and its code) of `head` (n,), the
    heads 0..n-1 (an arange on the scores' device): the geometric sequence 2^(-8i/n), i = 1..n,
    for n heads a power of 2; otherwise the n' = 2^k < n heads' sequence followed by every other
    slope of 2n' heads' (2^(-4(2i-1)/n'), i = 1..)."""
    p = 1 << (num_heads.bit_length() - 1)  # the largest power of 2 <= num_heads
    exponents = (head + 1) * (-8.0 / p)  # (n,)
    if p < num_heads:
        exponents = F.np.where(head < p, exponents, ((head - p) * 2 + 1) * (-4.0 / p))  # (n,)
    return F.np.exp(exponents * math.log(2.0))


class ALiBiAttention(SameNames, DotProductAttention):
    """d2l 9.1's dot-product attention with ALiBi's bias (Press et al. 2022): head h of row r
    (``transpose_qkv`` puts example b's head h at row ``b * num_heads + h``) adds
    ``-slope_h * distance`` to each score before the masked softmax. ``distance`` (q, k) or
    (k,): given, or |k - q + i - j| for query i and key j, the queries being the last q of the
    k positions (encoder: |i - j|; a decoder's self-attention with its past first: i - j, its
    later keys masked). ``drophead`` > 0: DropHead on its rows (`variants.blocks.DropHeadAttention`)."""

    alibi = True

    def __init__(self, dropout, num_heads, drophead=0.0, **kwargs):
        super().__init__(dropout, **kwargs)
        self.num_heads = num_heads
        self.drophead = nn.Dropout(drophead) if drophead > 0 else None

    def hybrid_forward(self, F, query, key, value, valid_length=None, distance=None):
        """query: (batch * h, q, d); key: (batch * h, k, d); value: (batch * h, k, d_v)."""
        sqrt_d = math.sqrt(query.shape[-1]) if F is mx.nd else \
            F.np.sqrt(F.npx.shape_array(query)[-1:].astype("float32"))  # read from the graph
        scores = F.npx.batch_dot(query, key, transpose_b=True) / sqrt_d  # (batch * h, q, k)
        if distance is None:
            distance = key_distance(F, scores)  # (q, k)
        scores = F.npx.reshape(scores, (-6, -1, self.num_heads, -2, -2))  # (batch, h, q, k)
        slopes = alibi_slopes(F, F.npx.arange_like(scores, axis=1), self.num_heads)  # (h,)
        bias = -F.npx.reshape(slopes, (-2, 1, 1)) * distance  # (h, 1, 1) * (q|1, k)
        scores = F.npx.reshape(scores + bias, (-5, -2, -2))  # (batch * h, q, k)
        self.attention_weights = masked_softmax(scores, valid_length)
        output = F.npx.batch_dot(self.dropout(self.attention_weights), value)  # (batch*h, q, d_v)
        if self.drophead is None:
            return output
        ones = F.np.ones_like(F.np.mean(output, axis=(1, 2), keepdims=True))  # (batch * h, 1, 1)
        return output * self.drophead(ones)


def key_distance(F, scores):
    """|k - q + i - j| (q, k) for the scores (rows, q, k): query i is at position k - q + i."""
    i = F.npx.arange_like(scores, axis=1)  # (q,)
    j = F.npx.arange_like(scores, axis=2)  # (k,)
    shift = F.np.sum(F.np.ones_like(j)) - F.np.sum(F.np.ones_like(i))  # k - q, ()
    return F.np.abs(F.np.expand_dims(i, -1) + shift - j)  # (q, 1) - (k,) -> (q, k)
