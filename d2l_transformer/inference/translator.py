"""Translating with a trained model (the corrected model of d2l 9.3): one beam search over the
key/value-cache step (`step.DecoderStep`), greedy decoding being its one-beam case, and the
attention weights of a translation (`step.AttentionProbe`).

**The search** is gluonnlp 0.10's ``BeamSearchSampler`` with GNMT's score (Wu et al. 2016; the
paper's 6.1 uses beam 4, alpha 0.6): ``log P(Y | x) / ((5 + |Y|) / 6) ** alpha``, |Y| counting
``<eos>``. Each live beam proposes its `beam_size` best next tokens, which compete with the
finished beams for the sentence's `beam_size` places. Beams are rows of the step; the host
reads each step's (rows, V) logits and ranks their log-softmax with NumPy. A sentence emits at
most `max_length` tokens (an unfinished hypothesis is scored without ``<eos>``); it has
finished when all its beams have, or once its n best have and no live beam can beat them
(`_settled`); once half of a batch's sentences have finished, they leave the step's rows. The
device side (the step graph, its caches: `_Rows`) and the host's books (scores, live beams,
each step's words and parents: `_Beams`) are kept apart.

**Special tokens**: ``<pad>`` and ``<bos>`` (`limits.BANNED`), and ``<unk>`` with ``no_unk``
(CTranslate2's ``disable_unk``), get -1e18 added to their log-probability before the search
picks (an under-trained model emits them otherwise); ``suppress=False`` masks nothing, the
chapter's argmax.
"""

import collections
import weakref

import numpy as onp
from mxnet import np

from .. import _gluon, _graphs
from .._runtime import threads as _threads
from ..data import truncate_pad
from . import step as _step
from .limits import BANNED, check_lengths, check_search, decode_limit, require_corrected

BEAM_SIZE, ALPHA = 4, 0.6  # the paper's (6.1)
NEG = onp.float32(-1e18)  # the score of an impossible candidate (gluonnlp's LARGE_NEGATIVE_FLOAT)
Hypothesis = collections.namedtuple("Hypothesis", ["tokens", "score", "log_prob"],
                                    defaults=(None,))
Hypothesis.__doc__ = ("A translation: target tokens (no <bos>/<eos>), its length-penalised score "
                      "and its log-probability (the plain sum over the tokens and <eos>; None "
                      "where unknown).")


def length_penalty(length, alpha=ALPHA):
    """``((5 + |Y|) / 6) ** alpha`` (GNMT), the divisor of a hypothesis' log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


def _penalties(t, alpha):
    """``(lp(t - 1), lp(t))`` in float32 as gluonnlp's scorer computes them (lp(0) = 1)."""
    a, base = onp.float32(alpha), onp.float32(6.0 ** alpha)
    lp = onp.float32(5 + t) ** a / base
    return (onp.float32(5 + t - 1) ** a / base if t > 1 else onp.float32(1)), lp


def _log_softmax(logits):
    """The log-softmax of each row of logits (R, V), float32, its sum of exponentials in
    float64: within about a float32 rounding of the exact value, where MXNet's float32
    ``log_softmax`` is up to ~4e-6 off per token. Overwrites logits."""
    logits -= logits.max(axis=1, keepdims=True)
    logits -= onp.log(onp.exp(logits).sum(axis=1, keepdims=True, dtype="float64")).astype(
        "float32")
    return logits


def _row_top_k(log_probs, k):
    """The k largest entries of each row of log_probs (R, V), best first, ties to the lower id:
    (values, ids), each (R, k). Overwrites log_probs (a copy read from the device)."""
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
    (`_row_top_k`); scores: (B, k), length-normalised; alive: (B, k) bool. Returns
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


