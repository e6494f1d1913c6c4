"""Checkpoint averaging (Vaswani et al. 2017 averaged the last 5): the element-wise mean of the
parameters in the last N Gluon ``.params`` files (`training.averaging.average_arrays`), written
atomically to a new file."""

import os
import tempfile

import mxnet as mx

from ..io import atomic
from ..training.averaging import average_arrays


def average_params(paths):
    """{name: mean NDArray} over the ``mx.nd.load``-ed parameter files in `paths`."""
    if not paths:
        raise ValueError("no checkpoints to average")
    return average_arrays([mx.nd.load(p) for p in paths], list(paths))


def average_checkpoints(paths, out_path, last=None):
    """Average the last `last` (default all) of `paths` (oldest first) into `out_path`.

    The file is written atomically (`atomic.write_file`: temporary name, fsync, rename), so a
    crash never leaves a half-written checkpoint. Returns the paths that were averaged.
    """
    paths = list(paths)[-last:] if last else list(paths)
    averaged = average_params(paths)
    atomic.write_file(out_path, lambda tmp: mx.nd.save(tmp, averaged))
    return paths


def average_model_dirs(directories, out_dir, last=None):
    """Average the last `last` model directories (`checkpoint.save`'s format, oldest
    first) into a new model directory `out_dir`, with the newest one's vocabularies and config.

    Every input is loaded (and so validated) by `checkpoint.load` first; the output is written
    atomically by `checkpoint.save`. Returns `out_dir`.
    """
    from .. import checkpoint  # model directories, only here

    directories = list(directories)[-last:] if last else list(directories)
    if not directories:
        raise ValueError("no model directories to average")
    for d in directories:
        checkpoint.load(d)
    model, src_vocab, tgt_vocab, cfg, summary = checkpoint.load(directories[-1])
    averaged = average_params([os.path.join(d, checkpoint.PARAMS) for d in directories])
    fd, tmp = tempfile.mkstemp(suffix=".params")
    os.close(fd)
    try:
        mx.nd.save(tmp, averaged)
        model.load_parameters(tmp)
    finally:
        os.remove(tmp)
    summary = dict(summary, averaged_from=[os.path.abspath(d) for d in directories])
    return checkpoint.save(out_dir, model, src_vocab, tgt_vocab, cfg, summary)
