"""Translating with a trained model: greedy and beam search over one key/value-cache step graph,
and the attention weights of a translation (the corrected model of d2l 9.3).

**The source** (`Translator.encode_source`, the only encoding of a source anywhere): tokens ->
ids (unknown words -> ``<unk>``; no ``<eos>`` is appended, the chapter's sources have none),
each sentence padded with ``<pad>`` to max(`num_steps`, the batch's longest) and never
truncated; its valid length is its number of tokens. The encoder masks the padding, so a
sentence's translation does not depend on the other sentences of its batch (its tokens; its
score to float rounding, since a matrix product's blocking depends on its number of rows).

**The search** is the beam search of gluonnlp 0.10's ``BeamSearchSampler`` with GNMT's score
(Wu et al. 2016; the Transformer paper, 6.1, uses beam 4 and alpha 0.6): a hypothesis Y scores
``log P(Y | x) / lp(|Y|)``, ``lp = ((5 + |Y|) / 6) ** alpha``, |Y| counting ``<eos>``. At every
step each live beam proposes its `beam_size` best next tokens, which compete with the finished
beams for the sentence's `beam_size` places. Beams are batch rows: one step graph
(`model.DecoderStep` with a key/value cache, static shapes) runs on (sentences x beams) rows;
the self-attention caches follow their beams (``take`` at the start of the next step); the
encoder's keys and values (`model.EncoderKV`) are projected once per sentence. Greedy decoding
(beam size 1) runs the same step graph and the same score, pipelined (`Translator._greedy`), and
equals this search with one beam token for token and score for score (tested). A sentence
emits at most `max_length` tokens (an unfinished hypothesis is scored without ``<eos>``). A
sentence has finished when all its beams have, or once its n best have and no live beam can
still beat them (`_settled`: the same n best hypotheses, sooner); a batch stops when all its
sentences have finished, and once half of them have, these leave the batch, so that the
remaining steps run on the live rows only (as CTranslate2 does; `Translator._compact`).

**Special tokens** never appear in a translation: ``<pad>`` and ``<bos>`` (and ``<unk>`` with
``no_unk=True``, as CTranslate2's ``disable_unk``) get a score of -1e18 added to their
log-probability before the search picks its tokens, in greedy and beam search alike (one (1, V)
bias row; the picked tokens' log-probabilities are unchanged, so beam 1 still equals greedy).
An under-trained model emits them otherwise. ``suppress=False`` masks nothing: the chapter's
argmax over the whole vocabulary (`predict_s2s_ch8`).

On a CPU with the fused kernels, beam search ranks each row's best tokens and keeps the books
on the device too (`_BeamUpdateStep`: ``d2t_row_topk``, from the logits with their
log-softmax, and ``d2t_beam_update``, the arithmetic of `_beam_update`), pipelined as greedy
decoding is (`Translator._device_search`). Elsewhere the
host loop reads the step's log-probabilities once per step and NumPy picks each row's best
tokens (MXNet's CPU ``topk`` reduces each row in one thread and took ~5x longer than the copy
and NumPy's ``argmax`` together); the bookkeeping of the beams is a few NumPy operations on
(sentences, beams, beams) arrays. Greedy decoding picks each row's token on the device
(``d2t_row_topk`` with k = 1; MXNet's ``argmax`` without the kernels), because then the next
step can start before the host reads anything.
"""

import collections
import functools
import warnings
import weakref

import mxnet as mx
import numpy as onp
from mxnet import np
from mxnet.gluon import nn

from .. import _graphs, kernels
from ..data import truncate_pad
from ..model import DecoderStep, EncoderKV
from .limits import SentenceError, check_length

BEAM_SIZE, ALPHA = 4, 0.6  # the paper's (6.1)
NEG = onp.float32(-1e18)  # the score of an impossible candidate (gluonnlp's LARGE_NEGATIVE_FLOAT)
EXTRA_LENGTH = 10  # max_length=None: a sentence may emit max(num_steps, its length + 10) tokens
Hypothesis = collections.namedtuple("Hypothesis", ["tokens", "score"])
Hypothesis.__doc__ = "A translation: target tokens (no <bos>/<eos>) and its length-penalised score."


def length_penalty(length, alpha=ALPHA):
    """``((5 + |Y|) / 6) ** alpha`` (GNMT), the divisor of a hypothesis' log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


def _hybridize_alone(graph, static=True):
    """Hybridize `graph` only. MXNet's ``hybridize`` recurses into the children, which would
    leave the user's own model hybridized; the graph is traced through them all the same."""
    children = graph._children
    graph._children = collections.OrderedDict()
    try:
        graph.hybridize(static_alloc=static, static_shape=static)
    finally:
        graph._children = children
    return graph


