#!/usr/bin/env python
"""The curves of the peer runs (scripts/peer_*.py ``--score-checkpoints``, peer_package.py) in
one figure, BLEU against minutes of training, one line per run, with a Markdown table of every
row and the rows in one JSON file:

    python scripts/peer_plot.py runs/package_curve_en_de runs/onmt_curve_en_de \\
        --png docs/figures/bible_curves.png --json docs/figures/bible_curves.json

Each WORK directory holds the run's ``curve.json`` (peer_common's rows: ``minutes``, ``updates``,
``bleu``, ``chrf``, ``tokens_per_sec``, ``peak_rss_gb``, ``settings``); a line is labelled with
its toolkit and direction, and runs of the same label are one line (a curve continued in a
second WORK, as peer_package.py ``--models`` scores stages trained by hand). Each direction has
its own panel, each toolkit its colour in all of them. The average of the last checkpoints (a
row whose name says ``average``) is drawn as its own marker at its time, not as a point of the
line.
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402


def load(work):
    """``(label, rows)`` of WORK/curve.json, the label ``toolkit [--set fields] direction``
    (peer_package.py's ``--set`` makes a run of its own)."""
    with open(os.path.join(work, "curve.json"), encoding="utf-8") as f:
        rows = json.load(f)
    settings = rows[0]["settings"] if rows else {}
    toolkit = " ".join([settings.get("toolkit", os.path.basename(work)), *settings.get("set", [])])
    return f"{toolkit} {settings.get('direction', '')}", rows


def is_average(row):
    return "average" in row["checkpoint"]


def plot(curves, path):
    """BLEU against minutes: a panel per direction, a line per run, a colour per toolkit (the
    same in every panel), averages as stars."""
    directions = sorted({label.split()[-1] for label, _ in curves})
    toolkits = sorted({label.rsplit(" ", 1)[0] for label, _ in curves})
    colours = {t: f"C{i}" for i, t in enumerate(toolkits)}
    fig, axes = plt.subplots(1, len(directions), figsize=(5.5 * len(directions), 4), squeeze=False)
    for ax, direction in zip(axes[0], directions):
        for label, rows in curves:
            toolkit, run_direction = label.rsplit(" ", 1)
            if run_direction != direction:
                continue
            points = [r for r in rows if not is_average(r)]
            ax.plot([r["minutes"] for r in points], [r["bleu"] for r in points], "o-",
                    label=toolkit, color=colours[toolkit])
            averages = [r for r in rows if is_average(r)]
            ax.plot([r["minutes"] for r in averages], [r["bleu"] for r in averages], "*",
                    markersize=12, color=colours[toolkit])
        ax.set_title(direction)
        ax.set_xlabel("minutes of training")
        ax.set_ylabel("test BLEU (beam 4, sacreBLEU)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(curves):
    """The rows as a Markdown table."""
    lines = ["| run | checkpoint | minutes | updates | BLEU | chrF | tokens/s | peak RSS |",
             "|---|---|---|---|---|---|---|---|"]
    for label, rows in curves:
        lines += [f"| {label} | {r['checkpoint']} | {r['minutes']:.1f} | {r.get('updates')} | "
                  f"{r['bleu']:.2f} | {r['chrf']:.2f} | {r.get('tokens_per_sec')} | "
                  f"{_gb(r.get('peak_rss_gb'))} |" for r in rows]
    return "\n".join(lines)


def _gb(value):
    return "not measured" if value is None else f"{value} GB"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", nargs="+", help="the runs' WORK directories (each with curve.json)")
    p.add_argument("--png", required=True)
    p.add_argument("--json", help="all the rows, per run, in one file")
    args = p.parse_args(argv)
    curves = {}
    for label, rows in map(load, args.work):  # the same toolkit and direction: one line
        curves.setdefault(label, []).extend(rows)
    curves = [(label, sorted(rows, key=lambda r: r["minutes"])) for label, rows in curves.items()]
    plot(curves, args.png)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{"run": label, "rows": rows} for label, rows in curves], f, indent=1)
    print(table(curves))
    return curves


if __name__ == "__main__":
    main()
