"""Valid BLEU against minutes of training of several runs, as a PNG and a Markdown table
(docs/evaluation.md, "The one-hour recipe").

    python scripts/recipe_curves.py --png docs/figures/recipe_curves.png \
        "full=out/r1" "width 256=out/r2"

Each run is ``label=MODEL_DIR`` (a model directory written by ``d2l-transformer train
--valid-every 1``; its summary.json holds the validations with the training seconds before
each)."""

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
    args = parser.parse_args(argv)
    curves = {}
    for run in args.runs:
        label, sep, path = run.partition("=")
        if not sep:
            parser.error(f"a run is label=MODEL_DIR, not {run!r}")
        try:
            with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
                curves[label] = validation_curve(json.load(f))
        except (OSError, ValueError) as e:
            parser.error(f"cannot read {path}/summary.json: {e}")
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


if __name__ == "__main__":
    main()
