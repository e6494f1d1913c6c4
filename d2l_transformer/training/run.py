"""A whole training run (9.3.7), as ``d2l-transformer train`` and scripts/train_chapter.py run it:
data, model, the loop, checkpoints, resuming, the four translations the chapter prints."""

import os
import sys
import time

from mxnet import init
from tqdm import tqdm

from ..book import SENTENCES
from ..data import WordTokenizer, detokenize_words, load_data_nmt, load_data_split
from ..distributed.kvstore import announce_rank, create_kvstore, worker_info
from ..inference.decode import predict_s2s_ch8
from ..inference.translator import Translator
from ..io import checkpoint
from ..model import build_model
from .loop import rng_state, set_rng_state, set_seed, train_s2s_ch8
from .loss import MaskedSoftmaxCELoss
from .optim import make_trainer

SEED_STRIDE = 100000  # epoch e of a run with seed s draws from seed s * SEED_STRIDE + e


class RunError(ValueError):
    """A training run cannot start as asked; the message is one line."""


class TrainingStopped(Exception):
    """`train_model` stopped after epoch ``epoch`` because ``stop_after`` asked it to (the
    model directory holds the last checkpoint, as after a killed run)."""

    def __init__(self, epoch):
        super().__init__(f"stopped after epoch {epoch}")
        self.epoch = epoch


class ProgressBar:
    """One `tqdm` bar on stderr for the whole run: epoch, batches, loss (book units) and target
    tokens/s of the current epoch. It is a ``train_s2s_ch8`` ``on_batch`` callback, so the
    loss it shows is the one the loop reads every ``report_every`` batches (and at each
    epoch's end): the bar itself never reads the device."""

    def __init__(self, num_epochs, num_batches, start_epoch=1, file=None):
        file = file or sys.stderr
        tty = hasattr(file, "isatty") and file.isatty()
        self.num_epochs, self.num_batches, self.start_epoch = num_epochs, num_batches, start_epoch
        self.bar = tqdm(total=num_epochs * num_batches, initial=(start_epoch - 1) * num_batches,
                        unit="batch", file=file, mininterval=0.1 if tty else 30, dynamic_ncols=tty)
        self.epoch, self.tic = None, time.time()

    def __call__(self, epoch, done, sums):
        if epoch != self.epoch:
            self.epoch, self.tic = epoch, time.time()
            self.bar.set_description(f"epoch {epoch}/{self.num_epochs}", refresh=False)
        self.bar.update((epoch - 1) * self.num_batches + done - self.bar.n)
        if sums is not None:
            loss_sum, num_tokens = sums
            speed = num_tokens / max(time.time() - self.tic, 1e-9)
            self.bar.set_postfix_str(f"loss {loss_sum / max(num_tokens, 1):.4f}, "
                                     f"{speed:.0f} tokens/s", refresh=False)

    def close(self):
        self.bar.close()


def check_out_dir(out_dir, *, resume=False, overwrite=False):
    """Refuse (RunError, one line, before anything is written) a model directory a run may
    not write: a file; a directory that is not a model directory this package wrote
    (`checkpoint.is_model_dir`; an empty one is fine, the current directory never); a model
    directory unless the run continues it (``resume``) or replaces it (``overwrite``), as
    Sockeye's ``--output`` does. A missing path is fine."""
    if out_dir is None:
        return
    if resume and overwrite:
        raise RunError("--resume continues the model in the directory, --overwrite replaces "
                       "it: give one of them")
    path = os.path.abspath(out_dir)
    if checkpoint.is_model_dir(path):
        if not (resume or overwrite):
            raise RunError(f"{out_dir} already holds a trained model: give --resume to continue "
                           "it, --overwrite to replace it, or another --out")
        return
    if resume:
        return  # the load says what is wrong with the directory
    try:
        checkpoint.atomic.check_replaceable(path)
    except checkpoint.atomic.NotReplaceable:
        what = "a directory that is not a model directory" if os.path.isdir(path) else "a file"
        raise RunError(f"{out_dir} is {what}; training writes a model directory only into a "
                       "new or empty directory (nothing was changed)") from None
    if os.path.isdir(path) and os.path.realpath(path) == os.path.realpath(os.getcwd()):
        raise RunError(f"{out_dir} is the current directory: give a subdirectory for the "
                       "model directory")