class _Beams:
    """The host's books of a beam search over B sentences with k beams each (gluonnlp 0.10's
    ``BeamSearchSampler`` state, in NumPy): each beam's score and whether it lives; per step,
    each beam's word and the beam it continues; the sentences still in the step's rows (live),
    sentence ``live[i]``'s beams being rows i * k ... i * k + k - 1. A sentence that has left
    the rows steps as the identity (its beams keep their places and scores, word -1)."""

    def __init__(self, limits, k, alpha, n, bos, eos):
        B = len(limits)
        self.limits, self.k, self.alpha, self.n = limits, k, alpha, n  # limits: (B,)
        self.bos, self.eos = bos, eos
        self.scores = onp.full((B, k), NEG, "float32")  # (B, k), length-normalised, best first
        self.scores[:, 0] = 0  # one live beam to start from: the others would only repeat it
        self.alive = onp.ones((B, k), bool)  # (B, k)
        self.live = onp.arange(B)  # (L,): the sentences in the step's rows, in order
        self.words, self.parents = [], []  # per step, each (B, k): the word (-1: none), its beam

    def inputs(self):
        """The next step's inputs, each (L * k,): each row's token (``<bos>`` at the start; any
        token for a finished beam) and the row of the previous step that it continues."""
        L, k = len(self.live), self.k
        if not self.words:
            return onp.full(L * k, self.bos), onp.arange(L * k)
        word, parent = self.words[-1][self.live], self.parents[-1][self.live]  # (L, k) each
        return onp.maximum(word, 0).reshape(-1), (parent + onp.arange(0, L * k, k)[:, None]).reshape(-1)

    def update(self, log_probs, t):
        """Step t's log-probabilities (L * k, V), a row per live beam, into the books
        (`_beam_update`); a beam finishes with ``<eos>`` or at its sentence's limit."""
        live, k = self.live, self.k
        word = onp.full(self.scores.shape, -1)  # (B, k): the sentences off the rows: no word
        parent = onp.tile(onp.arange(k), (len(word), 1))  # (B, k): ... and their own beams
        self.scores[live], word[live], parent[live] = _beam_update(  # (L, k) each
            *_row_top_k(log_probs, k), self.scores[live], self.alive[live], k,
            *_penalties(t, self.alpha))
        self.alive = onp.take_along_axis(self.alive, parent, axis=1) & (word != self.eos) \
            & (self.limits[:, None] > t)  # (B, k): finished, or at the sentence's length limit
        self.words.append(word)
        self.parents.append(parent)

    def finished(self, t, early_stop):
        """(B,) bool after step t: the sentences all of whose beams have finished, or with
        ``early_stop`` whose n best no live beam can change any more (`_settled`)."""
        done = ~self.alive.any(axis=1)  # (B,)
        if early_stop:
            done |= _settled(self.scores, self.alive, t, self.limits, self.alpha, self.n)
        return done

    def shrink(self, done):
        """Once half of the live sentences are done (`finished`), they leave the step's rows:
        the rows that stay (L' * k,), positions in the step's L * k; None: all stay."""
        keep = onp.flatnonzero(~done[self.live])  # (L',): positions in `live`
        if not 0 < 2 * len(keep) <= len(self.live):
            return None
        self.live = self.live[keep]
        return (keep[:, None] * self.k + onp.arange(self.k)).reshape(-1)  # (L', k) -> (L' * k,)

    def hypotheses(self):
        """Each sentence's n best beams, followed back from the last step: a list of
        ``(ids, score, log P)`` per sentence, best first, ids without ``<eos>`` (beams scored
        `NEG`, never filled, left out after the first)."""
        words, parents = onp.stack(self.words), onp.stack(self.parents)  # (steps, B, k) each
        out = []
        for b in range(words.shape[1]):
            best = []
            for beam in range(self.n):
                if beam and self.scores[b, beam] <= NEG / 2:
                    break
                j, ids = beam, []
                for t in range(words.shape[0] - 1, -1, -1):
                    if words[t, b, j] >= 0:
                        ids.append(int(words[t, b, j]))
                    j = int(parents[t, b, j])
                ids.reverse()
                size = len(ids)  # |Y|: with <eos>, when the beam has it
                if ids and ids[-1] == self.eos:
                    ids.pop()
                score = float(self.scores[b, beam])
                best.append((ids, score, score * length_penalty(size, self.alpha)))
            out.append(best)
        return out


class _Rows:
    """The device side of a beam search: the step graph (`step.DecoderStep`) and, a row per
    beam of each live sentence, the source's valid length and the caches, 4 per decoder block:
    self keys, self values (rows, steps, hidden), newest first, then `step.EncoderKV`'s keys
    and values (rows, T, hidden)."""

    def __init__(self, step, enc_kv, valid_length, k, steps, ctx):
        self.graph, self.ctx = step, ctx
        beams = np.array(onp.arange(valid_length.shape[0] * k) // k, dtype="int32",
                         ctx=ctx)  # (B * k,): each row's sentence
        enc_kv = [np.take(x, beams, axis=0) for x in enc_kv]  # each (B * k, T, hidden)
        self.valid_length = np.take(valid_length, beams)  # (B * k,)
        empty = np.zeros((len(beams), steps, enc_kv[0].shape[-1]), ctx=ctx)  # (B * k, steps, hidden)
        self.caches = [c for K_enc, V_enc in zip(enc_kv[0::2], enc_kv[1::2])
                       for c in (empty, empty, K_enc, V_enc)]

    def step(self, tokens, parents, t):
        """Step t (position t - 1) on the rows, each continuing its parent's cache: tokens,
        parents (rows,) -> the logits (rows, V), read to the host."""
        ctx = self.ctx
        logits, *self_kv = _step.call(
            self.graph, np.array(tokens[:, None], ctx=ctx),  # (rows,) -> (rows, 1)
            np.array([t - 1], ctx=ctx), self.valid_length, np.array(parents, ctx=ctx),
            *self.caches)  # self_kv: 2 caches per block, each (rows, steps, hidden)
        self.caches[0::4], self.caches[1::4] = self_kv[0::2], self_kv[1::2]
        return logits.asnumpy()  # (rows, V)

    def keep(self, rows):
        """Keep only `rows` (rows',), as `_Beams.shrink` gives them."""
        rows = np.array(rows, dtype="int32", ctx=self.ctx)  # (rows',)
        self.caches = [np.take(c, rows, axis=0) for c in self.caches]
        self.valid_length = np.take(self.valid_length, rows)  # (rows',)


