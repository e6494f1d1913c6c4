"""The CPU's arithmetic pinned, so that one seed gives the same numbers on any x86-64 CPU with
AVX2 and FMA.

MXNet's CPU results depend on the CPU they run on: oneDNN (MXNet's MKLDNN) and OpenBLAS pick
their kernels by the instruction set they find, and kernels of different widths add in
different orders, so the same seed trains to other losses and other translations on an
AVX-512 Intel than on an AVX2 AMD. `configure` caps oneDNN at AVX2 (``DNNL_MAX_CPU_ISA``; this
MXNet's oneDNN reads no ``ONEDNN_`` spelling) and fixes OpenBLAS's kernels to its Haswell ones
(``OPENBLAS_CORETYPE``), the kernels every x86-64 CPU with AVX2 and FMA (Intel since Haswell,
AMD since Zen) can run, so such a CPU computes what the README's table was made with
(docs/chapter.md, "The same numbers on every CPU", has the measurements). The OpenMP thread
count changes the rounding too: that rule is `threads`' (one thread below `threads.is_big`);
`describe` reports what ran of all three.

OpenBLAS reads its variable when it loads, with MXNet; oneDNN its own at its first kernel. So
`configure` runs before MXNet's import (`_runtime.prepare`: ``import d2l_transformer`` calls
it first thing, and ``scripts/chapter_oracle.py``, which imports nothing of the package, loads
the folder by path). When MXNet was imported first, `prepare` says in one line which pins came
too late (`too_late`).

``D2L_TRANSFORMER_CPU``: ``pinned`` (the default) or ``native`` (the CPU's own kernels: faster
on some CPUs, other numbers). A value of either variable that the user set is kept, with a
one-line notice (`environ`'s policy, the same as the threads'). It is an environment variable,
not a command-line flag, because it must act before MXNet loads, and importing the package
loads MXNet. Nothing is pinned where it cannot hold: a CPU without AVX2 and FMA (the Haswell
kernels would not run), a non-x86 CPU, or a system whose CPU features are not readable here
(not Linux). Imports no MXNet: the standard library only.
"""

import ctypes
import os
import platform
import sys

from . import environ, threads

ENV = "D2L_TRANSFORMER_CPU"
MODES = ("pinned", "native")
ISA_CAP = ("DNNL_MAX_CPU_ISA", "AVX2")
OPENBLAS_CORE = ("OPENBLAS_CORETYPE", "Haswell")
PINS = dict((ISA_CAP, OPENBLAS_CORE))
_state = {"mode": None, "reason": None,  # `configure`'s: the mode, why nothing is pinned
          "kept": {},  # {name: the user's value kept instead of the pin}
          "late": [],  # the pins set after MXNet was imported (`too_late`)
          "settled": None,  # "capped" or "lifted": the first `settle`'s
          "lifted_for": None,  # why it lifted the cap (a phrase)
          "isa_cap": None,  # DNNL_MAX_CPU_ISA when the first `settle` ran: oneDNN's
          "amx": None}  # `allow_amx`'s: "granted" or "refused" by Linux, None: not asked


def mode():
    """``"pinned"`` or ``"native"``, from ``D2L_TRANSFORMER_CPU`` (``"pinned"``, with a
    one-line notice at import, for anything else)."""
    value = os.environ.get(ENV, "pinned").strip().lower() or "pinned"
    return value if value in MODES else "pinned"


