"""CTranslate2's threads for ``--engine ctranslate2`` when none are asked for (``--engine-threads
0``): the fastest of a few counts on this machine, measured once on first use and cached.

No rule of the core count picks the fastest count on every machine (docs/export.md, "Threads":
two cores of the same topology, one where a second thread pays and one where it does not), so
the first use measures it (`measure`): one ``ctranslate2.Translator`` of the model in use per
count of `candidates` (1, 2, 4, 8, up to the physical cores), each decoding the same batch of
`PROBE_SENTENCES` synthetic sources for exactly `PROBE_STEPS` greedy steps, `ROUNDS`
interleaved rounds; `choose` takes the fewest threads whose median is within `MARGIN` of the
fastest. The result is kept in the package's cache directory (`io.cache`), in `CACHE_FILE`,
under `key`: the CPU model, the physical and usable CPUs, CTranslate2's version, the compute
type and the model's sizes (never in the model directory). A damaged cache file is ignored and
written anew; one that cannot be written leaves the count measured for this process only.
"""

import datetime
import json
import logging
import math
import os
import platform
import statistics
import time

from .._runtime import threads as _threads
from ..io import atomic
from ..io.cache import cache_dir

log = logging.getLogger(__name__)

CACHE_FILE = "ctranslate2_threads.json"
FORMAT = "d2l_transformer ctranslate2 threads 1"
MOST = 8  # the most threads measured
ROUNDS = 5
MARGIN = 0.10  # more threads must be this much faster than fewer to be chosen
PROBE_SENTENCES, PROBE_LENGTH, PROBE_STEPS = 64, 12, 20  # one batch: sources x tokens, steps
LEAST_SECONDS = 0.1  # one measurement repeats the batch at least this long (on one thread)
RESERVED = 4  # the vocabulary's first tokens: <unk>, <pad>, <bos>, <eos>


def candidates(cores):
    """The thread counts measured on `cores` physical cores: 1, 2, 4, 8 up to `cores` (at most
    `MOST`), and `cores` itself when it is fewer than `MOST`."""
    top = max(1, min(cores, MOST))
    counts = [n for n in (1, 2, 4, 8) if n <= top]
    return counts if top in counts else counts + [top]


def choose(seconds):
    """The thread count to use from ``{count: [seconds of each round]}``: the fewest whose
    median is within `MARGIN` of the fastest median."""
    medians = {n: statistics.median(s) for n, s in seconds.items()}
    fastest = min(medians.values())
    return min(n for n, m in medians.items() if m <= fastest * (1 + MARGIN))


def cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere `platform`'s)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def key(model, compute_type, version):
    """The cache key of a measurement: this machine's CPU model, physical cores and usable
    CPUs, CTranslate2's `version`, the `compute_type`, and the sizes of the export's `model`
    (its manifest's ``model``)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    sizes = "/".join(str(model.get(k)) for k in (
        "encoder_layers", "decoder_layers", "hidden_size", "ffn_hidden_size", "num_heads",
        "source_vocab_size", "target_vocab_size"))
    return (f"{cpu_model()}; {_threads.physical_cores()} cores, {usable} CPUs; ctranslate2 "
            f"{version}; {compute_type}; model {sizes}")


def read_cache(path):
    """The entries of the cache file at `path`: ``{key: {"threads": n, ...}}``; nothing for a
    missing or damaged file, or entries that are not ours."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring the damaged cache file %s (%s); measuring again", path,
                    getattr(e, "strerror", None) or type(e).__name__)
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get(
        "format") == FORMAT else None
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, dict) and type(
        v.get("threads")) is int and v["threads"] >= 1}


def probe(source_tokens):
    """The measured batch: `PROBE_SENTENCES` sources of `PROBE_LENGTH` tokens, taken in turn
    from the source vocabulary `source_tokens` (in id order; its reserved tokens left out)."""
    tokens = list(source_tokens[RESERVED:]) or list(source_tokens)
    return [[tokens[(i * PROBE_LENGTH + j) % len(tokens)] for j in range(PROBE_LENGTH)]
            for i in range(PROBE_SENTENCES)]


def measure(open_translator, counts, sources):
    """``{count: [seconds of each round]}``: `open_translator(count)` (a CTranslate2
    translator on that many threads) decoding `sources` for exactly `PROBE_STEPS` greedy
    steps, repeated to last at least `LEAST_SECONDS` on the first count (at most 50 times),
    `ROUNDS` rounds in alternating order."""
    options = {"beam_size": 1, "max_batch_size": len(sources), "min_decoding_length": PROBE_STEPS,
               "max_decoding_length": PROBE_STEPS, "max_input_length": 0}
    translators = {n: open_translator(n) for n in counts}
    for translator in translators.values():
        translator.translate_batch(sources, **options)  # warm-up: memory, caches
    tic = time.perf_counter()
    translators[counts[0]].translate_batch(sources, **options)
    repeats = max(1, min(50, math.ceil(LEAST_SECONDS / max(time.perf_counter() - tic, 1e-6))))
    seconds = {n: [] for n in counts}
    for r in range(ROUNDS):
        for n in counts if r % 2 == 0 else counts[::-1]:
            tic = time.perf_counter()
            for _ in range(repeats):
                translators[n].translate_batch(sources, **options)
            seconds[n].append(time.perf_counter() - tic)
    return seconds


def best_threads(open_translator, source_tokens, model, compute_type, version):
    """The thread count for this machine and model (`choose`): from the cache, else measured
    (`measure`, a few seconds) and cached. `open_translator(n)`: a ``ctranslate2.Translator``
    of the model on n threads; `source_tokens`: its source vocabulary; `model`, `compute_type`,
    `version`: the `key`'s."""
    counts = candidates(_threads.physical_cores())
    if len(counts) == 1:
        return 1
    path = os.path.join(cache_dir(), CACHE_FILE)
    name = key(model, compute_type, version)
    entries = read_cache(path)
    if name in entries:
        return entries[name]["threads"]
    seconds = measure(open_translator, counts, probe(source_tokens))
    threads = choose(seconds)
    entries[name] = {"threads": threads, "measured": datetime.datetime.now().isoformat(
        timespec="seconds"), "median_seconds": {str(n): statistics.median(s)
                                                for n, s in seconds.items()}}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic.write_text(path, json.dumps({"format": FORMAT, "entries": entries}, indent=1))
    except OSError as e:
        log.warning("cannot keep CTranslate2's measured threads in %s: %s", path,
                    e.strerror or e)
    return threads
