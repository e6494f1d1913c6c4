"""Scoring given translations (``d2l-transformer score``; sockeye-score, fairseq's
``--score-reference``, CTranslate2's ``Translator.score_batch``): the log-probability the model
gives each target token of a pair, ``<eos>`` included, by teacher forcing.

The MXNet engine's scores come from one teacher-forced pass per batch (`step.TeacherForced`,
the arithmetic of the `Translator`'s cached step) over ``<bos> y_1 ... y_m``, its log-softmax
on the host (`translator._log_softmax`, float64 sums), the log-probability of ``y_1 ... y_m
<eos>`` gathered. Nothing is masked (CTranslate2's ``score_batch`` masks nothing either): a
target word outside the vocabulary is scored as ``<unk>``, as both engines map it.
"""

import collections

import numpy as onp
from mxnet import np

from ..data import truncate_pad
from . import step as _step
from .limits import SentenceError, check_length, check_lengths
from .translator import _log_softmax

Score = collections.namedtuple("Score", ["tokens", "log_probs"])
Score.__doc__ = ("A scored target: its tokens as the model sees them (unknown words as <unk>) "
                 "then <eos>, and the log-probability of each (floats).")


def check_pairs(sources, targets, max_positions, max_target):
    """Refuse (SentenceError, naming the pair) a source no model can encode (`check_lengths`)
    or a target whose tokens and ``<eos>`` exceed the decoder's `max_target` positions;
    ValueError when the two lists differ in length."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    check_lengths(sources, max_positions)
    for i, target in enumerate(targets):
        if len(target) + 1 > max_target:
            raise SentenceError(f"pair {i}: a target of {len(target)} tokens; at most "
                                f"{max_target - 1} (the model's positions)", too_large=True)


def total(score):
    """``(log P of the whole target, per token)``: the sum, and the mean over its tokens."""
    s = float(sum(score.log_probs))
    return s, s / len(score.log_probs)


def score_pairs(translator, sources, targets):
    """`Score` of each (source tokens, target tokens) pair under the `Translator`'s model, in
    batches of its `batch_size` pairs of similar lengths."""
    sources, targets = [list(s) for s in sources], [list(t) for t in targets]
    check_pairs(sources, targets, translator.max_source, translator.max_target)
    order = sorted(range(len(sources)), key=lambda i: (len(targets[i]), len(sources[i])))
    graph = translator._graph("teacher", lambda: _step.TeacherForced(translator.model),
                              static=False)
    out = [None] * len(sources)
    with translator.ctx:
        for start in range(0, len(order), translator.batch_size):
            part = order[start:start + translator.batch_size]
            batch = _score_batch(translator, graph, [sources[i] for i in part],
                                 [targets[i] for i in part])
            for i, result in zip(part, batch):
                out[i] = result
    return out


def _score_batch(translator, graph, sources, targets):
    """The `Score` of each pair of one batch: one pass of `graph` (`step.TeacherForced`)."""
    vocab, ctx = translator.tgt_vocab, translator.ctx
    X, valid_length = translator.encode_source(sources)  # (rows, T), (rows,)
    gold = [vocab[t] + [translator.eos] for t in targets]  # y_1 ... y_m <eos> per row
    width = max(len(g) for g in gold)  # m + 1 of the longest
    Y = np.array([truncate_pad([translator.bos] + g[:-1], width, vocab["<pad>"]) for g in gold],
                 ctx=ctx)  # (rows, m + 1): <bos> y_1 ... y_m, padded
    causal = np.array(onp.tile(onp.arange(1, width + 1), (len(gold), 1)), ctx=ctx)  # (rows, m + 1)
    logits = _step.call(graph, X, valid_length, Y, causal).asnumpy()  # (rows, m + 1, V)
    rows, _, V = logits.shape
    log_probs = _log_softmax(logits.reshape(rows * width, V)).reshape(rows, width, V)
    return [Score(vocab.to_tokens(g), log_probs[r, onp.arange(len(g)), g].astype(float).tolist())
            for r, g in enumerate(gold)]


def score_texts(engine, sources, targets, chunk=512):
    """Each (source text, target text) pair's `Score` by `engine` (`engines`: ``score``), the
    texts tokenized by its tokenizer, `chunk` pairs at a time with a progress bar on a
    terminal (`stream.progress`). SentenceError (one line, ``line N: ...``) for a pair no
    model can score; ValueError for lists of different lengths."""
    from .stream import progress
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} references")
    tok = engine.tokenizer
    src, tgt = [tok.encode(s) for s in sources], [tok.encode_target(t) for t in targets]
    for i, (s, t) in enumerate(zip(src, tgt), 1):
        try:
            check_length(s, engine.max_positions, max_tokens=None)
            check_length(t + ["<eos>"], engine.max_positions, max_tokens=None)
        except SentenceError as e:
            raise SentenceError(f"line {i}: {e}", e.too_large, e.reason) from None
    out = []
    with progress(len(src), unit="pairs") as bar:
        for start in range(0, len(src), chunk):
            out += engine.score(src[start:start + chunk], tgt[start:start + chunk])
            bar.update(len(src[start:start + chunk]))
    return out
