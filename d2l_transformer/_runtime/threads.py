"""How many OpenMP threads MXNet's CPU operators use: one for small work, every core for big.

MXNet 1.9 sizes its OpenMP pool once, at import: half of the logical CPUs when
``OMP_NUM_THREADS`` is not set (it assumes two hardware threads per core), so on a machine
without SMT — most cloud VMs, this project's 2-core test machine — it uses half the cores. And
one size does not fit: at the chapter's sizes (64 x 10 tokens, d=32) a second thread does not
pay (a parallel region costs about what such an operator's arithmetic does), while the `full`
preset's step (256 x ~15 tokens, d=128, 4,000 outputs), mostly matrix products, gains from
every core (the figures: docs/benchmarks.md, "Threads").

So, before MXNet is imported (`configure`, called first thing by the package), this sets
``OMP_NUM_THREADS=1``: MXNet then asks OpenMP, per engine thread, how many threads to use,
instead of fixing the number. Work whose output layer multiplies more than `BIG_WORK`
multiply-adds per call (`threads_for`) then switches the engine's CPU worker to every physical
core and back. `size_for(work)` is the one door, for the training loop and the translator:
the rule is `threads_for`, the switch the kernel library's ``d2t_omp_threads`` operator, which
runs on that thread (MXNet has no call for it: ``omp_set_num_threads`` from Python sets the
calling thread's count only); `kernels` hands it over at import (`set_switch`), the arrows
pointing down. Without the kernels (no compiler) everything stays on one thread, MXNet's
choice on this machine.

``D2L_TRANSFORMER_THREADS``: ``auto`` (the default, as above), a number N (always N threads),
or ``mxnet`` (leave MXNet's own choice alone); ``D2L_TRANSFORMER_MAX_THREADS`` caps what
``auto`` uses (`distributed.launch` sets it to the cores / the workers of a local job). A user's own
``OMP_NUM_THREADS`` or ``MXNET_OMP_MAX_THREADS`` is never overridden: then nothing here
changes anything. Importing MXNet before this package has the same effect (MXNet has read its
settings already).
"""

import os
import sys
import warnings

ENV = "D2L_TRANSFORMER_THREADS"
MAX_ENV = "D2L_TRANSFORMER_MAX_THREADS"  # the most `auto` uses (the local launcher shares cores)
_MARK = "D2L_TRANSFORMER_OMP_SET"  # our own OMP_NUM_THREADS, inherited by child processes
BIG_WORK = 1 << 24  # multiply-adds of one output-layer call from which every core pays
_state = {"managed": False,  # OMP_NUM_THREADS is ours (`configure`)
          "threads": 1,  # the count in force on the engine's CPU worker
          "switch": None}  # `set_switch`'s: sets that count, True once done


def physical_cores():
    """The physical cores this process may run on (Linux's topology in sysfs; elsewhere the
    logical CPUs)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        try:
            with open(path) as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def setting():
    """``"auto"``, ``"mxnet"`` or a number of threads, from ``D2L_TRANSFORMER_THREADS``
    (``"auto"``, with a one-line warning at import, for anything else)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value in ("auto", "mxnet"):
        return value
    return int(value) if value.isdigit() and int(value) > 0 else "auto"


def configure():
    """Before MXNet's import: ``OMP_NUM_THREADS=1`` (or N), unless the user set the thread
    count or MXNet is already imported. Returns whether the threads are ours to switch."""
    mode = setting()
    if mode == "auto" and os.environ.get(ENV, "auto").strip().lower() not in ("", "auto"):
        warnings.warn(f"{ENV}={os.environ[ENV]!r} is not auto, mxnet or a number of threads "
                      "(1 or more): using auto", stacklevel=3)
    ours = os.environ.get(_MARK) is not None and os.environ.get(_MARK) == os.environ.get(
        "OMP_NUM_THREADS")
    user_set = not ours and ("OMP_NUM_THREADS" in os.environ
                             or "MXNET_OMP_MAX_THREADS" in os.environ)
    if mode == "mxnet" or user_set or ("mxnet" in sys.modules and not ours):
        _state["managed"] = False
        return False
    value = "1" if mode == "auto" else str(mode)
    os.environ["OMP_NUM_THREADS"] = os.environ[_MARK] = value
    _state["managed"] = True
    return True


def threads_for(work):
    """The threads for operators whose biggest product has `work` multiply-adds: None when
    the threads are not ours to switch, else N, or 1 / every core (``auto``)."""
    if not _state["managed"]:
        return None
    mode = setting()
    if isinstance(mode, int):
        return mode
    if work < BIG_WORK:
        return 1
    cap = os.environ.get(MAX_ENV, "").strip()
    return max(1, min(physical_cores(), int(cap))) if cap.isdigit() else physical_cores()


def set_switch(switch):
    """Register ``switch(n) -> bool``, which sets the engine's CPU worker's OpenMP threads to n
    (in order with the operators before and after it) and returns False when it cannot: the
    kernel library's, at its import (`kernels`)."""
    _state["switch"] = switch


def size_for(work):
    """Run the CPU operators that follow with the threads `threads_for(work)` asks for (one for
    small work, every physical core for big), where this package manages the threads and the
    switch works; else leave them alone. `work`: the multiply-adds of the biggest product of
    one call (the output layer's rows x hidden x vocabulary). Returns the thread count now in
    force, or None when it is not ours to set."""
    n = threads_for(work)
    if n is None:
        return None
    if n != _state["threads"]:
        switch = _state["switch"]
        if switch is None or not switch(n):
            return None
        _state["threads"] = n
    return n