def load_data(cfg, batch_size, data_path=None, *, rank=0, num_workers=1, fast=False,
              tokenizer=None):
    """``(src_vocab, tgt_vocab, train_iter, tokenizer)`` for `cfg`: the chapter's pairs
    (`load_data_nmt`), or the preset's own split, tokenizer and buckets (`load_data_split`)
    when it has them. ``tokenizer``: the one a resumed run was trained with (else `cfg`'s,
    a subword one trained on the training part)."""
    if cfg.num_valid or cfg.num_test or cfg.num_buckets:
        data = load_data_split(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.min_freq, cfg.num_valid,
            cfg.num_test, cfg.num_buckets, data_path, rank=rank, num_workers=num_workers,
            tokenizer=tokenizer or cfg.tokenizer, vocab_size=cfg.vocab_size, split_by=cfg.split_by)
        return data.src_vocab, data.tgt_vocab, data.train_iter, data.tokenizer
    return load_data_nmt(batch_size, cfg.num_steps, cfg.num_examples, data_path, rank=rank,
                         num_workers=num_workers, fast_loader=fast) + (WordTokenizer(),)


def book_translations(model, src_vocab, tgt_vocab, cfg, ctx, tokenizer=None):
    """The chapter's four sentences translated by its `predict_s2s_ch8` (in exact mode with the
    chapter's behaviour): ``{sentence: translation}``. A subword model gets them as text
    (``Go.``) through its tokenizer, greedy, and answers in text."""
    if tokenizer is not None and tokenizer.kind != "word":
        translator = Translator(model, src_vocab, tgt_vocab, ctx, num_steps=cfg.num_steps)
        hyps = translator.translate([tokenizer.encode(detokenize_words(s)) for s in SENTENCES])
        return {s: tokenizer.decode(h.tokens) for s, h in zip(SENTENCES, hyps)}
    return {s: predict_s2s_ch8(model, s, src_vocab, tgt_vocab, cfg.num_steps, ctx)
            for s in SENTENCES}


