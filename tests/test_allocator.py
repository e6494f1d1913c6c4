"""glibc's malloc as the package sets it (d2l_transformer/_runtime/allocator.py): one heap,
kept, so that a large buffer freed at one step is reused by the next without new page faults;
the user's own malloc settings, and MXNet imported first, leave glibc alone."""

import json
import os
import subprocess
import sys

import pytest

from d2l_transformer._runtime import allocator, compat


def _glibc():
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


pytestmark = pytest.mark.skipif(not _glibc(), reason="glibc's malloc only (not this C library)")

# A fresh interpreter: import as given, then allocate, fill, free and allocate again a 128 MB
# block (glibc by default maps such a block on its own and unmaps it when freed), and give
# the share of its pages that fault in the second fill (huge pages off for the probe).
PROBE = """
import ctypes, json, resource
libc = ctypes.CDLL("libc.so.6")
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: one fault a page, whatever the system's THP
{pre}
from d2l_transformer._runtime import allocator
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
size = 128 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
libc.free(block)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = libc.malloc(size)
ctypes.memset(block, 1, size)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
libc.free(block)
pages = size // resource.getpagesize()  # each faults once when mapped afresh
print(json.dumps({{"configured": allocator.configured(), "faults": faults / pages}}))
"""


# What a user who imports mxnet first must do on NumPy >= 1.24 (Python 3.12 and later), where
# MXNet 1.9.1 does not import without NumPy's removed aliases: the package's own shim, loaded
# by its path so that the package itself is not imported before mxnet.
ALIASES = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("compat", {compat.__file__!r})
shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shim)
shim.apply()
"""


def _probe(pre, **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in allocator.USER and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre)], env={**clean, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_package_keeps_a_freed_large_block_for_the_next():
    got = _probe("import d2l_transformer")
    assert got["configured"] is True
    assert got["faults"] < 0.05  # the share of its pages that fault again: reused, none


def test_glibc_defaults_map_it_afresh():
    """The same probe with glibc as it comes (the user's MALLOC_ARENA_MAX=0, which glibc
    ignores): every page of the block faults again. This is what the package saves."""
    got = _probe("import d2l_transformer", MALLOC_ARENA_MAX="0")
    assert got["configured"] is False
    assert got["faults"] > 0.5


@pytest.mark.parametrize("name, value", [("MALLOC_TRIM_THRESHOLD_", "131072"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.mmap_max=8")])
def test_a_users_malloc_setting_is_kept(name, value):
    assert _probe("import d2l_transformer", **{name: value})["configured"] is False


def test_mxnet_imported_first_leaves_glibc_alone():
    """MXNet's threads would hold arenas of their own already: nothing is changed."""
    got = _probe(ALIASES + "import mxnet\nimport d2l_transformer")
    assert got["configured"] is False
    assert got["faults"] > 0.5
