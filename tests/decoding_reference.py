"""Reference decoders for tests and benchmarks only: independent of the package's translator.

* `beam_search`: gluonnlp 0.10's ``BeamSearchSampler`` over the chapter's stateful decoder call
  ``decoder(X, state)`` (beams are batch rows; the sampler repeats the state per beam and
  reorders it with ``take``; every step re-projects every cached input). Scores are GNMT's
  ``log P(Y) / ((5 + |Y|) / 6) ** alpha``. This is the package's former translation path.
* `score`: a translation's score by teacher forcing through the chapter's state.
* `greedy`: greedy decoding one sentence at a time through the chapter's state (``"state"``:
  each block caches its inputs and re-projects them) or the graph call on the whole prefix
  (``"prefix"``, optionally hybridized).

Sources are padded to ``max(num_steps, longest)`` and never truncated, valid length = number of
tokens (the translator's encoding). Nothing in d2l_transformer imports this file.
"""

import mxnet as mx
import numpy as onp
from gluonnlp.model import BeamSearchSampler, BeamSearchScorer
from mxnet import np, npx

from d2l_transformer.data import truncate_pad


def length_penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def _convert(state, to_np):
    """The decoder's state (nested lists of arrays and None) in the other array API (gluonnlp
    0.10 works on legacy ``mx.nd`` arrays, the model on ``mx.np``; both share memory)."""
    if isinstance(state, (list, tuple)):
        return [_convert(s, to_np) for s in state]
    if state is None:
        return None
    return state.as_np_ndarray() if to_np else state.as_nd_ndarray()


class _StepDecoder:
    """gluonnlp's ``(step_input (N,), states) -> (log_probs (N, V), states)`` over the chapter's
    stateful call."""

    def __init__(self, decoder):
        self.decoder = decoder

    def __call__(self, step_input, states):
        with mx.util.np_shape(True), mx.util.np_array(True):
            X = step_input.as_np_ndarray().astype("float32").reshape(-1, 1)  # (N, 1)
            Y, state = self.decoder(X, _convert(states, to_np=True))  # Y: (N, 1, vocab)
            log_probs = npx.log_softmax(Y[:, 0, :])  # (N, vocab)
            return log_probs.as_nd_ndarray(), _convert(state, to_np=False)


def encode(model, sentences, src_vocab, num_steps, ctx):
    """Token lists -> (enc_outputs (batch, width, d), enc_valid_length (batch,))."""
    ids = [src_vocab[list(tokens)] for tokens in sentences]
    width = max([num_steps] + [len(t) for t in ids])
    X = np.array([truncate_pad(t, width, src_vocab["<pad>"]) for t in ids], ctx=ctx)  # (batch, width)
    enc_valid_length = np.array([len(t) for t in ids], ctx=ctx)  # (batch,)
    return model.encoder(X, enc_valid_length), enc_valid_length


def beam_search(model, sentences, src_vocab, tgt_vocab, num_steps, ctx, beam_size=4, alpha=0.6,
                max_length=None):
    """``[(tokens, score), ...]``: the best hypothesis of each sentence (gluonnlp's sampler).
    At most `max_length` (default `num_steps`) tokens; one cut there is scored without <eos>."""
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


def score(model, src_tokens, tgt_tokens, src_vocab, tgt_vocab, num_steps, ctx, finished=True,
          alpha=0.6):
    """``sum log P(y_t | y_<t, x) / lp(|Y|)`` by teacher forcing, ``<eos>`` appended when
    `finished`; the log-softmax of the float32 logits in float64 (MXNet's float32
    ``log_softmax`` is up to ~4e-6 off per token: the exact value is the reference)."""
    enc_outputs, enc_valid_length = encode(model, [src_tokens], src_vocab, num_steps, ctx)
    state = model.decoder.init_state(enc_outputs, enc_valid_length)
    ids = tgt_vocab[list(tgt_tokens)] + ([tgt_vocab["<eos>"]] if finished else [])
    dec_X = np.array([[tgt_vocab["<bos>"]] + ids[:-1]], ctx=ctx)  # (1, |Y|)
    Y, _ = model.decoder(dec_X, state)  # (1, |Y|, vocab)
    logits = Y[0].asnumpy().astype("float64")  # (|Y|, vocab)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - onp.log(onp.exp(shifted).sum(axis=1, keepdims=True))
    return sum(float(log_probs[t, i]) for t, i in enumerate(ids)) / length_penalty(len(ids), alpha)


def greedy(model, src_tokens, src_vocab, tgt_vocab, num_steps, ctx, mode="state", max_length=None,
           until_eos=True):
    """One sentence, greedily: the chapter's state (``mode="state"``) or the whole prefix
    through the graph call (``"prefix"``). Returns the tokens (no <eos>)."""
    max_length = max_length or num_steps
    enc_outputs, enc_valid_length = encode(model, [src_tokens], src_vocab, num_steps, ctx)
    state = model.decoder.init_state(enc_outputs, enc_valid_length)
    dec_X = np.array([[tgt_vocab["<bos>"]]], ctx=ctx)  # (1, 1)
    prefix, out = dec_X, []
    for _ in range(max_length):
        if mode == "state":
            Y, state = model.decoder(dec_X, state)  # (1, 1, vocab)
        else:
            fresh = model.decoder.init_state(enc_outputs, enc_valid_length)
            Y = model.decoder(prefix, fresh)[0][:, -1:]  # the whole prefix again: (1, 1, vocab)
        dec_X = Y.argmax(axis=2).astype("float32")  # (1, 1)
        prefix = np.concatenate((prefix, dec_X), axis=1)  # (1, t + 2)
        token = int(dec_X.item())
        if token == tgt_vocab["<eos>"] and until_eos:
            break
        out.append(token)
    return tgt_vocab.to_tokens(out)
