"""One thread owns the model; requests wait in a queue and are translated together.

MXNet 1.x does not allow Gluon blocks (CachedOp) to be called from several threads at once, and
numpy mode (``npx.set_np()``) is a per-thread setting, so every MXNet call of the server --
loading the model included -- runs on the engine's single worker thread (docs/serving.md).
Requests that arrive while the model is busy are merged into one ``translate`` call of the
translation engine (micro-batching): one batch per beam size, up to `max_batch` sentences.

The translations come from the engine chosen (`inference.engines`: ``"mxnet"``, the package's
`Translator`, or ``"ctranslate2"``); the attention weights always come from the MXNet model,
which the server loads with either engine (a teacher-forced pass over the engine's translation).
The attention a request may ask for is capped by `MAX_ATTENTION_CELLS` (`check_attention`).

A model trained with ``--exact-chapter`` is refused (`ServeError`, one line): the server's
answers carry beam search, scores and attention weights, which only the corrected model gives;
``d2l-transformer translate`` decodes such a model with the chapter's loop.
"""

import collections
import concurrent.futures
import logging
import os
import queue
import threading

from mxnet import npx

from .. import checkpoint
from ..context import parse_ctx
from ..inference.engines import (
    DEFAULT_ENGINE,
    EngineError,
    MXNetEngine,
    check_engine_options,
    open_engine,
)
from ..inference.export import ExportError
from ..inference.limits import ExactChapterError, require_corrected
from ..inference.translator import ALPHA
from . import ServeError

log = logging.getLogger(__name__)

Job = collections.namedtuple("Job", ["sources", "tokens", "beam", "attention", "future",
                                   "n_best"])
MAX_ATTENTION_CELLS = 1_000_000  # attention weights per request (~8 MB of JSON)


class Busy(Exception):
    """Too many sentences are waiting; the client should retry later (HTTP 429)."""


class Unavailable(Exception):
    """The engine is closed or its worker thread has stopped (HTTP 503)."""


class TooLarge(Exception):
    """The attention weights asked for have more than `MAX_ATTENTION_CELLS` cells (HTTP 413)."""


def check_attention(cells, least=False):
    """Refuse (TooLarge) `cells` attention weights over `MAX_ATTENTION_CELLS`: the one rule,
    applied before decoding to the fewest the sources can have (`least`: a one-token
    translation each) and after it to what the translations have."""
    if cells > MAX_ATTENTION_CELLS:
        raise TooLarge(f"attention: {'at least ' if least else ''}{cells} weights (layers x "
                       f"heads x queries x keys); at most {MAX_ATTENTION_CELLS} per request: "
                       "send fewer or shorter sentences")


