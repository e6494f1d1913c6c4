"""8.14 Sequence to sequence: d2l 0.11.4's LSTM encoder and decoder, on the package's d2l 9.1 bases.

The encoder returns ``(outputs, state)``: outputs (seq_len, batch, num_hiddens), time first, and
the LSTM's final ``state = [H, C]``, each (num_layers, batch, num_hiddens); the decoder starts
from that state. The book's flaw is a switch of the encoder's, off by default (docs/chapter.md,
"The book's seq2seq models"; `config.EXACT_BUGS` keeps it in exact runs):

* ``state_after_padding``: (a) the encoder ignores the valid lengths, so the state it returns
  is the LSTM's state after the padding steps, not after the last real token; (b) so the
  decoder's initial state depends on how much padding follows the sentence. Off, the encoder
  runs the LSTM in one call up to the shortest sentence's end, then a step at a time up to the
  longest's, each sentence's state kept from its last real token on (MXNet's
  ``use_sequence_length`` is cuDNN's alone: on a CPU it ignores the lengths); its outputs after
  the longest sentence's end are zeros, which no attention reads.
"""

from mxnet import np
from mxnet.gluon import nn, rnn

from .model import Decoder, Encoder


class Seq2SeqEncoder(Encoder):
    """8.14.1: embed the tokens, run a multi-layer LSTM from a zero state over every step."""

    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0,
                 state_after_padding=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = rnn.LSTM(num_hiddens, num_layers, dropout=dropout)
        self.state_after_padding = state_after_padding

    def forward(self, X, *args):
        """X: (batch, seq_len) ids, ``args[0]`` their valid lengths (batch,) (None or absent:
        every step is real) -> ((seq_len, batch, num_hiddens), [H, C]), H and C: (num_layers,
        batch, num_hiddens), the state after each sentence's last real token (with
        ``state_after_padding``, after the last step, as the book's)."""
        X = self.embedding(X).swapaxes(0, 1)  # (seq_len, batch, embed_size): time first
        state = self.rnn.begin_state(batch_size=X.shape[1], ctx=X.context)  # zeros: [H, C]
        valid_length = args[0] if args else None
        if self.state_after_padding or valid_length is None:
            return self.rnn(X, state)
        steps = X.shape[0]
        lengths = valid_length.asnumpy()  # how many steps to run: the host decides
        shortest, longest = (min(int(n), steps) for n in (lengths.min(), lengths.max()))
        outputs = []
        if shortest:  # every sentence is real up to the shortest one's end: one call
            out, state = self.rnn(X[:shortest], state)  # (shortest, batch, num_hiddens)
            outputs.append(out)
        for t in range(shortest, longest):  # then a step at a time, each row's state kept
            out, new = self.rnn(X[t:t + 1], state)  # out: (1, batch, num_hiddens)
            real = (valid_length > t).reshape(1, -1, 1)  # (1, batch, 1): step t is a real token
            state = [np.where(real, n, s) for n, s in zip(new, state)]
            outputs.append(out)
        if longest < steps:  # padding only: never attended to (masked), so not computed
            outputs.append(np.zeros((steps - longest, X.shape[1], state[0].shape[-1]),
                                    ctx=X.context))
        return np.concatenate(outputs, axis=0), state  # (seq_len, batch, num_hiddens)


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
