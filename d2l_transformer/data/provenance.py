"""What a model was trained, validated and tested on, checked wherever it is read again
(``--resume``, ``train --init-from``, ``evaluate``): each corpus and each of the user's own
dev and test files is compared with the SHA-256 its model directory recorded (summary.json's
``data``), and a file that moved may be given again at its new place. The one rule: a record
holds, or a one-line `DataError` says what differs and what to do (docs/data.md, "What a
model directory records")."""

import os

from .corpus import read_corpus, read_heldout
from .languages import UNTOLD, DataError
from .sources import open_data

PARTS = ("valid", "test")


def read_for_model(data, pair, flags, shown, how):
    """The `corpus.Corpus` of new data for a model directory `shown` that translates `pair`
    (``--init-from``, ``--resume``: `how`): its languages by the user's `flags`
    (``(source_lang, target_lang)``) where given, else by the file names (the direction the
    model's), else, where the names tell nothing, the model's. DataError, one line naming both
    pairs, when they are not the model's."""
    src, tgt = flags
    try:
        corpus = read_corpus(data, *((src, tgt) if src and tgt else
                                     (src or (None if tgt else pair[0]), tgt)))
    except DataError as e:
        if not str(e).startswith(UNTOLD) or (src and tgt):
            raise
        corpus = read_corpus(data, *pair)
    if (corpus.source_lang, corpus.target_lang) != tuple(pair):
        by = "as --source-lang and --target-lang say" if src or tgt else "by its name"
        held = corpus.origins[0].columns if corpus.origins else corpus.columns
        raise DataError(f"{corpus.shown} holds {' and '.join(held)} ({by}) but model "
                        f"directory {shown} translates {pair[0]} to {pair[1]}: {how} needs "
                        "data of the model's languages (give "
                        "--source-lang and --target-lang where a file's name is wrong)")
    return corpus


def read_trained_corpus(records, pair, data, shown, flags=(None, None), how="evaluate"):
    """The `corpus.Corpus` of the corpora `records` describe (summary.json's
    ``data.corpora``), in the direction `pair`: read from `data` (their new place, a list of
    what `sources.open_data` takes; its languages checked, `read_for_model`) when given, else
    from the recorded files with their recorded columns; checked (`check_corpora`). `shown`:
    the model directory. DataError, one line, when a recorded file is gone and no `data` is
    given."""
    if data is None:
        missing = [f for r in records for f in r["files"] if not os.path.exists(f)]
        if missing:
            raise DataError(f"model directory {shown} was trained on {' and '.join(missing)}, "
                            "which is not there: give --data with its new place")
        return check_corpora(records, read_corpus(
            [open_data(r["files"], *pair, r.get("columns")) for r in records] or None, *pair),
            shown)
    return check_corpora(records, read_for_model(data, pair, flags, shown, how), shown)


def check_corpora(records, corpus, shown):
    """`corpus` when its corpora are the recorded ones (their number, and each one's SHA-256
    where one was recorded), else DataError naming what differs."""
    if not records:
        return corpus
    new = list(corpus.records)
    if len(new) != len(records) or any(
            r.get("sha256") and r["sha256"] != n.get("sha256") for r, n in zip(records, new)):
        raise DataError(f"{corpus.shown} is not the data model directory {shown} was trained "
                        "on (its pairs' SHA-256 differs from the one recorded): give the "
                        "corpus it was trained on")
    return corpus


def read_recorded_heldout(record, given, part, shown):
    """A user's own dev or test set (`corpus.read_heldout`) that a model directory `shown`
    recorded (`record`: summary.json's ``data.valid`` or ``data.test``, None when the part was
    drawn from the corpus): from `given` (its two files' new place) when given, else from the
    recorded files, and checked against the recorded SHA-256. DataError, one line, when a
    recorded file is gone, or the files are not the ones recorded."""
    files = (record or {}).get("files")
    if not files:
        if given:
            raise DataError(f"model directory {shown} was not trained with --{part} files: its "
                            f"{part} part is drawn from the corpus (leave out --{part})")
        return None
    if not given and not all(os.path.exists(f) for f in files):
        raise DataError(f"model directory {shown} was trained with --{part} {' '.join(files)}, "
                        f"which is not there: give --{part} with the files' new place")
    src, ref, new = read_heldout(given or files, record.get("source_lang"),
                                 record.get("target_lang"), f"--{part}")
    if record.get("sha256") and new["sha256"] != record["sha256"]:
        raise DataError(f"--{part} {' '.join(new['files'])} changed since model directory "
                        f"{shown} was trained with it (its SHA-256 differs from the one "
                        f"recorded): give the {part} files it was trained with")
    return src, ref, new
