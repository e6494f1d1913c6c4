"""A whole training run (9.3.7), as ``d2l-transformer train`` and scripts/train_chapter.py run it:
data, model, the loop, checkpoints, resuming, the four translations the chapter prints."""

import contextlib
import copy
import os
import sys
import time

from mxnet import init, nd

from .. import _runtime, checkpoint
from ..build import build_model
from ..distributed.kvstore import announce_rank, create_kvstore, worker_info
from ..io import lock, measured
from . import precision
from .inputs import data_record, load_inputs
from .loop import check_one_device, rng_state, set_rng_state, set_seed, train_s2s_ch8
from .loss import MaskedSoftmaxCELoss
from .optim import config_trainer
from .outdir import RunError, check_out_dir, keep_best, recorded_precision
from .progress import ProgressBar
from .steps import traceable
from .translations import book_translations, corpus_translations, edition_translations
from .validation import EarlyStopping, LastParameters, Validator, format_validation, validation_loss

SUBMODELS = ("best", "average")  # model directories inside a run's model directory
SEED_STRIDE = 100000  # epoch e of a run with seed s draws from seed s * SEED_STRIDE + e


def train_model(cfg, out_dir=None, *, seed=0, ctx, kvstore="device", fast=True, resume=False,
                data_path=None, checkpoint_every=1, progress=True, preset=None, log=None,
                valid_every=None, patience=None, average_last=None, overwrite=False,
                valid=None, test=None, init_from=None, languages=None):
    """Train `cfg` from seed `seed` and return its summary (what summary.json holds).

    The one way a chapter run trains: seed everything with `seed`, load the data, build the
    model, Xavier-initialise it, then `train_s2s_ch8` with MXNet's RNG reseeded at each epoch
    (``seed * SEED_STRIDE + epoch``) and NumPy's and Python's streams (the batch order) saved
    with every checkpoint, so that a run resumed at an epoch boundary repeats an uninterrupted
    one exactly. ``fast`` (the default) trains on the hybridized graph path, its products in
    `precision.settle`'s precision; the chapter's imperative loop runs with ``fast=False`` and
    always in exact mode (``cfg.exact_chapter``). The summary ends with its four translations.

    Exact mode is the chapter's own seeded run, epoch for epoch: epoch 1 is not reseeded (the
    deferred Xavier initialisation draws from MXNet's stream seeded once with `seed`, as the
    chapter's code; later epochs are, so that ``resume`` is exact for any dropout). Same
    per-epoch loss bit for bit and the same translations as scripts/chapter_oracle.py on the
    same machine (tests/test_exact_run.py).

    ``ctx``: a context or a list (data parallel). ``kvstore``: a name or a dist kvstore
    (`create_kvstore`); with several workers only rank 0 writes and translates. ``out_dir``:
    the model directory, saved every ``checkpoint_every`` epochs and at the end (None: not
    saved), locked while the run trains (`io.lock`); ``resume``: continue the run saved there;
    ``overwrite``: replace the model saved there (without either, an existing model directory
    is refused: `check_out_dir`). ``progress``: a `ProgressBar` on stderr. ``log``: where the
    one-line status messages go (stderr).

    The data (`inputs.load_inputs`): ``data_path`` (one corpus, or a list of them), read once;
    ``valid``, ``test``: the user's own dev and test sets, two files each (the sources, the
    references), in place of the split's parts. ``init_from``: a model directory to fine-tune
    (its parameters, vocabularies and tokenizer; `cfg` is its config with what
    `config.FINETUNABLE` lets change), from epoch 1 with a new Adam. ``languages``: the
    ``(source_lang, target_lang)`` the user gave (None where not): with ``init_from`` or
    ``resume`` the data must hold the model's languages, by these, else by its file names.

    Validation (`validation.Validator`, for a run with a valid part): every ``valid_every``
    epochs (None: 1 when it has one; 0: never), before the epoch's checkpoint is saved (with
    it, its record and the early-stopping count: a crash and --resume give the same run), the
    valid loss and greedy BLEU of the first ``cfg.valid_sentences`` valid pairs, kept in the
    summary's ``validation``; the best by BLEU is saved as ``OUT/best``; ``patience``: stop
    after that many validations without a better BLEU. ``average_last`` = N: ``OUT/average``
    holds the average of the last N epochs' parameters (validated too).

    Raises RunError, DataError or CheckpointError (one line) for a run that cannot start as
    asked."""
    run = _Run(cfg, out_dir, ctx, kvstore, seed=seed, fast=fast, resume=resume,
               overwrite=overwrite, log=log or sys.stderr, data_path=data_path,
               checkpoint_every=checkpoint_every, preset=preset, valid_every=valid_every,
               patience=patience, average_last=average_last, heldout=(valid, test),
               init_from=init_from, languages=languages or (None, None))
    with contextlib.ExitStack() as held:
        held.enter_context(measured.training())  # others measuring keep nothing beside it
        if run.writer:  # one writer per model directory, from before anything is written
            try:
                held.enter_context(lock.locked(out_dir, "trained"))
            except lock.Locked as e:
                raise RunError(str(e)) from None
            check_out_dir(out_dir, resume=resume, overwrite=overwrite)  # again, under the lock
        set_seed(seed)
        run.prepare_data()  # runs no kernel: oneDNN's instruction set is still open
        run.precision, run.work = precision.settle(  # pinned or not; auto: measured
            run.cfg, len(run.tgt_vocab), run.ctxs, fast=run.fast, log=run.log, seed=seed,
            src_size=len(run.src_vocab), batches=run.train_iter, workers=run.num_workers,
            recorded=recorded_precision(out_dir, cfg) if resume else None)
        if not run.load_or_build_model():
            return run.summary  # trained as many epochs as asked already
        run.set_up_validation()
        run.train(progress)
        run.finish()
        return run.summary


