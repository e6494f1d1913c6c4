"""Valid BLEU against minutes of training of several runs, as a PNG and a Markdown table
(docs/evaluation.md, "The one-hour recipe").

    python scripts/recipe_curves.py --png docs/figures/recipe_curves.png \
        "full=out/r1" "width 256=out/r2"

Each run is ``label=MODEL_DIR`` (a model directory written by ``d2l-transformer train
--valid-every 1``; its summary.json holds the validations with the training seconds before
each) or ``label=FILE.json:KEY`` (a record of such a run kept in a JSON file, as
docs/figures/recipe_runs.json keeps the one-hour recipe's candidates). ``--max-minutes M``
keeps the validations within M minutes of training: runs compared at one budget."""

import argparse
import json
import os

from d2l_transformer.viz.png import plot_validation, validation_curve


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="label=MODEL_DIR")
    parser.add_argument("--png", required=True, help="where to write the plot")
    parser.add_argument("--target", action="append", default=[],
                        help="minutes,bleu,label: a point to reach, drawn as a cross")
    parser.add_argument("--max-minutes", type=float, default=None, metavar="M",
                        help="only the validations within M minutes of training")
    args = parser.parse_args(argv)
    curves = {}
    for run in args.runs:
        label, sep, path = run.partition("=")
        if not sep:
            parser.error(f"a run is label=MODEL_DIR or label=FILE.json:KEY, not {run!r}")
        try:
            points = validation_curve(_summary(path))
        except (OSError, ValueError, KeyError) as e:
            parser.error(f"cannot read the validations of {path}: {e}")
        curves[label] = [p for p in points if args.max_minutes is None
                         or p[1] <= args.max_minutes]
    targets = []
    for t in args.target:
        minutes, bleu, label = t.split(",", 2)
        targets.append((float(minutes), float(bleu), label))
    plot_validation(curves, args.png, targets)
    print("| run | " + " | ".join(["epoch", "minutes", "valid BLEU"]) + " |")
    print("|---|---|---|---|")
    for label, points in curves.items():
        for epoch, minutes, bleu in points:
            print(f"| {label} | {epoch} | {minutes:.1f} | {bleu:.2f} |")
    print(f"wrote {args.png}")


def _summary(path):
    """A run's summary: MODEL_DIR/summary.json, or the entry KEY of FILE.json."""
    file, sep, key = path.rpartition(":")
    if sep and file.endswith(".json"):
        with open(file, encoding="utf-8") as f:
            return json.load(f)[key]
    with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    main()
