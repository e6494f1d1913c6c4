"""Take a trained model elsewhere: `export(model_dir, out_dir, format=...)` writes an export
directory from a model directory, in one of two formats (docs/export.md):

* ``"mxnet"`` (`export.mxnet`, the default): the encoder and the cached decoding step as
  MXNet graphs (``HybridBlock.export``), for any MXNet 1.9 program;
* ``"ctranslate2"`` (`export.ctranslate2`): a CTranslate2 model directory, for OpenNMT's
  engine (CPU float32/int8/int16, CUDA 12 GPUs), no MXNet needed.

Both read the model directory through `source.read_model_dir` (one version of it), and the
export appears whole through `io.atomic.write_dir`, with its manifest (`io.manifest`). An
existing `out_dir` is replaced only when it is an export written here (or empty); anything else
is refused in one line and left untouched.

`kept_export(model_dir)` is the float32 CTranslate2 export that ``--engine ctranslate2`` reads
(`inference.engines`): made on first use, kept inside the model directory as ``ctranslate2/``
(so that it moves and is copied with the model), reused while it was made from the model
directory's current version (the SHA-256 of its ``manifest.json``, recorded in the export's
manifest) and rebuilt otherwise. An earlier release kept it beside the model directory as the
hidden sibling ``.NAME.ctranslate2``: that one is removed once the new one is made.
"""

import contextlib
import os

from ...io import atomic, lock
from ...io.manifest import (
    MANIFEST,
    ManifestError,
    build_manifest,
    check_manifest,
    listed_files,
    read_manifest,
)
from . import ctranslate2 as _ct2
from . import mxnet as _mxnet
from .source import ExportError, read_config, read_model_dir

FORMATS = ("mxnet", "ctranslate2")
DEFAULT_FORMAT = "mxnet"  # what `export` wrote before there was a choice (docs/export.md)
EXPORT_FORMATS = (_mxnet.FORMAT, _ct2.FORMAT)  # the manifests' "format"

KEPT_NAME = "ctranslate2"  # the kept export of model directory NAME: NAME/ctranslate2
OLD_KEPT_SUFFIX = ".ctranslate2"  # where an earlier release kept it: .NAME.ctranslate2 beside NAME

__all__ = ["DEFAULT_FORMAT", "FORMATS", "ExportError", "export", "is_export", "kept_export"]


def is_export(directory):
    """True when `directory` holds an export this package wrote (its manifest says so)."""
    try:
        return read_manifest(atomic.resolve_dir(directory)).get("format") in EXPORT_FORMATS
    except ManifestError:
        return False


def _check_out_dir(out_dir):
    if not os.path.lexists(out_dir):
        return
    if not os.path.isdir(out_dir):
        raise ExportError(f"{out_dir} exists and is not a directory; choose another --out")
    if os.listdir(out_dir) and not is_export(out_dir):
        raise ExportError(f"{out_dir} exists and is not an export directory written by "
                          "d2l-transformer export; choose another --out")


def export(model_dir, out_dir, ctx=None, *, format=DEFAULT_FORMAT, quantization=None):
    """Export the model directory `model_dir` into `out_dir` (created, or replacing a previous
    export) in `format` (`FORMATS`); returns the manifest (a dict). `quantization`: CTranslate2's
    weight type (``int8``, ``int16``, ``float16``, ... see `export.ctranslate2.QUANTIZATIONS`; None:
    float32); `ctx`: where MXNet loads the model (the CPU by default).

    Raises `checkpoint.CheckpointError` for a model directory that cannot be loaded and
    `ExportError` (one line) for a model the format cannot express (the chapter's exact model,
    ScaleNorm for CTranslate2), a missing ``ctranslate2`` package, or an `out_dir` that holds
    something else than an export."""
    import mxnet as mx
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
    if quantization is not None and format != "ctranslate2":
        raise ExportError("--quantization is CTranslate2's: use it with --format ctranslate2")
    if format == "ctranslate2":
        _ct2.import_ctranslate2()
    out_dir = os.path.abspath(out_dir)
    _check_out_dir(out_dir)
    directory, cfg = read_config(model_dir)
    if format == "ctranslate2":
        _ct2.check(cfg, quantization)
    ctx = ctx or mx.cpu()
    source = read_model_dir(directory, ctx)
    written = {}

    def fill(tmp):
        if format == "ctranslate2":
            extra = _ct2.write(source, tmp, quantization)
        else:
            extra = _mxnet.write(source, tmp, ctx)
        written["manifest"] = build_manifest(tmp, extra)

    atomic.write_dir(out_dir, fill, replaceable=is_export,  # never anything but an export
                     owned=listed_files)
    return written["manifest"]


def kept_path(model_dir):
    """Where `kept_export` keeps the export of `model_dir`: ``NAME/ctranslate2`` inside it."""
    return os.path.join(os.path.abspath(model_dir), KEPT_NAME)


def _remove_old_kept(model_dir):
    """Remove the export an earlier release kept beside `model_dir` (``.NAME.ctranslate2``),
    when it is one this package wrote (where the parent cannot be written, it stays)."""
    parent, base = os.path.split(os.path.abspath(model_dir).rstrip(os.sep))
    old = os.path.join(parent, f".{base}{OLD_KEPT_SUFFIX}")
    if os.path.lexists(old) and is_export(old):
        with contextlib.suppress(OSError):
            atomic.remove_dir(old)


def _current(path, key):
    """The manifest of the export at `path` when it is a whole float32 CTranslate2 export of
    the model version whose manifest has SHA-256 `key`; else None (to be rebuilt)."""
    directory = atomic.resolve_dir(path)
    try:
        manifest = read_manifest(directory)
        if (manifest.get("format"), manifest.get("quantization"),
                manifest.get("model_manifest_sha256")) != (_ct2.FORMAT, "float32", key):
            return None
        check_manifest(directory)  # every file whole (a damaged export is rebuilt)
    except ManifestError:
        return None
    return directory, manifest


def kept_export(model_dir):
    """``(export directory, its manifest)``: the float32 CTranslate2 export of `model_dir`,
    exported now unless the one kept in it (`kept_path`) was made from the directory's
    current version. ExportError (one line) for a model CTranslate2 cannot run, a missing
    ``ctranslate2`` package, a ``NAME/ctranslate2`` that is not an export (never replaced) or
    cannot be written, or another process exporting it at that moment (`io.lock`)."""
    _ct2.import_ctranslate2("--engine ctranslate2")
    directory, cfg = read_config(model_dir, "--engine ctranslate2")  # one version
    _ct2.check(cfg, None)
    key = atomic.sha256(os.path.join(directory, MANIFEST))
    path = kept_path(model_dir)
    kept = _current(path, key)
    if kept:
        return kept
    try:
        with lock.locked(path, "exported"):  # one exporter at a time (another process: refused)
            kept = _current(path, key)  # exported meanwhile by the lock's previous holder
            if kept:
                return kept
            atomic.check_replaceable(path, is_export)
            export(directory, path, format="ctranslate2")  # the version read above
            _remove_old_kept(model_dir)
    except lock.Locked as e:
        raise ExportError(str(e)) from None
    except atomic.NotReplaceable:
        raise ExportError(f"{path} is not an export written by d2l-transformer; move it away "
                          f"to keep the CTranslate2 export of {model_dir} there") from None
    except PermissionError as e:
        raise ExportError(f"cannot keep the CTranslate2 export of {model_dir} at {path}: "
                          f"{e.strerror}") from None
    return _current(path, key)  # exported from `directory`: its manifest records `key`
