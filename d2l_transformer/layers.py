"""9.3.2-9.3.4 Position-wise FFN, add & norm, positional encoding."""

from mxnet import np
from mxnet.gluon import nn


class PositionWiseFFN(nn.HybridBlock):
    """9.3.2: two dense layers applied to the last axis of every position."""

    def __init__(self, ffn_hidden_size, hidden_size_out, **kwargs):
        super().__init__(**kwargs)
        self.ffn_1 = nn.Dense(ffn_hidden_size, flatten=False, activation="relu")
        self.ffn_2 = nn.Dense(hidden_size_out, flatten=False)

    def hybrid_forward(self, F, X):
        """X: (batch, seq_len, d) -> (batch, seq_len, hidden_size_out)."""
        return self.ffn_2(self.ffn_1(X))


class AddNorm(nn.HybridBlock):
    """9.3.3: a residual connection, then layer normalization: ``norm(dropout(Y) + X)``."""

    def __init__(self, dropout, **kwargs):
        super().__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm()

    def hybrid_forward(self, F, X, Y):
        """X, Y: (batch, seq_len, d) -> (batch, seq_len, d)."""
        return self.norm(self.dropout(Y) + X)


def positional_encoding_table(embedding_size, max_len=1000):
    """9.3.4's P: P[0, i, 2j] = sin(i / 10000^(2j/d)), P[0, i, 2j+1] = cos(...), (1, max_len, d).

    MXNet's float32 operators, as the chapter computes it.
    """
    P = np.zeros((1, max_len, embedding_size))
    X = np.arange(0, max_len).reshape(-1, 1) / np.power(
        10000, np.arange(0, embedding_size, 2) / embedding_size)  # (max_len, d / 2)
    P[:, :, 0::2] = np.sin(X)
    P[:, :, 1::2] = np.cos(X)
    return P


class PositionalEncoding(nn.HybridBlock):
    """9.3.4: add rows of the sin/cos table P to the embeddings, then dropout.

    ``offset`` ((1,), optional) is the position of X's first row: step t of prediction adds
    row t, as training did. The chapter always adds rows 0, 1, ... (bug 3).
    """

    def __init__(self, embedding_size, dropout, max_len=1000, **kwargs):
        super().__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)
        self.P = self.params.get_constant("P", positional_encoding_table(embedding_size, max_len))

    def hybrid_forward(self, F, X, offset=None, P=None):
        """X: (batch, seq_len, embedding_size); offset: None or (1,) -> X's shape."""
        positions = F.npx.arange_like(X, axis=1)  # (seq_len,)
        if offset is not None:
            positions = positions + offset.astype("float32")  # (seq_len,)
        X = X + F.np.take(P, positions.astype("int32"), axis=1)  # P's rows: (1, seq_len, d)
        return self.dropout(X)