class _Run:
    """One `train_model` run, stage by stage: the options checked before anything is written,
    the data, the model and trainer, validation, the loop and its per-epoch callback, the end
    (averaging, the translations, the last save). ``summary`` is what summary.json holds."""

    def __init__(self, cfg, out_dir, ctx, kvstore, *, seed, fast, resume, overwrite, log,
                 data_path, checkpoint_every, preset, valid_every, patience, average_last,
                 heldout=(None, None), init_from=None, languages=(None, None)):
        check_out_dir(out_dir, resume=resume, overwrite=overwrite)
        if init_from and resume:
            raise RunError("--resume continues the run in --out, --init-from starts a new one "
                           "from a trained model: give one of them")
        self.cfg, self.out_dir, self.seed, self.resume, self.log = cfg, out_dir, seed, resume, log
        self.ctxs = ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx]
        self.fast = fast and not cfg.exact_chapter and traceable(cfg)  # exact: the book's loop
        if resume and out_dir is None:
            raise RunError("resuming needs the model directory of the run")
        self.kvstore = kvstore = (create_kvstore(kvstore) if isinstance(kvstore, str) or kvstore is None
                                  else kvstore)
        self.rank, self.num_workers = worker_info(kvstore)
        if self.num_workers > 1:  # `launch` prefixes this worker's lines with its rank from now on
            announce_rank(kvstore)
        self.batch_size = cfg.batch_size // self.num_workers  # the preset's batch is the GLOBAL batch
        if self.batch_size < len(ctxs):
            raise RunError(f"batch size {cfg.batch_size} is too small for {self.num_workers} "
                           f"workers x {len(ctxs)} devices")
        # exact 1.0: d2l 1.0's loss, the mean over every position of a batch, on one device
        self.reduction = "mean" if "loss_over_padding" in cfg.bugs else cfg.loss_reduction
        try:
            check_one_device(self.reduction, ctxs, kvstore)
        except ValueError as e:
            raise RunError(str(e)) from None
        self.writer = self.rank == 0 and out_dir is not None  # only rank 0 writes the model directory
        self.data_path, self.checkpoint_every, self.preset = data_path, checkpoint_every, preset
        self.valid_every, self.patience, self.average_last = valid_every, patience, average_last
        self.carry = resume  # OUT/best and OUT/average of a model this run replaces are not its own
        self.bar, self.work = None, None  # work: the run's (`_runtime.cpu_math.settle`)
        self.heldout, self.init_from, self.languages = heldout, init_from, languages
        self.pending_best = None  # OUT/best's summary, saved after OUT by `finish`

    def prepare_data(self):
        """The data, read once (`inputs.load_inputs`: a resumed or fine-tuned model's tokenizer,
        what was dropped said in two lines), `cfg` with the lengths the data decided;
        ``valid_every`` settled before, a warmup longer than the run warned of after."""
        self.check_validation()  # before reading: a run that cannot validate writes nothing
        self.data, self.cfg = load_inputs(
            self.cfg, self.batch_size, self.data_path, self.heldout,
            resume_dir=self.out_dir if self.resume else None, init_from=self.init_from,
            rank=self.rank, num_workers=self.num_workers, fast=self.fast, say=self.say,
            languages=self.languages)
        self.src_vocab, self.tgt_vocab, self.train_iter, self.tokenizer = self.data[:4]
        self.edition_valid = self.data.edition_valid
        self.check_schedule()

    def check_schedule(self):  # a warmup longer than the run warned of
        cfg, updates = self.cfg, len(self.train_iter) * self.cfg.num_epochs
        if cfg.warmup_steps > updates:  # the learning rate would never reach cfg.lr
            print(f"warning: warmup_steps {cfg.warmup_steps} is longer than the whole run "
                  f"({len(self.train_iter)} batches x {cfg.num_epochs} epochs = {updates} updates): the "
                  f"learning rate never reaches lr {cfg.lr}; give e.g. --set "
                  f"warmup_steps={max(1, updates // 4)}, or more --epochs or data", file=self.log)

    def check_validation(self):
        """``valid_every`` settled (1 with a valid part: the split's, or the user's), and
        checked with ``patience``, before anything is read."""
        cfg, recorded = self.cfg, {}
        if self.resume:
            recorded = checkpoint.load_summary(self.out_dir).get("data") or {}
        has_valid = cfg.edition != "1.0" and bool(cfg.num_valid or self.heldout[0] or (
            recorded.get("valid") or {}).get("files"))
        if self.valid_every is None:
            self.valid_every = 1 if has_valid else 0
        if cfg.edition == "1.0" and any(self.heldout):
            raise RunError("edition 1.0 validates as d2l 1.0 does (its loss on pairs of its own "
                           "data): --valid and --test are not for it (give another --edition)")
        if self.valid_every and cfg.edition == "1.0" and cfg.num_valid:
            raise RunError("edition 1.0 validates as d2l 1.0 does (its loss every epoch): "
                           "--valid-every is not for it")
        if self.valid_every and not has_valid:
            raise RunError("--valid-every needs a valid part: this config has num_valid 0 (give "
                           "e.g. --set num_valid=2000, or --valid SRC REF)")
        if self.patience is not None and not self.valid_every:
            raise RunError("--patience needs validation (--valid-every N, and a valid part)")

    def load_or_build_model(self):
        """The model, its trainer, the summary and the first epoch: a resumed run's from its
        model directory, a fine-tuned one's parameters from ``init_from``, else a new model
        initialised as its edition does. False when the resumed run has trained
        ``cfg.num_epochs`` epochs already (said on the log)."""
        cfg, out_dir, ctxs = self.cfg, self.out_dir, self.ctxs
        if self.resume or self.init_from:
            self.model, saved_src, saved_tgt, _, summary = checkpoint.load(
                out_dir if self.resume else self.init_from, ctxs)
            if saved_src.idx_to_token != self.src_vocab.idx_to_token or \
                    saved_tgt.idx_to_token != self.tgt_vocab.idx_to_token:
                raise checkpoint.CheckpointError(f"{out_dir}: its vocabularies differ from the "
                                                 "data's; was it trained on another dataset?")
        else:
            self.model = build_model(cfg, len(self.src_vocab), len(self.tgt_vocab))
            if cfg.edition == "1.0":  # its encoder and decoder call initialize(): Uniform(0.07)
                self.model.encoder.initialize(ctx=ctxs)
                self.model.decoder.initialize(ctx=ctxs)
            else:
                self.model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
        self.trainer = config_trainer(self.model, cfg, self.kvstore)
        if not self.resume:
            self.summary = {"seed": self.seed, "preset": self.preset, "data": data_record(self.data),
                            "exact_chapter": cfg.exact_chapter, "epoch_history": [],
                            "train_seconds": 0.0, "epochs_done": 0}
            if self.init_from:
                self.summary["init_from"] = {"model": os.path.abspath(self.init_from),
                                             "data": summary.get("data"),
                                             "epochs_done": summary.get("epochs_done")}
            self.start_epoch = 1
            return True
        if summary.get("seed") != self.seed:
            raise checkpoint.CheckpointError(f"{out_dir} was trained with --seed "
                                             f"{summary.get('seed')}, not {self.seed}")
        checkpoint.load_trainer_states(out_dir, self.trainer)
        summary["data"] = data_record(self.data)  # checked against it: a moved file's new place
        self.summary, self.start_epoch = summary, summary["epochs_done"] + 1
        if self.writer:
            keep_best(out_dir, summary, lambda epoch: self.save_sub(
                "best", self.sub_summary(best_epoch=epoch)))
        if self.start_epoch > cfg.num_epochs:
            print(f"{out_dir} has already been trained {summary['epochs_done']} epochs; "
                  "give a larger --epochs to train on", file=self.log)
            return False
        return True

    def set_up_validation(self):
        """The `Validator` (if validating), early stopping, the epochs kept for averaging."""
        cfg, summary = self.cfg, self.summary
        summary["fast"] = self.fast
        precision.record_change(summary, self.precision.record(), self.start_epoch)
        self.validator = Validator(self.model, self.data.parts[0], self.tokenizer, self.src_vocab,
                                   self.tgt_vocab, cfg, self.ctxs[0]) if self.valid_every else None
        self.stopping = EarlyStopping.from_state(self.patience, summary.get("best"))
        self.history = LastParameters(self.model, self.average_last) if self.average_last else None
        if self.validator is not None:
            summary.setdefault("validation", [])

    def train(self, progress):
        """`train_s2s_ch8` from ``start_epoch``, calling `on_epoch`; its results in the summary."""
        cfg, ctxs, num_workers = self.cfg, self.ctxs, self.num_workers
        where = ",".join(map(str, ctxs)) + (f", worker {self.rank} of {num_workers}"
                                            if num_workers > 1 else "")
        print(f"training {cfg.num_epochs} epochs (from epoch {self.start_epoch}) on {where}, "
              f"{'fast graph' if self.fast else 'imperative'} path, {self.precision.name}: "
              f"{len(self.src_vocab)} source / {len(self.tgt_vocab)} target tokens, "
              f"{len(self.train_iter)} batches per epoch"
              + (f"; model directory {self.out_dir}" if self.out_dir else ""), file=self.log)
        self.tic = time.time()
        if self.resume and "rng_state" in self.summary:
            set_rng_state(self.summary["rng_state"])
        if progress:
            self.bar = ProgressBar(cfg.num_epochs, len(self.train_iter), self.start_epoch)
        # exact 0.17 and 1.0 draw their dropout from the one stream seeded once, as their code
        # does (a resumed run then differs)
        self.train_loss = MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=self.reduction)
        reseed = not (cfg.exact_chapter and cfg.edition != "0.11")
        try:
            result = train_s2s_ch8(
                self.model, self.train_iter, cfg.lr, cfg.num_epochs, ctxs, self.on_epoch,
                trainer=self.trainer, loss=self.train_loss, start_epoch=self.start_epoch,
                epoch_seed=self.seed * SEED_STRIDE if reseed else None,
                reseed_from=2 if cfg.exact_chapter else 1,  # exact: Xavier from the seed, as the book
                fast=self.fast, kvstore=self.kvstore, on_batch=self.bar,
                clip_per_token=cfg.clip_per_token, size_threads=not cfg.exact_chapter,
                work=self.work, precision=self.precision.name)  # exact: the book's threads
        finally:
            if self.bar is not None:
                self.bar.close()
        self.summary.update({k: result[k] for k in ("loss", "loss_per_token", "perplexity",
                                                    "tokens_per_sec", "ctx")})

    def on_epoch(self, epoch, loss):
        """After each epoch: the summary, validation, checkpoints; True stops (early stopping)."""
        nd.waitall()  # reads of a batch norm's statistics wait for their writer (docs/variants.md)
        summary = self.summary
        summary["epoch_history"].append(
            (epoch, loss) if self.edition_valid is None else
            (epoch, loss, validation_loss(self.model, self.edition_valid, self.train_loss,
                                          self.ctxs[0])))
        summary["train_seconds"] += time.time() - self.tic
        summary["epochs_done"] = epoch
        summary["rng_state"] = rng_state()  # the batch order's streams, for --resume
        if self.history is not None:
            self.history.add(epoch)
        improved = self.validate(epoch)
        stop = self.stopping.should_stop
        if stop:
            summary["stopped_early"] = epoch
        saved = self.writer and not stop and epoch < self.cfg.num_epochs and (
            improved or epoch % self.checkpoint_every == 0)
        if saved:  # the epoch with its validation and early-stopping count, once (the last
            self.save()  # or a stopping epoch is saved by `finish`: a crash repeats it)
        if self.writer and improved:  # OUT/best after OUT; a crash between: `keep_best`
            self.pending_best = self.sub_summary(best_epoch=epoch)
            if saved:
                self.save_sub("best", self.pending_best)
                self.pending_best = None
        self.tic = time.time()
        if not stop:
            return False
        stopping, out_dir = self.stopping, self.out_dir
        self.say(f"stopping after epoch {epoch}: no better valid BLEU in {self.patience} "
                 f"validations (best {stopping.best_bleu:.2f} at epoch {stopping.best_epoch}, "
                 f"kept in {os.path.join(out_dir, 'best') if out_dir else 'no model directory'})")
        return True  # `train_s2s_ch8` ends the training here

    def validate(self, epoch):
        """This epoch's validation (when one is due) into the summary, with the early-stopping
        count: True when its BLEU is the best so far."""
        if self.validator is None or epoch % self.valid_every:
            return False
        record = dict(self.validator(), epoch=epoch,
                      train_seconds=round(self.summary["train_seconds"], 1))
        self.summary["validation"].append(record)
        improved = self.stopping.update(epoch, record["valid_bleu"])
        self.summary["best"] = self.stopping.state()
        self.say(format_validation(epoch, record, improved))
        return improved

    def finish(self):
        """The end: OUT/average, the summary's last fields, the translations, the last save."""
        cfg, summary, ctx = self.cfg, self.summary, self.ctxs[0]
        averaged = self.average() if self.history is not None else None
        summary["epochs"] = cfg.num_epochs
        summary["history"] = [(e, loss) for e, loss, *_ in summary["epoch_history"] if e % 10 == 0]
        if self.edition_valid is not None:
            summary["val_loss"] = summary["epoch_history"][-1][2]
        if self.num_workers > 1:
            summary.update(num_workers=self.num_workers, kvstore=self.kvstore.type)
        if self.rank == 0 and cfg.pair != ("en", "fr"):  # the book's sentences are English
            summary["translations"] = corpus_translations(self.model, self.src_vocab,
                                                          self.tgt_vocab, cfg, ctx, self.tokenizer,
                                                          self.data.corpus.sources)
        elif self.rank == 0 and cfg.edition == "0.11":
            summary["translations"] = book_translations(self.model, self.src_vocab,
                                                        self.tgt_vocab, cfg, ctx, self.tokenizer)
        elif self.rank == 0:
            summary["translations"], summary["bleu"] = edition_translations(
                self.model, self.src_vocab, self.tgt_vocab, cfg, ctx)
        summary.update(edition=cfg.edition, architecture=cfg.architecture)
        summary["cpu_math"] = _runtime.cpu_math.describe(str(ctx))  # which kernels made these numbers
        if self.writer:
            self.save()
            if self.pending_best is not None:  # the last epoch was the best
                self.save_sub("best", self.pending_best)
            if averaged is not None:  # after OUT, as OUT/best: a run of one epoch saves OUT last
                arrays, sub = averaged
                with self.history.swapped_in(arrays):
                    self.save_sub("average", sub)

    def average(self):
        """The last ``average_last`` epochs' mean, validated, in the summary: returns ``(its
        arrays, OUT/average's summary)`` for `finish` to save after OUT."""
        history, average_last = self.history, self.average_last
        if len(history.epochs) < average_last:
            print(f"warning: averaging the last {len(history.epochs)} epochs, not "
                  f"{average_last} (this run trained only those)", file=self.log)
        arrays = history.average()
        with history.swapped_in(arrays):
            average = {"averaged_epochs": history.epochs}
            if self.validator is not None:
                average.update(self.validator())
                print(format_validation(f"average of epochs {history.epochs[0]}-"
                                        f"{history.epochs[-1]}", average, False), file=self.log)
        self.summary["average"] = average
        return arrays, self.sub_summary(average=average)

    def save(self):
        """``OUT`` with the trainer's states (a replaced run's OUT/best, OUT/average dropped)."""
        checkpoint.save(self.out_dir, self.model, self.src_vocab, self.tgt_vocab, self.cfg,
                        self.summary, self.trainer, self.tokenizer,
                        drop=() if self.carry else SUBMODELS)
        self.carry = True

    def sub_summary(self, **extra):
        """The summary of ``OUT/best`` or ``OUT/average`` as it is now, with `extra`."""
        sub = {k: v for k, v in self.summary.items() if k not in ("rng_state", "translations")}
        return copy.deepcopy(dict(sub, **extra))

    def save_sub(self, name, summary):
        """``OUT/best``, ``OUT/average``: model directories of their own."""
        path = os.path.join(self.out_dir, name)
        checkpoint.save(path, self.model, self.src_vocab, self.tgt_vocab, self.cfg, summary,
                        tokenizer=self.tokenizer)
        return path

    def say(self, line):
        """A line on the log, above the progress bar when there is one."""
        self.bar.write(line) if self.bar is not None else print(line, file=self.log)
