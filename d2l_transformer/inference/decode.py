"""Translating with a trained model: the chapter's greedy `predict_s2s_ch8`."""

import warnings
import weakref

import numpy as onp
from mxnet import np

from .. import kernels
from ..data import truncate_pad
from ..model import DecoderStep


def predict_s2s_ch8(model, src_sentence, src_vocab, tgt_vocab, num_steps, ctx):
    """Greedy decoding one token at a time through the decoder's cached state (d2l).

    The sentence is lower-cased and split on spaces; at most `num_steps` tokens are emitted.
    """
    src_tokens = src_vocab[src_sentence.lower().split(" ")]
    enc_valid_length = np.array([len(src_tokens)], ctx=ctx)
    src_tokens = truncate_pad(src_tokens, num_steps, src_vocab["<pad>"])
    enc_X = np.array(src_tokens, ctx=ctx)
    enc_outputs = model.encoder(np.expand_dims(enc_X, axis=0), enc_valid_length)  # (1, T, d)
    dec_state = model.decoder.init_state(enc_outputs, enc_valid_length)
    dec_X = np.expand_dims(np.array([tgt_vocab["<bos>"]], ctx=ctx), axis=0)  # (1, 1)
    predict_tokens = []
    for _ in range(num_steps):
        Y, dec_state = model.decoder(dec_X, dec_state)  # Y: (1, 1, vocab)
        dec_X = Y.argmax(axis=2)  # the most likely token is the next input, (1, 1)
        py = dec_X.squeeze(axis=0).astype("int32").item()
        if py == tgt_vocab["<eos>"]:
            break
        predict_tokens.append(py)
    return " ".join(tgt_vocab.to_tokens(predict_tokens))


_STEPS = weakref.WeakKeyDictionary()  # decoder -> {device type: its hybridized DecoderStep}


def _decoder_step(decoder, ctx):
    """The decoder's cached-step graph for `ctx`'s device type, built once (CPU: with the
    fused kernels, `kernels.fused`)."""
    steps = _STEPS.setdefault(decoder, {})
    if ctx.device_type not in steps:
        step = DecoderStep(decoder)
        step.hybridize(static_alloc=True, static_shape=True)
        steps[ctx.device_type] = step
    return steps[ctx.device_type]


def predict_greedy_batch(model, src_sentences, src_vocab, tgt_vocab, num_steps, ctx, cache=True,
                         *, until_eos=True):
    """Batched greedy decoding (issue 4): every sentence of `src_sentences` at once.

    Token for token the same as :func:`predict_s2s_ch8` on each sentence (rows are
    independent: every source is padded to `num_steps`). Stops when every sentence has emitted
    ``<eos>`` (``until_eos=False``: always `num_steps` steps, for benchmarks) or after
    `num_steps` tokens. ``cache=True``: a key/value cache, each step projects and attends only
    the new position, as one hybridized graph of fixed shapes (`DecoderStep`; this hybridizes
    the decoder's blocks);
    ``cache="inputs"``: the chapter's state, which caches each block's inputs and re-projects
    all of them every step; ``cache=False``: the whole prefix is recomputed every step with the
    graph call ``decoder(prefix, enc_outputs, enc_valid_length)`` (corrected model only).
    One host sync per step (the argmax of the batch).
    """
    if not src_sentences:
        return []
    if cache not in (True, False, "inputs"):
        raise ValueError(f"cache must be True, False or 'inputs', not {cache!r}")
    pad, bos, eos = src_vocab["<pad>"], tgt_vocab["<bos>"], tgt_vocab["<eos>"]
    tokens = [src_vocab[s.lower().split(" ")] for s in src_sentences]
    enc_valid_length = np.array([len(t) for t in tokens], ctx=ctx)  # (batch,)
    enc_X = np.array([truncate_pad(t, num_steps, pad) for t in tokens], ctx=ctx)  # (batch, T)
    enc_outputs = model.encoder(enc_X, enc_valid_length)  # (batch, T, d)
    batch = len(src_sentences)
    dec_X = np.full((batch, 1), bos, ctx=ctx)  # (batch, 1)
    if cache is True:
        step_graph, caches = _decoder_step(model.decoder, ctx), []
        for blk in model.decoder._active_blocks():
            K_enc, V_enc = blk.attention_2.project_kv(enc_outputs)  # once: (batch, T, hidden)
            empty = np.zeros((batch, num_steps, K_enc.shape[-1]), ctx=ctx)  # (batch, steps, hidden)
            caches += [empty, empty, K_enc, V_enc]
    elif cache == "inputs":
        dec_state = model.decoder.init_state(enc_outputs, enc_valid_length)
    prefix = dec_X
    out = onp.zeros((batch, num_steps), dtype="int64")
    done = onp.zeros(batch, dtype=bool)
    lengths = onp.full(batch, num_steps)
    for t in range(num_steps):
        if cache is True:
            with warnings.catch_warnings(), kernels.fused(ctx):  # encoder-side W_k/W_v: unused
                warnings.filterwarnings("ignore", "Parameter .* is not used", UserWarning)
                Y, *self_caches = step_graph(dec_X, np.array([t], ctx=ctx), enc_valid_length,
                                             *caches)  # Y: (batch, 1, vocab)
            caches[0::4], caches[1::4] = self_caches[0::2], self_caches[1::2]
        elif cache is False:
            Y = model.decoder(prefix, enc_outputs, enc_valid_length)[:, -1:]  # (batch, 1, vocab)
        else:
            Y, dec_state = model.decoder(dec_X, dec_state)  # (batch, 1, vocab)
        dec_X = Y.argmax(axis=2)  # (batch, 1)
        if cache is False:
            prefix = np.concatenate((prefix, dec_X.astype(prefix.dtype)), axis=1)  # (batch, t+2)
        step = dec_X.asnumpy().astype("int64")[:, 0]  # one sync per step
        newly = (~done) & (step == eos)
        lengths[newly] = t
        done |= newly
        out[:, t] = step
        if until_eos and done.all():
            break
    return [" ".join(tgt_vocab.to_tokens(out[b, :lengths[b]].tolist())) for b in range(batch)]
