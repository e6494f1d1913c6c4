"""A whole training run (9.3.7), as ``d2l-transformer train`` and scripts/train_chapter.py run it:
data, model, the loop, checkpoints, resuming, the four translations the chapter prints."""

import contextlib
import os
import sys
import time

from mxnet import init

from .. import _cpu_math, checkpoint
from ..book import EDITIONS, SENTENCES
from ..build import build_model
from ..data import (
    WordTokenizer,
    detokenize_words,
    load_data_mt_fra_eng,
    load_data_nmt,
    load_data_split,
    split_corpus,
)
from ..distributed.kvstore import announce_rank, create_kvstore, worker_info
from ..evaluate import bleu
from ..inference.decode import chapter_greedy, predict_s2s_ch8, predict_step
from ..inference.engines import translator_options
from ..inference.limits import chapter_only
from ..inference.translator import Translator
from ..io import lock
from .loop import check_one_device, rng_state, set_rng_state, set_seed, train_s2s_ch8
from .loss import MaskedSoftmaxCELoss
from .optim import config_trainer
from .progress import ProgressBar
from .validation import (
    EarlyStopping,
    LastParameters,
    Validator,
    format_validation,
    validation_loss,
)

SUBMODELS = ("best", "average")  # model directories inside a run's model directory
SEED_STRIDE = 100000  # epoch e of a run with seed s draws from seed s * SEED_STRIDE + e


class RunError(ValueError):
    """A training run cannot start as asked; the message is one line."""


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
    """``(src_vocab, tgt_vocab, train_iter, tokenizer, valid_iter)`` for `cfg`: the chapter's
    pairs (`load_data_nmt`, as `cfg.edition`'s d2l prepares them; d2l 1.0's
    `load_data_mt_fra_eng`, whose ``valid_iter`` holds its validation pairs, else None), or
    the preset's own split, tokenizer and buckets (`load_data_split`) when it has them.
    ``tokenizer``: the one a resumed run was trained with (else `cfg`'s, a subword one trained
    on the training part)."""
    if cfg.edition == "1.0":
        if num_workers > 1:
            raise RunError("edition 1.0 trains in one process (its validation is d2l's)")
        src_vocab, tgt_vocab, train_iter, valid_iter = load_data_mt_fra_eng(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.num_valid, data_path,
            fast_loader=fast)
        return src_vocab, tgt_vocab, train_iter, WordTokenizer("1.0"), valid_iter
    if cfg.num_valid or cfg.num_test or cfg.num_buckets:
        data = load_data_split(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.min_freq, cfg.num_valid,
            cfg.num_test, cfg.num_buckets, data_path, rank=rank, num_workers=num_workers,
            tokenizer=tokenizer or cfg.tokenizer, vocab_size=cfg.vocab_size, split_by=cfg.split_by)
        return data.src_vocab, data.tgt_vocab, data.train_iter, data.tokenizer, None
    return load_data_nmt(batch_size, cfg.num_steps, cfg.num_examples, data_path, rank=rank,
                         num_workers=num_workers, fast_loader=fast, min_freq=cfg.min_freq,
                         edition=cfg.edition) + (WordTokenizer(cfg.edition), None)


def book_translations(model, src_vocab, tgt_vocab, cfg, ctx, tokenizer=None):
    """The chapter's four sentences translated by its `predict_s2s_ch8` (in exact mode with the
    chapter's behaviour): ``{sentence: translation}``. A subword model gets them as text
    (``Go.``) through its tokenizer, greedy, and answers in text."""
    if tokenizer is not None and tokenizer.kind != "word":
        translator = Translator(model, src_vocab, tgt_vocab, ctx, **translator_options(cfg))
        hyps = translator.translate([tokenizer.encode(detokenize_words(s)) for s in SENTENCES])
        return {s: tokenizer.decode(h.tokens) for s, h in zip(SENTENCES, hyps)}
    return {s: predict_s2s_ch8(model, s, src_vocab, tgt_vocab, cfg.num_steps, ctx)
            for s in SENTENCES}


