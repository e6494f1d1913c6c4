"""9.3.5-9.3.6 The encoder, the decoder that keeps its past in ``state``, and d2l 9.1's bases.

The decoder is called as in the chapter, ``decoder(X, state) -> (logits, state)`` with
``state = [enc_outputs, enc_valid_length, [past inputs of block 0, ...]]``. Inside a hybridized
graph (the fast training path) the same call runs on symbols, with a fresh state.
Each of the chapter's bugs is a switch of its own, off by default, set at construction
(`config.BUGS` says which edition's exact run keeps which): ``tile_valid_lengths`` (bug 2,
`attention.repeat_valid_length`), ``restart_positions`` (bug 3, `TransformerDecoder.forward`),
``mask_in_training_only`` (`DecoderBlock.forward`); bug 1 is the decoder's vocabulary size
(`build.build_model`).
"""

import math

from mxnet import autograd, np
from mxnet.gluon import nn

from .attention import _F, MultiHeadAttention
from .layers import AddNorm, PositionalEncoding, PositionWiseFFN


class Encoder(nn.HybridBlock):
    """d2l 9.1: the encoder interface (``hybrid_forward`` in place of ``forward``)."""


class Decoder(nn.HybridBlock):
    """d2l 9.1: the decoder interface."""

    def init_state(self, enc_outputs, *args):
        raise NotImplementedError


class EncoderDecoder(nn.Block):
    """d2l 9.1: encode, initialise the decoder's state, decode."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, enc_X, dec_X, *args):
        enc_outputs = self.encoder(enc_X, *args)
        dec_state = self.decoder.init_state(enc_outputs, *args)
        return self.decoder(dec_X, dec_state)


class EncoderBlock(nn.HybridBlock):
    """9.3.5: self-attention and a position-wise FFN, each followed by add & norm."""

    def __init__(self, embedding_size, ffn_hidden_size, num_heads, dropout,
                 tile_valid_lengths=False, **kwargs):
        super().__init__(**kwargs)
        self.attention = MultiHeadAttention(embedding_size, num_heads, dropout, tile_valid_lengths)
        self.addnorm_1 = AddNorm(dropout)
        self.ffn = PositionWiseFFN(ffn_hidden_size, embedding_size)
        self.addnorm_2 = AddNorm(dropout)

    def hybrid_forward(self, F, X, valid_length):
        """X: (batch, seq_len, embedding_size); valid_length: (batch,) -> X's shape."""
        Y = self.addnorm_1(X, self.attention(X, X, X, valid_length))
        return self.addnorm_2(Y, self.ffn(Y))


