"""The precision of a training run's matrix products, decided once per run (`settle`).

``float32``: every operator in float32, the chapter's arithmetic. ``bfloat16``: the graph
path's matrix products (the Dense layers' FullyConnected, `fused.Bfloat16Dense`) take their
input and weight rounded to bfloat16; oneDNN accumulates in float32 and hands back bfloat16,
so each product's output, the output layer's logits too, is rounded to bfloat16 (8 bits of
mantissa) before it is cast back to float32 (`training.bfloat16`), as mixed-precision training
does (Micikevicius et al. 2018; Kalamkar et al. 2019 for bfloat16); the master weights, their
gradients, Adam's states, the checkpoints, the softmax, the layer norms and the loss compute
in float32, so a model trained in bfloat16 loads and exports as any other.

The config's ``precision`` asks: ``float32``; ``bfloat16``; or ``auto`` (the default): float32
for a pinned run (every edition's chapter run, ``tiny``, exact runs: `choose`), and for a
machine-bound one (`_runtime.threads.is_big` of its work, the one rule that also gives it every
core and the CPU's own instruction set: the `full` and `hour` presets) on a CPU with bfloat16
units, whichever is faster on this CPU, measured: a few training steps of the run's model in
each precision (`probe.time_steps`), bfloat16 only when it is faster by more than `MARGIN`
(`decide`), so that the default is never slower than float32. The figures are kept per CPU,
versions and model sizes (`io.measured`), so a run measures once, in seconds, and says so in
one line. bfloat16 runs only where it can: the graph path on CPU contexts (MXNet 1.9.1 computes
bfloat16 with oneDNN, on the CPU only), a CPU with bfloat16 units (`units`: AVX512-BF16 or
AMX-BF16 in /proc/cpuinfo); asked elsewhere, the run computes in float32 and says why in one
line (`Precision.notice`).
"""

import dataclasses
import time

import mxnet as mx

from .._runtime import cpu_math, threads
from ..io import measured
from . import probe
from .bfloat16 import BFLOAT16
from .loop import rng_state, set_rng_state
from .steps import traceable

UNITS = ("amx_bf16", "avx512_bf16")  # the CPU's bfloat16 units, as /proc/cpuinfo names them
MARGIN = 0.05  # bfloat16 must be this much faster than float32 for ``auto`` to take it
PRECISIONS = ("float32", "bfloat16")  # what ``auto`` measures, in this order


@dataclasses.dataclass(frozen=True)
class Precision:
    """What a run computes in: ``name`` (``"float32"`` or ``"bfloat16"``), what its config
    asked (``asked``, one of `config.PRECISIONS`) and why (``why``, one phrase)."""

    name: str
    asked: str
    why: str
    measured: dict = None  # ``{"float32": s, "bfloat16": s, "cached": bool}``: `settle`'s

    @property
    def bfloat16(self):
        return self.name == "bfloat16"

    def record(self):
        """What summary.json keeps: ``{"precision", "asked", "why"}``, and ``"measured"``
        (seconds per training step in each precision, and whether they came from the cache)
        where ``auto`` measured."""
        record = {"precision": self.name, "asked": self.asked, "why": self.why}
        return record if self.measured is None else dict(record, measured=self.measured)

    def notice(self):
        """One line when bfloat16 was asked and float32 runs (why), else None."""
        if self.asked == "bfloat16" and not self.bfloat16:
            return f"precision: bfloat16 asked, float32 runs: {self.why}"
        return None


def units(flags=None):
    """The CPU's bfloat16 units among `UNITS` (its /proc/cpuinfo flags, or `flags`), in that
    order; () where it has none or its flags cannot be read."""
    flags = cpu_math.cpu_flags() if flags is None else flags
    return tuple(u for u in UNITS if u in (flags or ()))