def _run(graph, *args):
    """A cached graph's call (`_graphs.call`); the first call traces it, for inference only
    (`kernels.inference`: no dropout, nor the operators that ask whether MXNet is training),
    when the weights a graph does not use (the other side's) draw Gluon's "not used" warning:
    no news here."""
    if graph._cached_op is not None and _graphs.traced_with(graph) == kernels.active():
        return _graphs.call(graph, *args)
    with warnings.catch_warnings(), kernels.inference():
        warnings.filterwarnings("ignore", "Parameter .* is not used", UserWarning)
        return _graphs.call(graph, *args)


_GRAPHS = weakref.WeakKeyDictionary()  # model -> {key: its graph}, built once


def _graph(model, key, build, static=True):
    graphs = _GRAPHS.setdefault(model, {})
    if key not in graphs:
        graphs[key] = _graphs.track(_hybridize_alone(build(), static))
    return graphs[key]


class _BeamStep(nn.HybridBlock):
    """`DecoderStep` with the self-attention caches first reordered to follow their beams:
    ``(control (B*k, 2), position, enc_valid_length, bias (1, V), *caches) -> (top, *self_caches)``;
    control holds each row's token and the row of the old caches it continues (one upload).
    With the fused kernels (a CPU), the caches are taken and shifted in one copy and `top` is
    each row's `k` best entries of ``log_probs + bias``, (B*k, 2k): values, then ids as floats
    (`kernels.row_topk`, from the logits with their log-softmax), so that the host reads
    (B*k, 2k) numbers, not (B*k, V); otherwise `top` is ``log_probs + bias`` (B*k, V) and the
    host ranks it (`_row_top_k`, the same result)."""

    def __init__(self, decoder, k, **kwargs):
        super().__init__(**kwargs)
        self.step = DecoderStep(decoder, reorder=True, log_softmax=False)
        self.k = k

    def hybrid_forward(self, F, control, position, enc_valid_length, bias, *caches):
        tokens = control[:, 0:1]  # (B*k, 1)
        rows = control[:, 1]  # (B*k,)
        logits, *new_caches = self.step(tokens, position, enc_valid_length, rows, *caches)
        if F is mx.sym and kernels.active():  # (B*k, 2k)
            return (kernels.row_topk(F, logits, bias, self.k, log_softmax=True), *new_caches)
        return (F.npx.log_softmax(logits) + bias, *new_caches)  # (B*k, V) + (1, V)


class _BeamUpdateStep(nn.HybridBlock):
    """`_BeamStep` with the beams' bookkeeping on the device too (fused CPU kernels only):
    ``(state (B, k, 6), position, enc_valid_length, bias (1, V), info (3,), limits (B,),
    *caches) -> (state, *self_caches)``. state holds per beam its score, alive, word, parent,
    next token and cache row (`kernels.beam_update`, the arithmetic of `_beam_update`); info
    t, lp(t - 1), lp(t). Each step's state feeds the next step directly, so the host reads it
    while the device runs the next step (`Translator._search`), as greedy decoding does."""

    def __init__(self, decoder, k, eos, **kwargs):
        super().__init__(**kwargs)
        self.step = DecoderStep(decoder, reorder=True, log_softmax=False)
        self.k, self.eos = k, eos

    def hybrid_forward(self, F, state, position, enc_valid_length, bias, info, limits, *caches):
        tokens = F.npx.reshape(state[:, :, 4:5], (-1, 1))  # (B, k, 1) -> (B*k, 1)
        rows = F.npx.reshape(state[:, :, 5], (-1,))  # (B, k) -> (B*k,)
        logits, *new_caches = self.step(tokens, position, enc_valid_length, rows, *caches)
        top = kernels.row_topk(F, logits, bias, self.k, log_softmax=True)  # (B*k, 2k)
        return (kernels.beam_update(F, top, state, info, limits, self.k, self.eos), *new_caches)


class _FirstBeamStep(nn.HybridBlock):
    """`_BeamUpdateStep`'s first step on one row per sentence: at step 1 a sentence's k beams
    are all ``<bos>`` on the same caches, so one row computes what k would. ``(state (B, k,
    6), position, enc_valid_length (B,), bias, info, limits, *caches (B rows)) -> (state,
    *self_caches (B rows))``; each row's top entries are repeated to its sentence's k rows
    (tiny) for `kernels.beam_update`, whose cache rows (b * k + parent) then index the caches
    once `Translator._beams` has given them k rows each."""

    def __init__(self, decoder, k, eos, **kwargs):
        super().__init__(**kwargs)
        self.step = DecoderStep(decoder, log_softmax=False)
        self.k, self.eos = k, eos

    def hybrid_forward(self, F, state, position, enc_valid_length, bias, info, limits, *caches):
        tokens = state[:, 0, 4:5]  # (B, 1): <bos>
        logits, *new_caches = self.step(tokens, position, enc_valid_length, *caches)
        top = kernels.row_topk(F, logits, bias, self.k, log_softmax=True)  # (B, 2k)
        top = F.np.repeat(top, self.k, axis=0)  # (B, 2k) -> (B*k, 2k)
        return (kernels.beam_update(F, top, state, info, limits, self.k, self.eos), *new_caches)


