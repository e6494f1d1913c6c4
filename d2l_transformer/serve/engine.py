"""One thread owns the model; requests wait in a queue and are translated together.

MXNet 1.x does not allow Gluon blocks (CachedOp) to be called from several threads at once, and
numpy mode (``npx.set_np()``) is a per-thread setting, so every MXNet call of the server --
loading the model included -- runs on the engine's single worker thread (docs/serving.md).
Requests that arrive while the model is busy are merged into one `Translator.translate` call
(micro-batching): one batch per beam size, up to `max_batch` sentences.
"""

import collections
import concurrent.futures
import logging
import os
import queue
import threading

from mxnet import npx

from ..context import parse_ctx
from ..inference.translator import ALPHA, Translator
from ..io import checkpoint

log = logging.getLogger(__name__)

Job = collections.namedtuple("Job", ["sources", "tokens", "beam", "attention", "future"])


class Busy(Exception):
    """Too many sentences are waiting; the client should retry later."""


class Engine:
    """The model of `model_dir` behind a queue, served by one worker thread.

    After construction (which waits until the model is loaded, or re-raises why it could not
    be) `tokenizer`, `src_vocab`, `max_positions` and `info` are read-only and may be used from
    any thread; the model itself is only touched by the worker.
    """

    def __init__(self, model_dir, ctx="auto", *, max_batch=64, max_pending=4096):
        self.model_dir = os.path.abspath(model_dir)
        self.max_batch, self.max_pending = max_batch, max_pending
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

    def submit(self, sources, tokens, beam, attention=False):
        """Queue sentences (texts and their token lists); a Future of their result dicts
        ``{"source", "translation", "score"[, "attention"]}``. Raises Busy when full."""
        with self._lock:
            if self._pending + len(tokens) > self.max_pending:
                raise Busy(f"{self._pending} sentences are waiting; retry later")
            self._pending += len(tokens)
        future = concurrent.futures.Future()
        self._queue.put(Job(list(sources), list(tokens), beam, attention, future))
        return future

    def close(self):
        """Finish the queued work and stop the worker."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # ----------------------------------------------------------------- the worker thread
    def _load(self, ctx_spec):
        npx.set_np()  # per thread: the chapter's numpy mode for this thread's MXNet calls
        ctx = parse_ctx(ctx_spec)
        model, self.src_vocab, self.tgt_vocab, cfg, summary = checkpoint.load(self.model_dir, ctx)
        self.tokenizer = checkpoint.load_tokenizer(self.model_dir, cfg)
        self.translator = Translator(model, self.src_vocab, self.tgt_vocab, ctx,
                                     num_steps=cfg.num_steps, batch_size=self.max_batch)
        self.max_positions = model.encoder.pos_encoding.max_len
        self.info = {"name": os.path.basename(self.model_dir), "preset": summary.get("preset"),
                     "epochs": summary.get("epochs_done"), "layers": cfg.num_layers,
                     "heads": cfg.num_heads, "embedding_size": cfg.embedding_size,
                     "src_vocab": len(self.src_vocab), "tgt_vocab": len(self.tgt_vocab),
                     "max_positions": self.max_positions, "ctx": str(ctx)}

    def _run(self, ctx_spec):
        try:
            self._load(ctx_spec)
        except BaseException as e:  # re-raised by __init__ in the caller's thread
            self._error = e
            return
        finally:
            self._ready.set()
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

    def _translate(self, jobs, beam):
        """One `Translator.translate` call for all sentences of `jobs`; their result lists."""
        hyps = iter(self.translator.translate([t for j in jobs for t in j.tokens],
                                              beam_size=beam, alpha=ALPHA))
        self.batches += 1
        results = []
        for j in jobs:
            items = []
            for source, tokens in zip(j.sources, j.tokens):
                hyp = next(hyps)
                item = {"source": source, "translation": self.tokenizer.decode(list(hyp.tokens)),
                        "score": round(float(hyp.score), 4)}
                if j.attention:
                    item["attention"] = self.translator.attention(tokens, list(hyp.tokens))
                items.append(item)
            results.append(items)
        self.sentences += sum(len(j.tokens) for j in jobs)
        return results
