"""A corpus read once: its pairs in memory (`Corpus`), cleaned with counts (`clean_pairs`), and
the user's own dev and test sets (`read_heldout`).

`read_corpus` reads one or several sources (`sources.open_corpora`: zips, TSVs, aligned files,
compressed or not) in ONE pass and drops the blank lines and the pairs with an empty side,
counting them; every stage after it (the chapter's pipeline, the split, the tokenizer, the
batches, validation, `evaluate`) takes the `Corpus` and reads no file again. `clean_pairs` is
the split pipeline's cleaning (the `clean` config field): exact duplicate pairs and pairs with a
side over `MAX_CHARS` characters (the translator's own limit, `inference.limits`) are dropped
and counted, before the held-out parts are drawn, so that neither reaches a part; the training
part's length and ratio filters follow its tokenizer (`data.lengths`). `format_counts` is the
one line a run and `evaluate` print (docs/data.md, "Cleaning").
"""

import dataclasses
import os
from typing import Dict, List, Tuple

from .sources import DataError, fingerprint, open_corpora, open_data, read_lines

MAX_CHARS = 1000  # characters a sentence may have: the translator's limit, and the corpus's
NO_BREAK_SPACES = ("\u202f", "\xa0")  # what d2l's `preprocess_nmt` makes plain spaces first


def plain_spaces(text):
    """Non-breaking spaces (`NO_BREAK_SPACES`: French ``Va\\u202f!``, ``\\xa0``) made plain
    spaces, as d2l's `preprocess_nmt` does first (`text`)."""
    for char in NO_BREAK_SPACES:
        text = text.replace(char, " ")
    return text




@dataclasses.dataclass(frozen=True)
class Corpus:
    """Sentence pairs in memory, in one direction, read from `origins` (`sources.DataSource`s):
    ``sources[i]`` translates to ``targets[i]``; `counts`: what reading them dropped. Takes the
    place of a `DataSource` everywhere (`pairs`, `text`, `describe`)."""

    sources: List[str]
    targets: List[str]
    source_lang: str
    target_lang: str
    origins: Tuple = ()
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)
    records: Tuple = ()  # each origin's `describe` record

    @property
    def shown(self):
        return "; ".join(o.shown for o in self.origins) or "the pairs given"

    @property
    def columns(self):
        return self.source_lang, self.target_lang

    def pairs(self):
        """``(sources, targets)``, lists of str as written."""
        return self.sources, self.targets

    def text(self):
        """The pairs in the chapter's layout, ``source<TAB>target`` a line (`DataSource.text`)."""
        return "".join(f"{s}\t{t}\n" for s, t in zip(self.sources, self.targets))

    def describe(self, pairs=None):
        """What summary.json's ``data`` records: the direction, each corpus read (its files,
        columns, lines, pairs and their SHA-256), the pairs in all."""
        return {"source_lang": self.source_lang, "target_lang": self.target_lang,
                "corpora": list(self.records), "pairs": len(self.sources)}


def read_corpus(data=None, source_lang=None, target_lang=None, columns=None):
    """The `Corpus` of `data`: what `sources.open_corpora` takes (a path, two aligned files, a
    DataSource, or a list of them: several corpora, concatenated in order), or a Corpus
    (returned as it is). Blank lines and pairs with an empty side are dropped and counted
    (``counts``: ``lines``, ``empty``). `columns`: the column languages a model directory
    recorded (one corpus). DataError, one line, naming the file, when a corpus holds no pair."""
    if isinstance(data, Corpus):
        return data if "lines" in data.counts else _counted(data)
    origins = [open_data(data, source_lang, target_lang, columns)] if columns else \
        open_corpora(data, source_lang, target_lang)
    sources, targets, records, counts = [], [], [], {"lines": 0, "empty": 0}
    for origin in origins:
        src, tgt = origin.lines()
        keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s.strip() and t.strip()]
        _check_not_empty(origin, len(src), len(keep), src, tgt)
        kept = ([src[i] for i in keep], [tgt[i] for i in keep])
        counts["lines"] += len(src)
        counts["empty"] += len(src) - len(keep)
        records.append(dict(origin.describe(kept), lines=len(src)))
        sources += kept[0]
        targets += kept[1]
    first = origins[0]
    return Corpus(sources, targets, first.source_lang, first.target_lang, tuple(origins),
                  counts, tuple(records))