def edition_translations(model, src_vocab, tgt_vocab, cfg, ctx):
    """The later editions' four sentences as their prediction cells translate and score them:
    ``({sentence: translation}, {sentence: d2l's bleu with k=2})``. Exact 0.17: its
    ``predict_seq2seq`` (`chapter_greedy` on the source and ``<eos>``); exact 1.0: its
    ``predict_step`` (`predict_step`: the four as one batch); corrected: the `Translator`,
    greedy, nothing masked."""
    references = EDITIONS[cfg.edition]["references"]
    sources = [s.split(" ") + ["<eos>"] for s in references]
    if not chapter_only(cfg):
        translator = Translator(model, src_vocab, tgt_vocab, ctx, num_steps=cfg.num_steps,
                                max_length=cfg.num_steps, suppress=False)
        outs = [hyp.tokens for hyp in translator.translate(sources)]
    elif cfg.edition == "0.17":
        outs = [chapter_greedy(model, s, src_vocab, tgt_vocab, cfg.num_steps, ctx) for s in sources]
    else:
        outs = predict_step(model, sources, src_vocab, tgt_vocab, cfg.num_steps, ctx)
    translations = {s: " ".join(out) for s, out in zip(references, outs)}
    return translations, {s: bleu(translations[s], ref, 2) for s, ref in references.items()}