class TransformerEncoder(Encoder):
    """9.3.5: embedding * sqrt(d) + positional encoding, then `num_layers` encoder blocks."""

    def __init__(self, vocab_size, embedding_size, ffn_hidden_size, num_heads, num_layers,
                 dropout, tile_valid_lengths=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding_size = embedding_size
        self.embed = nn.Embedding(vocab_size, embedding_size)
        self.pos_encoding = PositionalEncoding(embedding_size, dropout)
        self.blks = nn.HybridSequential()
        for _ in range(num_layers):
            self.blks.add(EncoderBlock(embedding_size, ffn_hidden_size, num_heads, dropout,
                                       tile_valid_lengths))

    def forward(self, X, valid_length, *args):
        return super().forward(X, valid_length)  # the chapter ignores the extra arguments

    def hybrid_forward(self, F, X, valid_length):
        """X: (batch, seq_len) token ids; valid_length: (batch,) -> (batch, seq_len, d)."""
        X = self.pos_encoding(self.embed(X) * math.sqrt(self.embedding_size))
        for blk in self.blks:
            X = blk(X, valid_length)
        return X


def causal_valid_length(X, num_past):
    """(batch, seq_len): query j of X sees the keys up to its own position, num_past + j + 1."""
    F = _F(X)
    lengths = F.np.cumsum(F.np.ones_like(X[:, :, 0]), axis=1)  # (batch, seq_len): 1, 2, ...
    return lengths + num_past if num_past else lengths


class DecoderBlock(nn.HybridBlock):
    """9.3.6: causal self-attention, encoder-decoder attention, FFN, each with add & norm.

    ``i`` is the block's index in the decoder: its past inputs are kept in ``state[2][i]``.
    The chapter masks the future in training only (``mask_in_training_only``); the corrected
    block always does, so that a whole target fed at prediction time (scoring, validation)
    cannot see it either.
    """

    def __init__(self, embedding_size, ffn_hidden_size, num_heads, dropout, i,
                 tile_valid_lengths=False, mask_in_training_only=False, **kwargs):
        super().__init__(**kwargs)
        self.i = i
        self.mask_in_training_only = mask_in_training_only
        self.attention_1 = MultiHeadAttention(embedding_size, num_heads, dropout,
                                              tile_valid_lengths)
        self.addnorm_1 = AddNorm(dropout)
        self.attention_2 = MultiHeadAttention(embedding_size, num_heads, dropout,
                                              tile_valid_lengths)
        self.addnorm_2 = AddNorm(dropout)
        self.ffn = PositionWiseFFN(ffn_hidden_size, embedding_size)
        self.addnorm_3 = AddNorm(dropout)

    def forward(self, X, state):
        """X: (batch, seq_len, embedding_size) -> (X's shape, state)."""
        enc_outputs, enc_valid_length = state[0], state[1]
        past = state[2][self.i]  # (batch, num_past, d) or None
        key_values = X if past is None else np.concatenate((past, X), axis=1)
        state[2][self.i] = key_values
        valid_length = None  # the chapter's prediction: one query sees every key
        if autograd.is_training() or not self.mask_in_training_only:
            valid_length = causal_valid_length(X, 0 if past is None else past.shape[1])
        X2 = self.attention_1(X, key_values, key_values, valid_length)
        Y = self.addnorm_1(X, X2)
        Y2 = self.attention_2(Y, enc_outputs, enc_outputs, enc_valid_length)
        Z = self.addnorm_2(Y, Y2)
        return self.addnorm_3(Z, self.ffn(Z)), state


class TransformerDecoder(Decoder):
    """9.3.6: embedding * sqrt(d) + positional encoding, decoder blocks, dense to the vocabulary.

    ``restart_positions=True``: every call starts at position 0, as the chapter's (bug 3)."""

    def __init__(self, vocab_size, embedding_size, ffn_hidden_size, num_heads, num_layers,
                 dropout, tile_valid_lengths=False, mask_in_training_only=False,
                 restart_positions=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding_size = embedding_size
        self.num_layers = num_layers
        self.restart_positions = restart_positions
        self.embed = nn.Embedding(vocab_size, embedding_size)
        self.pos_encoding = PositionalEncoding(embedding_size, dropout)
        self.blks = nn.HybridSequential()
        for i in range(num_layers):
            self.blks.add(DecoderBlock(embedding_size, ffn_hidden_size, num_heads, dropout, i,
                                       tile_valid_lengths, mask_in_training_only))
        self.dense = nn.Dense(vocab_size, flatten=False)

    def init_state(self, enc_outputs, enc_valid_length, *args):
        return [enc_outputs, enc_valid_length, [None] * self.num_layers]

    def forward(self, X, state):
        """X: (batch, seq_len) target ids -> ((batch, seq_len, vocab_size), state)."""
        X = self.embed(X) * math.sqrt(self.embedding_size)
        if self.restart_positions or state[2][0] is None:  # the chapter restarts at row 0 (bug 3)
            X = self.pos_encoding(X)
        else:  # fixed: continue after the positions kept in state
            X = self.pos_encoding(X, np.array([state[2][0].shape[1]], ctx=X.context))
        for blk in self.blks:
            X, state = blk(X, state)
        return self.dense(X), state

