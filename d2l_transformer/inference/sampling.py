"""Sampled translations (back-translation; fairseq's ``--sampling --sampling-topk``, Sockeye's
``--sample``, CTranslate2's ``sampling_topk``): each next token drawn at random from the `topk`
most probable (0: from the whole vocabulary), their probabilities ``softmax(log P /
temperature)``.

The MXNet engine samples over the `Translator`'s cached step (`translator._Rows`, one row per
sentence): the host reads each step's logits, takes their log-softmax (the banned tokens at
-1e18, as in the search) and draws with NumPy's ``Generator`` seeded by `seed`, so that a seed
gives the same translations on every run (sentences in the `Translator`'s order, by length).
A hypothesis' ``log_prob`` is the model's own (untempered) log-probability of its tokens and
``<eos>``; its ``score`` that divided by GNMT's length penalty at the default alpha.
"""

import numpy as onp

from .limits import check_lengths
from .translator import ALPHA, Hypothesis, _log_softmax, length_penalty


def check_sampling(topk, temperature):
    """Refuse (ValueError, one line) a `topk` below 0 or a `temperature` that is not above 0."""
    if topk < 0:
        raise ValueError(f"--sample-topk must be at least 0 (0: the whole vocabulary), not {topk}")
    if not temperature > 0:
        raise ValueError(f"--temperature must be above 0, not {temperature}")


def draw(log_probs, topk, temperature, rng):
    """One token per row of log_probs (R, V): drawn from the row's `topk` best (0: all), with
    probabilities ``softmax(log_probs / temperature)`` among them; (R,) ids."""
    scaled = log_probs.astype("float64") / temperature  # (R, V)
    if 0 < topk < scaled.shape[1]:
        ids = onp.sort(onp.argpartition(-scaled, topk - 1, axis=1)[:, :topk], axis=1)  # (R, k)
    else:
        ids = onp.tile(onp.arange(scaled.shape[1]), (len(scaled), 1))  # (R, V)
    values = onp.take_along_axis(scaled, ids, axis=1)  # (R, k)
    p = onp.exp(values - values.max(axis=1, keepdims=True))
    cdf = onp.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)  # (R, k)
    u = rng.random((len(cdf), 1))  # (R, 1)
    picked = onp.minimum((cdf < u).sum(axis=1), ids.shape[1] - 1)  # (R,): a position in the k
    return ids[onp.arange(len(ids)), picked]


def sample(translator, sentences, topk, temperature=1.0, seed=None):
    """One sampled `Hypothesis` per token list, by the `Translator`'s model; `seed`: NumPy's
    (None: fresh entropy)."""
    check_sampling(topk, temperature)
    sentences = [list(s) for s in sentences]
    check_lengths(sentences, translator.max_source)
    rng = onp.random.default_rng(seed)
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out = [None] * len(sentences)
    with translator.ctx:
        for start in range(0, len(order), translator.batch_size):
            part = order[start:start + translator.batch_size]
            for i, hyp in zip(part, _sample_batch(translator, [sentences[i] for i in part], topk,
                                                  temperature, rng)):
                out[i] = hyp
    return out


def _sample_batch(translator, sentences, topk, temperature, rng):
    """The sampled `Hypothesis` of each sentence of one batch."""
    limits = onp.array([translator._limit(len(s)) for s in sentences])  # (B,)
    rows = translator._rows(sentences, 1, int(limits.max()))  # a row per sentence
    B = len(sentences)
    tokens, parents = onp.full(B, translator.bos), onp.arange(B)  # (B,) each
    alive, log_p = onp.ones(B, bool), onp.zeros(B)  # (B,) each
    ids = [[] for _ in range(B)]
    for t in range(1, int(limits.max()) + 1):
        log_probs = _log_softmax(rows.step(tokens, parents, t))  # (B, V)
        log_probs += translator._bias  # (B, V) + (1, V): the banned tokens at -1e18
        tokens = draw(log_probs, topk, temperature, rng)  # (B,)
        log_p += onp.where(alive, log_probs[onp.arange(B), tokens], 0)
        for b in onp.flatnonzero(alive):
            ids[b].append(int(tokens[b]))
        alive &= (tokens != translator.eos) & (limits > t)
        if not alive.any():
            break
    out = []
    for b in range(B):
        size = len(ids[b])  # |Y|: with <eos>, when it came
        if ids[b] and ids[b][-1] == translator.eos:
            ids[b].pop()
        out.append(Hypothesis(translator.tgt_vocab.to_tokens(ids[b]),
                              float(log_p[b] / length_penalty(size, ALPHA)), float(log_p[b])))
    return out
