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
(`_settled`); once half of a batch's sentences have finished, they leave the step's rows.

**Special tokens**: ``<pad>`` and ``<bos>`` (`limits.BANNED`), and ``<unk>`` with ``no_unk``
(CTranslate2's ``disable_unk``), get -1e18 added to their log-probability before the search
picks (an under-trained model emits them otherwise); ``suppress=False`` masks nothing, the
chapter's argmax.
"""

import collections
import weakref

import numpy as onp
from mxnet import np

from .. import _graphs
from .._runtime import threads as _threads
from ..data import truncate_pad
from . import step as _step
from .limits import BANNED, check_lengths, check_search, decode_limit, require_corrected

BEAM_SIZE, ALPHA = 4, 0.6  # the paper's (6.1)
NEG = onp.float32(-1e18)  # the score of an impossible candidate (gluonnlp's LARGE_NEGATIVE_FLOAT)
Hypothesis = collections.namedtuple("Hypothesis", ["tokens", "score"])
Hypothesis.__doc__ = "A translation: target tokens (no <bos>/<eos>) and its length-penalised score."


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


_GRAPHS = weakref.WeakKeyDictionary()  # model -> {key: its graph}, built once


class Translator:
    """Batched greedy and beam-search translation of token lists, and attention weights.

    `num_steps`: the narrowest source encoding (``pad_to_num_steps=False``: each batch's
    longest source, as CTranslate2 pads; the same tokens, less work); `max_length`: the most
    tokens of a translation (None: `limits.decode_limit` per sentence); `batch_size` sentences
    are decoded together. The graphs (source side, step, attention pass) are built once per
    model and device type and hybridized alone (the model's blocks are left as they are).
    Corrected model only (`limits.require_corrected`; the chapter's loop is
    `decode.predict_s2s_ch8`). One call at a time per model: the graphs are shared.
    """

    def __init__(self, model, src_vocab, tgt_vocab, ctx, *, num_steps=10, max_length=None,
                 batch_size=64, no_unk=False, suppress=True, pad_to_num_steps=True):
        require_corrected(model.decoder, "the translator")
        if batch_size < 1 or num_steps < 1 or (max_length is not None and max_length < 1):
            raise ValueError("batch_size, num_steps and max_length must be at least 1")
        self.model, self.src_vocab, self.tgt_vocab, self.ctx = model, src_vocab, tgt_vocab, ctx
        self.num_steps, self.max_length, self.batch_size = num_steps, max_length, batch_size
        self.min_width = num_steps if pad_to_num_steps else 1  # the narrowest source encoding
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
        return decode_limit(self.num_steps, source_length, self.max_target)

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
            if any(p._data is None for p in self.model.collect_params().values()):
                X = np.ones((1, 2), ctx=self.ctx)  # (batch, seq_len)
                self.model(X, X, np.array([2], ctx=self.ctx))
            graphs[key] = _graphs.track(_step.hybridized(build(), static))
        return graphs[key]

    def _search(self, sentences, k, alpha, early_stop, n):
        """Beam search with `k` beams on one batch: each sentence's `n` best hypotheses. Rows
        b * k ... b * k + k - 1 are sentence b's beams; the host keeps the books (scores, live
        beams; per step each beam's word and parent). A sentence that has left the rows steps
        as the identity (its beams keep their places and scores, word -1)."""
        model, ctx, B = self.model, self.ctx, len(sentences)
        encode = self._graph("encoder", lambda: _step.EncoderKV(model))
        step = self._graph("step", lambda: _step.DecoderStep(model.decoder, reorder=True))
        X, valid_length = self.encode_source(sentences)
        beams = np.array(onp.arange(B * k) // k, dtype="int32", ctx=ctx)  # (B*k,): a row per beam
        enc_kv = [np.take(x, beams, axis=0) for x in _step.call(encode, X, valid_length)]
        valid_length = np.take(valid_length, beams)  # (B*k,)
        limits = onp.array([self._limit(len(s)) for s in sentences])  # (B,)
        steps = int(limits.max())
        empty = np.zeros((B * k, steps, enc_kv[0].shape[-1]), ctx=ctx)  # (B*k, steps, hidden)
        caches = [c for K_enc, V_enc in zip(enc_kv[0::2], enc_kv[1::2])
                  for c in (empty, empty, K_enc, V_enc)]  # 4 per block: self K, V; encoder K, V
        scores = onp.full((B, k), NEG, "float32")
        scores[:, 0] = 0  # one live beam to start from: the others would only repeat it
        alive = onp.ones((B, k), bool)
        live = onp.arange(B)  # the sentences in the step's rows, in order
        tokens, parent_rows = onp.full(B * k, self.bos), onp.arange(B * k)
        words, parents = [], []
        for t in range(1, steps + 1):
            logits, *self_kv = _step.call(
                step, np.array(tokens[:, None], ctx=ctx), np.array([t - 1], ctx=ctx), valid_length,
                np.array(parent_rows, ctx=ctx), *caches)  # (rows, V), 2 caches per block
            caches[0::4], caches[1::4] = self_kv[0::2], self_kv[1::2]
            log_probs = _log_softmax(logits.asnumpy())
            log_probs += self._bias  # (rows, V) + (1, V): the banned tokens at -1e18
            word = onp.full((B, k), -1)  # a sentence that has left the rows: the identity
            parent = onp.tile(onp.arange(k), (B, 1))  # (B, k)
            scores[live], word[live], parent[live] = _beam_update(
                *_row_top_k(log_probs, k), scores[live], alive[live], k, *_penalties(t, alpha))
            alive = onp.take_along_axis(alive, parent, axis=1) & (word != self.eos) \
                & (limits[:, None] > t)  # finished, or at the sentence's length limit
            words.append(word)
            parents.append(parent)
            done = ~alive.any(axis=1)  # (B,)
            if early_stop:
                done |= _settled(scores, alive, t, limits, alpha, n)  # as good as finished
                if done.all():
                    break
            keep = onp.flatnonzero(~done[live])  # positions in the step's rows
            if 0 < 2 * len(keep) <= len(live):  # half have finished: they leave the rows
                rows = np.array((keep[:, None] * k + onp.arange(k)).reshape(-1), dtype="int32",
                                ctx=ctx)  # (len(keep) * k,): the kept sentences' beams
                caches = [np.take(c, rows, axis=0) for c in caches]
                valid_length = np.take(valid_length, rows)
                live = live[keep]
            tokens = onp.maximum(word[live], 0).reshape(-1)  # finished beams: any token
            parent_rows = (parent[live] + onp.arange(0, len(live) * k, k)[:, None]).reshape(-1)
        return self._hypotheses(onp.stack(words), onp.stack(parents), scores, n)

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