def choose(cfg, tgt_size, ctxs, *, fast=True, flags=None):
    """The `Precision` of a run of `cfg` with `tgt_size` target tokens on `ctxs` (a device or a
    list), on the graph path when `fast`; `flags`: the CPU's (default: /proc/cpuinfo's)."""
    asked = cfg.precision
    if asked == "float32":
        return Precision("float32", asked, "asked for")
    ctxs = _as_list(ctxs)
    found = units(flags)
    if not fast or cfg.exact_chapter or not traceable(cfg):
        why = "the imperative path (exact runs, the seq2seq models, --imperative) is float32"
    elif any(c.device_type != "cpu" for c in ctxs):
        why = "MXNet 1.9.1 computes bfloat16 products on the CPU only (oneDNN)"
    elif not found:
        why = f"this CPU has no bfloat16 units ({' or '.join(UNITS)})"
    elif asked == "bfloat16":
        return Precision("bfloat16", asked, f"asked for; the CPU's {', '.join(found)}")
    elif not threads.is_big(threads.run_work(cfg, tgt_size)):
        why = "a pinned run: its output layer's products are below the threads' big work"
    else:  # measured by `settle`
        return Precision("bfloat16", asked, "a machine-bound run (big work); the CPU's "
                         f"{', '.join(found)}: to be measured")
    return Precision("float32", asked, why)


def _as_list(ctxs):
    return list(ctxs) if isinstance(ctxs, (list, tuple)) else [ctxs]


def decide(medians, margin=MARGIN):
    """``(precision, why)`` from the median seconds of a training step in each precision
    (``{"float32": s, "bfloat16": s}``): bfloat16 when float32's time is more than ``1 +
    margin`` times bfloat16's, else float32 (the default is never slower than float32)."""
    speed = medians["float32"] / medians["bfloat16"]
    if speed > 1 + margin:
        return "bfloat16", (f"measured on this CPU: a training step of this run's model "
                            f"{speed:.2f}x as fast in bfloat16, above the {margin:.0%} margin")
    return "float32", (f"measured on this CPU: a training step of this run's model "
                       f"{speed:.2f}x as fast in bfloat16, not over the {margin:.0%} margin")


def settle(cfg, tgt_size, ctxs, *, fast=True, log=None, src_size=None, batches=None, seed=0,
           workers=1, recorded=None):
    """A run's precision, once, before its first kernel: `choose`'s, then oneDNN's instruction
    set for it (`cpu_math.settle`); float32 after all where this process's oneDNN computes no
    bfloat16 product (`_bfloat16_runs`, `cpu_math.amx_refused`); for ``auto`` on a
    machine-bound run, the faster by measurement (`measure`: `src_size` source tokens, default
    `tgt_size`; `batches`, the run's, for their largest shape; `seed`, the run's, to which
    MXNet's stream is reseeded after the probe); float32 for a run of several `workers` or
    devices, which would each measure on their own and might choose apart. `recorded`: what
    a resumed ``auto`` run computed (summary.json's), kept rather than measured again. Its one
    line (`Precision.notice`, or what was measured) on `log` (a stream) when there is one.
    Returns ``(the Precision, the run's work)`` (`cpu_math.settle`'s)."""
    if cfg.precision == "auto" and recorded in PRECISIONS:
        chosen, work = settle(cfg.replace(precision=recorded), tgt_size, ctxs, fast=fast,
                              log=log, src_size=src_size, batches=batches, seed=seed,
                              workers=workers)
        return Precision(chosen.name, "auto", f"the resumed run's, as recorded ({recorded}); "
                         + chosen.why), work
    chosen = choose(cfg, tgt_size, ctxs, fast=fast)
    work = cpu_math.settle(cfg, tgt_size, bfloat16=chosen.bfloat16)
    if chosen.bfloat16:
        blocked = cpu_math.amx_refused() or (None if _bfloat16_runs() else (
            "this process's oneDNN has no bfloat16 kernels (capped below AVX-512 before this "
            "run's first kernel)"))
        if blocked:
            chosen = Precision("float32", chosen.asked, blocked)
        elif chosen.asked == "auto" and (workers > 1 or len(_as_list(ctxs)) > 1):
            chosen = Precision("float32", "auto", "auto measures a run of one process on one "
                               "device (each worker would measure, and might choose, apart): "
                               "give --set precision=bfloat16 to compute in bfloat16")
        elif chosen.asked == "auto":
            chosen = measure(cfg, src_size or tgt_size, tgt_size, work,
                             probe.largest_shape(cfg, batches), seed, log)
    if chosen.notice() and log is not None:
        print(chosen.notice(), file=log)
    return chosen, work


