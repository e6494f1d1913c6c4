"""9.1-9.2 Additive attention and the seq2seq decoder that attends over the encoder's outputs.

`MLPAttention` is d2l 9.1's (d2l 0.11.4), on the package's `masked_softmax`; written once for
MXNet's two array APIs, as `attention.DotProductAttention`. `Seq2SeqAttentionDecoder` is the
section's own class (d2l 0.11.4's library does not have it; oracles/chapter_9_2.py holds it
verbatim): at each step the last layer's hidden state queries the encoder's outputs, and the
context is concatenated to the input embedding. Its state is ``[enc_outputs (batch, seq_len,
num_hiddens), [H, C], enc_valid_length]``. The book's flaw is a switch, off by default
(docs/chapter.md, "The book's seq2seq models"; `config.EXACT_BUGS` keeps it in exact runs):

* ``tanh_before_sum``: (c) `MLPAttention` applies tanh to each projection before adding them,
  so the query adds the same score to every key and the softmax cancels it: the weights do not
  depend on the query, and the decoder's context is the same at every step. Off, the tanh
  follows the sum, ``v^T tanh(W_q q + W_k k)`` (Bahdanau et al. 2015; d2l-en's fix of May 2020,
  #799), with the same parameters;
* it starts from the encoder's final [H, C] (`seq2seq`'s ``state_after_padding``).
"""

from mxnet import np
from mxnet.gluon import nn, rnn

from .attention import masked_softmax
from .model import Decoder


class MLPAttention(nn.HybridBlock):
    """d2l 9.1: scores v^T tanh(W_k q + W_q k) for every query-key pair (with
    ``tanh_before_sum``, the book's v^T (tanh(W_k q) + tanh(W_q k)): (c)), masked softmax,
    dropout on the weights, weighted values."""

    def __init__(self, units, dropout, tanh_before_sum=False, **kwargs):
        super().__init__(**kwargs)
        each = "tanh" if tanh_before_sum else None  # (c): the tanh inside each projection
        self.W_k = nn.Dense(units, activation=each, use_bias=False, flatten=False)
        self.W_q = nn.Dense(units, activation=each, use_bias=False, flatten=False)
        self.v = nn.Dense(1, use_bias=False, flatten=False)
        self.dropout = nn.Dropout(dropout)
        self.tanh_before_sum = tanh_before_sum

    def hybrid_forward(self, F, query, key, value, valid_length):
        """query: (batch, q, d_q); key: (batch, k, d_k); value: (batch, k, d_v); valid_length:
        None, (batch,) or (batch, q) -> (batch, q, d_v)."""
        query, key = self.W_k(query), self.W_q(key)  # the book's names, crossed: (batch, q|k, units)
        # (batch, q, 1, units) + (batch, 1, k, units): every query-key pair, (batch, q, k, units)
        features = F.np.expand_dims(query, axis=2) + F.np.expand_dims(key, axis=1)
        if not self.tanh_before_sum:
            features = F.np.tanh(features)
        scores = F.np.squeeze(self.v(features), axis=-1)  # (batch, q, k)
        self.attention_weights = masked_softmax(scores, valid_length)
        return F.npx.batch_dot(self.dropout(self.attention_weights), value)


class Seq2SeqAttentionDecoder(Decoder):
    """9.2: an LSTM fed [context; embedding] step by step, the context attended with the last
    layer's hidden state as the query, then a dense layer to the vocabulary."""

    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0,
                 tanh_before_sum=False, **kwargs):
        super().__init__(**kwargs)
        self.attention_cell = MLPAttention(num_hiddens, dropout, tanh_before_sum)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = rnn.LSTM(num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Dense(vocab_size, flatten=False)

    def init_state(self, enc_outputs, enc_valid_length, *args):
        outputs, hidden_state = enc_outputs
        # outputs: (seq_len, batch, num_hiddens) -> (batch, seq_len, num_hiddens)
        return (outputs.swapaxes(0, 1), hidden_state, enc_valid_length)

    def forward(self, X, state):
        """X: (batch, seq_len) ids -> ((batch, seq_len, vocab_size), state)."""
        enc_outputs, hidden_state, enc_valid_length = state
        X = self.embedding(X).swapaxes(0, 1)  # (seq_len, batch, embed_size)
        outputs = []
        for x in X:  # x: (batch, embed_size), one step
            query = np.expand_dims(hidden_state[0][-1], axis=1)  # last layer's H: (batch, 1, num_hiddens)
            context = self.attention_cell(query, enc_outputs, enc_outputs, enc_valid_length)
            # (batch, 1, num_hiddens) and (batch, 1, embed_size) -> (batch, 1, num_hiddens + embed_size)
            x = np.concatenate((context, np.expand_dims(x, axis=1)), axis=-1)
            out, hidden_state = self.rnn(x.swapaxes(0, 1), hidden_state)  # out: (1, batch, num_hiddens)
            outputs.append(out)
        outputs = self.dense(np.concatenate(outputs, axis=0))  # (seq_len, batch, vocab_size)
        return outputs.swapaxes(0, 1), [enc_outputs, hidden_state, enc_valid_length]
