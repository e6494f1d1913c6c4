"""What must happen before MXNet loads, as one ordered step: `prepare`.

MXNet reads its settings when it loads (OpenBLAS its kernels, OpenMP its threads) or at its first
kernel (oneDNN its instruction set), and MXNet 1.9.1 itself needs NumPy's removed aliases to
import at all. So, in this order: NumPy's aliases (`compat`), glibc's malloc, kept and reused
before MXNet's threads take arenas of their own (`allocator`), the OpenMP threads (`threads`),
the CPU's kernels (`cpu_math`), the CUDA libraries of the cu112 extra (`cuda`). The variables
the threads and the kernels set follow one policy (`environ`): the user's own values are kept,
and `environ.user_environ` is the environment the user had, for child processes that are not
the package's.

The package's face calls `prepare` first thing. A program that must not import the package
(scripts/chapter_oracle.py, which runs the chapter's own code) loads this folder by its path
and calls the same step: the modules here use the standard library and NumPy only.
"""

import logging
import sys

from . import allocator, compat, cpu_math, cuda, environ, threads


def prepare():
    """The step before MXNet's import: `compat.apply`, `allocator.configure` (not once MXNet
    is in), `threads.configure`, `cpu_math.configure`, `cuda.preload`. Call it before the
    first ``import mxnet``; after it, one line says which settings came too late."""
    late = "mxnet" in sys.modules
    compat.apply()
    if not late:
        allocator.configure()
    threads.configure()
    cpu_math.configure()
    if late:
        _say_too_late()
    cuda.preload()


def _say_too_late():
    """One line naming each setting that MXNet, imported first, has read already."""
    missed = [p for p in [threads.too_late()] + cpu_math.too_late() if p]
    if missed:
        environ.notice(f"mxnet was imported before d2l_transformer: {'; '.join(missed)}, so "
                       "results may differ from the README's (import d2l_transformer first)")


def quietly(call):
    """``call()`` without configuring the root logger: MXNet's `npx.set_np` logs through
    ``logging.info``, whose first use on an unconfigured root logger calls
    ``logging.basicConfig``, so that importing the package would fix every log line's format
    (``WARNING:d2l_transformer.data.sources:...``) before a program (the CLI: plain lines)
    could choose its own."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    if not root.handlers:
        root.addHandler(placeholder)
    try:
        return call()
    finally:
        root.removeHandler(placeholder)
