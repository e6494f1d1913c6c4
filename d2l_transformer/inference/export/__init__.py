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
"""

import os

from ...io import atomic
from ...io.manifest import ManifestError, build_manifest, read_manifest
from . import ctranslate2 as _ct2
from . import mxnet as _mxnet
from .source import ExportError, read_config, read_model_dir

FORMATS = ("mxnet", "ctranslate2")
DEFAULT_FORMAT = "mxnet"  # what `export` wrote before there was a choice (docs/export.md)
EXPORT_FORMATS = (_mxnet.FORMAT, _ct2.FORMAT)  # the manifests' "format"

__all__ = ["DEFAULT_FORMAT", "FORMATS", "ExportError", "export", "is_export"]


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

    Raises `io.checkpoint.CheckpointError` for a model directory that cannot be loaded and
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

    atomic.write_dir(out_dir, fill, replaceable=is_export)  # never anything but an export
    return written["manifest"]
