"""Where sentence pairs come from: any Tatoeba pair, a user's own parallel files, either way round.

Three formats, one result (the same pairs in the same order, docs/data.md "Your own data"):

* a Tatoeba "anki" zip (manythings.org: ``deu-eng.zip`` holding ``deu.txt``; d2l's
  ``fra-eng.zip`` holds ``fra-eng/fra.txt``): ``english<TAB>other`` a line and, in today's
  files, a third column, the CC-BY attribution, which is dropped;
* a TSV file, ``first<TAB>second`` a line (a third column only if it is Tatoeba's attribution);
* two aligned plain-text files, one sentence a line (Moses, WMT, OPUS: ``train.de``,
  ``train.en``).

A TSV or a text file may be compressed (``.gz``, ``.xz``, ``.bz2``: OPUS ships ``.gz``); it is
read through the standard library's decompressing streams. A `DataSource` is one corpus on disk
(its files, the language of each column) and a direction (which column is the source); a run
may read several (`open_corpora`), each in the same pair of languages. The languages come from
the file names (a Tatoeba zip and its member, ``*.de-en.tsv``, the extensions of aligned files),
normalised to ISO 639-1 where there is a code (``deu`` -> ``de``, by ``pycountry``), or from
``--source-lang`` / ``--target-lang``, which win over a name (`choose_direction`).

Reading is strict: a line with text but no tab or with too many columns, two files of different
line counts, a tab inside a sentence of an aligned file, invalid UTF-8 and a zip without a text
member are a one-line `DataError` naming the file and the line. Lines follow one rule
(`read_lines`): a UTF-8 byte-order mark and the ``\\r`` of CRLF are no data, the final newline
ends the last line. Blank lines and pairs with an empty side are no pairs: `data.corpus` drops
and counts them.
"""

import bz2
import dataclasses
import gzip
import hashlib
import lzma
import os
import zipfile
from typing import Optional, Tuple

from .languages import COMPRESSED_SUFFIXES, DataError, _names_languages, choose_direction

DATA_ENV = "D2L_TRANSFORMER_DATA"
TEXT_SUFFIXES = (".txt", ".tsv")
COMPRESSED = dict(zip(COMPRESSED_SUFFIXES, (gzip.open, lzma.open, bz2.open)))  # as streams
ATTRIBUTION = "CC-BY"  # how the third column of Tatoeba's exports begins


def default_data_path():
    """Where a run reads when no data is given: ``D2L_TRANSFORMER_DATA``, else
    ``data/fra-eng.zip`` of the source tree this package sits in."""
    if os.environ.get(DATA_ENV):
        return os.environ[DATA_ENV]
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # d2l_transformer/
    return os.path.join(os.path.dirname(package), "data", "fra-eng.zip")


# ---------------------------------------------------------------------------------- reading
def progress(items, what, unit):
    """`items`, with a progress bar on stderr when the loop lasts over 2 seconds and stderr is
    a terminal (tqdm): what a large corpus shows while it is read, split and encoded."""
    from tqdm import tqdm
    return tqdm(items, desc=what, unit=unit, disable=None, delay=2, leave=False,
                unit_scale=True, mininterval=0.5)


def _not_found(path):
    """The one line for a missing file: the default corpus names its variable."""
    if os.path.abspath(path) == os.path.abspath(default_data_path()):
        return DataError(f"dataset not found: {path} (set {DATA_ENV} or pass the path)")
    return DataError(f"{path} not found")


