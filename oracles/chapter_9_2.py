"""The section's own code, d2l 0.11 edition: section 9.2 "Sequence to Sequence with Attention
Mechanisms" (d2l-ai/d2l-en, chapter_attention-mechanisms/seq2seq-attention.md at commit
28c06cfe7db6c8de7e52ba58e838b48b1e3ffde7, 17 Dec 2019, the file's last change of 2019; code
Apache-2.0). Its import cell and its `Seq2SeqAttentionDecoder` cell, verbatim: the class is the
same from 8992dba6 (22 Nov 2019) on, until 4dcff450 (19 Feb 2020) reworded three of its comments
(hidden_size -> num_hiddens). d2l 0.11.4's library does not have the class; it runs on that
library's `Decoder` and `MLPAttention`. An independent oracle for tests/test_seq2seq.py; nothing
in d2l_transformer imports this file."""
# ruff: noqa
import d2l
from mxnet import np, npx
from mxnet.gluon import rnn, nn
npx.set_np()


class Seq2SeqAttentionDecoder(d2l.Decoder):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers,
                 dropout=0, **kwargs):
        super(Seq2SeqAttentionDecoder, self).__init__(**kwargs)
        self.attention_cell = d2l.MLPAttention(num_hiddens, dropout)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = rnn.LSTM(num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Dense(vocab_size, flatten=False)

    def init_state(self, enc_outputs, enc_valid_len, *args):
        outputs, hidden_state = enc_outputs
        # Transpose outputs to (batch_size, seq_len, hidden_size)
        return (outputs.swapaxes(0, 1), hidden_state, enc_valid_len)

    def forward(self, X, state):
        enc_outputs, hidden_state, enc_valid_len = state
        X = self.embedding(X).swapaxes(0, 1)
        outputs = []
        for x in X:
            # query shape: (batch_size, 1, hidden_size)
            query = np.expand_dims(hidden_state[0][-1], axis=1)
            # context has same shape as query
            context = self.attention_cell(
                query, enc_outputs, enc_outputs, enc_valid_len)
            # Concatenate on the feature dimension
            x = np.concatenate((context, np.expand_dims(x, axis=1)), axis=-1)
            # Reshape x to (1, batch_size, embed_size+hidden_size)
            out, hidden_state = self.rnn(x.swapaxes(0, 1), hidden_state)
            outputs.append(out)
        outputs = self.dense(np.concatenate(outputs, axis=0))
        return outputs.swapaxes(0, 1), [enc_outputs, hidden_state,
                                        enc_valid_len]
