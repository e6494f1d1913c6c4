"""Which languages a corpus holds: ISO 639 codes normalised (``deu`` -> ``de``, by
``pycountry``), what a file name tells (`_names_languages`) and which way a run translates
(`choose_direction`: the flags win over the names). The one place of these rules
(docs/data.md, "Languages")."""

import logging
import os
import re

log = logging.getLogger(__name__)

_CODE = re.compile(r"[a-z]{2,3}([-_][a-z0-9]{2,8})*")
COMPRESSED_SUFFIXES = (".gz", ".xz", ".bz2")


UNTOLD = "cannot tell the languages of"  # how the DataError of a nameless corpus begins


class DataError(ValueError):
    """The dataset cannot be read; the message is one line naming the path (and the line)."""


def _language(base):
    """``pycountry``'s entry for an ISO 639-1 or 639-3 code, or None."""
    import pycountry
    return pycountry.languages.get(**{"alpha_2" if len(base) == 2 else "alpha_3": base})


def language_code(code):
    """`code` as the package writes it: lower case, ISO 639-1 where the language has such a code
    (``deu`` and ``de`` -> ``de``), else as given (``cmn``); None when it is not a language code."""
    code = str(code).strip().lower().replace("_", "-")
    if not _CODE.fullmatch(code):
        return None
    base, _, region = code.partition("-")
    found = _language(base)
    return getattr(found, "alpha_2", base) + (f"-{region}" if region else "")


def known_language(code):
    """The normalised code when ``pycountry`` knows the language (so a file name's part is taken
    for a language only when it is one), else None."""
    normal = language_code(code)
    return normal if normal and _language(normal.split("-")[0]) is not None else None


def language_name(code):
    """The English name of a language code (``de`` -> ``German``), else the code itself."""
    return getattr(_language(code.split("-")[0]), "name", code)


_NOT_LANGUAGES = {"txt", "tsv", "csv", "tok", "raw", "src", "tgt", "ref", "hyp", "out", "bpe"}


def _named(part):
    """The language a part of a file name names (``deu``, ``de``), or None: a plain code of 2
    or 3 letters that ``pycountry`` knows and that is not a file extension of MT pipelines
    (`_NOT_LANGUAGES`: ``txt`` is Citak's code, ``src`` Sardinian's)."""
    part = part.lower()
    if part in _NOT_LANGUAGES or not re.fullmatch(r"[a-z]{2,3}", part):
        return None
    return known_language(part)


def uncompressed_name(path):
    """The file name without its compression suffix (``train.de.gz`` -> ``train.de``)."""
    name = os.path.basename(path)
    root, suffix = os.path.splitext(name)
    return root if suffix.lower() in COMPRESSED_SUFFIXES else name


def _names_languages(files, member):
    """The language of each column as the file names tell it, or ``(None, None)``: the
    extensions of aligned files (``train.de``, ``train.de.gz``); a Tatoeba zip (English first,
    the member's or the zip's code: ``deu.txt``, ``deu-eng.zip``); a name ending ``.xx-yy``
    or ``xxx-yyy`` (``corpus.de-en.tsv``). A name of one code outside a zip (``dev.tsv``,
    ``deu.txt``) names nothing: ``dev`` is Domung's code."""
    if len(files) == 2:  # aligned files: their extensions
        langs = tuple(_named(os.path.splitext(uncompressed_name(f))[1][1:]) for f in files)
        return langs if None not in langs else (None, None)
    if member is not None:  # a Tatoeba export: English first
        other = _named(os.path.splitext(os.path.basename(member))[0])
        if other is None:  # the zip's name, deu-eng.zip
            m = re.fullmatch(r"([a-z]{3})-eng", os.path.splitext(os.path.basename(files[0]))[0])
            other = _named(m.group(1)) if m else None
        return ("en", other) if other and other != "en" else (None, None)
    stem = os.path.splitext(uncompressed_name(files[0]))[0]
    m = re.fullmatch(r"([a-z]{2,3})-([a-z]{2,3})", stem.rsplit(".", 1)[-1].lower())
    if m and _named(m.group(1)) and _named(m.group(2)):
        return _named(m.group(1)), _named(m.group(2))  # train.de-en.tsv
    return None, None


def choose_direction(columns, source_lang=None, target_lang=None, shown="the data"):
    """``(columns, source_lang, target_lang)`` for a corpus whose file names say its columns
    hold the languages `columns` (None where they tell nothing). The flags win: both given and
    not the named pair, they are the columns (the first column is the source; a logged line
    when the names said otherwise); one given, it must be a named column and chooses the
    direction; none, the first column's language to the second's. DataError (one line) when
    they cannot decide, or both sides would be one language."""
    source_lang = source_lang and _checked_code(source_lang, "--source-lang")
    target_lang = target_lang and _checked_code(target_lang, "--target-lang")
    if source_lang and target_lang:
        if source_lang == target_lang:
            raise DataError(f"--source-lang and --target-lang are both {source_lang}")
        if set(columns) == {source_lang, target_lang}:
            return tuple(columns), source_lang, target_lang
        if None not in columns:
            log.warning("%s: its name says %s and %s; read as %s to %s, as --source-lang and "
                        "--target-lang say (the first column is the source)", shown,
                        *columns, source_lang, target_lang)
        return (source_lang, target_lang), source_lang, target_lang
    if None in columns:
        raise DataError(f"{UNTOLD} {shown} from its name: give "
                        "--source-lang and --target-lang (the first column is the source)")
    first, second = columns
    if first == second:
        raise DataError(f"both columns of {shown} are {first} by their names: give "
                        "--source-lang and --target-lang (the first column is the source)")
    for flag, value in (("--source-lang", source_lang), ("--target-lang", target_lang)):
        if value and value not in columns:
            raise DataError(f"{shown} holds {first} and {second}, not {value} ({flag}; give "
                            "both flags to read its columns as other languages)")
    if source_lang:
        return tuple(columns), source_lang, second if source_lang == first else first
    if target_lang:
        return tuple(columns), (second if target_lang == first else first), target_lang
    return tuple(columns), first, second


def _checked_code(value, flag):  # the flag's value normalised (`language_code`), or DataError
    code = language_code(value)
    if code is None:
        raise DataError(f"{flag} {value!r} is not a language code (e.g. en, de, fra)")
    return code
