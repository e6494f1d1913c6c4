"""What an export reads from a model directory, read once for every format: the model, its
vocabularies, config, summary and tokenizer files, all from ONE version of the directory; and
what both formats' manifests say of them: the model's own tokenization (`tokens_manifest`) and
the package's decoding rules (`decoding_rules`, `inference.limits`).

A model directory holds versions and a link ``current`` to one (`io.atomic.write_dir`); the
version is resolved once (`io.atomic.resolve_dir`) and everything is read from it, so an export
made while training saves the next epoch still describes one model.
"""

import collections
import os

from ... import checkpoint
from ...io import atomic
from ..limits import BANNED, EXTRA_LENGTH, ExactChapterError, require_corrected


class ExportError(ValueError):
    """The model cannot be exported there, or in that format; the message is one line."""


ModelSource = collections.namedtuple(
    "ModelSource", ["directory", "model", "src_vocab", "tgt_vocab", "cfg", "summary",
                    "tokenizer"])
ModelSource.__doc__ = """A loaded model directory: `directory` is the version read; `tokenizer`
the one it was trained with (`checkpoint.load_tokenizer`; its ``files()`` are copied)."""


def read_config(model_dir, what="export"):
    """``(version directory, TransformerConfig)``, before the weights are read (a model that a
    format cannot express is refused without loading it). CheckpointError for a directory that
    is not a model directory; ExportError for an exact-chapter model (`limits.require_corrected`
    of `what`: no engine reproduces the book's decoder)."""
    directory = atomic.resolve_dir(model_dir)
    if os.path.isdir(directory):
        directory = os.path.realpath(directory)  # one version, whatever the next save does
    cfg = checkpoint.load_config(directory)
    try:
        require_corrected(cfg, what)
    except ExactChapterError as e:
        raise ExportError(f"{model_dir}: {e}") from None
    return directory, cfg


def read_model_dir(directory, ctx):
    """The `ModelSource` of a version directory (from `read_config`); CheckpointError (one
    line) for a damaged one."""
    model, src_vocab, tgt_vocab, cfg, summary = checkpoint.load(directory, ctx)
    tokenizer = checkpoint.load_tokenizer(directory, cfg)
    return ModelSource(directory, model, src_vocab, tgt_vocab, cfg, summary, tokenizer)


def write_tokenizer_files(source, directory):
    """Copy the tokenizer's files (the sentencepiece models of a subword model) into
    `directory`; returns their names."""
    files = source.tokenizer.files()
    for name, data in files.items():
        atomic.write_file(os.path.join(directory, name),
                          lambda tmp, data=data: _write_bytes(tmp, data))
    return sorted(files)


def _write_bytes(path, data):
    with open(path, "xb") as f:
        f.write(data)


def copy_file(src, dst):
    """`src` to `dst`, fsynced (`atomic.write_file`)."""
    def write(tmp):
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            fout.write(fin.read())
    atomic.write_file(dst, write)


def decoding_rules(cfg):
    """The package's decoding rules for a model of `cfg`, as data for the manifests
    (`inference.limits`): a translation has at most min(num_steps, ceil(``length_ratio`` x
    source tokens) + ``extra_length``) tokens (``length_ratio`` 0: max(num_steps, source
    tokens + ``extra_length``)) and never one of ``banned``."""
    return {"extra_length": EXTRA_LENGTH, "length_ratio": cfg.length_ratio,
            "banned": list(BANNED)}


def limit_text(num_steps, length, length_ratio=0.0):
    """`limits.decode_limit` written out for a source of `length` tokens (a phrase, or a Python
    expression: the CTranslate2 README's snippet evaluates it)."""
    if not length_ratio:
        return f"max({num_steps}, {length} + {EXTRA_LENGTH})"
    return f"min({num_steps}, math.ceil({length_ratio} * {length}) + {EXTRA_LENGTH})"


def describe_words(rule):
    """One line saying what the word tokenizer's `rule` (`WordTokenizer.rule`) does."""
    spaces = ", ".join(f"U+{ord(c):04X}" for c in rule["no_break_spaces"])
    end = f", then {' '.join(rule['source_end'])} appended" if rule["source_end"] else ""
    return (f"d2l {rule['edition']}'s words: no-break spaces ({spaces}) made spaces, "
            f"lower-cased, a space put before {' '.join(rule['marks'])} that follow a "
            f"non-space, split on spaces{end}")


def tokens_manifest(tokenizer):
    """The manifests' ``tokens``: how text becomes the model's source tokens and target tokens
    text, asked of the model's own tokenizer (`data.tokenize`; ``words``: a word tokenizer's
    `WordTokenizer.rule`)."""
    if tokenizer.kind == "subword":
        return {"kind": "subword",
                "source": "sentencepiece pieces of spm_src.model (encode(text, out_type=str))",
                "target": "sentencepiece pieces of spm_tgt.model (decode(pieces))"}
    rule = tokenizer.rule()
    return {"kind": "word", "source": describe_words(rule), "target": "words, joined with spaces",
            "words": rule}
