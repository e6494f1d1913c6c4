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
instead of fixing the number. `is_big` is the one rule for whether work is machine-bound: its
output layer multiplies `BIG_WORK` or more numbers per call. Such work (`threads_for`) switches
the engine's CPU worker to every physical core and back, and a run of it lifts oneDNN's cap
(`cpu_math.settle`). `size_for(work)` is the one door, for the training loop and the
translator: the switch is the kernel library's ``d2t_omp_threads`` operator, which runs on that
thread (MXNet has no call for it: ``omp_set_num_threads`` from Python sets the calling thread's
count only); `kernels` hands it over at import (`set_switch`), the arrows pointing down.
Without the kernels (no compiler) everything stays on one thread, MXNet's choice on this
machine. `ran` reports the counts a run used (`cpu_math.describe`).

``D2L_TRANSFORMER_THREADS``: ``auto`` (the default, as above), a number N (always N threads),
or ``mxnet`` (leave MXNet's own choice alone); ``D2L_TRANSFORMER_MAX_THREADS`` caps what
``auto`` uses (`distributed.launch` sets it to the cores / the workers of a local job). A
user's own ``OMP_NUM_THREADS`` or ``MXNET_OMP_MAX_THREADS`` is kept (`environ`'s policy, with
a one-line notice): then nothing here changes anything. Importing MXNet before this package
has the same effect (MXNet has read its settings already; `_runtime.prepare` says so).
"""

import os
import sys

from . import environ

ENV = "D2L_TRANSFORMER_THREADS"
MAX_ENV = "D2L_TRANSFORMER_MAX_THREADS"  # the most `auto` uses (the local launcher shares cores)
OMP = ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS")  # MXNet's thread count, when set
BIG_WORK = 1 << 26  # multiply-adds of one output-layer call from which every core pays
CGROUP = "/sys/fs/cgroup"  # Linux's control groups: v2's cpu.max, v1's cpu/ (or cpu,cpuacct/)
PROC_CGROUP = "/proc/self/cgroup"  # where this process lives in them
_state = {"managed": False,  # OMP_NUM_THREADS is ours (`configure`)
          "threads": 1,  # the count in force on the engine's CPU worker
          "used": set(),  # the counts `size_for` put in force since `begin`
          "cause": None,  # why the count is not ours: `ran`
          "late": False,  # MXNet was imported first and chose its own count: `too_late`
          "switch": None}  # `set_switch`'s: sets that count, True once done


def is_big(work):
    """Whether work of `work` multiply-adds in its output layer per call (a run's: `run_work`)
    is machine-bound: every physical core (`threads_for`), oneDNN on the CPU's own instruction
    set (`cpu_math.settle`). Below `BIG_WORK` it is pinned: one thread, the capped kernels, the
    same numbers on every CPU."""
    return work >= BIG_WORK


def run_work(cfg, tgt_size):
    """The work of a training run of `cfg` with `tgt_size` target tokens: its output layer's
    multiply-adds per batch, rows x ``output_width`` x `tgt_size`, the rows a batch's tokens at
    most: ``batch_tokens`` where it bounds them, else ``batch_size`` x ``num_steps``."""
    return (cfg.batch_tokens or cfg.batch_size * cfg.num_steps) * cfg.output_width * tgt_size


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


def usable_cpus():
    """The logical CPUs this process may run on (its affinity; elsewhere all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_quota():
    """The CPUs' worth of time this process may take: the smallest quota of its own control
    group and of each above it (`PROC_CGROUP` says where it lives; cgroup v2's ``cpu.max``,
    v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), or None: no quota, or none readable."""
    where = {}
    try:
        with open(PROC_CGROUP) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if not controllers or "cpu" in controllers.split(","):
                    where["v1" if controllers else "v2"] = path
    except (OSError, ValueError):
        pass
    files = [(os.path.join(CGROUP, rel, "cpu.max"), None) for rel in _up(where.get("v2"))]
    files += [(os.path.join(CGROUP, d, rel, "cpu.cfs_quota_us"),
               os.path.join(CGROUP, d, rel, "cpu.cfs_period_us"))
              for d in ("cpu", "cpu,cpuacct") for rel in _up(where.get("v1"))]
    shares = [share for share in (_share(*f) for f in files) if share]
    return min(shares) if shares else None


def _up(path):
    """A control group's path and each above it, relative to the root (``"a/b"``, ``"a"``,
    ``""``)."""
    parts = [p for p in (path or "").split("/") if p and p != ".."]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _share(quota, period):
    """The CPUs' worth of one control group's quota file (and v1's period file), or None."""
    try:
        with open(quota) as f:
            words = f.read().split()
        if period is not None:
            with open(period) as f:
                words = words[:1] + f.read().split()[:1]
        share = int(words[0]) / int(words[1])
    except (OSError, ValueError, IndexError, ZeroDivisionError):  # "max", v1's -1: none
        return None
    return share if share > 0 else None


def _count(value):
    """`value` as a number of threads (1 or more), else None."""
    value = (value or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def setting():
    """``"auto"``, ``"mxnet"`` or a number of threads, from ``D2L_TRANSFORMER_THREADS``
    (``"auto"``, with a one-line notice at import, for anything else)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    return value if value in ("auto", "mxnet") else _count(value) or "auto"


def max_threads():
    """The most threads ``auto`` uses (``D2L_TRANSFORMER_MAX_THREADS``), or None: every core."""
    return _count(os.environ.get(MAX_ENV))


def _check_settings():
    """One line for each of ``D2L_TRANSFORMER_THREADS`` and ``_MAX_THREADS`` that means
    nothing: it is then ignored."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value not in ("", "auto", "mxnet") and _count(value) is None:
        environ.notice(f"{ENV}={os.environ[ENV]!r} is not auto, mxnet or a number of threads "
                       "(1 or more): using auto")
    if os.environ.get(MAX_ENV, "").strip() and max_threads() is None:
        environ.notice(f"{MAX_ENV}={os.environ[MAX_ENV]!r} is not a number of threads (1 or "
                       "more): ignored")


def configure():
    """Before MXNet's import: ``OMP_NUM_THREADS=1`` (or N), unless the user set the thread
    count (kept, with a one-line notice) or MXNet is already imported. Returns whether the
    threads are ours to switch."""
    _check_settings()
    mode = setting()
    users = {name: environ.users(name) for name in OMP}
    late = "mxnet" in sys.modules and not environ.is_ours(OMP[0])  # MXNet read them already
    _state.update(managed=False, threads=1, used=set(), cause=None,
                  late=late and mode != "mxnet" and not any(users.values()))
    if mode == "mxnet" or any(users.values()) or late:
        if not late:
            environ.release(OMP[0])  # a parent's count is not this process's choice
        _state["cause"] = _cause(mode, users, late)
        if any(users.values()) and _fixed(users) != 1:
            environ.notice(f"{_state['cause']}: MXNet's thread count is yours, so a seed's "
                           "numbers may differ from the README's (unset it for the package's)")
        return False
    environ.claim(OMP[0], "1" if mode == "auto" else str(mode))
    _state["managed"] = True
    return True


def _cause(mode, users, late):
    """Why the thread count is not this package's to set (one phrase)."""
    if any(users.values()):
        return ", ".join(f"{name}={value}" for name, value in users.items() if value)
    if late:
        return "MXNet imported before d2l_transformer: its own OpenMP threads"
    return f"{ENV}=mxnet: MXNet's own OpenMP threads"


def _fixed(users):
    """The thread count MXNet's operators run with when the user set it, else None."""
    if users[OMP[1]]:
        return _count(users[OMP[1]])
    return _count(users[OMP[0]])


def too_late():
    """What came too late for the threads when MXNet was imported first (a phrase), or None."""
    return "MXNet runs its own OpenMP thread count, not the package's" if _state["late"] else None


def threads_for(work):
    """The threads for operators whose biggest product has `work` multiply-adds: None when
    the threads are not ours to switch, else N, or 1 / every core (``auto``, `is_big`)."""
    if not _state["managed"]:
        return None
    mode = setting()
    if isinstance(mode, int):
        return mode
    if not is_big(work):
        return 1
    return max(1, min(physical_cores(), max_threads() or physical_cores()))


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
            _state["used"].add(_state["threads"])
            return None
        _state["threads"] = n
    _state["used"].add(n)
    return n


def begin():
    """A run begins (`cpu_math.settle`, before it computes): `ran` counts from here."""
    _state["used"] = set()


def ran():
    """``(counts, cause)``: the OpenMP thread counts MXNet's CPU operators ran with since
    `begin` (sorted; the count in force when `size_for` was not asked), or None where MXNet
    chose them; and why they are not this package's choice (None when they are)."""
    if _state["managed"]:
        counts, mode = sorted(_state["used"] or {_state["threads"]}), setting()
        if counts == [1]:
            return counts, None
        return counts, f"{ENV}={mode}" if isinstance(mode, int) else "sized to a machine-bound run"
    users = {name: environ.users(name) for name in OMP}
    fixed = _fixed(users) if any(users.values()) else None
    return (None if fixed is None else [fixed]), _state["cause"]
