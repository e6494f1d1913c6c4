"""The CPU's arithmetic pinned, so that one seed gives the same numbers on any x86-64 CPU with AVX2.

MXNet's CPU results depend on the CPU they run on: oneDNN (MXNet's MKLDNN) and OpenBLAS pick
their kernels by the instruction set they find, and kernels of different widths add in
different orders, so the same seed trains to other losses and other translations on an
AVX-512 Intel than on an AVX2 AMD. `pin` caps oneDNN at AVX2 (``DNNL_MAX_CPU_ISA``; this
MXNet's oneDNN reads no ``ONEDNN_`` spelling) and fixes OpenBLAS's kernels to its Haswell ones
(``OPENBLAS_CORETYPE``), the kernels every x86-64 CPU with AVX2 and FMA (Intel since Haswell,
AMD since Zen) can run, so such a CPU computes what the README's table was made with
(docs/chapter.md, "The same numbers on every CPU", has the measurements). The OpenMP thread
count changes the rounding too: that rule is `threads`' (one thread at the chapter's sizes,
and a user's ``OMP_NUM_THREADS`` wins); `describe` reports both.

OpenBLAS reads its variable when it loads, with MXNet; oneDNN its own at its first kernel. So
`configure` runs before MXNet's import: ``import d2l_transformer`` calls it first thing, and
``scripts/chapter_oracle.py`` (which imports nothing of the package) loads this file by path.
When MXNet was imported first, a one-line warning says which pin came too late.

``D2L_TRANSFORMER_CPU``: ``pinned`` (the default) or ``native`` (the CPU's own kernels: faster
on some CPUs, other numbers). Pinned, the pins replace what the environment held (the same
numbers everywhere is the mode's point); a child process inherits them, and in native mode gets
back what they replaced. It is an
environment variable, not a command-line flag, because it must act before MXNet loads, and
importing the package loads MXNet. Nothing is pinned where it cannot hold: a CPU without AVX2
and FMA (the Haswell kernels would not run), a non-x86 CPU, or a system whose CPU features are
not readable here (not Linux). Imports no MXNet: the standard library only.
"""

import ctypes
import json
import os
import platform
import sys
import warnings

ENV = "D2L_TRANSFORMER_CPU"
MODES = ("pinned", "native")
ISA_CAP = ("DNNL_MAX_CPU_ISA", "AVX2")
OPENBLAS_CORE = ("OPENBLAS_CORETYPE", "Haswell")
PINS = dict((ISA_CAP, OPENBLAS_CORE))
_MARK = "D2L_TRANSFORMER_CPU_PINNED"  # JSON {name: the value it replaced or None}, inherited
_state = {"mode": None, "reason": None, "settled": None, "replaced": {}}


def mode():
    """``"pinned"`` or ``"native"``, from ``D2L_TRANSFORMER_CPU`` (``"pinned"``, with a
    one-line warning at import, for anything else)."""
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
    """Before MXNet's import: set `PINS` in the environment, unless ``D2L_TRANSFORMER_CPU`` is
    ``native`` or the CPU cannot run them. Returns whether the pins are set."""
    if os.environ.get(ENV, "pinned").strip().lower() not in MODES + ("",):
        warnings.warn(f"{ENV}={os.environ[ENV]!r} is not pinned or native: using pinned",
                      stacklevel=3)
    _state.update(mode=mode(), reason=None, settled=None, replaced={})
    inherited = json.loads(os.environ.pop(_MARK, "{}"))  # a pinned parent's pins: not the user's
    for name, original in inherited.items():
        if os.environ.get(name) != PINS.get(name):
            continue  # changed since: the user's
        if original is None:
            del os.environ[name]
        else:
            os.environ[name] = original
    reason = None if _state["mode"] == "native" else unpinnable(flags=cpu_flags())
    if _state["mode"] == "native" or reason:
        _state["reason"] = reason
        return False
    _state["replaced"] = {name: os.environ.get(name) for name in PINS}
    os.environ[_MARK] = json.dumps(_state["replaced"])
    os.environ.update(PINS)
    if "mxnet" in sys.modules and openblas_core() not in (None, OPENBLAS_CORE[1]):
        warnings.warn("mxnet was imported before d2l_transformer: OpenBLAS runs its "
                      f"{openblas_core()} kernels, not the pinned Haswell ones, so results may "
                      "differ from the README's (import d2l_transformer first)", stacklevel=3)
    return True