class _GreedyStep(nn.HybridBlock):
    """`DecoderStep` that also picks each row's best next token on the device:
    ``(tokens (B, 1), position, enc_valid_length, bias (1, V), *caches) -> (next (B, 1),
    log_prob (B,), *self_caches)``; `next` is the argmax of the step's log-probabilities plus
    `bias` (-1e18 on the tokens never to emit) and feeds the next step directly, so the host
    reads two small arrays after the device has already moved on (`Translator._greedy`).
    With the fused kernels (a CPU) the pick and its log-probability come from the logits in
    one operator (`kernels.row_topk` with k = 1), the same numbers to float32 rounding."""

    def __init__(self, decoder, **kwargs):
        super().__init__(**kwargs)
        self.step = DecoderStep(decoder, log_softmax=False)

    def hybrid_forward(self, F, tokens, position, enc_valid_length, bias, *caches):
        logits, *new_caches = self.step(tokens, position, enc_valid_length, *caches)
        if F is mx.sym and kernels.active():
            top = kernels.row_topk(F, logits, bias, 1, log_softmax=True)  # (B, 2): value, id
            return (top[:, 1:2], top[:, 0], *new_caches)  # (B, 1) next tokens, (B,) log-probs
        log_probs = F.npx.log_softmax(logits)  # (B, V)
        best = F.np.argmax(log_probs + bias, axis=1)  # (B, V) + (1, V) -> (B,)
        return (F.np.expand_dims(best.astype("float32"), 1),  # (B, 1): the next step's tokens
                F.npx.pick(log_probs, best, axis=1), *new_caches)  # its log-probability: (B,)