# model -> {key: graph}: a cache beside the user's model, which it leaves as it was. The graphs
# hold the model's encoder and decoder, never the model: when the model dies its entry goes, and
# the graphs with the next collection
_GRAPHS = weakref.WeakKeyDictionary()


class Translator:
    """Batched greedy and beam-search translation of token lists, and attention weights.

    `num_steps`: the narrowest source encoding (``pad_to_num_steps=False``: each batch's
    longest source, as CTranslate2 pads; the same tokens, less work), and the fewest tokens a
    translation may reach with ``length_ratio`` 0, the most with a measured one
    (`limits.decode_limit`); `max_length`: the
    most tokens of a translation (None: `limits.decode_limit` per sentence, with the model's
    `length_ratio`); `batch_size` sentences
    are decoded together. The graphs (source side, step, attention pass) are built once per
    model and device type and hybridized alone (the model's blocks are left as they are).
    Corrected model only (`limits.require_corrected`; the chapter's loop is
    `decode.predict_s2s_ch8`). One call at a time per model: the graphs are shared.
    """

    def __init__(self, model, src_vocab, tgt_vocab, ctx, *, num_steps=10, max_length=None,
                 batch_size=64, no_unk=False, suppress=True, pad_to_num_steps=True,
                 length_ratio=0.0):
        require_corrected(model.decoder, "the translator")
        if batch_size < 1 or num_steps < 0 or (max_length is not None and max_length < 1):
            raise ValueError("batch_size and max_length must be at least 1, num_steps at least 0")
        self.model, self.src_vocab, self.tgt_vocab, self.ctx = model, src_vocab, tgt_vocab, ctx
        self.num_steps, self.max_length, self.batch_size = num_steps, max_length, batch_size
        self.length_ratio = length_ratio
        self.min_width = max(1, num_steps if pad_to_num_steps else 1)  # the narrowest encoding
        self.max_source = model.encoder.pos_encoding.P.shape[1]
        self.max_target = model.decoder.pos_encoding.P.shape[1]
        if max_length is not None and max_length > self.max_target:
            raise ValueError(f"max_length {max_length} is longer than the model's "
                             f"{self.max_target} positions")
        self.pad, self.bos, self.eos = src_vocab["<pad>"], tgt_vocab["<bos>"], tgt_vocab["<eos>"]
        if no_unk and not suppress:
            raise ValueError("no_unk masks <unk>: it needs suppress=True")
        special = (BANNED + (("<unk>",) if no_unk else ())) if suppress else ()
        self._bias = onp.zeros((1, model.decoder.dense.weight.shape[0]), "float32")  # (1, V)
        self._bias[0, sorted({tgt_vocab[t] for t in special})] = NEG  # never emitted

    # ------------------------------------------------------------------------------ the source
    def encode_source(self, sentences):
        """Token lists -> ``(X (batch, width), valid_length (batch,))`` on the device, the
        translator's only source encoding: ids (no ``<eos>`` appended, as in the chapter)
        padded with ``<pad>`` to width = max(num_steps, longest) (``pad_to_num_steps=False``:
        the longest), never cut. The encoder masks the padding, so a translation does not
        depend on its batch (its tokens; its score to float rounding). An empty sentence, or
        one longer than the model's positions, raises SentenceError (`limits.check_lengths`)."""
        check_lengths(sentences, self.max_source)
        ids = [self.src_vocab[list(tokens)] for tokens in sentences]
        width = max([self.min_width] + [len(t) for t in ids])
        X = np.array([truncate_pad(t, width, self.pad) for t in ids], ctx=self.ctx)  # (batch, width)
        return X, np.array([len(t) for t in ids], ctx=self.ctx)  # valid lengths: (batch,)

    def _limit(self, source_length):
        if self.max_length is not None:
            return self.max_length
        return decode_limit(self.num_steps, source_length, self.max_target, self.length_ratio)

    # ------------------------------------------------------------------------------ translating
    def translate(self, sentences, beam_size=1, alpha=ALPHA, *, early_stop=True, n_best=None):
        """The best hypothesis of each token list: ``[Hypothesis(tokens, score), ...]``.

        ``beam_size=1`` is greedy decoding. ``early_stop=False`` always runs every step up to
        the longest limit (benchmarks; the results are the same). ``n_best=n`` (at most
        `beam_size`): a list of each sentence's n best finished beams instead, best first (the
        first is the hypothesis returned without it; beams the search could not fill are left
        out)."""
        check_search(beam_size, n_best)
        vocab = self._bias.shape[1]
        if beam_size > vocab:
            raise ValueError(f"beam size {beam_size} is larger than the vocabulary ({vocab})")
        sentences = [list(s) for s in sentences]
        check_lengths(sentences, self.max_source)  # numbered as given, before sorting
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # less padding
        out = [None] * len(sentences)
        # OpenMP threads for the output layer's size (`_runtime.threads`)
        _threads.size_for(min(self.batch_size, len(order)) * beam_size
                          * self.model.decoder.embedding_size * vocab)
        with self.ctx:
            for start in range(0, len(order), self.batch_size):
                part = order[start:start + self.batch_size]
                hyps = self._search([sentences[i] for i in part], beam_size, alpha, early_stop,
                                    n_best or 1)
                for i, best in zip(part, hyps):
                    out[i] = best if n_best else best[0]
        return out

    def _graph(self, name, build, static=True):
        """The model's graph `name` on this device type, built (`build()`) and hybridized once,
        after one imperative call on a dummy sentence if the model's initialisation is still
        deferred (the graphs need the weights' shapes); tracked so that a block's change
        (`_graphs.invalidate`) traces it again."""
        graphs = _GRAPHS.setdefault(self.model, {})
        key = (name, self.ctx.device_type)
        if key not in graphs:
            if _gluon.deferred(self.model.collect_params().values()):
                X = np.ones((1, 2), ctx=self.ctx)  # (batch, seq_len)
                self.model(X, X, np.array([2], ctx=self.ctx))
            graphs[key] = _graphs.track(_step.hybridized(build(), static))
        return graphs[key]

    def _search(self, sentences, k, alpha, early_stop, n):
        """Beam search with `k` beams on one batch: each sentence's `n` best hypotheses. The
        device runs the step on a row per beam of each live sentence (`_Rows`); the host reads
        its logits and keeps the books (`_Beams`)."""
        limits = onp.array([self._limit(len(s)) for s in sentences])  # (B,)
        steps = int(limits.max())
        books, rows = _Beams(limits, k, alpha, n, self.bos, self.eos), self._rows(sentences, k, steps)
        for t in range(1, steps + 1):
            log_probs = _log_softmax(rows.step(*books.inputs(), t))  # (rows, V)
            log_probs += self._bias  # (rows, V) + (1, V): the banned tokens at -1e18
            books.update(log_probs, t)
            done = books.finished(t, early_stop)  # (B,)
            if early_stop and done.all():
                break
            kept = books.shrink(done)
            if kept is not None:
                rows.keep(kept)
        return [[Hypothesis(self.tgt_vocab.to_tokens(ids), score, log_prob)
                 for ids, score, log_prob in best] for best in books.hypotheses()]

    def _rows(self, sentences, k, steps):
        """The device side of a search (`_Rows`): the sources encoded, `k` rows per sentence."""
        encode = self._graph("encoder", lambda: _step.EncoderKV(self.model))
        step = self._graph("step", lambda: _step.DecoderStep(self.model.decoder, reorder=True))
        X, valid_length = self.encode_source(sentences)
        return _Rows(step, _step.call(encode, X, valid_length), valid_length, k, steps, self.ctx)

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
        n, m1 = len(src_tokens), len(tgt_tokens) + 1
        if m1 > self.max_target:
            raise ValueError(f"a translation of {len(tgt_tokens)} tokens is longer than the "
                             f"model's {self.max_target} positions")
        Y = np.array([[self.bos] + self.tgt_vocab[tgt_tokens]], ctx=self.ctx)  # (1, m + 1)
        probe = self._graph("attention", lambda: _step.AttentionProbe(self.model), static=False)
        with self.ctx:
            causal = np.arange(1, m1 + 1, ctx=self.ctx).reshape(1, m1)  # (1, m + 1)
            weights = [w.asnumpy() for w in _step.call(probe, X, valid_length, Y, causal)]
        enc = len(_step.active_blocks(self.model.encoder))
        dec = enc + len(_step.active_blocks(self.model.decoder))  # where the cross weights start

        def cut(ws, rows, cols):  # (heads, queries, keys) each -> nested lists, 4 decimals
            return [onp.round(w[:, :rows, :cols].astype("float64"), 4).tolist() for w in ws]

        return {"src_tokens": src_tokens, "tgt_tokens": ["<bos>"] + tgt_tokens,
                "out_tokens": tgt_tokens + ["<eos>"], "encoder": cut(weights[:enc], n, n),
                "decoder": cut(weights[enc:dec], m1, m1), "cross": cut(weights[dec:], m1, n)}