def settle(cfg, bfloat16=False):
    """Before a run of `cfg` computes: keep oneDNN capped for a run on a slice of the data
    (``cfg.num_examples`` set: every edition's chapter run, exact or corrected, and ``tiny``);
    lift the cap for a run on the whole corpus (the ``full`` presets) and for a run whose
    products compute in bfloat16 (``bfloat16``: `training.precision`; oneDNN has no bfloat16
    kernels below AVX-512), and for the latter ask for AMX (`allow_amx`). Those size their
    threads to the machine's cores (`threads`), so their numbers depend on the machine anyway,
    and the cap would cost them speed (docs/benchmarks.md, "The CPU math"). OpenBLAS stays on
    its Haswell kernels: they are what an AVX2 CPU runs anyway. oneDNN reads its cap once, at
    its first kernel, so the first run of a process decides for the process: `train_model` and
    `checkpoint.load` call this before they compute; later calls change nothing."""
    if _state["settled"]:
        return
    if _state["mode"] == "pinned" and not _state["reason"]:
        whole = getattr(cfg, "num_examples", None) is None or bfloat16
        _state["settled"] = "lifted" if whole else "capped"
        name = ISA_CAP[0]
        if whole and os.environ.get(name) == ISA_CAP[1]:
            if _state["replaced"].get(name) is None:
                del os.environ[name]
            else:
                os.environ[name] = _state["replaced"][name]
    if bfloat16:
        allow_amx()


AMX = ("DNNL_MAX_CPU_ISA", "AVX512_CORE_AMX")  # oneDNN 2.4 uses AMX only when its cap names it
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # Linux x86-64


def allow_amx(flags=None):
    """Let oneDNN's bfloat16 products run on the CPU's AMX tiles, where it has them (`flags`:
    its /proc/cpuinfo flags by default) and no other oneDNN cap is set: Linux lends a process
    the tiles' state only when it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM)``; an AMX
    instruction without it kills the process, SIGILL), and oneDNN 2.4 neither asks nor uses
    AMX unless ``DNNL_MAX_CPU_ISA`` names it. Before oneDNN's first kernel. Returns whether AMX
    was allowed."""
    flags = cpu_flags() if flags is None else flags
    if not {"amx_bf16", "amx_tile"} <= set(flags or ()) or os.environ.get(AMX[0]):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        return False  # a kernel without the request (before Linux 5.16) has no AMX for us
    os.environ[AMX[0]] = AMX[1]
    return True


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


def threads():
    """MXNet's OpenMP threads as the environment fixes them (``OMP_NUM_THREADS``), or None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() else None


def describe(device="cpu"):
    """What summary.json records of the arithmetic a run on `device` used: ``{"pinned",
    "mode", "cpu", "isa_cap", "openblas", "threads", "why"}``; `why` says, when the run's
    numbers may differ from the README's, why (None when they should not)."""
    pinned = _state["mode"] == "pinned" and not _state["reason"] and _state["settled"] != "lifted"
    record = {"pinned": pinned, "mode": _state["mode"] or mode(), "cpu": cpu_name(),
              "isa_cap": os.environ.get(ISA_CAP[0]), "openblas": openblas_core(),
              "threads": threads(), "why": None}
    if not device.startswith("cpu"):
        record["why"] = f"it ran on {device}, whose arithmetic is the GPU's, not the pinned CPU's"
    elif record["mode"] == "native":
        record["why"] = f"{ENV}=native: this CPU's own kernels"
    elif _state["reason"]:
        record["why"] = f"not pinned: {_state['reason']}"
    elif _state["settled"] == "lifted":
        record["why"] = "a run on the whole corpus: oneDNN on every instruction set of this CPU"
    elif record["openblas"] not in (None, OPENBLAS_CORE[1]):
        record["why"] = f"OpenBLAS ran its {record['openblas']} kernels (MXNet imported first)"
    elif record["threads"] != 1:
        record["why"] = (f"{record['threads'] or 'MXNet default'} OpenMP threads "
                         "(OMP_NUM_THREADS), not one")
    return record


def line(record, label="CPU math"):
    """One line for a run's `describe` record: the arithmetic, and why the table may differ."""
    if record is None:
        return f"{label}: not recorded (a run made before the package recorded it)"
    parts = [f"oneDNN capped at {record['isa_cap']}" if record.get("isa_cap") else
             "oneDNN uncapped", f"OpenBLAS {record.get('openblas') or 'unknown'} kernels",
             f"OMP_NUM_THREADS={record.get('threads') or 'unset'}"]
    text = f"{label}: {', '.join(parts)} on {record.get('cpu')}"
    if record.get("why"):
        return text + f"; this table may differ from the README's: {record['why']}"
    return text + " (pinned: the README's numbers on any x86-64 CPU with AVX2)"
