"""What must happen before MXNet loads, as one ordered step: `prepare`.

MXNet reads its settings when it loads (OpenBLAS its kernels, OpenMP its threads) or at its first
kernel (oneDNN its instruction set), and MXNet 1.9.1 itself needs NumPy's removed aliases to
import at all. So, in this order: NumPy's aliases (`compat`), the OpenMP threads (`threads`),
the CPU's kernels (`cpu_math`), the CUDA libraries of the cu112 extra (`cuda`).

The package's face calls `prepare` first thing. A program that must not import the package
(scripts/chapter_oracle.py, which runs the chapter's own code) loads this folder by its path
and calls the same step: the modules here use the standard library and NumPy only.
"""

from . import compat, cpu_math, cuda, threads


def prepare():
    """The step before MXNet's import: `compat.apply`, `threads.configure`,
    `cpu_math.configure`, `cuda.preload`. Call it before the first ``import mxnet``."""
    compat.apply()
    threads.configure()
    cpu_math.configure()
    cuda.preload()
