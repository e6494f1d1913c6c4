"""9.3.2-9.3.4 Position-wise FFN, add & norm, positional encoding."""

import mxnet as mx
from mxnet import init, np
from mxnet.gluon import nn

from . import kernels


class PositionWiseFFN(nn.HybridBlock):
    """9.3.2: two dense layers applied to the last axis of every position."""

    def __init__(self, ffn_hidden_size, hidden_size_out, **kwargs):
        super().__init__(**kwargs)
        self.ffn_1 = nn.Dense(ffn_hidden_size, flatten=False, activation="relu")
        self.ffn_2 = nn.Dense(hidden_size_out, flatten=False)

    def hybrid_forward(self, F, X):
        """X: (batch, seq_len, d) -> (batch, seq_len, hidden_size_out)."""
        return self.ffn_2(self.ffn_1(X))


class ScaleNorm(nn.HybridBlock):
    """ScaleNorm (Nguyen & Salazar 2019): ``g * x / max(||x||, eps)`` over the last axis.

    One learned scalar g, initialised to sqrt(d) as in the paper when `hidden_size` is given.
    """

    def __init__(self, hidden_size=None, eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.eps = eps
        g0 = 1.0 if hidden_size is None else float(hidden_size) ** 0.5
        self.g = self.params.get("g", shape=(1,), init=init.Constant(g0))

    def hybrid_forward(self, F, X, g):
        """X: (batch, seq_len, d) -> (batch, seq_len, d)."""
        norm = F.np.sqrt(F.np.sum(X * X, axis=-1, keepdims=True))  # (batch, seq_len, 1)
        return g * X / F.np.maximum(norm, self.eps)


class LayerNorm(nn.LayerNorm):
    """The chapter's ``nn.LayerNorm`` (same parameters, same checkpoints, same values).

    ``norm(X, residual)`` normalizes ``X + residual`` (AddNorm's sum, in that order). Inside a
    graph traced under `kernels.fused` on a CPU, it runs the fused kernel (MXNet 1.9's
    CPU LayerNorm backward is a third of a fast training step); everywhere else, MXNet's
    ``LayerNorm`` after an ordinary add.
    """

    def hybrid_forward(self, F, data, residual=None, gamma=None, beta=None):
        """data, residual: (batch, seq_len, d) -> (batch, seq_len, d)."""
        if self.fused(F):
            return kernels.layer_norm(F, data, residual, gamma, beta, self._epsilon)
        if residual is not None:
            data = data + residual  # (batch, seq_len, d)
        return super().hybrid_forward(F, data, gamma, beta)

    def fused(self, F):
        """True when a call with `F` runs the kernel: in a graph traced under `kernels.fused`
        on a CPU, for the chapter's LayerNorm (last axis, with gamma and beta)."""
        return F is mx.sym and kernels.active() and self._axis == -1 and self._center \
            and self._scale

    def dropout_add(self, F, data, residual, rate):
        """``LayerNorm(Dropout(rate)(data) + residual)`` as ONE kernel, the dropout drawn
        inside it (MXNet's Dropout distribution, off at inference); only where `fused`.
        data, residual: (batch, seq_len, d) symbols -> (batch, seq_len, d)."""
        gamma, beta = (p.var().as_np_ndarray() for p in (self.gamma, self.beta))  # graph inputs
        return kernels.layer_norm(F, data, residual, gamma, beta, self._epsilon, rate)


def make_norm(norm="layer", hidden_size=None):
    """The normalization layer: ``"layer"`` (the chapter's LayerNorm) or ``"scale"`` (ScaleNorm)."""
    if norm == "layer":
        return LayerNorm()
    if norm == "scale":
        return ScaleNorm(hidden_size)
    raise ValueError(f"unknown norm {norm!r}: expected 'layer' or 'scale'")


class AddNorm(nn.HybridBlock):
    """9.3.3: residual connection then layer normalization, ``norm(dropout(Y) + X)``.

    Variants (keyword-only): ``pre_norm=True`` returns ``X + dropout(Y)`` and the caller
    normalizes the sublayer's input with `prenorm` (Xiong et al. 2020); ``norm="scale"`` uses
    ScaleNorm instead of LayerNorm.
    """

    def __init__(self, dropout, *, pre_norm=False, norm="layer", hidden_size=None, **kwargs):
        super().__init__(**kwargs)
        self.pre_norm = pre_norm
        self.dropout = nn.Dropout(dropout)
        self.norm = make_norm(norm, hidden_size)

    def prenorm(self, X):
        """The sublayer's input: ``norm(X)`` with pre-norm, else X unchanged (chapter)."""
        return self.norm(X) if self.pre_norm else X

    def hybrid_forward(self, F, X, Y):
        """X, Y: (batch, seq_len, d) -> (batch, seq_len, d)."""
        if self.pre_norm:
            return self.dropout(Y) + X
        if isinstance(self.norm, LayerNorm):
            rate = self.dropout._rate
            if 0 < rate < 1 and self.norm.fused(F):  # dropout, add and norm: one kernel
                return self.norm.dropout_add(F, Y, X, rate)
            return self.norm(self.dropout(Y), X)  # LayerNorm(dropout(Y) + X), one kernel in graphs
        return self.norm(self.dropout(Y) + X)


def positional_encoding_table(embedding_size, max_len=1000):
    """The chapter's P: P[0, i, 2j] = sin(i / 10000^(2j/d)), P[0, i, 2j+1] = cos(...).

    Computed with MXNet's float32 ops exactly as the chapter does. Shape (1, max_len, d).
    """
    P = np.zeros((1, max_len, embedding_size))
    X = np.arange(0, max_len).reshape(-1, 1) / np.power(
        10000, np.arange(0, embedding_size, 2) / embedding_size
    )  # (max_len, ceil(d / 2))
    P[:, :, 0::2] = np.sin(X)
    P[:, :, 1::2] = np.cos(X)
    return P


class PositionalEncoding(nn.HybridBlock):
    """9.3.4: add the sin/cos table P to the embeddings, then dropout.

    ``offset`` (an array of one integer, optional) is the position of X's first row: the
    decoder passes the number of positions it has already cached, so that step t of
    prediction adds row t of P, as training did. The chapter always adds rows 0.. (bug 3).
    """

    def __init__(self, embedding_size, dropout, max_len=1000, **kwargs):
        super().__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)
        self.max_len = max_len
        self.P = self.params.get_constant("P", positional_encoding_table(embedding_size, max_len))

    def hybrid_forward(self, F, X, offset=None, P=None):
        """X: (batch, seq_len, embedding_size); offset: None or (1,) -> (batch, seq_len, embedding_size)."""
        positions = F.npx.arange_like(X, axis=1)  # (seq_len,)
        if offset is not None:
            positions = positions + offset.astype("float32")  # (seq_len,)
        X = X + F.np.take(P, positions.astype("int32"), axis=1)  # P rows: (1, seq_len, d)
        return self.dropout(X)
