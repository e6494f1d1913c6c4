#!/usr/bin/env python
"""9.3.7's claim on this machine: the Transformer against the book's seq2seq models, in the
chapter's setting (docs/exercises.md).

    python scripts/claim.py --out out/claim                  # 3 seeds, 200 epochs: the claim
    python scripts/claim.py --out out/epochs --epochs 1000   # exercise 1: early and late
    python scripts/claim.py --out out/claim --report         # the table again, from the runs

For each seed and each model (9.3's Transformer, 9.2's seq2seq with attention, 8.14's seq2seq),
the book's own code (scripts/chapter_oracle.py --architecture A: the section's classes on d2l
0.11.4, trained by its `train_s2s_ch9`) and the package's default (``d2l-transformer train
--architecture A``: the corrected model, the Transformer on its graph path), one after the
other in this order, each in its own process on the CPU, all with the same epochs. Then the
table (`claim.table`), the verdicts (`claim.verdict_lines`) and OUT/claim.png; OUT/claim.md
holds the same. A run already in OUT (its summary.json) is not run again. Without d2l 0.11.4,
the package's runs only. Run it alone on the machine: its speeds are measured.
"""

import argparse
import json
import os
import subprocess
import sys

from d2l_transformer.report import claim
from d2l_transformer.viz.png import plot_claim

ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chapter_oracle.py")
TRAIN = [sys.executable, "-m", "d2l_transformer"]
FOLDERS = {"book's code": "book", "package": "package"}  # OUT/ARCHITECTURE-FOLDER-SEED


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the runs, claim.md and claim.png")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=200, help="every run's (9.2's 200)")
    p.add_argument("--architectures", nargs="+", choices=claim.ARCHITECTURES,
                   default=list(claim.ARCHITECTURES))
    p.add_argument("--no-book", action="store_true", help="the package's runs only")
    p.add_argument("--report", action="store_true", help="no new runs: the table of OUT's runs")
    p.add_argument("--data", default=None, help="path of fra-eng.zip")
    return p


def _command(code, architecture, seed, epochs, out, data):
    """The command of one run, writing OUT/summary.json."""
    common = ["--architecture", architecture, "--seed", str(seed), "--epochs", str(epochs),
              "--ctx", "cpu"] + (["--data", data] if data else [])
    if code == "book's code":
        return [sys.executable, ORACLE, *common, "--out", out]
    return [*TRAIN, "train", *common, "--quiet", "--overwrite", "--out", out]


def _book_installed():
    try:
        import d2l
    except ImportError:
        return False
    return getattr(d2l, "__version__", None) == "0.11.4"


def run_all(args):
    """Every missing run, interleaved (seed, model, code); ``[(architecture, code, summary)]``."""
    codes = claim.CODES if not args.no_book and _book_installed() else claim.CODES[1:]
    runs = []
    for seed in args.seeds:
        for architecture in args.architectures:
            for code in codes:
                out = os.path.join(args.out, f"{architecture}-{FOLDERS[code]}-{seed}")
                path = os.path.join(out, "summary.json")
                if not os.path.exists(path) and not args.report:
                    print(f"seed {seed}, {architecture}, {code} ...", file=sys.stderr, flush=True)
                    r = subprocess.run(_command(code, architecture, seed, args.epochs, out,
                                                args.data), capture_output=True, text=True)
                    if r.returncode:
                        sys.exit(f"error: the run into {out} failed:\n{r.stderr[-2000:]}")
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        runs.append((architecture, code, json.load(f)))
    return runs


def main(argv=None):
    args = get_parser().parse_args(argv)
    if args.epochs < 1 or not args.seeds:
        sys.exit("error: --epochs must be at least 1 and --seeds name one seed or more")
    os.makedirs(args.out, exist_ok=True)
    runs = run_all(args)
    if not runs:
        sys.exit(f"error: no runs in {args.out}")
    text = "\n".join([claim.table(runs), "", *claim.verdict_lines(runs)])
    print(text)
    with open(os.path.join(args.out, "claim.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    png = plot_claim(claim.group(runs), os.path.join(args.out, "claim.png"), claim.NAMES)
    print(f"wrote {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