def _zip_member(path):
    """The text member of a zip: the one ``.txt``/``.tsv`` file whose name does not start with
    ``_`` (Tatoeba's ``_about.txt``); DataError when there is none or several."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
    except FileNotFoundError:
        raise _not_found(path) from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DataError(f"dataset {path} is damaged or unreadable: {e}") from None
    texts = [n for n in names if n.lower().endswith(TEXT_SUFFIXES)
             and not os.path.basename(n).startswith("_")]
    if len(texts) == 1:
        return texts[0]
    if not texts:
        raise DataError(f"{path} holds no text member (.txt or .tsv): {', '.join(names[:5]) or 'nothing'}")
    raise DataError(f"{path} holds several text members ({', '.join(texts[:5])}): unzip the one "
                    "to train on and pass it")


def _read_bytes(path, member=None):
    """The bytes of a file, of a zip's `member`, or of a compressed file (`COMPRESSED`, by its
    suffix), decompressed; DataError, one line, naming the file."""
    opener = COMPRESSED.get(os.path.splitext(path)[1].lower(), open)
    try:
        if member is not None:
            with zipfile.ZipFile(path) as z:
                return z.read(member)
        with opener(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise _not_found(path) from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory, not a data file") from None
    except (zipfile.BadZipFile, OSError, EOFError, lzma.LZMAError) as e:
        raise DataError(f"{path} is damaged or unreadable: {e}") from None


def read_lines(path, member=None, what=None):
    """The lines of a UTF-8 text file (compressed or not, or a zip's `member`) as a list of
    str, by the one rule of every file the package reads (corpora, test sets, hypotheses,
    references): a leading byte-order mark and the ``\\r`` of CRLF line ends are no data; the
    final newline ends the last line (``"a\\nb\\n"`` is two lines, ``"a\\n\\n"`` two, the
    second empty), as sacreBLEU reads. Invalid UTF-8 is a DataError naming the line; `what`
    names the file in the messages (``"reference file"``)."""
    shown = f"{path}:{member}" if member else path
    try:
        data = _read_bytes(path, member)
    except DataError as e:
        raise DataError(f"{what} {e}" if what else str(e)) from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{what + ' ' if what else ''}{shown} line {line}: not UTF-8 "
                        f"({e.reason})") from None
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line
    return lines


def _columns_of(lines, shown):
    """Each line's two columns (a third, Tatoeba's attribution, dropped; a blank line two empty
    sides); DataError naming the first line with another shape."""
    first, second = [], []
    for i, line in enumerate(progress(lines, f"reading {os.path.basename(shown)}", "line")):
        parts = line.split("\t")
        if len(parts) == 3 and parts[2].startswith(ATTRIBUTION):
            parts.pop()
        if len(parts) == 1 and not line.strip():
            parts = ["", ""]  # a blank line: no pair (`data.corpus` counts it)
        if len(parts) != 2:
            what = "has no tab" if len(parts) == 1 else \
                f"has {len(parts)} columns, not 2 (source<TAB>target)"
            raise DataError(f"{shown} line {i + 1} {what}")
        first.append(parts[0])
        second.append(parts[1])
    return first, second


def _aligned(files):
    """The lines of two aligned files; DataError when their counts differ or a line holds a
    tab (a sentence of one language a line)."""
    sides = [read_lines(f) for f in files]
    if len(sides[0]) != len(sides[1]):
        raise DataError(f"{files[0]} has {len(sides[0])} lines but {files[1]} has "
                        f"{len(sides[1])}: aligned files pair line i with line i")
    for path, lines in zip(files, sides):
        bad = next((i for i, line in enumerate(lines) if "\t" in line), None)
        if bad is not None:
            raise DataError(f"{path} line {bad + 1} holds a tab: an aligned file has one "
                            "sentence a line (a TSV file is passed alone)")
    return sides


# ---------------------------------------------------------------------------------- a source
@dataclasses.dataclass(frozen=True)
class DataSource:
    """A parallel corpus on disk and a direction: `files` (one zip or TSV, or two aligned
    files, absolute), the zip's text `member`, the language of each of its two `columns`, and
    the `source_lang` and `target_lang` (the two of `columns`). `columns_text` reads it;
    `data.corpus.read_corpus` reads one or several into memory, once, with counts."""

    files: Tuple[str, ...]
    columns: Tuple[str, str]
    source_lang: str
    target_lang: str
    member: Optional[str] = None

    @property
    def reversed(self):
        """Whether the source is the second column (French to English on fra-eng.zip)."""
        return self.source_lang == self.columns[1]

    @property
    def shown(self):
        return " and ".join(self.files)

    def columns_text(self):
        """The two columns as lists of str, in file order, a pair a line (blank lines and empty
        sides included: `data.corpus` counts and drops them)."""
        if len(self.files) == 2:
            return _aligned(self.files)
        shown = f"{self.files[0]}:{self.member}" if self.member else self.files[0]
        return _columns_of(read_lines(self.files[0], self.member), shown)

    def lines(self):
        """``(sources, targets)``: every line in this direction, empty sides included."""
        first, second = self.columns_text()
        return (second, first) if self.reversed else (first, second)

    def pairs(self):
        """``(sources, targets)``: the pairs in this direction, as written, without those with
        an empty side."""
        keep = [(s, t) for s, t in zip(*self.lines()) if s.strip() and t.strip()]
        return [s for s, _ in keep], [t for _, t in keep]

    def text(self):
        """The pairs in the chapter's layout, ``source<TAB>target`` a line, each line ended by a
        newline: what d2l's ``read_data_nmt`` returns for ``fra.txt`` (for fra-eng.zip from
        English to French, its text itself)."""
        sources, targets = self.pairs()
        return "".join(f"{s}\t{t}\n" for s, t in zip(sources, targets))

    def describe(self, pairs=None):
        """What a model directory records of this corpus: its files, member, columns and
        direction, and (given its `pairs`) their number and SHA-256 (`fingerprint`)."""
        record = {"files": list(self.files), "member": self.member, "columns": list(self.columns),
                  "source_lang": self.source_lang, "target_lang": self.target_lang}
        if pairs is not None:
            record["pairs"] = len(pairs[0])
            record["sha256"] = fingerprint(pairs)
        return record


def fingerprint(pairs):
    """The SHA-256 of pairs ``(sources, targets)``: tells whether two readings are one corpus."""
    h = hashlib.sha256()
    for s, t in zip(*pairs):
        h.update(f"{s}\t{t}\n".encode("utf-8"))
    return h.hexdigest()


def open_data(data=None, source_lang=None, target_lang=None, columns=None):
    """The `DataSource` of `data`: None (`default_data_path`), a path (a zip, a TSV file, either
    compressed), two paths (aligned files), or a source (a DataSource, or an in-memory
    `data.corpus.Corpus`: returned as it is). `source_lang`/`target_lang` choose the direction
    and win over the names (`choose_direction`); `columns`: the languages of the columns as a
    model directory recorded them. DataError, one line."""
    if hasattr(data, "source_lang") and hasattr(data, "pairs"):
        return data
    files, member = _located(data)
    shown = " and ".join(os.path.basename(f) for f in files)
    named = tuple(columns) if columns else _names_languages(files, member)
    langs, src, tgt = choose_direction(named, source_lang, target_lang, shown)
    return DataSource(files, langs, src, tgt, member)


def _located(data):
    """``(files, member)``: the absolute files of `data` (what `open_data` takes, not a
    source) and a zip's text member; DataError for a missing file or a directory."""
    paths = [default_data_path()] if data is None else \
        [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not 1 <= len(paths) <= 2:
        raise DataError(f"--data takes one file (a zip or TSV) or two aligned files, not "
                        f"{len(paths)} (repeat --data for several corpora)")
    files = tuple(os.path.abspath(os.fspath(p)) for p in paths)
    for f in files:
        if not os.path.exists(f):
            raise _not_found(f)
        if os.path.isdir(f):
            raise DataError(f"{f} is a directory, not a data file")
    is_zip = len(files) == 1 and (files[0].lower().endswith(".zip") or zipfile.is_zipfile(files[0]))
    return files, _zip_member(files[0]) if is_zip else None


def named_languages(data):
    """The languages the file names of `data` (what `open_data` takes) tell, ``(first
    column's, second's)``, or ``(None, None)``; a source's own columns."""
    if hasattr(data, "source_lang") and hasattr(data, "pairs"):
        return tuple(getattr(data, "columns", (data.source_lang, data.target_lang)))
    return _names_languages(*_located(data))


def open_corpora(data=None, source_lang=None, target_lang=None):
    """The `DataSource` of each corpus of `data` (a list of what `open_data` takes, or one of
    them), all in one direction: the first one's pair (its flags' or names'), which every
    other must hold. DataError, one line, naming the corpus that does not."""
    many = isinstance(data, (list, tuple)) and data and \
        all(isinstance(d, (list, tuple)) or hasattr(d, "pairs") for d in data)
    data = list(data) if many else [data]
    if source_lang and target_lang and len(data) > 1:  # the flags win over each name: the
        _check_names_agree(data)                       # names must still be one pair
    sources = [open_data(d, source_lang, target_lang) for d in data]
    first = sources[0]
    for other in sources[1:]:
        if {other.source_lang, other.target_lang} != {first.source_lang, first.target_lang}:
            raise DataError(f"{other.shown} holds {other.source_lang} and {other.target_lang}, "
                            f"not {first.source_lang} and {first.target_lang} (the first "
                            "corpus's): every --data of a run is one pair of languages")
    return [s if s.source_lang == first.source_lang else open_data(
        s.files, first.source_lang, first.target_lang, s.columns) for s in sources]


def _check_names_agree(data):
    """DataError, one line, when the file names of two corpora of `data` tell two pairs of
    languages."""
    told = [(d, named_languages(d)) for d in data]
    told = [(d, set(n)) for d, n in told if None not in n]
    for d, names in told[1:]:
        if names != told[0][1]:
            shown = [" and ".join(map(str, x if isinstance(x, (list, tuple)) else [x]))
                     for x in (d, told[0][0])]
            raise DataError(f"{shown[0]} holds {' and '.join(sorted(names))} by its name, "
                            f"{shown[1]} {' and '.join(sorted(told[0][1]))}: every --data of a "
                            "run is one pair of languages")