def train_model(cfg, out_dir=None, *, seed=0, ctx, kvstore="device", fast=True, resume=False,
                data_path=None, checkpoint_every=1, progress=True, preset=None, log=None,
                valid_every=None, patience=None, average_last=None, overwrite=False):
    """Train `cfg` from seed `seed` and return its summary (what summary.json holds).

    The one way a chapter run trains: seed everything with `seed`, load the data, build the
    model, Xavier-initialise it, then `train_s2s_ch8` with MXNet's RNG reseeded at each epoch
    (``seed * SEED_STRIDE + epoch``) and NumPy's and Python's streams (the batch order) saved
    with every checkpoint, so that a run resumed at an epoch boundary repeats an uninterrupted
    one exactly. ``fast`` (the default) trains on the hybridized graph path; the
    chapter's imperative loop runs with ``fast=False`` and always in exact mode
    (``cfg.exact_chapter``). The summary ends with the chapter's four translations.

    Exact mode is the chapter's own seeded run, epoch for epoch: epoch 1 is not reseeded, so
    the deferred Xavier initialisation at its first batch draws from MXNet's stream seeded
    once with `seed`, as in the chapter's code seeded before its training cell (from epoch 2
    on, MXNet's stream feeds only dropout, which the chapter sets to 0; reseeding there keeps
    ``resume`` exact for any dropout). Same per-epoch loss bit for bit and the same
    translations as scripts/chapter_oracle.py on the same machine (tests/test_exact_run.py).

    ``ctx``: a context or a list (data parallel). ``kvstore``: a name or a dist kvstore
    (`create_kvstore`); with several workers only rank 0 writes and translates. ``out_dir``:
    the model directory, saved every ``checkpoint_every`` epochs and at the end (None: not
    saved); ``resume``: continue the run saved there; ``overwrite``: replace the model saved
    there (without either, an existing model directory is refused: `check_out_dir`, which also
    refuses any directory that is not a model directory). While the run trains ``out_dir`` it
    holds its lock (`io.lock`, taken before anything is written): a second run into the same
    directory is refused at once. ``progress``: a `ProgressBar` on stderr.
    ``log``: where the one-line status messages go (stderr).

    Validation (`validation.Validator`, for a config with a valid part): every ``valid_every``
    epochs (None: 1 when ``cfg.num_valid``, else never; 0: never) the valid loss and greedy
    BLEU of the first ``cfg.valid_sentences`` valid pairs, logged and kept in the summary's
    ``validation`` list; the best by BLEU is saved as the model directory ``OUT/best``
    (`checkpoint.save`); ``patience``: stop after that many validations without a better
    BLEU. ``average_last`` = N: at the end, ``OUT/average`` holds the average of the last N
    epochs' parameters (validated too, when validation is on). A warning when the warmup is
    longer than the whole run (the learning rate would never reach ``cfg.lr``).

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
    # exact 1.0: d2l 1.0's loss, the mean over every position of a batch, on one device
    reduction = "mean" if "loss_over_padding" in cfg.bugs else cfg.loss_reduction
    try:
        check_one_device(reduction, ctxs, kvstore)
    except ValueError as e:
        raise RunError(str(e)) from None
    writer = rank == 0 and out_dir is not None  # only rank 0 writes the model directory
    with contextlib.ExitStack() as held:
        if writer:  # one writer per model directory, from before anything is written
            try:
                held.enter_context(lock.locked(out_dir, "trained"))
            except lock.Locked as e:
                raise RunError(str(e)) from None
            check_out_dir(out_dir, resume=resume, overwrite=overwrite)  # again, under the lock
        _cpu_math.settle(cfg)  # oneDNN's instruction set, before this process's first kernel
        set_seed(seed)
        tokenizer = checkpoint.load_tokenizer(out_dir, cfg) if resume else None
        src_vocab, tgt_vocab, train_iter, tokenizer, edition_valid = load_data(
            cfg, batch_size, data_path, rank=rank, num_workers=num_workers, fast=fast,
            tokenizer=tokenizer)
        updates = len(train_iter) * cfg.num_epochs
        if cfg.warmup_steps > updates:
            print(f"warning: warmup_steps {cfg.warmup_steps} is longer than the whole run "
                  f"({len(train_iter)} batches x {cfg.num_epochs} epochs = {updates} updates): the "
                  f"learning rate never reaches lr {cfg.lr}; give e.g. --set "
                  f"warmup_steps={max(1, updates // 4)}, or more --epochs or data", file=log)
        if valid_every is None:
            valid_every = 1 if cfg.num_valid and edition_valid is None else 0
        if valid_every and edition_valid is not None:
            raise RunError("edition 1.0 validates as d2l 1.0 does (its loss every epoch): "
                           "--valid-every is not for it")
        if valid_every and not cfg.num_valid:
            raise RunError("--valid-every needs a valid part: this config has num_valid 0 (give "
                           "e.g. --set num_valid=2000)")
        if patience is not None and not valid_every:
            raise RunError("--patience needs validation (--valid-every N, and a valid part)")
        if resume:
            model, saved_src, saved_tgt, _, summary = checkpoint.load(out_dir, ctxs)
            if saved_src.idx_to_token != src_vocab.idx_to_token or \
                    saved_tgt.idx_to_token != tgt_vocab.idx_to_token:
                raise checkpoint.CheckpointError(f"{out_dir}: its vocabularies differ from the data's; "
                                                 "was it trained on another dataset?")
            if summary.get("seed") != seed:
                raise checkpoint.CheckpointError(f"{out_dir} was trained with --seed "
                                                 f"{summary.get('seed')}, not {seed}")
            trainer = config_trainer(model, cfg, kvstore)
            checkpoint.load_trainer_states(out_dir, trainer)
            start_epoch = summary["epochs_done"] + 1
            if start_epoch > cfg.num_epochs:
                print(f"{out_dir} has already been trained {summary['epochs_done']} epochs; "
                      "give a larger --epochs to train on", file=log)
                return summary
        else:
            model = build_model(cfg, len(src_vocab), len(tgt_vocab))
            if cfg.edition == "1.0":  # its encoder and decoder call initialize(): Uniform(0.07)
                model.encoder.initialize(ctx=ctxs)
                model.decoder.initialize(ctx=ctxs)
            else:
                model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
            trainer = config_trainer(model, cfg, kvstore)
            summary = {"seed": seed, "preset": preset, "exact_chapter": cfg.exact_chapter,
                       "epoch_history": [], "train_seconds": 0.0, "epochs_done": 0}
            start_epoch = 1
        summary["fast"] = fast
        validator = Validator(model, split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test,
                                                  data_path, cfg.split_by).valid,
                              tokenizer, src_vocab, tgt_vocab, cfg, ctxs[0]) if valid_every else None
        stopping = EarlyStopping.from_state(patience, summary.get("best"))
        history = LastParameters(model, average_last) if average_last else None
        if validator is not None:
            summary.setdefault("validation", [])
        where = ",".join(map(str, ctxs)) + (f", worker {rank} of {num_workers}" if num_workers > 1 else "")
        print(f"training {cfg.num_epochs} epochs (from epoch {start_epoch}) on {where}, "
              f"{'fast graph' if fast else 'imperative'} path: {len(src_vocab)} source / "
              f"{len(tgt_vocab)} target tokens, {len(train_iter)} batches per epoch"
              + (f"; model directory {out_dir}" if out_dir else ""), file=log)
        tic = [time.time()]

        carry = [resume]  # OUT/best and OUT/average of a model this run replaces are not its own

        def save():
            checkpoint.save(out_dir, model, src_vocab, tgt_vocab, cfg, summary, trainer, tokenizer,
                            keep=SUBMODELS if carry[0] else ())
            carry[0] = True

        def save_sub(name, **extra):  # OUT/best, OUT/average: model directories of their own
            path = os.path.join(out_dir, name)
            sub = {k: v for k, v in summary.items() if k not in ("rng_state", "translations")}
            checkpoint.save(path, model, src_vocab, tgt_vocab, cfg, dict(sub, **extra),
                            tokenizer=tokenizer)
            return path

        def say(line):
            if bar is not None:
                bar.write(line)
            else:
                print(line, file=log)

        def on_epoch(epoch, loss):
            summary["epoch_history"].append((epoch, loss) if edition_valid is None else
                                            (epoch, loss, validation_loss(model, edition_valid,
                                                                          train_loss, ctxs[0])))
            summary["train_seconds"] += time.time() - tic[0]
            summary["epochs_done"] = epoch
            summary["rng_state"] = rng_state()  # the batch order's streams, for --resume
            if history is not None:
                history.add(epoch)
            improved = False
            if validator is not None and epoch % valid_every == 0:
                record = dict(validator(), epoch=epoch, train_seconds=round(summary["train_seconds"], 1))
                summary["validation"].append(record)
                improved = stopping.update(epoch, record["valid_bleu"])
                summary["best"] = stopping.state()
                say(format_validation(epoch, record, improved))
            if writer and (epoch % checkpoint_every == 0 or epoch == cfg.num_epochs or improved):
                save()
            if writer and improved:
                save_sub("best", best_epoch=epoch)
            tic[0] = time.time()
            if stopping.should_stop:
                summary["stopped_early"] = epoch
                say(f"stopping after epoch {epoch}: no better valid BLEU in {patience} validations "
                    f"(best {stopping.best_bleu:.2f} at epoch {stopping.best_epoch}, kept in "
                    f"{os.path.join(out_dir, 'best') if out_dir else 'no model directory'})")
                return True  # `train_s2s_ch8` ends the training here
            return False

        if resume and "rng_state" in summary:
            set_rng_state(summary["rng_state"])
        bar = ProgressBar(cfg.num_epochs, len(train_iter), start_epoch) if progress else None
        # exact 0.17 and 1.0 draw their dropout from the one stream seeded once, as their code
        # does (a resumed run then differs)
        train_loss = MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=reduction)
        reseed = not (cfg.exact_chapter and cfg.edition != "0.11")
        try:
            result = train_s2s_ch8(
                model, train_iter, cfg.lr, cfg.num_epochs, ctxs, on_epoch, trainer=trainer,
                loss=train_loss, start_epoch=start_epoch,
                epoch_seed=seed * SEED_STRIDE if reseed else None,
                reseed_from=2 if cfg.exact_chapter else 1,  # exact: Xavier from the seed, as the book
                fast=fast, kvstore=kvstore, on_batch=bar, clip_per_token=cfg.clip_per_token,
                size_threads=not cfg.exact_chapter)  # exact: the book's code's threads
        finally:
            if bar is not None:
                bar.close()
        summary.update({k: result[k] for k in ("loss", "loss_per_token", "perplexity", "tokens_per_sec",
                                               "ctx")})
        if history is not None:
            if len(history.epochs) < average_last:
                print(f"warning: averaging the last {len(history.epochs)} epochs, not "
                      f"{average_last} (this run trained only those)", file=log)
            with history.swapped_in(history.average()):
                average = {"averaged_epochs": history.epochs}
                if validator is not None:
                    average.update(validator())
                    print(format_validation(f"average of epochs {history.epochs[0]}-"
                                            f"{history.epochs[-1]}", average, False), file=log)
                summary["average"] = average
                if writer:
                    save_sub("average", **{"average": average})
        summary["epochs"] = cfg.num_epochs
        summary["history"] = [(e, loss) for e, loss, *_ in summary["epoch_history"] if e % 10 == 0]
        if edition_valid is not None:
            summary["val_loss"] = summary["epoch_history"][-1][2]
        if num_workers > 1:
            summary.update(num_workers=num_workers, kvstore=kvstore.type)
        if rank == 0 and cfg.edition == "0.11":
            summary["translations"] = book_translations(model, src_vocab, tgt_vocab, cfg, ctxs[0],
                                                        tokenizer)
        elif rank == 0:
            summary["translations"], summary["bleu"] = edition_translations(
                model, src_vocab, tgt_vocab, cfg, ctxs[0])
        summary["edition"] = cfg.edition
        summary["cpu_math"] = _cpu_math.describe(str(ctxs[0]))  # which kernels made these numbers
        if writer:
            save()
        return summary
