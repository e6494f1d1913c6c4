"""Beam search on the decoder's cached state, through `gluonnlp.model.BeamSearchSampler`.

Each beam is a batch row: the sampler repeats ``state = [enc_outputs, enc_valid_length,
[cache of block 0, ...]]`` `beam_size` times along the batch axis and, after every step, keeps
the surviving rows of every array in it with ``take``. Hypotheses are ranked by the GNMT score
(Wu et al. 2016, used by the Transformer paper) ``log P(Y) / lp(Y)`` with
``lp(Y) = ((5 + |Y|) / 6) ** alpha``; |Y| counts the emitted tokens including ``<eos>``.
The paper uses ``beam_size=4, alpha=0.6``. ``beam_size=1`` is greedy decoding.
"""

import mxnet as mx
from gluonnlp.model import BeamSearchSampler, BeamSearchScorer
from mxnet import np, npx

from ..data import truncate_pad

BEAM_SIZE, ALPHA = 4, 0.6  # the paper's (6.1)


def length_penalty(length, alpha=ALPHA):
    """``((5 + |Y|) / 6) ** alpha`` (GNMT), the divisor of a hypothesis' log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


def _convert(state, to_np):
    """The decoder's state (nested lists of arrays and None) in the other array API.

    gluonnlp 0.10 works on legacy ``mx.nd`` arrays, our model on ``mx.np``; both views share
    the same memory."""
    if isinstance(state, (list, tuple)):
        return [_convert(s, to_np) for s in state]
    if state is None:
        return None
    return state.as_np_ndarray() if to_np else state.as_nd_ndarray()


class _StepDecoder:
    """gluonnlp's one-step decoder ``(step_input (N,), states) -> (log_probs (N, V), states)``
    over the chapter's stateful call ``decoder(X, state)``."""

    def __init__(self, decoder):
        self.decoder = decoder

    def __call__(self, step_input, states):
        with mx.util.np_shape(True), mx.util.np_array(True):
            X = step_input.as_np_ndarray().astype("float32").reshape(-1, 1)  # (N, 1)
            Y, state = self.decoder(X, _convert(states, to_np=True))  # Y: (N, 1, vocab)
            log_probs = npx.log_softmax(Y[:, 0, :])  # (N, vocab)
            return log_probs.as_nd_ndarray(), _convert(state, to_np=False)


def encode(model, sentences, src_vocab, num_steps, ctx):
    """Token lists -> ``(enc_outputs, enc_valid_length)`` for the whole batch.

    As `predict_s2s_ch8` does, each sentence is padded to `num_steps` (or to the longest
    sentence, which is never truncated) and its valid length is its number of tokens.
    enc_outputs: (batch, max(num_steps, longest), d); enc_valid_length: (batch,).
    """
    ids = [src_vocab[tokens] for tokens in sentences]
    width = max([num_steps] + [len(t) for t in ids])
    X = np.array([truncate_pad(t, width, src_vocab["<pad>"]) for t in ids], ctx=ctx)  # (batch, width)
    enc_valid_length = np.array([len(t) for t in ids], ctx=ctx)  # (batch,)
    return model.encoder(X, enc_valid_length), enc_valid_length


def beam_search(model, sentences, src_vocab, tgt_vocab, num_steps, ctx, beam_size=BEAM_SIZE,
                alpha=ALPHA, max_length=None):
    """Translate token lists by beam search; returns ``[(tokens, score), ...]``, the best
    hypothesis of each sentence with its length-penalised score.

    At most `max_length` tokens are emitted (default `num_steps`, as `predict_s2s_ch8`); a
    hypothesis that reaches it without ``<eos>`` is scored without one.
    """
    max_length = max_length or num_steps
    enc_outputs, enc_valid_length = encode(model, sentences, src_vocab, num_steps, ctx)
    state = model.decoder.init_state(enc_outputs, enc_valid_length)
    eos = tgt_vocab["<eos>"]
    sampler = BeamSearchSampler(beam_size, _StepDecoder(model.decoder), eos,
                                scorer=BeamSearchScorer(alpha=alpha, K=5), max_length=max_length)
    bos = mx.nd.full((len(sentences),), tgt_vocab["<bos>"], ctx=ctx, dtype="int32")  # (batch,)
    with mx.util.np_array(False), mx.util.np_shape(False):  # gluonnlp's legacy arrays
        samples, scores, valid_length = sampler(bos, _convert(state, to_np=False))
    # samples: (batch, beam, 1 + length) starting with <bos>; the beams are sorted by score
    samples, scores, valid_length = samples.asnumpy(), scores.asnumpy(), valid_length.asnumpy()
    results = []
    for b in range(len(sentences)):
        ids = [int(i) for i in samples[b, 0, 1:valid_length[b, 0]]]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        results.append((tgt_vocab.to_tokens(ids), float(scores[b, 0])))
    return results


def score_translation(model, src_tokens, tgt_tokens, src_vocab, tgt_vocab, num_steps, ctx,
                      finished=True, alpha=ALPHA):
    """The beam search score of a given translation: ``sum log P(y_t | y_<t, x) / lp(|Y|)``,
    with ``<eos>`` appended when `finished` (a translation cut at `max_length` has none)."""
    enc_outputs, enc_valid_length = encode(model, [src_tokens], src_vocab, num_steps, ctx)
    state = model.decoder.init_state(enc_outputs, enc_valid_length)
    ids = tgt_vocab[list(tgt_tokens)] + ([tgt_vocab["<eos>"]] if finished else [])
    dec_X = np.array([[tgt_vocab["<bos>"]] + ids[:-1]], ctx=ctx)  # (1, |Y|): teacher forcing
    Y, _ = model.decoder(dec_X, state)  # (1, |Y|, vocab)
    log_probs = npx.log_softmax(Y[0])  # (|Y|, vocab)
    total = sum(float(log_probs[t, i]) for t, i in enumerate(ids))
    return total / length_penalty(len(ids), alpha)
