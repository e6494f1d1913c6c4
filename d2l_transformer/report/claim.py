"""9.3.7's conclusion, checked: "compared to the seq2seq model with attention, the transformer
runs faster per epoch, and converges faster at the beginning" (and 9.3.9's exercise 1: early
against late, over many epochs).

From the summaries of chapter-setting runs (`d2l-transformer train --architecture A` and
scripts/chapter_oracle.py's, the book's own code), several seeds each: a table of each model's
speed (tokens per second as the book prints it, seconds per epoch), its loss at some epochs, the
epoch and the second at which it first reaches a loss, and one verdict per half of the claim.
The medians over the seeds decide; the table shows the seeds' range beside them. The seconds at
which a loss is reached are the epoch times the run's mean seconds per epoch.
"""

import statistics

ARCHITECTURES = ("transformer", "attention", "seq2seq")  # the claim's pair first
NAMES = {"transformer": "Transformer (9.3)", "attention": "seq2seq + attention (9.2)",
         "seq2seq": "seq2seq (8.14)"}
CODES = ("book's code", "package")  # chapter_oracle.py's runs; the package's default (corrected)
EPOCHS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
THRESHOLDS = (0.1, 0.05)
EARLY = (1, 2, 5, 10, 20)  # "at the beginning": the epochs the second verdict reads


def seconds_per_epoch(summary):
    """The run's mean training seconds per epoch."""
    return summary["train_seconds"] / len(summary["epoch_history"])


def loss_at(summary, epoch):
    """The loss (book units) of `epoch`, None when the run is shorter."""
    history = summary["epoch_history"]
    return history[epoch - 1][1] if epoch <= len(history) else None


def first_below(summary, threshold):
    """``(epoch, seconds)`` of the first epoch whose loss is at most `threshold`, None if none."""
    for epoch, loss, *_ in summary["epoch_history"]:
        if loss <= threshold:
            return epoch, epoch * seconds_per_epoch(summary)
    return None


def _cell(values, fmt):
    """The median of `values` (None: not reached) and, for several, their range."""
    if any(v is None for v in values):
        reached = sum(v is not None for v in values)
        return f"{reached} of {len(values)} seeds" if reached else "not reached"
    median = fmt.format(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def group(runs):
    """``{(architecture, code): [summary, ...]}`` of runs ``[(architecture, code, summary)]``."""
    groups = {}
    for architecture, code, summary in runs:
        groups.setdefault((architecture, code), []).append(summary)
    return groups


def table(runs):
    """The claim's table (Markdown): one row per model and code, medians over the seeds with
    their range."""
    groups = group(runs)
    longest = max(len(s["epoch_history"]) for _, _, s in runs)
    epochs = [e for e in EPOCHS if e <= longest]
    header = (["model", "code", "seeds", "tokens/s", "s/epoch"] + [f"loss @{e}" for e in epochs]
              + [f"{what} to {t}" for t in THRESHOLDS for what in ("epoch", "s")])
    rows = []
    for code in CODES:
        for architecture in ARCHITECTURES:
            summaries = groups.get((architecture, code))
            if not summaries:
                continue
            row = [NAMES[architecture], code, str(len(summaries)),
                   _cell([s["tokens_per_sec"] for s in summaries], "{:.0f}"),
                   _cell([seconds_per_epoch(s) for s in summaries], "{:.2f}")]
            row += [_cell([loss_at(s, e) for s in summaries], "{:.3f}") for e in epochs]
            for t in THRESHOLDS:
                reached = [first_below(s, t) for s in summaries]
                row.append(_cell([r and r[0] for r in reached], "{:g}"))
                row.append(_cell([r and r[1] for r in reached], "{:.0f}"))
            rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _median(summaries, value):
    return statistics.median(value(s) for s in summaries)


def verdicts(runs, code):
    """The two halves of the claim for `code`'s runs (the book's code, or the package's), each
    ``(claim, holds, why)``; an empty list when the Transformer or 9.2's model is missing."""
    groups = group(runs)
    ours, theirs = groups.get(("transformer", code)), groups.get(("attention", code))
    if not ours or not theirs:
        return []
    fast, slow = (_median(g, seconds_per_epoch) for g in (ours, theirs))
    speed = ("runs faster per epoch", fast < slow,
             f"{fast:.2f} s against {slow:.2f} s per epoch ({slow / fast:.2f}x), medians of "
             f"{len(ours)} and {len(theirs)} seeds")
    early = [e for e in EARLY if all(loss_at(s, e) is not None for s in ours + theirs)]
    medians = [(e, statistics.median(loss_at(s, e) for s in ours),
                statistics.median(loss_at(s, e) for s in theirs)) for e in early]
    lower = [e for e, a, b in medians if a < b]
    pairs = ", ".join(f"{a:.3f} vs {b:.3f} @{e}" for e, a, b in medians)
    converge = ("converges faster at the beginning", bool(early) and lower == early,
                f"median loss lower at {len(lower)} of epochs {', '.join(map(str, early))} "
                f"({pairs})")
    return [speed, converge]


def verdict_lines(runs):
    """The verdicts as text lines, for the book's code and for the package."""
    lines = []
    for code in CODES:
        for claim, holds, why in verdicts(runs, code):
            lines.append(f"{code}: the Transformer {claim}: "
                         f"{'holds' if holds else 'does not hold'} on this machine: {why}")
    return lines
