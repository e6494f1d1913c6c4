"""What the row modules of scripts/bench.py share: the sizes of a run, the environment variables
that carry bench.py's options into a row's process, the chapter's data read once per process,
peak memory. Standard library only at import time: a row imports the package itself, after
bench.py has imported it first (its NumPy-alias shim must precede every import of mxnet)."""

import functools
import os
import resource

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(SCRIPTS, "bench.py")  # what a row's own child processes run
ROOT = os.path.dirname(SCRIPTS)
REPEATS_ENV = "D2L_TRANSFORMER_BENCH_REPEATS"  # --repeats, for the (i) rows' process
THREADS_ENV = "D2L_TRANSFORMER_BENCH_THREADS"  # --threads, likewise
SERVE_MODEL_ENV = "D2L_TRANSFORMER_BENCH_SERVE_MODEL"  # --serve-model DIR, for the row's process
MODEL_ENV = "D2L_TRANSFORMER_BENCH_MODEL"  # --model DIR, for the row's process
FULL_PRESET_ENV = "D2L_TRANSFORMER_BENCH_FULL_PRESET"  # --full-preset NAME, likewise


def sizes(quick):
    import d2l_transformer as d2t
    if quick:  # (f), (h): the `full` model on 100 test sentences of a 3,000-pair split
        return dict(cfg=d2t.TINY, epochs=3, n_greedy=3, n_batch=256, n_batch_1=20,
                    translate_length=10,
                    full_cfg=d2t.FULL.replace(num_examples=3000, vocab_size=600, batch_size=32,
                                              num_valid=100, num_test=100),
                    full_batches=4, full_epochs=2)
    return dict(cfg=d2t.CHAPTER, epochs=6, n_greedy=20, n_batch=1000, n_batch_1=100,
                translate_length=30,
                full_cfg=d2t.PRESETS[os.environ.get(FULL_PRESET_ENV, "full")], full_batches=24,
                full_epochs=3)


@functools.lru_cache(maxsize=None)
def chapter_data(cfg, fast_loader=False):
    """(src_vocab, tgt_vocab, data_iter), read once per process (reading takes seconds)."""
    import d2l_transformer as d2t
    return d2t.load_data_nmt(cfg.batch_size, cfg.num_steps, cfg.num_examples,
                             fast_loader=fast_loader)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def own_peak_rss_mb():
    """This process's own peak resident memory: Linux's VmHWM, which starts afresh at exec
    (ru_maxrss keeps the parent's peak across fork and exec); elsewhere ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return peak_rss_mb()
