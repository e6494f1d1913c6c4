"""What an export reads from a model directory, read once for every format: the model, its
vocabularies, config, summary and tokenizer files, all from ONE version of the directory.

A model directory is a link to a versioned sibling (`io.atomic.write_dir`); the version is
resolved once (``os.path.realpath``) and everything is read from it, so an export made while
training saves the next epoch still describes one model.
"""

import collections
import os

from ... import checkpoint
from ...io import atomic
from ..limits import ExactChapterError, require_corrected


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
