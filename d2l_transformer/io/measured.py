"""What was measured on this machine, kept: the one cache of decisions made by measuring
(CTranslate2's threads, `inference.ct2_threads`; a training run's precision,
`training.precision`), so that each costs its measurement once per machine, library versions
and model sizes.

`key(what, parts)`: the decision, this machine (`machine`: the CPU's model, its physical cores
and usable CPUs, its control group's CPU quota) and what else the figures depend on (versions,
sizes), as one string. `recall(key, choices)`: the entry kept under it, if its value is one of
`choices`, the ones that were measured (another value, a count of 100,000 threads, is refused:
measured again). `keep(key, entry)`: read, merged and written under a lock (`io.lock`, waiting
its turn; `atomic.write_text`), so that two processes measuring at once lose no entry. A
measurement taken while other work ran (`busy`) decides for its process alone and is not kept:
a decision made under another job's load would outlive it. The file is ``measured.json`` in the
package's cache directory (`io.cache`), never in a model directory. A damaged file is ignored
with a one-line warning and written anew; one that cannot be written leaves the decision to
this process alone.
"""

import datetime
import json
import logging
import os

from .._runtime import cpu_math, threads
from . import atomic, lock
from .cache import cache_dir

log = logging.getLogger(__name__)

FILE = "measured.json"
FORMAT = "d2l_transformer measured 1"
WAIT = 30  # seconds to wait for another process writing the file
BUSY = 1.5  # a load average over this many times the usable CPUs: other work ran (`busy`)


def path():
    """The cache file's path (`io.cache.cache_dir`)."""
    return os.path.join(cache_dir(), FILE)


def machine():
    """This machine as the figures depend on it: the CPU's model, its physical cores and the
    CPUs this process may use, and its control group's CPU quota (one phrase)."""
    quota = threads.cpu_quota()
    return (f"{cpu_math.cpu_name()}; {threads.physical_cores()} cores, "
            f"{threads.usable_cpus()} CPUs, quota {'none' if quota is None else f'{quota:g} CPUs'}")


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


def busy():
    """Why figures measured now are not this machine's own (one phrase), or None: its 1-minute
    load average, this process's own threads counted, over `BUSY` times the CPUs it may use."""
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
    is one of `choices` (compared with its type: ``2``, not ``"2"`` or ``2.0``), else None."""
    entry = _read(path()).get(name)
    if entry is None or not any(type(entry.get("value")) is type(c) and entry["value"] == c
                                for c in choices):
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
    entry = {"value": value, "figures": figures,
             "measured": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        with lock.locked(file, "written", wait=WAIT):
            entries = _read(file)
            entries[name] = entry
            atomic.write_text(file, json.dumps({"format": FORMAT, "entries": entries}, indent=1))
    except (OSError, lock.Locked) as e:
        why = getattr(e, "strerror", None) or str(e)
        log.warning("cannot keep %s in %s: %s", what, file, why)
        return None, f"{file}: {why}"
    return file, None
