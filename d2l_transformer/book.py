"""The book's printed output for 9.3, and the side-by-side table against our runs."""

import json
import os

BOOK_LOSS = 0.033
BOOK_TRANSLATIONS = {
    "Go .": "va !",
    "Wow !": "<unk> !",
    "I'm OK .": "ça va .",
    "I won !": "je l'ai emporté !",
}
SENTENCES = list(BOOK_TRANSLATIONS)


LOSS_TOLERANCE = 0.005  # chosen (about 15% of 0.033); the seed spread is not measured yet


def _loss_matches(loss):
    """The book printed one run; a run matches when it lands within LOSS_TOLERANCE of it."""
    return abs(loss - BOOK_LOSS) <= LOSS_TOLERANCE


def compare_table(runs):
    """A text table: the book, then one column per run, with match/differs per run.

    runs: ``[(title, summary), ...]`` with summaries as written by the chapter script.
    """
    header = ["", "book"] + [title for title, _ in runs]
    rows = [["loss (book units)", f"{BOOK_LOSS:.3f}"]
            + [f"{s['loss']:.3f} ({'match' if _loss_matches(s['loss']) else 'differs'})"
               for _, s in runs]]
    rows.append(["loss per token", "-"] + [f"{s['loss_per_token']:.3f}" for _, s in runs])
    for sentence, expected in BOOK_TRANSLATIONS.items():
        cells = []
        for _, s in runs:
            got = s["translations"].get(sentence, "")
            cells.append(f"{got} ({'match' if got == expected else 'differs'})")
        rows.append([sentence, expected] + cells)
    rows.append(["tokens/sec", "-"] + [f"{s['tokens_per_sec']:.0f}" for _, s in runs])
    rows.append(["context", "gpu(0)"] + [s["ctx"] for _, s in runs])
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def fmt(r):
        return " | ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()

    lines = [fmt(header), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in rows]
    return "\n".join(lines)


def load_run(directory):
    """``(title, summary)`` of a chapter run or model directory holding a summary.json.

    Raises OSError or ValueError (one line) when the summary cannot be read."""
    path = os.path.join(directory, "summary.json")
    with open(path, encoding="utf-8") as f:
        s = json.load(f)
    missing = [k for k in ("loss", "loss_per_token", "translations", "tokens_per_sec", "ctx")
               if k not in s]
    if missing:
        raise ValueError(f"{path} is not a chapter run's summary (no {', '.join(missing)})")
    return ("exact chapter" if s.get("exact_chapter") else "corrected", s)
