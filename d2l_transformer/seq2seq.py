"""8.14 Sequence to sequence: d2l 0.11.4's LSTM encoder and decoder, on the package's d2l 9.1 bases.

The encoder returns ``(outputs, state)``: outputs (seq_len, batch, num_hiddens), time first, and
the LSTM's final ``state = [H, C]``, each (num_layers, batch, num_hiddens); the decoder starts
from that state. Kept as the book has them, not fixed yet (docs/chapter.md, "The book's seq2seq
models"):

* (a) the encoder ignores the valid lengths, so the state it returns is the LSTM's state after
  the padding steps, not after the last real token;
* (b) so the decoder's initial state, the whole of that state, depends on how much padding
  follows the sentence (the same sentence padded to 7 or to 10 steps decodes differently).
"""

from mxnet.gluon import nn, rnn

from .model import Decoder, Encoder


class Seq2SeqEncoder(Encoder):
    """8.14.1: embed the tokens, run a multi-layer LSTM from a zero state over every step."""

    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = rnn.LSTM(num_hiddens, num_layers, dropout=dropout)

    def forward(self, X, *args):
        """X: (batch, seq_len) ids; the valid lengths in ``args`` are ignored, as the book's (a)
        -> ((seq_len, batch, num_hiddens), [H, C]), H and C: (num_layers, batch, num_hiddens)."""
        X = self.embedding(X).swapaxes(0, 1)  # (seq_len, batch, embed_size): time first
        state = self.rnn.begin_state(batch_size=X.shape[1], ctx=X.context)  # zeros: [H, C]
        return self.rnn(X, state)


class Seq2SeqDecoder(Decoder):
    """8.14.2: an LSTM from the encoder's final state, then a dense layer to the vocabulary."""

    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = rnn.LSTM(num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Dense(vocab_size, flatten=False)

    def init_state(self, enc_outputs, *args):
        return enc_outputs[1]  # the encoder's [H, C], after the padding steps (b)

    def hybrid_forward(self, F, X, state):
        """X: (batch, seq_len) ids; state: [H, C] -> ((batch, seq_len, vocab_size), [H, C])."""
        X = F.np.swapaxes(self.embedding(X), 0, 1)  # (seq_len, batch, embed_size)
        out, state = self.rnn(X, state)  # out: (seq_len, batch, num_hiddens)
        return F.np.swapaxes(self.dense(out), 0, 1), state  # (batch, seq_len, vocab_size)