def train_model(cfg, out_dir=None, *, seed=0, ctx, kvstore="device", fast=True, resume=False,
                data_path=None, checkpoint_every=1, progress=True, preset=None, stop_after=None,
                log=None, overwrite=False):
    """Train `cfg` from seed `seed` and return its summary (what summary.json holds).

    The one way a chapter run trains: seed everything with `seed`, load the data, build the
    model, Xavier-initialise it, then `train_s2s_ch8` with MXNet's RNG reseeded at each epoch
    (``seed * SEED_STRIDE + epoch``) and NumPy's and Python's streams (the batch order) saved
    with every checkpoint, so that a run resumed at an epoch boundary repeats an uninterrupted
    one exactly, and a run with dropout 0 is the chapter's seeded run (set once, as the book's
    script does). ``fast`` (the default) trains on the hybridized graph path; the
    chapter's imperative loop runs with ``fast=False`` and always in exact mode
    (``cfg.exact_chapter``). The summary ends with the chapter's four translations.

    ``ctx``: a context or a list (data parallel). ``kvstore``: a name or a dist kvstore
    (`create_kvstore`); with several workers only rank 0 writes and translates. ``out_dir``:
    the model directory, saved every ``checkpoint_every`` epochs and at the end (None: not
    saved); ``resume``: continue the run saved there; ``overwrite``: replace the model saved
    there (without either, an existing model directory is refused: `check_out_dir`, which also
    refuses any directory that is not a model directory). ``progress``: a `ProgressBar` on stderr.
    ``log``: where the one-line status messages go (stderr). ``stop_after`` (tests of resume):
    raise `TrainingStopped` after that epoch's checkpoint, as if the run had been killed.

    Raises RunError or CheckpointError (one line) for a run that cannot start as asked.
    """
    log = log or sys.stderr
    check_out_dir(out_dir, resume=resume, overwrite=overwrite)
    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx]
    fast = fast and not cfg.exact_chapter  # the book's bugs live in the imperative code
    if resume and out_dir is None:
        raise RunError("resuming needs the model directory of the run")
    kvstore = create_kvstore(kvstore) if isinstance(kvstore, str) or kvstore is None else kvstore
    rank, num_workers = worker_info(kvstore)
    if num_workers > 1:  # `launch` prefixes this worker's lines with its rank from now on
        announce_rank(kvstore)
    batch_size = cfg.batch_size // num_workers  # the preset's batch is the GLOBAL batch
    if batch_size < len(ctxs):
        raise RunError(f"batch size {cfg.batch_size} is too small for {num_workers} workers "
                       f"x {len(ctxs)} devices")
    set_seed(seed)
    tokenizer = checkpoint.load_tokenizer(out_dir, cfg) if resume else None
    src_vocab, tgt_vocab, train_iter, tokenizer = load_data(
        cfg, batch_size, data_path, rank=rank, num_workers=num_workers, fast=fast,
        tokenizer=tokenizer)
    writer = rank == 0 and out_dir is not None  # only rank 0 writes the model directory
    if resume:
        model, saved_src, saved_tgt, _, summary = checkpoint.load(out_dir, ctxs)
        if saved_src.idx_to_token != src_vocab.idx_to_token or \
                saved_tgt.idx_to_token != tgt_vocab.idx_to_token:
            raise checkpoint.CheckpointError(f"{out_dir}: its vocabularies differ from the data's; "
                                             "was it trained on another dataset?")
        if summary.get("seed") != seed:
            raise checkpoint.CheckpointError(f"{out_dir} was trained with --seed "
                                             f"{summary.get('seed')}, not {seed}")
        trainer = make_trainer(model, cfg.lr, cfg.warmup_steps, kvstore)
        checkpoint.load_trainer_states(out_dir, trainer)
        start_epoch = summary["epochs_done"] + 1
        if start_epoch > cfg.num_epochs:
            print(f"{out_dir} has already been trained {summary['epochs_done']} epochs; "
                  "give a larger --epochs to train on", file=log)
            return summary
    else:
        model = build_model(cfg, len(src_vocab), len(tgt_vocab))
        model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
        trainer = make_trainer(model, cfg.lr, cfg.warmup_steps, kvstore)
        summary = {"seed": seed, "preset": preset, "exact_chapter": cfg.exact_chapter,
                   "epoch_history": [], "train_seconds": 0.0, "epochs_done": 0}
        start_epoch = 1
    summary["fast"] = fast
    where = ",".join(map(str, ctxs)) + (f", worker {rank} of {num_workers}" if num_workers > 1 else "")
    print(f"training {cfg.num_epochs} epochs (from epoch {start_epoch}) on {where}, "
          f"{'fast graph' if fast else 'imperative'} path: {len(src_vocab)} source / "
          f"{len(tgt_vocab)} target tokens, {len(train_iter)} batches per epoch"
          + (f"; model directory {out_dir}" if out_dir else ""), file=log)
    tic = [time.time()]

    def save():
        checkpoint.save(out_dir, model, src_vocab, tgt_vocab, cfg, summary, trainer, tokenizer)

    def on_epoch(epoch, loss):
        summary["epoch_history"].append((epoch, loss))
        summary["train_seconds"] += time.time() - tic[0]
        summary["epochs_done"] = epoch
        summary["rng_state"] = rng_state()  # the batch order's streams, for --resume
        if writer and (epoch % checkpoint_every == 0 or epoch == cfg.num_epochs):
            save()
        tic[0] = time.time()
        if stop_after and epoch >= stop_after:
            raise TrainingStopped(epoch)

    if resume and "rng_state" in summary:
        set_rng_state(summary["rng_state"])
    bar = ProgressBar(cfg.num_epochs, len(train_iter), start_epoch) if progress else None
    try:
        result = train_s2s_ch8(
            model, train_iter, cfg.lr, cfg.num_epochs, ctxs, on_epoch, trainer=trainer,
            loss=MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=cfg.loss_reduction),
            start_epoch=start_epoch,
            epoch_seed=seed * SEED_STRIDE, fast=fast, kvstore=kvstore, on_batch=bar)
    finally:
        if bar is not None:
            bar.close()
    summary.update({k: result[k] for k in ("loss", "loss_per_token", "perplexity", "tokens_per_sec",
                                           "ctx")})
    summary["epochs"] = cfg.num_epochs
    summary["history"] = [(e, loss) for e, loss in summary["epoch_history"] if e % 10 == 0]
    if num_workers > 1:
        summary.update(num_workers=num_workers, kvstore=kvstore.type)
    if rank == 0:
        summary["translations"] = book_translations(model, src_vocab, tgt_vocab, cfg, ctxs[0],
                                                    tokenizer)
    if writer:
        save()
    return summary
