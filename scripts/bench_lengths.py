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
tokens a pair, and each row's tokens per second against ``fra``'s. ``--profile`` runs each row
once more under MXNet's profiler and prints where a row's time per token goes, operator group
by operator group, against fra's (``--repeats 0 --profile``: the breakdown alone).
docs/data.md has the figures.
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
import mxnet as mx
profile = sys.argv.pop(1) == "profile"
if profile:  # every operator's time, summed by name (MXNet's aggregate statistics)
    mx.profiler.set_config(profile_symbolic=True, profile_imperative=True, aggregate_stats=True,
                           filename=sys.argv.pop(1))
    mx.profiler.set_state("run")
from d2l_transformer.cli import main
code = main(sys.argv[1:])
ops = None
if profile:
    mx.profiler.set_state("stop")
    ops = json.loads(mx.profiler.dumps(format="json"))
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"code": code, "peak_rss_gb": peak / 1024 ** 2, "ops": ops}))
"""
# --profile's groups: the first whose words are in an operator's name (its backward's too)
GROUPS = (("loss", ("softmax_ce", "log_softmax", "pick")),
          ("attention", ("d2t_attention", "batch_dot", "softmax", "masked")),
          ("products", ("FullyConnected", "dot")),
          ("add & norm", ("layer_norm", "LayerNorm")),
          ("optimizer", ("adam", "multi_")),
          ("embedding", ("Embedding", "take")),
          ("the rest", ("",)))


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bible", required=True, help="the folder ../shared/data/bible.sh wrote")
    p.add_argument("--pairs", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", default="auto")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS),
                   help="the rows to run (all; fra is always one: the others are against it)")
    p.add_argument("--profile", action="store_true",
                   help="one more run a row with MXNet's profiler: its operators' time per "
                        "1,000 target tokens, by group, the groups against fra's")
    p.add_argument("--json", default=None)
    return p


def run_row(name, args, out, profile=False):
    """One training run of row `name` in a process of its own: its summary's figures (and its
    operators' aggregate times with `profile`)."""
    files, extra = ROWS[name]
    data = ["--data"] + [os.path.join(args.bible, f) for f in files] if files else []
    argv = ["train", "--preset", "hour", *data, "--max-pairs", str(args.pairs), "--epochs",
            str(args.epochs), "--set", "num_valid=0", "--set", "num_test=0", "--set",
            f"precision={args.precision}", "--quiet", "--out", out, "--overwrite", *extra]
    mode = ["profile", out + ".profile.json"] if profile else ["time"]
    run = subprocess.run([sys.executable, "-c", CHILD, *mode, *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if run.returncode:
        raise SystemExit(f"{name}: {run.stderr.strip().splitlines()[-1]}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    lengths = summary["data"]["lengths"]
    child = json.loads(run.stdout.strip().splitlines()[-1])
    if profile:
        return groups(child["ops"], summary["tokens_per_sec"], summary["train_seconds"])
    return {"tokens_per_sec": summary["tokens_per_sec"], "peak_rss_gb": child["peak_rss_gb"],
            "pairs": lengths["pairs"], "limit": lengths["limit"],
            "precision": summary["precision"]["precision"]}


def groups(ops, tokens_per_sec, train_seconds):
    """Milliseconds per 1,000 target tokens by `GROUPS`, from MXNet's aggregate statistics
    (``{"Time": {"operator": {name: {"Total": ms, ...}}, ...}}``; the other domains, the C
    API's calls, are the Python thread's waits for them) over the run's target tokens
    (its tokens a second times its seconds of training), and ``outside the operators``: the
    wall clock's milliseconds per 1,000 tokens less the operators' (Python, the engine, waits;
    negative where operators overlap)."""
    totals = dict.fromkeys([g for g, _ in GROUPS], 0.0)
    for op, stats in ops.get("Time", {}).get("operator", {}).items():  # not the C API's waits
        group = next(g for g, words in GROUPS if any(w in op for w in words))
        totals[group] += stats["Total"]
    thousands = tokens_per_sec * train_seconds / 1000
    result = {g: round(t / thousands, 2) for g, t in totals.items()}
    result["outside the operators"] = round(1e6 / tokens_per_sec - sum(result.values()), 2)
    return result


def breakdown(profiles):
    """Prints each row's groups (ms per 1,000 target tokens) and their ratios to fra's."""
    base = profiles["fra"]
    print(f"{'ms per 1,000 target tokens':28}" + "".join(f"{name:>20}" for name in profiles))
    for g in base:
        print(f"{g:28}" + "".join(f"{p[g]:11.1f} ({p[g] / base[g] if base[g] else 0:4.2f}x)"
                                  for p in profiles.values()))


def main(args):
    rows = ["fra"] + [name for name in args.rows if name != "fra"]
    figures = {name: [] for name in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in (rows if r % 2 == 0 else rows[::-1]):
                figures[name].append(run_row(name, args, os.path.join(tmp, f"{r}-{name}")))
                print(name, figures[name][-1], flush=True)
        profiles = {name: run_row(name, args, os.path.join(tmp, f"profile-{name}"), profile=True)
                    for name in rows} if args.profile else None
    result = {name: dict(runs[-1], **{k: statistics.median(x[k] for x in runs)
                                      for k in ("tokens_per_sec", "peak_rss_gb")})
              for name, runs in figures.items() if runs}
    if result:
        base = result["fra"]["tokens_per_sec"]
        print(f"{'row':18} {'tokens/s':>9} {'vs fra':>7} {'peak RSS':>9} {'pairs':>6} {'limit':>5}")
        for name, r in result.items():
            print(f"{name:18} {r['tokens_per_sec']:9.0f} {r['tokens_per_sec'] / base:7.2f} "
                  f"{r['peak_rss_gb']:8.2f}G {r['pairs']:6d} {r['limit']:5d}  ({r['precision']})")
    if profiles:
        breakdown(profiles)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": result, "runs": figures,
                       "profile_ms_per_1000_target_tokens": profiles}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_parser().parse_args()))