def cpu_flags():
    """The CPU's feature flags (Linux's /proc/cpuinfo), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_name():
    """The CPU's model name (Linux), else what `platform` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def unpinnable(machine=None, flags=None):
    """Why this CPU cannot compute the pinned figures (one phrase), or None when it can."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return f"a {machine} CPU: MXNet's kernels there are not the x86-64 ones"
    if flags is None:
        return "the CPU's features could not be read (not Linux)"
    missing = [f for f in ("avx2", "fma") if f not in flags]
    if missing:
        return f"the CPU lacks {' and '.join(m.upper() for m in missing)}"
    return None


def configure():
    """Before MXNet's import: set each of `PINS` that the user did not set (one line names the
    user's values kept), unless ``D2L_TRANSFORMER_CPU`` is ``native`` or the CPU cannot run
    them. Returns whether every pin is in force."""
    if os.environ.get(ENV, "pinned").strip().lower() not in MODES + ("",):
        environ.notice(f"{ENV}={os.environ[ENV]!r} is not pinned or native: using pinned")
    _state.update(mode=mode(), reason=None, kept={}, late=[], settled=None, lifted_for=None,
                  isa_cap=None, amx=None)
    reason = None if _state["mode"] == "native" else unpinnable(flags=cpu_flags())
    if _state["mode"] == "native" or reason:
        _state["reason"] = reason
        for name in PINS:
            environ.release(name)  # a pinned parent's: not the user's
        return False
    for name, pin in PINS.items():
        value = environ.users(name)
        if value is None:
            if "mxnet" in sys.modules and not environ.is_ours(name):
                _state["late"].append(name)
            environ.claim(name, pin)
        elif value != pin:  # oneDNN 2.4 reads `avx2` as no cap at all: the exact spelling
            _state["kept"][name] = value
    if _state["kept"]:
        kept = _state["kept"]
        environ.notice(", ".join(f"{k}={v}" for k, v in kept.items())
                       + (" are yours and are kept" if len(kept) > 1 else " is yours and is kept")
                       + ": a seed's numbers may differ from the README's (unset "
                       + ("them" if len(kept) > 1 else "it") + " for the pinned kernels)")
    return not _state["kept"]


def too_late():
    """What came too late for the pins when MXNet was imported first: a list of phrases."""
    late = []
    core = openblas_core()
    if OPENBLAS_CORE[0] in _state["late"] and core not in (None, OPENBLAS_CORE[1]):
        late.append(f"OpenBLAS runs its {core} kernels, not the pinned Haswell ones")
    if ISA_CAP[0] in _state["late"]:
        late.append("oneDNN's AVX2 cap holds only if no MXNet operator has run yet")
    return late


def settle(cfg, tgt_size, bfloat16=False):
    """Before a training run of `cfg` with `tgt_size` target tokens computes (or a model of it
    is loaded): keep oneDNN capped for a pinned run, lift the cap for a machine-bound one
    (`threads.is_big` of its `threads.run_work`: the `full` presets'), which runs on every core
    anyway, so that its numbers depend on the machine already, and which the cap would cost
    speed (docs/benchmarks.md, "The CPU math"), and for a run whose products may compute in
    bfloat16 (``bfloat16``: `training.precision`; oneDNN has no bfloat16 kernels below
    AVX-512), for which it also asks for AMX (`allow_amx`; so it does for any run under a cap
    of the user's that names AMX). OpenBLAS stays on its Haswell kernels: they are what an AVX2
    CPU runs anyway. oneDNN reads its cap once, at its first kernel, so the first run of a
    process decides for the process: `train_model` and `checkpoint.load` call this before their
    first kernel; later calls change nothing. Starts the run's record of its threads
    (`threads.begin`); returns the run's work."""
    work = threads.run_work(cfg, tgt_size)
    threads.begin()
    if _state["settled"]:
        return work
    big = threads.is_big(work)
    lift = _state["mode"] == "pinned" and not _state["reason"] and (big or bfloat16)
    _state["settled"] = "lifted" if lift else "capped"
    if lift:
        _state["lifted_for"] = "a machine-bound run" if big else \
            "bfloat16 asked (oneDNN has no bfloat16 kernels below AVX-512)"
        environ.release(ISA_CAP[0])  # a cap the user set stays
    if bfloat16 or "AMX" in (environ.users(ISA_CAP[0]) or "").upper():
        allow_amx()  # the tiles: for bfloat16, or for the user's own cap naming AMX
    _state["isa_cap"] = os.environ.get(ISA_CAP[0])
    return work


AMX = "AVX512_CORE_AMX"  # oneDNN 2.4 uses AMX only when its cap names it
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # Linux x86-64


def allow_amx(flags=None):
    """Let oneDNN's bfloat16 products run on the CPU's AMX tiles, where it has them (`flags`:
    its /proc/cpuinfo flags by default). Linux lends a process the tiles' state only when it
    asks (``arch_prctl(ARCH_REQ_XCOMP_PERM)``; an AMX instruction without it kills the process,
    SIGILL, without a message), so this asks whenever the CPU has them, whatever the cap: a
    user's own ``DNNL_MAX_CPU_ISA`` naming AMX needs the tiles as much. Where the user set no
    cap, it names AMX (oneDNN 2.4 uses AMX only then). Before oneDNN's first kernel. Returns
    whether oneDNN may use AMX now (`amx_refused` says when a product would be fatal)."""
    flags = cpu_flags() if flags is None else flags
    if not {"amx_bf16", "amx_tile"} <= set(flags or ()):
        return False
    if _state["amx"] is None:
        libc = ctypes.CDLL(None, use_errno=True)
        granted = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
        _state["amx"] = "granted" if granted else "refused"  # refused: Linux before 5.16
    if _state["amx"] == "refused":
        return False
    if environ.users(ISA_CAP[0]) is None:
        environ.claim(ISA_CAP[0], AMX)
    return "AMX" in os.environ[ISA_CAP[0]].upper()


def amx_state():
    """``"granted"`` or ``"refused"`` (Linux's answer to `allow_amx`), or None: not asked."""
    return _state["amx"]


def amx_refused():
    """Why oneDNN's bfloat16 products would kill this process (one phrase), or None: the cap
    names AMX (the user's) and Linux refused the tiles (`allow_amx`)."""
    cap = os.environ.get(ISA_CAP[0]) or ""
    if _state["amx"] == "refused" and "AMX" in cap.upper():
        return (f"{ISA_CAP[0]}={cap} is yours and names AMX, but Linux lends this process no "
                "AMX tiles (before Linux 5.16): an AMX product would kill it (unset it, or cap "
                "at AVX512_CORE_BF16)")
    return None


def openblas_core():
    """The kernels MXNet's OpenBLAS chose (``openblas_get_corename``), once MXNet is loaded;
    None before, or where MXNet has no OpenBLAS of its own."""
    mxnet = sys.modules.get("mxnet")
    folder = os.path.dirname(getattr(mxnet, "__file__", None) or "")
    path = os.path.join(folder, "libopenblas.so.0")
    if not mxnet or not os.path.exists(path):
        return None
    lib = ctypes.CDLL(path)  # the copy libmxnet.so loaded: the same handle
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return lib.openblas_get_corename().decode().strip()


def describe(device="cpu"):
    """What summary.json records of the arithmetic a run on `device` used: ``{"pinned",
    "mode", "cpu", "isa_cap", "openblas", "threads", "why"}``, as it ran: ``mode`` ``"pinned"``
    (the README's arithmetic), ``"native"`` (``D2L_TRANSFORMER_CPU=native``) or
    ``"unpinned"`` (pinned asked, left for what `why` says); oneDNN's cap when the run settled
    (`settle`; else the one in the environment), the kernels OpenBLAS chose, the OpenMP thread
    counts (`threads.ran`; None: MXNet's own). `why` says why the run's numbers may differ from
    the README's (None when they should not: then `pinned`)."""
    counts, cause = threads.ran()
    record = {"pinned": False, "mode": _state["mode"] or mode(), "cpu": cpu_name(),
              "isa_cap": _state["isa_cap"] if _state["settled"] else os.environ.get(ISA_CAP[0]),
              "openblas": openblas_core(), "threads": counts, "why": None}
    if not device.startswith("cpu"):
        why = [f"it ran on {device}, whose arithmetic is the GPU's, not the pinned CPU's"]
    elif record["mode"] == "native":
        why = [f"{ENV}=native: this CPU's own kernels"]
    elif _state["reason"]:
        why = [f"not pinned: {_state['reason']}"]
    else:
        why = _differences(record, cause)
    record["why"] = "; ".join(why) or None
    record["pinned"] = record["why"] is None
    if not record["pinned"] and record["mode"] == "pinned":
        record["mode"] = "unpinned"
    return record


def _differences(record, cause):
    """How a pinned-mode run's `record` differs from the pinned math (phrases)."""
    why = []
    cap = record["isa_cap"]
    if cap != ISA_CAP[1] and _state["settled"] == "lifted":
        ours = cap is None or (cap == AMX and ISA_CAP[0] not in _state["kept"])
        why.append(f"{_state['lifted_for']}: oneDNN on every instruction set of this CPU"
                   + (", AMX included" if cap else "") if ours else
                   f"{_state['lifted_for']}: oneDNN capped at {cap} ({ISA_CAP[0]} is yours)")
    elif cap != ISA_CAP[1]:
        why.append(f"oneDNN capped at {cap} ({ISA_CAP[0]} is yours), not AVX2")
    if record["openblas"] not in (None, OPENBLAS_CORE[1]):
        why.append(f"OpenBLAS ran its {record['openblas']} kernels ("
                   + (f"{OPENBLAS_CORE[0]} is yours" if OPENBLAS_CORE[0] in _state["kept"]
                      else "MXNet imported first") + ")")
    counts = record["threads"]
    if counts != [1]:
        what = (f"{' and '.join(map(str, counts))} OpenMP threads" if counts
                else "MXNet's own OpenMP thread count")
        why.append(f"{what} ({cause}), not one")
    return why


def line(record, label="CPU math"):
    """One line for a run's `describe` record: the arithmetic, and why the table may differ."""
    if record is None:
        return f"{label}: not recorded (a run made before the package recorded it)"
    counts = record.get("threads")
    counts = [counts] if isinstance(counts, int) else counts  # an older record: one number
    parts = [f"oneDNN capped at {record['isa_cap']}" if record.get("isa_cap") else
             "oneDNN uncapped", f"OpenBLAS {record.get('openblas') or 'unknown'} kernels",
             f"{' and '.join(map(str, counts))} OpenMP thread{'s' * (counts != [1])}" if counts
             else "MXNet's own OpenMP threads"]
    text = f"{label}: {', '.join(parts)} on {record.get('cpu')}"
    if record.get("why"):
        return text + f"; this table may differ from the README's: {record['why']}"
    return text + " (pinned: the README's numbers on any x86-64 CPU with AVX2 and FMA)"
