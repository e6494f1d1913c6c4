"""The precision of a training run's matrix products, decided once per run (`choose`).

``float32``: every operator in float32, the chapter's arithmetic. ``bfloat16``: the graph
path's matrix products (the Dense layers' FullyConnected, `fused.Bfloat16Dense`) take their
input and weight rounded to bfloat16 and accumulate in float32 (oneDNN), as mixed-precision
training does (Micikevicius et al. 2018; Kalamkar et al. 2019 for bfloat16); the master
weights, their gradients, Adam's states, the checkpoints, the softmax, the layer norms and the
loss stay float32, so a model trained in bfloat16 loads and exports as any other.

The config's ``precision`` asks: ``float32``; ``bfloat16``; or ``auto`` (the default),
bfloat16 for a machine-bound run (`_runtime.threads.is_big` of its work, the one rule that also
gives it every core and the CPU's own instruction set: the `full` and `hour` presets) on a CPU
with bfloat16 units, float32 otherwise (the pinned runs: every edition's chapter run, ``tiny``,
exact runs). bfloat16 runs only where it can: the graph path
on CPU contexts (MXNet 1.9.1 computes bfloat16 with oneDNN, on the CPU only), a CPU with
bfloat16 units (`units`: AVX512-BF16 or AMX-BF16 in /proc/cpuinfo); asked elsewhere, the run
computes in float32 and says why in one line (`Precision.notice`).
"""

import dataclasses

import mxnet as mx

from .._runtime import cpu_math, threads
from .bfloat16 import BFLOAT16
from .steps import traceable

UNITS = ("amx_bf16", "avx512_bf16")  # the CPU's bfloat16 units, as /proc/cpuinfo names them


@dataclasses.dataclass(frozen=True)
class Precision:
    """What a run computes in: ``name`` (``"float32"`` or ``"bfloat16"``), what its config
    asked (``asked``, one of `config.PRECISIONS`) and why (``why``, one phrase)."""

    name: str
    asked: str
    why: str

    @property
    def bfloat16(self):
        return self.name == "bfloat16"

    def record(self):
        """What summary.json keeps: ``{"precision", "asked", "why"}``."""
        return {"precision": self.name, "asked": self.asked, "why": self.why}

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
    ctxs = ctxs if isinstance(ctxs, (list, tuple)) else [ctxs]
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
    else:
        return Precision("bfloat16", asked, "a machine-bound run (big work); the CPU's "
                         f"{', '.join(found)}")
    return Precision("float32", asked, why)


def settle(cfg, tgt_size, ctxs, *, fast=True, log=None):
    """A run's precision, once, before its first kernel: `choose`'s, then oneDNN's instruction
    set for it (`cpu_math.settle`); float32 after all where this process's oneDNN computes no
    bfloat16 product (`_bfloat16_runs`); its `Precision.notice` on `log` (a stream) when there
    is one. Returns ``(the Precision, the run's work)`` (`cpu_math.settle`'s)."""
    chosen = choose(cfg, tgt_size, ctxs, fast=fast)
    work = cpu_math.settle(cfg, tgt_size, bfloat16=chosen.bfloat16)
    if chosen.bfloat16 and not _bfloat16_runs():
        chosen = Precision("float32", chosen.asked, "this process's oneDNN has no bfloat16 "
                           "kernels (capped below AVX-512 before this run's first kernel)")
    if chosen.notice() and log is not None:
        print(chosen.notice(), file=log)
    return chosen, work


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
