#!/usr/bin/env python
"""The package's own curve, as rows like the peers' (scripts/peer_common.py): a training run
in stages, each stage's model directory kept, each translated with beam 4 and scored.

    python scripts/peer_package.py --venv .venv \\
        --train train.en train.de --dev dev.en dev.de --test test.en test.de \\
        --src-lang en --tgt-lang de --work runs/package_curve_en_de --epochs-at 6 12 18
    python scripts/peer_package.py --venv .venv --test test.en test.de --src-lang en \\
        --tgt-lang de --work runs/package_scored --models out/a out/b    # score kept directories

The package saves its model directory over itself every ``--checkpoint-every`` epochs, so a
curve needs copies: ``--epochs-at E1 E2 ...`` runs ``d2l-transformer train --preset hour
--epochs E1``, copies the model directory to WORK/checkpoints/epoch_E1, then ``train --resume
--epochs E2`` (the same run continued: its optimizer states and batch order's streams are in the
directory), and so on; pick the epochs from the seconds an epoch takes (summary.json's
``validation`` entries carry the training seconds before each). ``--models DIR ...`` scores
model directories kept some other way. Each kept directory is scored by ``d2l-transformer
evaluate --model DIR --src --ref --beam 4 --json``, and the last stage's OUT/average too (the
last ``--average`` epochs of the last stage: a resumed run averages the epochs it trains, so
make the last stage at least that long).

A row's ``minutes`` is its summary.json's ``train_seconds`` (the epochs only: no start-up, no
validation), ``updates`` its epochs times the batches an epoch (the training's own line),
``tokens_per_sec`` the package's own (real target tokens a second of the last epoch: the peers'
rows count source+target), ``peak_rss_gb`` the largest of the training processes'. Only the
standard library here: the package runs in ``--venv``, on this checkout (PYTHONPATH).
"""

import argparse
import json
import os
import re
import shutil
import sys

