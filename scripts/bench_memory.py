#!/usr/bin/env python
"""Where a run's memory goes: the `hour` preset trained on the Bible's verses with one setting
changed per row, each row a training run in its own process, rounds interleaved, medians.

    ../shared/data/bible.sh out/bible
    .venv/bin/python scripts/bench_memory.py --bible out/bible --pairs 8000 --repeats 2

Rows (the first ``--pairs`` pairs, English to German, no held-out parts, ``--epochs`` epochs,
``--precision``, ``--threads`` threads (1 by default: `D2L_TRANSFORMER_THREADS=1`, so that CPU
seconds compare on a busy machine); ``--rows`` picks some):

* ``graph per call``: the package as it trains batches by length (`steps.static_batches`),
  with glibc's malloc as the package sets it (`_runtime.allocator`: one heap, kept);
* ``+ glibc defaults``: the first with glibc's own malloc settings (``MALLOC_ARENA_MAX=0``,
  which glibc ignores, so the package leaves malloc alone), as the package trained before;
* ``static graph``: its buffers planned once and kept (``static_alloc``), as before;
* ``before`` (with ``--before DIR``): the package as checked out in DIR (``git worktree add
  DIR REV``), the same command;

The glibc rows below set a malloc variable, so the package leaves glibc to them:

* ``+ glibc mmap 128 KB``: the first, ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc's threshold
  fixed: a freed large block goes back to the system at once);
* ``+ glibc 2 arenas``: the first, ``MALLOC_ARENA_MAX=2``;
* ``+ glibc huge pages``: the first, ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc 2.35 and
  later ask for transparent huge pages on the blocks they map: one page fault per 2 MB, not per
  4 KB, when the kernel's THP mode is ``madvise`` or ``always``);
* ``+ glibc heap only``: the first, ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824``
  (no block is mapped on its own, and up to 1 GB freed at the heap's top is kept: a large
  buffer freed at one step is reused by the next without new page faults).

MXNet 1.9.1 has no CPU memory pool to set: ``MXNET_CPU_MEM_POOL_TYPE`` came with MXNet 2.0, and
1.9.1's library does not read it (its name is not in ``libmxnet.so``).

Prints (and writes ``--json``) each row's median peak resident memory, CPU seconds (user +
system) and minor page faults of its process, and the loop's target tokens per second.
docs/data.md, "Memory", has the figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROWS = {"graph per call": ({}, ""),
        "+ glibc defaults": ({"MALLOC_ARENA_MAX": "0"}, ""),
        "static graph": ({}, "from d2l_transformer.training import loop\n"
                             "loop.static_batches = lambda data_iter: True\n"),
        "+ glibc mmap 128 KB": ({"MALLOC_MMAP_THRESHOLD_": "131072"}, ""),
        "+ glibc 2 arenas": ({"MALLOC_ARENA_MAX": "2"}, ""),
        "+ glibc huge pages": ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, ""),
        "+ glibc heap only": ({"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1073741824"}, "")}
CHILD = """import json, resource, sys
{patch}from d2l_transformer.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"code": code, "peak_rss_gb": peak / 1024 ** 2, "minor_faults": use.ru_minflt,
                  "cpu_seconds": use.ru_utime + use.ru_stime}}))
"""


BEFORE = """import d2l_transformer
assert d2l_transformer.__file__.startswith({dir!r}), d2l_transformer.__file__
"""  # run in DIR: ``python -c`` finds DIR's package first, from its working directory


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bible", required=True, help="the folder ../shared/data/bible.sh wrote")
    p.add_argument("--pairs", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precision", default="float32")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS),
                   help="the rows to run (all)")
    p.add_argument("--threads", type=int, default=1,
                   help="D2L_TRANSFORMER_THREADS of each run (1: CPU seconds compare when busy)")
    p.add_argument("--before", default=None, metavar="DIR",
                   help="a checkout of the package at another commit: adds the row 'before'")
    p.add_argument("--json", default=None)
    return p


def run_row(name, args, out):
    """One training run of row `name` in a process of its own: its figures."""
    before = os.path.abspath(args.before) if name == "before" else None
    env, patch = ROWS[name] if not before else ({}, BEFORE.format(dir=before))
    bible = os.path.abspath(args.bible)
    argv = ["train", "--preset", "hour", "--data", os.path.join(bible, "bible.en"),
            os.path.join(bible, "bible.de"), "--max-pairs", str(args.pairs), "--epochs",
            str(args.epochs), "--set", "num_valid=0", "--set", "num_test=0", "--set",
            f"precision={args.precision}", "--quiet", "--out", out, "--overwrite"]
    run = subprocess.run([sys.executable, "-c", CHILD.format(patch=patch), *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=before,
                         env={**os.environ, "D2L_TRANSFORMER_THREADS": str(args.threads), **env})
    if run.returncode:
        raise SystemExit(f"{name}: {run.stderr.strip().splitlines()[-1]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    del figures["code"]
    return dict(figures, tokens_per_sec=summary["tokens_per_sec"],
                precision=summary["precision"]["precision"])


def main(args):
    if args.before:
        args.rows = [*args.rows, "before"]
    figures = {name: [] for name in args.rows}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in (args.rows if r % 2 == 0 else args.rows[::-1]):
                out = os.path.join(tmp, f"{r}-{[*ROWS, 'before'].index(name)}")
                figures[name].append(run_row(name, args, out))
                print(name, figures[name][-1], flush=True)
    keys = ("peak_rss_gb", "cpu_seconds", "minor_faults", "tokens_per_sec")
    result = {name: dict(runs[-1], **{k: statistics.median(x[k] for x in runs) for k in keys})
              for name, runs in figures.items()}
    print(f"{'row':22} {'peak RSS':>9} {'CPU s':>7} {'faults':>9} {'tokens/s':>9}")
    for name, r in result.items():
        print(f"{name:22} {r['peak_rss_gb']:8.2f}G {r['cpu_seconds']:7.1f} "
              f"{r['minor_faults']:9.0f} {r['tokens_per_sec']:9.0f}  ({r['precision']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": result, "runs": figures}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_parser().parse_args()))