class Engine:
    """The model of `model_dir` behind a queue, served by one worker thread; `engine`: the
    translation engine (`inference.engines.ENGINES`); `engine_threads`, `compute_type`:
    CTranslate2's threads and compute type (`inference.engines.CTranslate2Engine`).

    After construction (which waits until the model is loaded, or re-raises why it could not
    be) `tokenizer`, `src_vocab`, `max_positions`, `pair` (the model's languages) and `info`
    are read-only and may be used from any thread; the model itself is only touched by the worker.
    """

    def __init__(self, model_dir, ctx="auto", *, engine=DEFAULT_ENGINE, max_batch=64,
                 max_pending=4096, engine_threads=0, compute_type=None):
        self.model_dir, self.engine = os.path.abspath(model_dir), engine
        self.engine_threads, self.compute_type = engine_threads, compute_type
        try:  # before the model loads
            check_engine_options(engine, compute_type)
            require_corrected(checkpoint.load_config(model_dir), "the server")
        except EngineError as e:
            raise ServeError(str(e)) from None
        except ExactChapterError as e:
            raise ServeError(f"{model_dir}: {e}; translate it with d2l-transformer translate "
                             f"--model {model_dir}") from None
        self.max_batch, self.max_pending = max_batch, max_pending
        self._closed = False
        self.batches = self.sentences = 0  # statistics: model calls and sentences translated
        self._pending, self._lock = 0, threading.Lock()
        self._queue = queue.Queue()
        self._ready, self._error = threading.Event(), None
        self._thread = threading.Thread(target=self._run, args=(ctx,), daemon=True,
                                        name="d2l-transformer-model")
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    # ----------------------------------------------------------------- any thread
    def encode(self, text):
        """Source text -> the model's source tokens (the tokenizer it was trained with)."""
        return self.tokenizer.encode(text)

    def pending(self):
        with self._lock:
            return self._pending

    def alive(self):
        """True while the engine takes work: not closed, and its worker thread running."""
        return not self._closed and self._thread.is_alive()

    def attention_cells(self, n, m):
        """The number of attention weights `Translator.attention` returns for a source of `n`
        tokens and a decoder input of `m` (``<bos>`` + the translation): layers x heads x
        queries x keys, summed over encoder self (n x n), decoder self (m x m) and
        encoder-decoder (m x n) attention."""
        return self.heads * (self.enc_layers * n * n + self.dec_layers * (m * m + m * n))

    def submit(self, sources, tokens, beam, attention=False, *, n_best=1):
        """Queue sentences (texts and their token lists); a Future of their result dicts
        ``{"source", "translation", "score", "log_prob"[, "attention"][, "nbest"]}``. `attention`:
        also each translation's attention weights (`check_attention`: TooLarge at once for
        sources that need too many, else the future fails with it when the translations do);
        `n_best` > 1: the n best beams as ``"nbest"`` (each translation, score, log_prob; the
        first is the translation). Raises Busy
        when too much is waiting, Unavailable when closed."""
        if attention:
            check_attention(sum(self.attention_cells(len(t), 1) for t in tokens), least=True)
        with self._lock:
            if not self.alive():
                raise Unavailable("the server is shutting down" if self._closed else
                                  "the model's worker thread has stopped")
            if self._pending + len(tokens) > self.max_pending:
                raise Busy(f"{self._pending} sentences are waiting; retry later")
            self._pending += len(tokens)
            future = concurrent.futures.Future()  # queued under the lock: close() comes after
            self._queue.put(Job(list(sources), list(tokens), beam, attention, future, n_best))
        return future

    def close(self):
        """Finish the queued work and stop the worker; `submit` fails from now on."""
        with self._lock:
            self._closed = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # ----------------------------------------------------------------- the worker thread
    def _load(self, ctx_spec):
        npx.set_np()  # per thread: the chapter's numpy mode for this thread's MXNet calls
        ctx = parse_ctx(ctx_spec)
        try:  # the one choice of `inference.engines.open_engine` (``auto``: said in `choice`)
            self.translator = open_engine(self.model_dir, self.engine, ctx,
                                          batch_size=self.max_batch,
                                          engine_threads=self.engine_threads,
                                          compute_type=self.compute_type)
        except (ExportError, EngineError) as e:
            raise ServeError(str(e)) from None
        self.choice = self.translator.choice
        # the MXNet model: the attention weights (and the translations of the "mxnet" engine)
        self.explainer = self.translator if self.translator.name == "mxnet" else \
            MXNetEngine.load(self.model_dir, ctx, batch_size=self.max_batch)
        model, cfg, summary = self.explainer.model, self.explainer.cfg, self.explainer.summary
        self.tokenizer, self.src_vocab = self.explainer.tokenizer, self.explainer.src_vocab
        self.tgt_vocab = self.explainer.tgt_vocab
        self.max_positions = self.explainer.max_positions
        self.enc_layers, self.dec_layers = len(model.encoder.blks), len(model.decoder.blks)
        self.heads = cfg.num_heads
        self.info = {"name": os.path.basename(self.model_dir), "engine": self.translator.name,
                     "compute_type": self.translator.compute_type,
                     "engine_threads": self.translator.intra_threads,
                     "preset": summary.get("preset"),
                     "epochs": summary.get("epochs_done"), "layers": cfg.num_layers,
                     "heads": cfg.num_heads, "embedding_size": cfg.embedding_size,
                     "src_vocab": len(self.src_vocab), "tgt_vocab": len(self.tgt_vocab),
                     "max_positions": self.max_positions, "ctx": str(ctx),
                     "source_lang": cfg.pair[0], "target_lang": cfg.pair[1]}
        self.pair = cfg.pair  # (source_lang, target_lang): what /languages lists

    def _run(self, ctx_spec):
        try:
            self._load(ctx_spec)
        except BaseException as e:  # re-raised by __init__ in the caller's thread
            self._error = e
            return
        finally:
            self._ready.set()
        jobs, stop = [], False
        try:
            while True:
                jobs = [self._queue.get()]
                size = 0 if jobs[0] is None else len(jobs[0].tokens)
                while jobs[-1] is not None and size < self.max_batch:
                    try:
                        jobs.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                    size += 0 if jobs[-1] is None else len(jobs[-1].tokens)
                stop = jobs[-1] is None
                self._serve([j for j in jobs if j is not None])
                if stop:
                    return
        finally:  # however the worker ends, nothing taken or queued waits for ever
            with self._lock:
                self._closed = True
            while True:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for job in jobs:
                if job is None or job.future.done():
                    continue
                if job.future.running() or job.future.set_running_or_notify_cancel():
                    job.future.set_exception(Unavailable("the server is shutting down" if stop
                                                         else "the model's worker thread has "
                                                              "stopped"))

    def _serve(self, jobs):
        for beam in sorted({j.beam for j in jobs}):
            group = [j for j in jobs if j.beam == beam]
            live = [j for j in group if j.future.set_running_or_notify_cancel()]
            try:
                outcome = self._translate(live, beam) if live else []
            except Exception as e:  # our bug: the clients get a 500, the log the traceback
                log.exception("translation failed")
                outcome = [e] * len(live)
            with self._lock:  # no longer pending once the answers are out
                self._pending -= sum(len(j.tokens) for j in group)
            for j, result in zip(live, outcome):
                if isinstance(result, Exception):
                    j.future.set_exception(result)
                else:
                    j.future.set_result(result)

    def _hypothesis(self, hyp):
        """A hypothesis' text, its score (GNMT's) and its log-probability."""
        return {"translation": self.tokenizer.decode(list(hyp.tokens)),
                "score": round(float(hyp.score), 4), "log_prob": round(float(hyp.log_prob), 4)}

    def _translate(self, jobs, beam):
        """One ``translate`` call of the engine for all sentences of `jobs`; their result
        lists."""
        n_best = max(j.n_best for j in jobs)
        hyps = iter(self.translator.translate([t for j in jobs for t in j.tokens], beam_size=beam,
                                              alpha=ALPHA, n_best=n_best))
        self.batches += 1
        results = []
        for j in jobs:
            best = [next(hyps) for _ in j.tokens]  # each sentence's n_best hypotheses
            if j.attention:
                try:
                    check_attention(sum(self.attention_cells(len(src), len(b[0].tokens) + 1)
                                        for src, b in zip(j.tokens, best)))
                except TooLarge as e:
                    results.append(e)
                    continue
            items = []
            for source, tokens, b in zip(j.sources, j.tokens, best):
                hyp = b[0]
                item = {"source": source, **self._hypothesis(hyp)}
                if j.attention:
                    item["attention"] = self.explainer.attention(tokens, list(hyp.tokens))
                if j.n_best > 1:
                    item["nbest"] = [self._hypothesis(h) for h in b[:j.n_best]]
                items.append(item)
            results.append(items)
        self.sentences += sum(len(j.tokens) for j in jobs)
        return results
