"""CTranslate2's threads for ``--engine ctranslate2`` when none are asked for (``--engine-threads
0``): the fastest of a few counts on this machine, measured once on first use and cached.

No rule of the core count picks the fastest count on every machine (docs/export.md, "Threads":
two cores of the same topology, one where a second thread pays and one where it does not), so
the first use measures it (`measure`): a ``ctranslate2.Translator`` of the model in use per
count of `candidates` (1, 2, 4, 8, up to the physical cores), one loaded at a time, each
decoding the same batch of `PROBE_SENTENCES` synthetic sources for exactly `PROBE_STEPS` greedy
steps, `ROUNDS` rounds in alternating order; `choose` takes the fewest threads whose median is
within `MARGIN` of the fastest. The result is kept in the package's cache of measured decisions
(`io.measured`) under `key`: this machine, CTranslate2's version, the compute type and the
model's sizes (never in the model directory); a count read back that is not one of the counts
measured here is refused (measured again).
"""

import math
import statistics
import time

from .._runtime import threads as _threads
from ..io import measured

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


def key(model, compute_type, version):
    """The cache key of a measurement (`io.measured.key`): this machine, CTranslate2's
    `version`, the `compute_type`, and the sizes of the export's `model` (its manifest's
    ``model``)."""
    sizes = "/".join(str(model.get(k)) for k in (
        "encoder_layers", "decoder_layers", "hidden_size", "ffn_hidden_size", "num_heads",
        "source_vocab_size", "target_vocab_size"))
    return measured.key("ctranslate2 threads", {"ctranslate2": version,
                                                "compute type": compute_type, "model": sizes})


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
    `ROUNDS` rounds in alternating order. One translator is loaded at a time: each round opens
    each count's in turn, warms it up (memory, caches), times it and drops it."""
    options = {"beam_size": 1, "max_batch_size": len(sources), "min_decoding_length": PROBE_STEPS,
               "max_decoding_length": PROBE_STEPS, "max_input_length": 0}
    seconds, repeats = {n: [] for n in counts}, None
    for r in range(ROUNDS):
        for n in counts if r % 2 == 0 else counts[::-1]:
            translator = open_translator(n)
            translator.translate_batch(sources, **options)  # warm-up
            if repeats is None:
                tic = time.perf_counter()
                translator.translate_batch(sources, **options)
                repeats = max(1, min(50, math.ceil(LEAST_SECONDS / max(
                    time.perf_counter() - tic, 1e-6))))
            tic = time.perf_counter()
            for _ in range(repeats):
                translator.translate_batch(sources, **options)
            seconds[n].append(time.perf_counter() - tic)
            del translator  # before the next one loads
    return seconds


def best_threads(open_translator, source_tokens, model, compute_type, version):
    """The thread count for this machine and model (`choose`): from the cache, else measured
    (`measure`, a few seconds) and cached; 1, unmeasured, on a machine busy with other work
    (`io.measured.busy`, docs/benchmarks.md: more threads only wait for the busy cores).
    `open_translator(n)`: a ``ctranslate2.Translator`` of the model on n threads;
    `source_tokens`: its source vocabulary; `model`, `compute_type`, `version`: the `key`'s."""
    counts = candidates(_threads.physical_cores())
    if len(counts) == 1:
        return 1
    name = key(model, compute_type, version)
    entry = measured.recall(name, counts)
    if entry is not None:
        return entry["value"]
    if measured.busy():  # what it measured now would not be kept (`measured.keep`), and it
        return 1  # would cost every run its time: one thread, the busy machine's best
    seconds = measure(open_translator, counts, probe(source_tokens))
    threads = choose(seconds)
    measured.keep(name, threads, {str(n): statistics.median(s) for n, s in seconds.items()},
                  "CTranslate2's measured threads")
    return threads
