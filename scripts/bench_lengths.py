#!/usr/bin/env python
"""Long segments against short ones: the `hour` preset's training tokens per second and peak
memory on Bible verses next to fra.txt's sentences, each row a training run in its own process,
rounds interleaved, medians.

    ../shared/data/bible.sh out/bible
    .venv/bin/python scripts/bench_lengths.py --bible out/bible --pairs 8000 --repeats 3

Rows (the first ``--pairs`` pairs of each corpus, no held-out parts, ``--epochs`` epochs, the
last one's figures):

* ``fra``: fra-eng.zip, English to French;
* ``bible``: the Bible, English to German, as the package trains it: the lengths from the data
  (nothing cut), batches of at most 7,680 padded tokens;
* ``bible, 128 a row``: ``--set num_steps=128 --set batch_tokens=0``: every batch 256 pairs,
  the limit raised and nothing else (how a user got the long verses whole before).

Prints (and writes ``--json``) each row's median target tokens per second (the loop's
``tokens_per_sec``), the median peak resident memory of its process, its pairs and target
tokens a pair, and each row's tokens per second against ``fra``'s. docs/data.md has the
figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROWS = {"fra": ([], []),
        "bible": (["bible.en", "bible.de"], []),
        "bible, 128 a row": (["bible.en", "bible.de"],
                             ["--set", "num_steps=128", "--set", "batch_tokens=0"])}
CHILD = """import json, sys
from d2l_transformer.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"code": code, "peak_rss_gb": peak / 1024 ** 2}))
"""


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bible", required=True, help="the folder ../shared/data/bible.sh wrote")
    p.add_argument("--pairs", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", default="auto")
    p.add_argument("--json", default=None)
    return p


def run_row(name, args, out):
    """One training run of row `name` in a process of its own: its summary's figures."""
    files, extra = ROWS[name]
    data = ["--data"] + [os.path.join(args.bible, f) for f in files] if files else []
    argv = ["train", "--preset", "hour", *data, "--max-pairs", str(args.pairs), "--epochs",
            str(args.epochs), "--set", "num_valid=0", "--set", "num_test=0", "--set",
            f"precision={args.precision}", "--quiet", "--out", out, "--overwrite", *extra]
    run = subprocess.run([sys.executable, "-c", CHILD, *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if run.returncode:
        raise SystemExit(f"{name}: {run.stderr.strip().splitlines()[-1]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    lengths = summary["data"]["lengths"]
    return {"tokens_per_sec": summary["tokens_per_sec"],
            "peak_rss_gb": json.loads(run.stdout.strip().splitlines()[-1])["peak_rss_gb"],
            "pairs": lengths["pairs"], "limit": lengths["limit"],
            "precision": summary["precision"]["precision"]}


def main(args):
    figures = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in (ROWS if r % 2 == 0 else list(ROWS)[::-1]):
                figures[name].append(run_row(name, args, os.path.join(tmp, str(len(figures)))))
                print(name, figures[name][-1], flush=True)
    result = {}
    for name, runs in figures.items():
        result[name] = dict(runs[-1], tokens_per_sec=statistics.median(
            x["tokens_per_sec"] for x in runs), peak_rss_gb=statistics.median(
            x["peak_rss_gb"] for x in runs))
    base = result["fra"]["tokens_per_sec"]
    print(f"{'row':18} {'tokens/s':>9} {'vs fra':>7} {'peak RSS':>9} {'pairs':>6} {'limit':>5}")
    for name, r in result.items():
        print(f"{name:18} {r['tokens_per_sec']:9.0f} {r['tokens_per_sec'] / base:7.2f} "
              f"{r['peak_rss_gb']:8.2f}G {r['pairs']:6d} {r['limit']:5d}  ({r['precision']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": result, "runs": figures}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_parser().parse_args()))