class _AttentionProbe(nn.HybridBlock):
    """One teacher-forced pass (encoder, causal graph decoder) whose outputs are the attention
    weights of every active block: encoder self, decoder self, encoder-decoder, each
    (heads, queries, keys) for a batch of one."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.encoder = model.encoder
        self.decoder = model.decoder

    def hybrid_forward(self, F, X, valid_length, Y):
        enc_outputs = self.encoder(X, valid_length)  # (1, T, d)
        self.decoder(Y, enc_outputs, valid_length)  # (1, m + 1, vocab), unused
        weights = [blk.attention.attention.attention_weights
                   for blk in self.encoder._active_blocks()]
        for name in ("attention_1", "attention_2"):
            weights += [getattr(blk, name).attention.attention_weights
                        for blk in self.decoder._active_blocks()]
        return tuple(weights)  # each (heads, queries, keys)


def _row_top_k(log_probs, k):
    """The k largest entries of each row of log_probs (R, V), best first: (values, ids), each
    (R, k). Overwrites log_probs (a copy read from the device)."""
    rows = onp.arange(log_probs.shape[0])
    values, ids = onp.empty((len(rows), k), "float32"), onp.empty((len(rows), k), "int64")
    for j in range(k):
        ids[:, j] = log_probs.argmax(axis=1)
        values[:, j] = log_probs[rows, ids[:, j]]
        log_probs[rows, ids[:, j]] = -onp.inf
    return values, ids


def _beam_update(values, ids, scores, alive, k, prev_lp, lp):
    """One step of gluonnlp's ``_BeamSearchStepUpdate``, in float32 like its scorer.

    values, ids: each row's k best log-probabilities (B*k, k), best first, and their tokens
    (`_row_top_k` or `kernels.row_topk`); scores: (B, k), length-normalised; alive: (B, k)
    bool. Returns
    ``(scores, words, parents)``, each (B, k), best first: words is -1 where a finished beam
    keeps its place, parents the beam each new beam continues. Each live beam's k best tokens
    are the only ones of it that can be among its sentence's k best candidates."""
    B = scores.shape[0]
    cand = (values.reshape(B, k, k) + (scores * prev_lp)[:, :, None]) / lp  # GNMT, (B, k, k)
    cand = onp.where(alive[:, :, None], cand, NEG)
    finished = onp.where(alive, NEG, scores)  # a finished beam competes with its score
    allc = onp.concatenate([cand.reshape(B, k * k), finished], axis=1)  # (B, k*k + k)
    pos = onp.argsort(-allc, axis=1, kind="stable")[:, :k]  # (B, k), best first
    new_scores = onp.take_along_axis(allc, pos, axis=1)
    kept = pos >= k * k
    parents = onp.where(kept, pos - k * k, pos // k)
    words = onp.where(kept, -1, onp.take_along_axis(ids.reshape(B, k * k),
                                                    onp.where(kept, 0, pos), axis=1))
    return new_scores, words, parents


def _greedy_update(ids, values, scores, alive, prev_lp, lp):
    """`_beam_update` for one beam, the same float32 arithmetic without the sorting: a live
    sentence takes its best token, a finished one keeps its score. ids, values: each row's best
    token and its log-probability (B, 1), picked on the device (`_GreedyStep`); scores, alive:
    (B, 1). Returns ``(scores, words)``, words -1 where a sentence had finished (no parents:
    one beam)."""
    cand = (values + scores * prev_lp) / lp  # GNMT, (B, 1)
    return onp.where(alive, cand, scores), onp.where(alive, ids, -1)


def _settled(scores, alive, t, limits, alpha, n):
    """Which sentences' n best hypotheses no later step can change (beam search's exact early
    stop, per sentence): their n best beams have finished and the n-th scores above the best
    any live beam can still reach. After step t a live beam's log-probability is
    ``score * lp(t)``, only falls, and is divided by at most ``lp(limit)`` (GNMT's `lp` grows
    with the length; it is 1 at alpha 0, where this is CTranslate2's stop at a finished best
    beam). scores, alive: (B, k), best first; limits: (B,). A 1e-4 margin covers float32
    rounding; a tie keeps the search running, as a tie could reorder the beams."""
    lp_t = length_penalty(t, alpha)
    bound = onp.where(alive, scores.astype("float64") * lp_t
                      / length_penalty(limits.astype("float64"), alpha)[:, None], -onp.inf)
    best_live = bound.max(axis=1)  # (B,): -inf where no beam lives
    margin = 1e-4 * (1 + onp.abs(onp.where(onp.isfinite(best_live), best_live, 0)))
    return ~alive[:, :n].any(axis=1) & (scores[:, n - 1] > best_live + margin)


class Translator:
    """Batched greedy and beam-search translation of token lists, and attention weights.

    ``Translator(model, src_vocab, tgt_vocab, ctx, *, num_steps=10, max_length=None,
    batch_size=64, no_unk=False, suppress=True, pad_to_num_steps=True)``: `num_steps` is the
    narrowest source encoding (the chapter pads to it; ``pad_to_num_steps=False``: each batch
    is padded to its longest source only, as CTranslate2 does — the encoder masks the padding,
    so the same tokens, the scores to float rounding, and less work when `num_steps` is far
    above the sentences' lengths);
    `max_length` the most tokens a translation may have (None: max(num_steps, source length
    + 10) per sentence); `batch_size` sentences are decoded together; ``<pad>`` and ``<bos>``
    are never emitted, nor ``<unk>`` with `no_unk` (`suppress=False`: nothing is masked, the
    chapter's argmax). The graphs (source side,
    decoding step, attention pass) are built once per model and device type and hybridized
    alone (the model's own blocks are left as they are); on a CPU they are traced with the
    fused kernels (`kernels.fused`). Corrected model only: a model built with
    ``exact_chapter=True`` decodes with the chapter's `predict_s2s_ch8`. One call at a time per
    model: the graphs are shared, and MXNet 1.9 does not run a cached graph from two threads.
    """

    def __init__(self, model, src_vocab, tgt_vocab, ctx, *, num_steps=10, max_length=None,
                 batch_size=64, no_unk=False, suppress=True, pad_to_num_steps=True):
        if getattr(model.decoder, "exact_chapter", False):
            raise ValueError("the translator needs the corrected model; a model built with "
                             "exact_chapter=True decodes with predict_s2s_ch8 (the chapter's loop)")
        if batch_size < 1 or num_steps < 1 or (max_length is not None and max_length < 1):
            raise ValueError("batch_size, num_steps and max_length must be at least 1")
        self.model, self.src_vocab, self.tgt_vocab, self.ctx = model, src_vocab, tgt_vocab, ctx
        self.num_steps, self.max_length, self.batch_size = num_steps, max_length, batch_size
        self.min_width = num_steps if pad_to_num_steps else 1  # the narrowest source encoding
        self.max_source = model.encoder.pos_encoding.max_len
        self.max_target = model.decoder.pos_encoding.max_len
        if max_length is not None and max_length > self.max_target:
            raise ValueError(f"max_length {max_length} is longer than the model's "
                             f"{self.max_target} positions")
        self.pad, self.bos, self.eos = src_vocab["<pad>"], tgt_vocab["<bos>"], tgt_vocab["<eos>"]
        if no_unk and not suppress:
            raise ValueError("no_unk masks <unk>: it needs suppress=True")
        special = ("<pad>", "<bos>") + (("<unk>",) if no_unk else ()) if suppress else ()
        self.banned = sorted({tgt_vocab[t] for t in special})  # target ids never emitted
        bias = onp.zeros((1, model.decoder.dense._units), "float32")  # (1, V)
        bias[0, self.banned] = NEG
        self._bias_host, self._bias = bias, np.array(bias, ctx=ctx)
        self._shapes_known = False  # `_initialized` has run

    # ------------------------------------------------------------------------------ the source
    def encode_source(self, sentences):
        """Token lists -> ``(X (batch, width), valid_length (batch,))`` on the device: ids
        padded to width = max(num_steps, longest) (``pad_to_num_steps=False``: the longest),
        never truncated. An empty sentence, or one
        longer than the model's positions, raises SentenceError (`limits.check_length`)."""
        self._check(sentences)
        ids = [self.src_vocab[list(tokens)] for tokens in sentences]
        width = max([self.min_width] + [len(t) for t in ids])
        X = np.array([truncate_pad(t, width, self.pad) for t in ids], ctx=self.ctx)  # (batch, width)
        return X, np.array([len(t) for t in ids], ctx=self.ctx)  # valid lengths: (batch,)

    def _check(self, sentences):
        """`limits.check_length` (the rule the CLI and the server apply too) on each sentence."""
        for i, tokens in enumerate(sentences):
            try:
                check_length(tokens, self.max_source, max_tokens=None)
            except SentenceError as e:
                raise SentenceError(f"sentence {i}: {e}", e.too_large) from None

    def _limit(self, source_length):
        if self.max_length is not None:
            return self.max_length
        return min(max(self.num_steps, source_length + EXTRA_LENGTH), self.max_target)

    # ------------------------------------------------------------------------------ translating
    def translate(self, sentences, beam_size=1, alpha=ALPHA, *, early_stop=True, n_best=None):
        """The best hypothesis of each token list: ``[Hypothesis(tokens, score), ...]``.

        ``beam_size=1`` is greedy decoding. ``early_stop=False`` always runs every step up to
        the longest limit (benchmarks; the results are the same). ``n_best=n`` (at most
        `beam_size`): a list of each sentence's n best finished beams instead, best first (the
        first is the hypothesis returned without it; beams the search could not fill are left
        out)."""
        if beam_size < 1:
            raise ValueError(f"beam size must be at least 1, not {beam_size}")
        if n_best is not None and not 1 <= n_best <= beam_size:
            raise ValueError(f"n_best must be 1 to the beam size {beam_size}, not {n_best}")
        vocab = self.model.decoder.dense._units
        if beam_size > vocab:
            raise ValueError(f"beam size {beam_size} is larger than the vocabulary ({vocab})")
        sentences = [list(s) for s in sentences]
        self._check(sentences)  # numbered as given, before the batches are sorted
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # less padding
        out = [None] * len(sentences)
        dec = self.model.decoder  # OpenMP threads for the output layer's size (`_threads`)
        kernels.use_threads(min(self.batch_size, len(order)) * beam_size * dec.embedding_size
                            * vocab)
        with self.ctx, kernels.fused(self.ctx):
            for start in range(0, len(order), self.batch_size):
                part = order[start:start + self.batch_size]
                batch = [sentences[i] for i in part]
                hyps = (self._greedy(batch, alpha, early_stop) if beam_size == 1
                        else self._search(batch, beam_size, alpha, early_stop, n_best or 1))
                if n_best is None:
                    hyps = [h[0] for h in hyps]
                for i, hyp in zip(part, hyps):
                    out[i] = hyp
        return out

    def _initialized(self):
        """Finish a deferred initialisation (weights whose shapes the first call decides) with
        one imperative call on a dummy sentence, as training does; the graphs need the shapes.
        Checked once per translator (collecting the model's parameters takes ~5 ms, a tenth
        of a batch's greedy decoding): initialised weights never lose their shapes."""
        if self._shapes_known:
            return
        if any(p._data is None for p in self.model.collect_params().values()):
            X = np.ones((1, 2), ctx=self.ctx)  # (batch, seq_len)
            self.model(X, X, np.array([2], ctx=self.ctx))
        self._shapes_known = True

    def _start(self, sentences, k):
        """The encoder's keys/values and the empty caches of a batch, `k` rows per sentence:
        ``(caches, valid_length (B*k,), limits (B,), steps)``."""
        self._initialized()
        encode = _graph(self.model, ("encoder", self.ctx.device_type),
                        lambda: EncoderKV(self.model))
        B = len(sentences)
        X, valid_length = self.encode_source(sentences)
        enc_kv = list(_run(encode, X, valid_length))  # 2 per block: (B, T, hidden)
        limits = onp.array([self._limit(len(s)) for s in sentences])  # (B,)
        steps = int(limits.max())
        empty = np.zeros((B, steps, enc_kv[0].shape[-1]), ctx=self.ctx)  # (B, steps, hidden)
        caches = []
        for i in range(0, len(enc_kv), 2):
            caches += [empty, empty, enc_kv[i], enc_kv[i + 1]]
        if k > 1:  # a row per beam
            valid_length = self._beams(k, caches, valid_length)
        return caches, valid_length, limits, steps

    def _beams(self, k, caches, valid_length):
        """A batch's caches (in place in the list `caches`) and valid lengths, one row per
        sentence, given k rows per sentence: rows b * k ... b * k + k - 1 are sentence b's
        beams. Returns the valid lengths (B * k,). (A `take` of rows: MXNet's CPU `repeat` is far
        slower for the same copy.)"""
        B = valid_length.shape[0]
        rows = np.array(onp.arange(B * k) // k, dtype="int32", ctx=self.ctx)  # (B * k,)
        for i, cache in enumerate(caches):
            caches[i] = np.take(cache, rows, axis=0)  # (B * k, steps or T, hidden)
        return np.take(valid_length, rows, axis=0)

    def _search(self, sentences, k, alpha, early_stop, n=1, *, books_on_device=True):
        """Beam search (`translate` runs k = 1 as `_greedy`, which equals this with k = 1).
        With the fused kernels the device keeps the books too (`_device_search`), unless
        `books_on_device` is False (tests: the host loop on the same step's numbers)."""
        if kernels.active() and books_on_device:
            return self._device_search(sentences, k, alpha, early_stop, n)
        model = self.model
        step = _graph(model, ("beam step", k, self.ctx.device_type),
                      lambda: _BeamStep(model.decoder, k))
        caches, valid_length, limits, steps = self._start(sentences, k)
        B, ctx = len(sentences), self.ctx
        scores = onp.full((B, k), NEG, dtype="float32")
        scores[:, 0] = 0  # one live beam to start from: the others would only repeat it
        alive = onp.ones((B, k), dtype=bool)
        shift = onp.arange(0, B * k, k)[:, None]  # (B, 1): each sentence's first row
        control = onp.stack([onp.full(B * k, self.bos), onp.arange(B * k)], axis=1)  # token, row
        control = np.array(control, ctx=ctx)  # (B * k, 2)
        positions = self._positions(steps)
        words, parents = [], []
        run = functools.partial(_run, step)  # the first step traces (or checks) the graph
        for t in range(1, steps + 1):
            top, *self_kv = run(control, positions[t - 1], valid_length, self._bias, *caches)
            if t == 1:  # then its operator runs with the weights looked up once (`_graphs.bound`)
                run = _graphs.bound(step)
            caches[0::4], caches[1::4] = self_kv[0::2], self_kv[1::2]
            prev_lp, lp = self._penalties(t, alpha)
            top = top.asnumpy()  # the banned tokens at -1e18
            if kernels.active():  # ranked on the device (the graph was traced so): (B*k, 2k)
                values, ids = top[:, :k], top[:, k:].astype("int64")
            else:  # (B*k, V)
                values, ids = _row_top_k(top, k)
            scores, word, parent = _beam_update(values, ids, scores, alive, k, prev_lp, lp)
            alive = onp.take_along_axis(alive, parent, axis=1) & (word != self.eos) \
                & (limits[:, None] > t)  # finished, or at the sentence's length limit
            words.append(word)
            parents.append(parent)
            if early_stop and (~alive.any(axis=1) | _settled(scores, alive, t, limits, alpha,
                                                             n)).all():
                break
            tokens = onp.maximum(word, 0).reshape(-1, 1)  # (B * k, 1); finished beams: any
            tokens = onp.concatenate([tokens, (parent + shift).reshape(-1, 1)], axis=1)  # + row
            control = np.array(tokens, ctx=ctx)  # the step's one upload
        return self._hypotheses(onp.stack(words), onp.stack(parents), scores, n)

    def _device_search(self, sentences, k, alpha, early_stop, n=1, *, compact=True):
        """`_search` with the ranking and the bookkeeping in the step graph (`_BeamUpdateStep`),
        the same hypotheses and scores bit for bit (tested), pipelined as `_greedy`: the host
        reads step t's (B, k, 6) state while the device runs step t + 1; when all sentences
        have finished (or settled, `_settled`), the one step already started is dropped.

        ``compact`` (CTranslate2 does the same): the batch runs on the rows it needs. Step 1
        runs on one row per sentence (`_FirstBeamStep`: its k beams are then identical), and
        once half the batch's sentences have
        finished, their rows leave the batch (`_compact`), so that the steps left run on the
        live sentences only. A finished sentence's step is the identity (its beams keep their
        places and scores, word -1), so its books are filled in as such on the host. The
        sentences left get the same tokens; their scores may differ in the last float bits, as
        they do in a batch of another size (the matrix products' blocking depends on the
        number of rows): tested to 1e-5, like the batch-independence of a translation."""
        model = self.model
        step = _graph(model, ("beam update step", k, self.eos, self.ctx.device_type),
                      lambda: _BeamUpdateStep(model.decoder, k, self.eos))
        first = None if not compact else _graph(  # step 1 on one row per sentence
            model, ("first beam step", k, self.eos, self.ctx.device_type),
            lambda: _FirstBeamStep(model.decoder, k, self.eos))
        caches, valid_length, limits, steps = self._start(sentences, 1 if first else k)
        B, ctx = len(sentences), self.ctx
        state = onp.zeros((B, k, 6), "float32")  # score, alive, word, parent, token, row
        state[:, :, 0], state[:, 0, 0] = NEG, 0  # one live beam to start from
        state[:, :, 1], state[:, :, 4] = 1, self.bos
        state[:, :, 5] = onp.arange(B * k).reshape(B, k)
        state = np.array(state, ctx=ctx)
        limits_dev = np.array(limits.astype("float32"), ctx=ctx)  # (B,)
        infos = [np.array([t, *self._penalties(t, alpha)], dtype="float32", ctx=ctx)
                 for t in range(1, steps + 1)]  # (3,) each: t, lp(t - 1), lp(t)
        positions = self._positions(steps)
        words, parents = [], []
        scores = onp.full((B, k), NEG, "float32")  # each sentence's, kept when it leaves
        live = onp.arange(B)  # the sentences in the device's rows, in order
        run, done, traced = functools.partial(_run, step), None, False
        for t in range(1, steps + 2):
            if t <= steps:  # step t starts on the device ...
                once = t == 1 and first is not None
                state, *self_kv = (functools.partial(_run, first) if once else run)(
                    state, positions[t - 1], valid_length, self._bias, infos[t - 1],
                    limits_dev, *caches)
                caches[0::4], caches[1::4] = self_kv[0::2], self_kv[1::2]
                if once:  # each sentence's caches (and valid length) to its k beams' rows
                    valid_length = self._beams(k, caches, valid_length)
                elif not traced:  # then its operator runs with the weights looked up once
                    run, traced = _graphs.bound(step), True
            if done is not None:  # ... while the host reads step t - 1's books
                books, rows = done[0].asnumpy(), done[1]  # (len(rows), k, 6)
                word = onp.full((B, k), -1, "int64")  # a finished sentence's step: identity
                parent = onp.tile(onp.arange(k), (B, 1))  # (B, k)
                word[rows], parent[rows] = books[:, :, 2], books[:, :, 3]
                scores[rows] = books[:, :, 0]
                words.append(word)
                parents.append(parent)
                beams = books[:, :, 1] > 0  # (len(rows), k): alive
                alive = beams.any(axis=1)  # (len(rows),) per sentence
                if early_stop:  # settled: as good as finished
                    alive &= ~_settled(books[:, :, 0], beams, t - 1, limits[rows], alpha, n)
                if (early_stop and not alive.any()) or t > steps:
                    break
                if compact and t < steps and 0 < 2 * alive.sum() <= len(rows):
                    keep = onp.flatnonzero(alive)  # finished after step t - 1: after t too
                    state, valid_length, limits_dev = self._compact(
                        keep, k, state, valid_length, limits_dev, caches)
                    live = live[keep]
            done = state, live
        return self._hypotheses(onp.stack(words), onp.stack(parents), scores, n)

    def _compact(self, keep, k, state, valid_length, limits, caches):
        """The device's batch cut to the sentences `keep` (positions in it, ascending): their
        `state` (beam search's, its cache rows renumbered; greedy's next tokens (B, 1) when
        k = 1), valid lengths, `limits` (None: kept on the host) and caches (in place in the
        list `caches`). Returns ``(state, valid_length, limits)``."""
        ctx = self.ctx
        sentences = np.array(keep, dtype="int32", ctx=ctx)  # (B',)
        rows = np.array((keep[:, None] * k + onp.arange(k)).reshape(-1), dtype="int32",
                        ctx=ctx)  # (B' * k,): each kept sentence's k beam rows
        state = np.take(state, sentences, axis=0)  # (B', k, 6) or (B', 1)
        if state.ndim == 3:  # beam search's: the cache row = its sentence's new first row +
            # its parent
            first = np.arange(len(keep), dtype="float32", ctx=ctx).reshape(-1, 1, 1) * k
            state = np.concatenate([state[:, :, :5], first + state[:, :, 3:4]], axis=2)
        for i, cache in enumerate(caches):  # self keys/values, encoder keys/values
            caches[i] = np.take(cache, rows, axis=0)  # (B' * k, L or T, hidden)
        return (state, np.take(valid_length, rows, axis=0),
                None if limits is None else np.take(limits, sentences, axis=0))

    def _greedy(self, sentences, alpha, early_stop, *, compact=True):
        """`_search` with one beam, token for token and score for score (tested), pipelined:
        the device picks each step's tokens (`_GreedyStep`) and runs the next step while the
        host reads this one's two small outputs and keeps the books (`_greedy_update`), so
        the host's work (~1 ms a step at batch 64) overlaps the device's. A sentence that has
        finished keeps being fed its argmax, which nothing reads, until half the batch has
        finished: then the finished sentences leave the batch (``compact``, as in
        `_device_search`). When all have finished, the one step already started is dropped."""
        model = self.model
        step = _graph(model, ("greedy step", self.ctx.device_type),
                      lambda: _GreedyStep(model.decoder))
        caches, valid_length, limits, steps = self._start(sentences, 1)
        B = len(sentences)
        scores, alive = onp.zeros((B, 1), dtype="float32"), onp.ones((B, 1), dtype=bool)
        tokens = np.full((B, 1), self.bos, ctx=self.ctx)  # (B, 1)
        positions = self._positions(steps)
        live = onp.arange(B)  # the sentences in the device's rows, in order
        words, run, done = [], functools.partial(_run, step), None
        for t in range(1, steps + 2):
            if t <= steps:  # step t starts on the device ...
                tokens, best, *self_kv = run(tokens, positions[t - 1], valid_length, self._bias,
                                             *caches)
                if t == 1:
                    run = _graphs.bound(step)
                caches[0::4], caches[1::4] = self_kv[0::2], self_kv[1::2]
            if done is not None:  # ... while the host reads step t - 1's picks
                ids, values, rows = done
                prev_lp, lp = self._penalties(t - 1, alpha)
                word = onp.full((B, 1), -1, "int64")  # a finished sentence's: -1
                scores[rows], word[rows] = _greedy_update(
                    ids.asnumpy().astype("int64"), values.asnumpy()[:, None], scores[rows],
                    alive[rows], prev_lp, lp)  # (len(rows), 1) each
                alive &= (word != self.eos) & (limits[:, None] > t - 1)
                words.append(word)
                if (early_stop and not alive.any()) or t > steps:
                    break
                if compact and t < steps and 0 < 2 * alive[rows].sum() <= len(rows):
                    keep = onp.flatnonzero(alive[rows, 0])
                    tokens, valid_length, _ = self._compact(keep, 1, tokens, valid_length, None,
                                                            caches)
                    best = np.take(best, np.array(keep, dtype="int32", ctx=self.ctx))  # (B',)
                    live = live[keep]
            done = tokens, best, live
        words = onp.stack(words)  # (steps run, B, 1)
        return self._hypotheses(words, onp.zeros_like(words), scores)

    def _positions(self, steps):
        """``[array([0]), ..., array([steps - 1])]`` on the device, uploaded once."""
        have = getattr(self, "_position_arrays", [])
        if len(have) < steps:
            have = have + [np.array([t], ctx=self.ctx) for t in range(len(have), steps)]
            self._position_arrays = have
        return have

    @staticmethod
    def _penalties(t, alpha):
        """``(lp(t - 1), lp(t))`` in float32 as gluonnlp's scorer computes them (lp(0) = 1)."""
        a, base = onp.float32(alpha), onp.float32(6.0 ** alpha)
        lp = onp.float32(5 + t) ** a / base
        return (onp.float32(5 + t - 1) ** a / base if t > 1 else onp.float32(1)), lp

    def _hypotheses(self, words, parents, scores, n=1):
        """Follow each sentence's `n` best beams back from the last step: words, parents
        (steps, B, k); scores (B, k), best first. A list of hypotheses per sentence (beams
        scored `NEG`, never filled, left out after the first)."""
        out = []
        for b in range(words.shape[1]):
            best = []
            for beam in range(n):
                if beam and scores[b, beam] <= NEG / 2:
                    break
                j, ids = beam, []
                for t in range(words.shape[0] - 1, -1, -1):
                    if words[t, b, j] >= 0:
                        ids.append(int(words[t, b, j]))
                    j = int(parents[t, b, j])
                ids.reverse()
                if ids and ids[-1] == self.eos:
                    ids.pop()
                best.append(Hypothesis(self.tgt_vocab.to_tokens(ids), float(scores[b, beam])))
            out.append(best)
        return out

    # ------------------------------------------------------------------------------ attention
    def attention(self, src_tokens, tgt_tokens):
        """Every layer's and head's attention weights for a source and its translation, from one
        teacher-forced pass over ``<bos> y_1 ... y_m`` (the same source encoding as `translate`).

        Returns the ATTENTION JSON: ``src_tokens`` (as given, one per encoder position),
        ``tgt_tokens`` (the decoder's inputs ``<bos> y_1 ... y_m``), ``out_tokens`` (what each
        decoder position predicts, ``y_1 ... y_m <eos>``), and ``encoder`` (layers x heads x
        src x src), ``decoder`` (layers x heads x tgt x tgt, causal), ``cross`` (layers x heads
        x tgt x src); weights rounded to 4 decimals, every row sums to 1."""
        src_tokens, tgt_tokens = list(src_tokens), list(tgt_tokens)
        X, valid_length = self.encode_source([src_tokens])
        if len(tgt_tokens) + 1 > self.max_target:
            raise ValueError(f"a translation of {len(tgt_tokens)} tokens is longer than the "
                             f"model's {self.max_target} positions")
        Y = np.array([[self.bos] + self.tgt_vocab[tgt_tokens]], ctx=self.ctx)  # (1, m + 1)
        self._initialized()
        probe = _graph(self.model, ("attention", self.ctx.device_type),
                       lambda: _AttentionProbe(self.model), static=False)
        with self.ctx:
            weights = [w.asnumpy() for w in _run(probe, X, valid_length, Y)]
        n, m1 = len(src_tokens), len(tgt_tokens) + 1
        layers = len(self.model.encoder._active_blocks())
        dec_layers = len(self.model.decoder._active_blocks())

        def cut(ws, rows, cols):  # (heads, queries, keys) each -> nested lists, 4 decimals
            return [onp.round(w[:, :rows, :cols].astype("float64"), 4).tolist() for w in ws]

        return {"src_tokens": src_tokens, "tgt_tokens": ["<bos>"] + tgt_tokens,
                "out_tokens": tgt_tokens + ["<eos>"],
                "encoder": cut(weights[:layers], n, n),
                "decoder": cut(weights[layers:layers + dec_layers], m1, m1),
                "cross": cut(weights[layers + dec_layers:], m1, n)}
