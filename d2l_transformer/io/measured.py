"""What was measured on this machine, kept: the one cache of decisions made by measuring
(CTranslate2's threads, `inference.ct2_threads`; a training run's precision,
`training.precision`), so that each costs its measurement once per machine, library versions
and model sizes.

`key(what, parts)`: the decision, this machine (`machine`: the CPU's model and the flags of it
that change the answer, its physical cores and usable CPUs, its control group's CPU quota,
oneDNN's instruction-set cap, whether Linux granted the AMX tiles, the package's kernels on or
off, the package's version) and what else the figures depend on (versions, sizes), as one
string. An entry expires after `MAX_AGE_DAYS`, or with a new package version.
`recall(key, choices)`: the entry kept under it, if its value is one of `choices`, the ones
that were measured (another value, a count of 100,000 threads, is refused: measured again).
`keep(key, entry)`: read, merged and written under a lock (`io.lock`, waiting
its turn; `atomic.write_text`), so that two processes measuring at once lose no entry. A
measurement taken while other work ran (`busy`: another process of the package training, see
`training`, or a load average over the usable CPUs) decides for its process alone and is not
kept: a decision made under another job's load would outlive it. The file is ``measured.json`` in the
package's cache directory (`io.cache`), never in a model directory. A damaged file is ignored
with a one-line warning and written anew; one that cannot be written leaves the decision to
this process alone.
"""

import contextlib
import datetime
import json
import logging
import os

from .._runtime import cpu_math, environ, threads
from .._version import __version__
from . import atomic, lock
from .cache import cache_dir

log = logging.getLogger(__name__)

FILE = "measured.json"
FORMAT = "d2l_transformer measured 1"
WAIT = 30  # seconds to wait for another process writing the file
BUSY = 1.0  # a load average over this many times the usable CPUs: other work ran (`busy`)
MAX_AGE_DAYS = 30  # an entry older than this is measured again
TRAINING = "training"  # the cache directory's folder of the package's training processes
# the CPU flags that change what is faster: the vector and matrix units oneDNN may use
FLAGS = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
         "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def path():
    """The cache file's path (`io.cache.cache_dir`)."""
    return os.path.join(cache_dir(), FILE)


def machine():
    """This machine as the figures depend on it (one phrase): the CPU's model and `FLAGS`, its
    physical cores and the CPUs this process may use, its control group's CPU quota, oneDNN's
    instruction-set cap (``DNNL_MAX_CPU_ISA``), whether Linux granted the AMX tiles, the
    package's kernels on or off, and the package's version."""
    quota = threads.cpu_quota()
    flags = [f for f in FLAGS if f in (cpu_math.cpu_flags() or ())]
    cap = os.environ.get(cpu_math.ISA_CAP[0])
    return (f"{cpu_math.cpu_name()}; {threads.physical_cores()} cores, "
            f"{threads.usable_cpus()} CPUs, quota {'none' if quota is None else f'{quota:g} CPUs'}; "
            f"flags {' '.join(flags) or 'none'}; {cpu_math.ISA_CAP[0]} {cap or 'unset'}; "
            f"AMX {cpu_math.amx_state() or 'not asked'}; "
            f"kernels {'on' if environ.kernels_enabled() else 'off'}; "
            f"d2l_transformer {__version__}")


def key(what, parts):
    """The key of a decision `what` on this machine (`machine`), `parts` (``{name: value}``:
    versions, sizes) in their order."""
    return "; ".join([what, machine()] + [f"{k} {v}" for k, v in parts.items()])


def _read(file):
    """The file's entries, ``{key: entry}``: nothing for a missing file, or a damaged one
    (one warning) or one that is not ours."""
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring the damaged cache file %s (%s); measuring again", file,
                    getattr(e, "strerror", None) or type(e).__name__)
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get(
        "format") == FORMAT else None
    return {k: v for k, v in entries.items() if isinstance(v, dict)} if isinstance(
        entries, dict) else {}


def _fresh(entry):
    """Whether an entry was measured by this version of the package, within `MAX_AGE_DAYS`."""
    try:
        age = datetime.datetime.now() - datetime.datetime.fromisoformat(entry["measured"])
    except (KeyError, TypeError, ValueError):
        return False
    return entry.get("version") == __version__ and age <= datetime.timedelta(MAX_AGE_DAYS)


def _marks():
    return os.path.join(cache_dir(), TRAINING)


@contextlib.contextmanager
def training():
    """Marks this process as training while the block runs (a file named by its pid in the
    cache directory's `TRAINING` folder), so that another process measuring does not keep
    figures taken beside it (`busy`). A folder that cannot be written marks nothing."""
    mark = os.path.join(_marks(), str(os.getpid()))
    try:
        os.makedirs(_marks(), exist_ok=True)
        with open(mark, "w"):
            pass
    except OSError:
        mark = None
    try:
        yield
    finally:
        if mark:
            with contextlib.suppress(OSError):
                os.remove(mark)


def other_training():
    """The pid of another live process of the package that is training (`training`), or None;
    the marks of processes that are gone are removed."""
    try:
        names = os.listdir(_marks())
    except OSError:
        return None
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            os.kill(int(name), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(_marks(), name))  # ours, its process gone
            continue
        except PermissionError:
            pass  # alive, another user's
        return int(name)
    return None


def busy():
    """Why figures measured now are not this machine's own (one phrase), or None: another
    process of the package training (`other_training`), or a 1-minute load average, this
    process's own threads counted, over `BUSY` times the CPUs it may use."""
    other = other_training()
    if other is not None:
        return f"another d2l_transformer process (pid {other}) was training"
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not a Unix
        return None
    cpus = threads.usable_cpus()
    if load <= BUSY * cpus:
        return None
    return f"the machine was busy (load average {load:.1f} on {cpus} CPUs)"


def recall(name, choices):
    """The entry kept under `name` (``{"value", "measured", "figures", ...}``) when its value
    is one of `choices` (compared with its type: ``2``, not ``"2"`` or ``2.0``) and it is fresh
    (`MAX_AGE_DAYS`, this package version), else None."""
    entry = _read(path()).get(name)
    if entry is None or not _fresh(entry) or not any(
            type(entry.get("value")) is type(c) and entry["value"] == c for c in choices):
        return None
    return entry


def keep(name, value, figures, what):
    """Keep `value` (measured: `figures`, ``{choice: number}``) under `name`, beside the file's
    other entries (read again and merged under the lock), unless the machine is `busy`.
    Returns ``(the path written, None)``, or ``(None, why not)``: busy, or the file cannot be
    written (one warning naming `what`)."""
    why = busy()
    if why:
        return None, why
    file = path()
    entry = {"value": value, "figures": figures, "version": __version__,
             "measured": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        with lock.locked(file, "written", wait=WAIT):
            entries = {k: e for k, e in _read(file).items() if _fresh(e)}  # the expired go
            entries[name] = entry
            atomic.write_text(file, json.dumps({"format": FORMAT, "entries": entries}, indent=1))
    except (OSError, lock.Locked) as e:
        why = getattr(e, "strerror", None) or str(e)
        log.warning("cannot keep %s in %s: %s", what, file, why)
        return None, f"{file}: {why}"
    return file, None
