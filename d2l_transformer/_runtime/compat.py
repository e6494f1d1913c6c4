"""Let MXNet 1.9.1 import on the NumPy releases that Python 3.12 and 3.13 need.

MXNet 1.9.1 (the last 1.x release, pure ctypes, one wheel for every Python 3) still uses the
NumPy aliases of Python's builtins, `np.bool`, `np.int`, `np.float`, `np.object`, `np.complex`
and `np.str`. NumPy deprecated them in 1.20 and removed them in 1.24, but the oldest NumPy
with wheels for Python 3.12 is 1.26. `apply()` puts back exactly the aliases that are missing,
bound to the builtins they always named; on NumPy < 1.24 they all still exist and nothing is
changed. It must run before the first `import mxnet`: it is the first part of the package's step before
MXNet loads (`_runtime.prepare`), so code that needs mxnet imports d2l_transformer before it
(scripts, the tests' conftest.py).

MXNet also imports `distutils.version`, which left the standard library in Python 3.12; the
`setuptools` package provides it again (setup.py requires it from 3.12 on). See docs/install.md.
"""

import builtins
import warnings

import numpy

ALIASES = ("bool", "int", "float", "object", "complex", "str")


def apply():
    """Set each of `numpy.<ALIASES>` that does not exist to the builtin of that name.

    Returns the names it set (empty on NumPy < 1.24, where the aliases still exist)."""
    added = []
    for name in ALIASES:
        with warnings.catch_warnings():  # NumPy 1.20-1.23 warn on access; they still have it
            warnings.simplefilter("ignore")
            present = hasattr(numpy, name)
        if not present:
            setattr(numpy, name, getattr(builtins, name))
            added.append(name)
    return added
