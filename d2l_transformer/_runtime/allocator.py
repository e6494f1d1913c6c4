"""glibc's malloc for training that plans its buffers per call: one heap, kept and reused.

A graph fed batches by length plans its buffers per call (`training.steps.static_batches`): it
allocates them at every step and frees each after its last reader. MXNet 1.9.1 has no CPU
memory pool; its CPU arrays come from the C library. glibc maps every block of 32 MB or more on
its own (the output layer's logits and their gradient are ~120 MB a batch on the Bible), and a
thread's allocation goes to one of its per-thread arenas, whose 64 MB heaps are unmapped once
empty. So a step's largest buffers went back to the system and came again at the next step,
in new pages the kernel had to fault in and zero.

`configure` (at the package's import, before MXNet starts its threads) sets glibc's own knobs
(``mallopt``) so that freed memory stays in the process for the next step:

* one arena (``M_ARENA_MAX`` 1), so every thread's blocks live in the one heap;
* no blocks mapped on their own (``M_MMAP_MAX`` 0): large blocks come from that heap too;
* no trimming of that heap below 2 GB free at its top (``M_TRIM_THRESHOLD``).

The heap then grows to the largest step's need, holes included, and stays there: fewer page
faults and more tokens/s, for a higher peak (docs/data.md, "Memory", has the figures and the
trade). Arithmetic is unchanged: MXNet asks for aligned blocks either way.

A user who sets any of glibc's malloc variables (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_MAX_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``, or a
``glibc.malloc`` tunable in ``GLIBC_TUNABLES``) keeps glibc as set: ``MALLOC_ARENA_MAX=0``
(which glibc ignores) gives its defaults back. Not glibc (musl, macOS), or MXNet imported
before this package (its threads hold arenas of their own already): nothing is changed.
Standard library only.
"""

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2 ** 31 - 1))
USER = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
_state = {"set": False}


def users_choice():
    """Whether the user set glibc's malloc themselves (then `configure` leaves it)."""
    return (any(os.environ.get(name) is not None for name in USER)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def configure():
    """Set `SETTINGS` with glibc's ``mallopt``, unless `users_choice` or not glibc. Call it
    before MXNet's import (`_runtime.prepare`). Returns whether they were set."""
    if _state["set"] or users_choice() or not _glibc():
        return _state["set"]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _state["set"] = all([mallopt(option, value) == 1 for option, value in SETTINGS])
    return _state["set"]


def _glibc():
    """Whether this process runs on glibc (its malloc is the one `SETTINGS` are for)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or not glibc
        return False


def configured():
    """Whether `configure` set glibc's knobs in this process."""
    return _state["set"]
