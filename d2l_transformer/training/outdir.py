"""The model directory a training run writes: which one it may write (`check_out_dir`), and
what a resumed run keeps of it (`recorded_precision`, `keep_best`)."""

import os

from .. import checkpoint


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


def recorded_precision(out_dir, cfg):
    """What the run saved in `out_dir` computed, kept when resumed unless `cfg` asks again
    (another ``precision`` than its saved config's: None)."""
    if checkpoint.load_config(out_dir).precision != cfg.precision:
        return None
    return (checkpoint.load_summary(out_dir).get("precision") or {}).get("precision")


def keep_best(out_dir, summary, save_best):
    """A resumed run whose last checkpoint is its best epoch, killed before OUT/best was
    written: `save_best` (epoch) writes it now, from that checkpoint (the same parameters)."""
    best = (summary.get("best") or {}).get("best_epoch")
    if best is None or best != summary["epochs_done"]:
        return
    try:
        if checkpoint.load_summary(os.path.join(out_dir, "best")).get("best_epoch") == best:
            return
    except checkpoint.CheckpointError:
        pass  # not written
    save_best(best)