import peer_common as pc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCHES = re.compile(r"(\d+) batches per epoch")


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", required=True, help="the virtual environment with the package")
    p.add_argument("--train", nargs=2, metavar=("SRC", "TGT"))
    p.add_argument("--dev", nargs=2, metavar=("SRC", "TGT"))
    p.add_argument("--test", nargs=2, required=True, metavar=("SRC", "REF"))
    p.add_argument("--src-lang", required=True)
    p.add_argument("--tgt-lang", required=True)
    p.add_argument("--work", required=True, help="a new (or empty) directory for everything")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--epochs-at", type=int, nargs="+", metavar="E",
                      help="train in stages to these epochs, a model directory kept after each")
    mode.add_argument("--models", nargs="+", metavar="DIR", help="score these model directories")
    p.add_argument("--preset", default="hour")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a config field on top of the preset (repeatable)")
    p.add_argument("--average", type=int, default=4, help="train's --average-last (0: none)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--test-lines", type=int, help="score the first K test lines only")
    p.add_argument("--batches", type=int,
                   help="batches an epoch, for the rows' updates with --models (a stage's "
                        "training line says it; --epochs-at reads it there)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p


def train_argv(args, r, epochs, resume):
    """``d2l-transformer train`` to `epochs` (resuming WORK/model after the first stage)."""
    argv = [r.tool("python"), "-m", "d2l_transformer", "train", "--preset", args.preset,
            "--data", *args.train, "--test", *args.test, "--source-lang", args.src_lang,
            "--target-lang", args.tgt_lang, "--epochs", epochs, "--seed", args.seed,
            "--out", os.path.join(args.work, "model"), "--quiet"]
    argv += ["--average-last", args.average] if args.average else []
    argv += ["--valid", *args.dev] if args.dev else []
    argv += [w for field in args.set for w in ("--set", field)]
    return argv + (["--resume"] if resume else [])


def train_stages(args, r):
    """Each stage trained and its model directory copied: ``(directories, batches an epoch,
    the largest peak RSS in MiB)``."""
    kept, batches, rss = [], None, 0
    for i, epochs in enumerate(sorted(args.epochs_at)):
        text, _, peak = r.run(train_argv(args, r, epochs, i > 0), capture=True,
                              log=os.path.join(args.work, f"train_{epochs}.log"))
        rss, found = max(rss, peak), BATCHES.search(text)
        batches = int(found[1]) if found else batches
        kept.append(os.path.join(args.work, "checkpoints", f"epoch_{epochs}"))
        shutil.copytree(os.path.realpath(os.path.join(args.work, "model")), kept[-1],
                        ignore=shutil.ignore_patterns("average", "best"))
    average = os.path.join(args.work, "model", "average")
    return kept + ([average] if os.path.isdir(average) else []), batches, rss


def evaluate(args, r, model, name):
    """``d2l-transformer evaluate`` of `model` on the test set: its beam's scores."""
    out = os.path.join(args.work, "curve", f"{name}.json")
    r.run([r.tool("python"), "-m", "d2l_transformer", "evaluate", "--model", model,
           "--beam", args.beam, "--src", args.test[0], "--ref", args.test[1], "--json", out],
          log=os.path.join(args.work, "curve", f"{name}.log"))
    with open(out, encoding="utf-8") as f:
        return beam_scores(json.load(f), args.beam)


def beam_scores(report, beam):
    """The scores of `evaluate --json`'s last set with beam `beam` (greedy for 1)."""
    decoders = report["sets"][-1]["decoders"]
    return decoders["greedy" if beam == 1 else f"beam {beam}"]


def summary_row(name, summary, batches, scores, rss_mib, settings):
    """A curve row from a model directory's summary.json and its scores."""
    epochs = summary.get("epochs_done") or 0
    if name == "average" and (summary.get("average") or {}).get("averaged_epochs"):
        name = f"{name} (average of epochs {summary['average']['averaged_epochs']})"
    row = pc.curve_row(name, epochs * batches if batches else None, summary["train_seconds"], 0,
                       scores, round(summary.get("tokens_per_sec") or 0, 1), rss_mib, settings)
    row.pop("wall_minutes")  # the package records its epochs' seconds only
    return dict(row, epochs=epochs)


def main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)
    if args.epochs_at and not args.train:
        p.error("--epochs-at trains: give --train (and --dev)")
    args.work = os.path.abspath(args.work)
    if os.path.isdir(args.work) and os.listdir(args.work):
        p.error(f"--work {args.work} is not empty")
    for sub in ("data", "checkpoints", "curve"):
        os.makedirs(os.path.join(args.work, sub), exist_ok=True)
    if args.test_lines:
        cut = [os.path.join(args.work, "data", f"test.{side}") for side in ("src", "ref")]
        for path, out in zip(args.test, cut):
            pc.write_lines(out, pc.read_lines(path, args.test_lines))
        args.test = cut
    r = pc.Runner(os.path.abspath(args.venv), args.work, args.threads)
    r.env["PYTHONPATH"] = ROOT  # this checkout's package, whatever the venv has installed
    models, batches, rss = train_stages(args, r) if args.epochs_at else (args.models, args.batches, 0)
    settings = {"toolkit": "d2l_transformer", "direction": f"{args.src_lang}-{args.tgt_lang}",
                "beam": args.beam, "threads": args.threads, "preset": args.preset,
                "set": args.set, "test_lines": args.test_lines,
                "tokens_per_sec_counts": "real target tokens a second, the last epoch"}
    rows = []
    for model in models:
        name = os.path.basename(os.path.normpath(model))
        with open(os.path.join(model, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        rows.append(summary_row(name, summary, batches, evaluate(args, r, model, name), rss, settings))
        pc.say_row(rows[-1])
    pc.dump(rows, os.path.join(args.work, "curve.json"))
    pc.dump({"toolkit": "d2l_transformer", "args": vars(args), "env": r.env_note, "curve": rows,
             "commands": r.commands}, os.path.join(args.work, "results.json"))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