def _counted(corpus):
    """An in-memory `Corpus` made without counts, read as a corpus on disk is: the pairs with
    an empty side dropped and counted (``lines``, ``empty``)."""
    src, tgt = corpus.sources, corpus.targets
    keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s.strip() and t.strip()]
    _check_not_empty(corpus, len(src), len(keep), src, tgt)
    return dataclasses.replace(corpus, sources=[src[i] for i in keep],
                               targets=[tgt[i] for i in keep],
                               counts=dict(corpus.counts, lines=len(src), empty=len(src) - len(keep)))


def _check_not_empty(origin, lines, kept, src, tgt):
    """DataError (one line, naming the files and what to do) for a corpus with no pair."""
    if kept:
        return
    if not lines:
        why = "is empty"
    elif not any(s.strip() or t.strip() for s, t in zip(src, tgt)):
        why = f"has {lines:,} line{'s' * (lines > 1)}, all blank"
    else:
        why = f"has {lines:,} line{'s' * (lines > 1)} but every pair has an empty side"
    raise DataError(f"{origin.shown} {why}: no sentence pairs to read (give a corpus with a "
                    "sentence on each side of a line)")


def clean_text(text):
    """A sentence as it is kept: non-breaking spaces (French ``Va\\u202f!``) made plain, and
    whitespace collapsed; case and punctuation untouched."""
    return " ".join(plain_spaces(text).split())


def clean_pairs(sources, targets, clean=True):
    """``(sources, targets, counts)``: the pairs as they are kept (`clean_text`), and with
    `clean` (the config's field; False for model directories written before it existed, whose
    held-out parts must stay theirs) without exact duplicate pairs (the first kept) and pairs
    with a side over `MAX_CHARS` characters; ``counts``: ``duplicates``, ``too_long``."""
    src = [clean_text(s) for s in sources]
    tgt = [clean_text(t) for t in targets]
    counts = {"duplicates": 0, "too_long": 0}
    if not clean:
        return src, tgt, counts
    seen, keep = set(), []
    for i, pair in enumerate(zip(src, tgt)):
        if max(len(pair[0]), len(pair[1])) > MAX_CHARS:
            counts["too_long"] += 1
        elif pair in seen:
            counts["duplicates"] += 1
        else:
            seen.add(pair)
            keep.append(i)
    return [src[i] for i in keep], [tgt[i] for i in keep], counts


def read_heldout(files, source_lang, target_lang, what):
    """A user's own dev or test set as ``(sources, targets, record)``: two aligned files (the
    source's, then the reference's; compressed or not), every line, as `read_lines` reads them.
    DataError (one line) for files that cannot be read, line counts that differ, no line, or an
    empty source line (nothing to translate). `what`: ``"--valid"`` or ``"--test"``."""
    if len(files) != 2:
        raise DataError(f"{what} takes two files, the sources then their references, not "
                        f"{len(files)}")
    src, ref = (read_lines(f, what=f"{what} file") for f in files)
    if len(src) != len(ref):
        raise DataError(f"{what}: {files[0]} has {len(src)} lines but {files[1]} has {len(ref)}")
    if not src:
        raise DataError(f"{what}: {files[0]} is empty")
    empty = next((i for i, s in enumerate(src) if not s.strip()), None)
    if empty is not None:
        raise DataError(f"{what}: {files[0]} line {empty + 1} is empty: nothing to translate")
    record = {"files": [os.path.abspath(f) for f in files], "pairs": len(src),
              "sha256": fingerprint((src, ref)), "source_lang": source_lang,
              "target_lang": target_lang}
    return src, ref, record


def format_counts(counts):
    """The one line of what reading and cleaning kept and dropped: ``read 31,102 pairs (31,102
    lines); dropped 3 duplicates, 1 over 1,000 characters``."""
    dropped = [f"{counts[key]:,} {label}" for key, label in (
        ("empty", "blank or with an empty side"), ("duplicates", "exact duplicates"),
        ("too_long", f"over {MAX_CHARS:,} characters"),
        ("shared_with_heldout", "sharing a sentence with the --valid or --test set"))
        if counts.get(key)]
    line = f"read {counts['lines'] - counts.get('empty', 0):,} pairs ({counts['lines']:,} lines)"
    if counts.get("first"):
        line += f", the first {counts['first']:,} used"
    return line + ("; dropped " + ", ".join(dropped) if dropped else "")
