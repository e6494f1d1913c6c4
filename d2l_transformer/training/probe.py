"""How fast a run's training step is in each precision on this CPU: a few fast-path steps of a
throwaway model of the run's config and vocabularies, on a synthetic batch of its largest
shape, timed in alternating order (`time_steps`). `training.precision`'s ``auto`` takes the
faster by these figures (docs/benchmarks.md, "bfloat16": a flag says a CPU has bfloat16
units, only a measurement says they pay).

The probe draws its batch from a private NumPy stream and the model's initialisation and
dropout from MXNet's; its caller (`precision.settle`) puts the random streams back as the run
expects them.
"""

import os
import statistics
import time

import mxnet as mx
import numpy as onp
from mxnet import init

from ..build import build_model
from .loss import MaskedSoftmaxCELoss
from .optim import config_trainer
from .steps import _fast_step

# untimed steps of each precision: tracing, first allocation, and oneDNN's bfloat16 primitives,
# whose steps settle at the fourth (the `hour` step on the Bible: 2.2, 0.71, 0.62, 0.78, then
# 0.59-0.62 s; float32 0.81 s from the second: docs/benchmarks.md, "bfloat16")
WARMUP = 3
ROUNDS, MOST_ROUNDS, LEAST_SECONDS = 5, 15, 2.0  # timed: 5 rounds, more while a precision's
# timed steps add up to less than 2 s (short steps: a burst of another job weighs less)
RESERVED = 4  # the vocabularies' first ids: <unk>, <pad>, <bos>, <eos>
# the config's fields that change the step's graph (the cache key names their values)
GRAPH_FIELDS = ("num_layers", "embedding_size", "ffn_hidden_size", "num_heads", "dropout",
                "pre_norm", "norm", "fixnorm", "layerdrop", "drophead", "fused_qkv",
                "pos_encoding", "tie_embeddings", "label_smoothing", "loss_reduction")


def largest_shape(cfg, batches=None):
    """``(rows, src_width, tgt_width)``: the largest of the shapes `batches` can have (its
    ``shapes``, bucketed data: by padded positions), else ``batch_size`` x ``num_steps``."""
    shapes = getattr(batches, "shapes", None)
    if shapes:
        return max(shapes, key=lambda s: (s[0] * (s[1] + s[2]), s))
    return cfg.batch_size, cfg.num_steps, cfg.num_steps


def synthetic_batch(shape, src_size, tgt_size, seed=0):
    """``(X, X_valid_len, Y, Y_valid_len)`` of `shape` (rows, source width, target width, the
    target with <bos> and <eos>), ids and lengths drawn from a private NumPy stream."""
    rows, src_width, tgt_width = shape
    draw = onp.random.RandomState(seed)
    X = draw.randint(RESERVED, max(src_size, RESERVED + 1), (rows, src_width))
    Y = draw.randint(RESERVED, max(tgt_size, RESERVED + 1), (rows, tgt_width))
    X_len = draw.randint((src_width + 1) // 2, src_width + 1, rows)
    Y_len = draw.randint(max(2, (tgt_width + 1) // 2), max(2, tgt_width) + 1, rows)
    return tuple(mx.np.array(a, dtype="float32") for a in (X, X_len, Y, Y_len))


def training_step(cfg, src_size, tgt_size, precision):
    """The fast path's training step (`steps._fast_step`) of a new model of `cfg`."""
    model = build_model(cfg, src_size, tgt_size)
    model.initialize(init.Xavier(), ctx=mx.cpu())
    loss = MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=cfg.loss_reduction)
    return _fast_step(model, config_trainer(model, cfg), loss, cfg.clip_per_token, precision)


def timed(step, batch):
    """Seconds of one step on `batch`, its update included (waits for every operator)."""
    X, X_len, Y, Y_len = batch
    tic = time.perf_counter()
    step(X, X_len, Y[:, :-1], Y[:, 1:], Y_len - 1)
    mx.nd.waitall()
    return time.perf_counter() - tic


def time_steps(cfg, src_size, tgt_size, shape, precisions=("float32", "bfloat16")):
    """``{precision: [seconds of each timed step]}``: `WARMUP` untimed then `ROUNDS` timed
    steps of a model of `cfg` per precision (more, up to `MOST_ROUNDS`, while a precision's
    add up to less than `LEAST_SECONDS`), on one synthetic batch of `shape`
    (`synthetic_batch`), the precisions in alternating order, on this process's threads."""
    batch = synthetic_batch(shape, src_size, tgt_size)
    steps = {name: training_step(cfg, src_size, tgt_size, name) for name in precisions}
    for _ in range(WARMUP):
        for step in steps.values():
            timed(step, batch)
    seconds, r = {name: [] for name in precisions}, 0
    while r < ROUNDS or (r < MOST_ROUNDS and min(map(sum, seconds.values())) < LEAST_SECONDS):
        for name in precisions if r % 2 == 0 else precisions[::-1]:
            seconds[name].append(timed(steps[name], batch))
        r += 1
    return seconds


def medians(seconds):
    """``{precision: median seconds}`` of `time_steps`' figures."""
    return {name: statistics.median(s) for name, s in seconds.items()}


def onednn_version():
    """The version of MXNet's oneDNN, from the header its wheel ships, or None."""
    header = os.path.join(os.path.dirname(mx.__file__), "include", "mkldnn", "oneapi", "dnnl",
                          "dnnl_version.h")
    try:
        with open(header) as f:
            found = dict(line.split()[1:3] for line in f if line.startswith("#define DNNL_VERSION_")
                         and len(line.split()) >= 3)
    except OSError:
        return None
    parts = [found.get(f"DNNL_VERSION_{k}") for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts) if all(parts) else None


def key_parts(cfg, src_size, tgt_size, shape, threads):
    """What the figures depend on besides the machine (`io.measured.key`): MXNet's and
    oneDNN's versions, the model's graph (`GRAPH_FIELDS`), vocabularies, the batch's shape and
    the thread count."""
    return {"mxnet": mx.__version__, "onednn": onednn_version(),
            "model": ", ".join(f"{k} {getattr(cfg, k)}" for k in GRAPH_FIELDS),
            "vocabularies": f"{src_size}/{tgt_size}", "batch": "x".join(map(str, shape)),
            "threads": threads}
