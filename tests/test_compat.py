"""The NumPy-alias shim (d2l_transformer/_runtime/compat.py): it sets exactly the aliases that are missing,
and the package applies it before anything imports mxnet."""

import builtins
import subprocess
import sys
import warnings

import numpy

from d2l_transformer._runtime import compat as _compat

NAMES = ("bool", "int", "float", "object", "complex", "str")  # what MXNet 1.9.1 uses


def _make_missing(monkeypatch, name):
    """Remove numpy.<name> whatever the NumPy: set by the shim (>= 1.24) or deprecated (< 1.24)."""
    if name in vars(numpy):
        monkeypatch.delattr(numpy, name)
    deprecated = getattr(numpy, "__deprecated_attrs__", {})  # NumPy 1.20-1.23 serve them here
    if name in deprecated:
        monkeypatch.delitem(deprecated, name)


def _has(name):
    with warnings.catch_warnings():  # NumPy warns on asking for a removed or deprecated alias
        warnings.simplefilter("ignore")
        return hasattr(numpy, name)


def test_sets_only_the_missing_aliases(monkeypatch):
    assert _compat.ALIASES == NAMES
    for name in NAMES:
        _make_missing(monkeypatch, name)
    assert not any(_has(name) for name in NAMES)
    kept = object()
    monkeypatch.setattr(numpy, "int", kept, raising=False)  # present: must stay as it is
    assert _compat.apply() == ["bool", "float", "object", "complex", "str"]
    assert numpy.int is kept
    assert all(getattr(numpy, name) is getattr(builtins, name) for name in NAMES if name != "int")
    assert _compat.apply() == []  # nothing missing any more: nothing set


# A fresh interpreter: make the aliases missing on any NumPy, record their state at the moment
# `mxnet` is first imported, then import the package.
PROBE = """
import builtins, sys, warnings
import numpy
warnings.simplefilter("ignore")  # NumPy warns on asking for a removed or deprecated alias
NAMES = %r
for name in NAMES:
    numpy.__dict__.pop(name, None)
    getattr(numpy, "__deprecated_attrs__", {}).pop(name, None)
assert "mxnet" not in sys.modules and not any(hasattr(numpy, n) for n in NAMES)
seen = []

class Probe:
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "mxnet" and not seen:
            seen.append(all(getattr(numpy, n, None) is getattr(builtins, n) for n in NAMES))
        return None

sys.meta_path.insert(0, Probe())
import d2l_transformer
print("aliases set when mxnet was imported:", seen)
""" % (NAMES,)


def test_package_applies_the_shim_before_importing_mxnet():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "aliases set when mxnet was imported: [True]" in r.stdout, r.stdout