def measure(cfg, src_size, tgt_size, work, shape, seed, log=None):
    """``auto``'s `Precision` for a machine-bound run on this CPU: `decide` on the median
    seconds of a training step in each precision, recalled from the cache of measured
    decisions (`io.measured`) or timed now (`probe.time_steps` on a batch of `shape`, with the
    run's threads, `work`) and kept; one line on `log` says what. The random streams are left
    as the run expects them: NumPy's and Python's as they were, MXNet's reseeded with `seed`
    (as `loop.set_seed` left it: nothing draws from it between `set_seed` and `settle`)."""
    name = measured.key("training precision", probe.key_parts(
        cfg, src_size, tgt_size, shape, threads.threads_for(work) or "MXNet's"))
    entry = measured.recall(name, PRECISIONS)
    figures = entry and entry.get("figures")
    if isinstance(figures, dict) and all(type(figures.get(p)) is float and figures[p] > 0
                                         for p in PRECISIONS):
        precision, why = decide(figures)
        line = _line(precision, figures, shape, f"measured before, cached in {measured.path()}")
        figures, cached = {p: figures[p] for p in PRECISIONS}, True
    else:
        tic = time.perf_counter()
        try:
            figures = _probe(cfg, src_size, tgt_size, work, shape, seed)
        except (mx.base.MXNetError, MemoryError) as e:  # the run would fail in bfloat16 too
            why = (f"auto could not time bfloat16 against float32 here "
                   f"({(str(e).strip().splitlines() or [type(e).__name__])[0]})")
            if log is not None:
                print(f"precision auto: float32 runs: {why}", file=log)
            return Precision("float32", "auto", why)
        precision, why = decide(figures)
        where, unkept = measured.keep(name, precision, figures, "the measured precision")
        line = _line(precision, figures, shape, f"measured in {time.perf_counter() - tic:.0f} "
                     "s; " + (f"cached for this CPU in {where}" if where else
                              f"not cached: {unkept}"))
        cached = False
    if log is not None:
        print(line, file=log)
    return Precision(precision, "auto", why, dict(figures, cached=cached))


def _probe(cfg, src_size, tgt_size, work, shape, seed):
    """`probe.time_steps`' medians on the run's threads (`work`), the random streams put back
    as the run expects them (`measure`) and the run's record of its threads started after."""
    streams = rng_state()
    try:
        threads.size_for(work)
        return probe.medians(probe.time_steps(cfg, src_size, tgt_size, shape, PRECISIONS))
    finally:
        set_rng_state(streams)
        mx.random.seed(seed)
        threads.begin()


def _line(precision, figures, shape, how):
    """The one line of `measure`: what was measured, both figures, the choice, and `how`."""
    return (f"precision auto: a training step of this run's model, batch "
            f"{'x'.join(map(str, shape))}: float32 {figures['float32']:.3f} s, bfloat16 "
            f"{figures['bfloat16']:.3f} s: {precision} runs ({how})")


def _bfloat16_runs():
    """Whether oneDNN computes a bfloat16 product in this process: it has no bfloat16 kernels
    below AVX-512 and reads its instruction set once, at its first kernel, so a process whose
    first kernel ran capped at AVX2 (`cpu_math`) keeps the cap."""
    one = mx.nd.amp_cast(mx.nd.ones((1, 1)), dtype=BFLOAT16)
    try:
        mx.nd.FullyConnected(one, one, num_hidden=1, no_bias=True).wait_to_read()
    except mx.base.MXNetError:
        return False
    return True


def record_change(summary, record, epoch):
    """summary.json's ``precision`` (`Precision.record`) of a run (re)started at `epoch`, and its
    ``precision_changes``: each precision the run computed in and the epoch it began at, a
    new entry only when it changes."""
    changes = summary.setdefault("precision_changes", [])
    if not changes and summary.get("precision") and epoch > 1:  # resumed from before the list
        changes.append({"epoch": 1, "precision": summary["precision"]["precision"]})
    if not changes or changes[-1]["precision"] != record["precision"]:
        changes.append({"epoch": epoch, "precision": record["precision"]})
    summary["precision"] = record
