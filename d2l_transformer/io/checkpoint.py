"""Keep a trained model as a directory, written atomically, and load it back.

A model directory holds::

    params.params      the parameters (``save_parameters``)
    src_vocab.json     the source vocabulary (`Vocab.to_dict`)
    tgt_vocab.json     the target vocabulary
    config.json        the TransformerConfig (`TransformerConfig.to_json`)
    summary.json       the training summary (loss, tokens/s, epochs done, ...)
    trainer.states     optional: the Adam moments and update count, to resume training
    manifest.json      size and SHA-256 of every file above

The whole directory is first written into a temporary sibling directory (each file through a
temporary name and ``os.replace``) and then renamed into place, so an interrupted save leaves the
previous model (or nothing), never half a model. Loading checks the manifest, then the shapes of
the parameters against the model the config and vocabularies build; any mismatch is one line.
"""

import hashlib
import json
import os
import shutil
import tempfile

import mxnet as mx
from mxnet import init, np

from ..config import TransformerConfig
from ..data import Vocab
from ..model import build_model

PARAMS, SRC_VOCAB, TGT_VOCAB = "params.params", "src_vocab.json", "tgt_vocab.json"
CONFIG, SUMMARY, TRAINER, MANIFEST = "config.json", "summary.json", "trainer.states", "manifest.json"


class CheckpointError(ValueError):
    """A model directory cannot be loaded; the message is one line naming the directory."""


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write(path, write):
    """``write(tmp_path)``, then ``os.replace`` onto `path`: the file appears whole or not at all."""
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def _write_text(path, text):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    _write(path, write)


def save(directory, model, src_vocab, tgt_vocab, cfg, summary=None, trainer=None):
    """Write the model directory `directory` atomically (replacing an existing one)."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix="." + os.path.basename(directory) + ".tmp-", dir=parent)
    try:
        _write(os.path.join(tmp_dir, PARAMS), model.save_parameters)
        for name, vocab in ((SRC_VOCAB, src_vocab), (TGT_VOCAB, tgt_vocab)):
            _write_text(os.path.join(tmp_dir, name), json.dumps(vocab.to_dict(), ensure_ascii=False))
        _write_text(os.path.join(tmp_dir, CONFIG), cfg.to_json())
        _write_text(os.path.join(tmp_dir, SUMMARY),
                    json.dumps(summary or {}, indent=2, ensure_ascii=False))
        if trainer is not None:
            _write(os.path.join(tmp_dir, TRAINER), trainer.save_states)
        manifest = {name: {"bytes": os.path.getsize(os.path.join(tmp_dir, name)),
                           "sha256": _sha256(os.path.join(tmp_dir, name))}
                    for name in sorted(os.listdir(tmp_dir))}
        _write_text(os.path.join(tmp_dir, MANIFEST), json.dumps(manifest, indent=2))
        old = None
        if os.path.exists(directory):  # move the old one aside, put the new one in, drop the old
            old = tempfile.mkdtemp(prefix="." + os.path.basename(directory) + ".old-", dir=parent)
            os.rmdir(old)
            os.replace(directory, old)
        os.replace(tmp_dir, directory)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return directory


def _read_json(directory, name):
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"model directory {directory} has no {name}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"model directory {directory}: cannot read {name}: {e}") from None


def _check_manifest(directory):
    manifest = _read_json(directory, MANIFEST)
    for name, entry in manifest.items():
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise CheckpointError(f"model directory {directory}: {name} is missing")
        if os.path.getsize(path) != entry["bytes"] or _sha256(path) != entry["sha256"]:
            raise CheckpointError(f"model directory {directory}: {name} is damaged or truncated "
                                  f"({os.path.getsize(path)} bytes, saved {entry['bytes']})")


def _built_shapes(model, ctxs):
    """Initialise the model and run it once on dummy input so that every shape is known."""
    model.initialize(init.Xavier(), ctx=ctxs)
    X = np.ones((1, 2), ctx=ctxs[0])  # (batch, seq_len)
    model(X, X, np.array([2], ctx=ctxs[0]))
    # the structural names save_parameters writes ("decoder.blks.0.ffn.ffn_1.weight")
    return {name: p.shape for name, p in model._collect_params_with_prefix().items()}


def load_config(directory):
    """The TransformerConfig saved in a model directory (CheckpointError if unreadable)."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"model directory {directory} does not exist")
    try:
        return TransformerConfig.from_json(json.dumps(_read_json(directory, CONFIG)))
    except CheckpointError:
        raise
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"model directory {directory}: {CONFIG}: {e}") from None


def load(directory, ctx=None):
    """``(model, src_vocab, tgt_vocab, cfg, summary)`` from a model directory.

    Raises CheckpointError (one line) for a missing directory or file, a damaged or truncated
    file, or parameters that do not fit the model built from config.json and the vocabularies.
    ``ctx``: a context or a list of them (the parameters are loaded onto each).
    """
    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx or mx.cpu()]
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"model directory {directory} does not exist")
    _check_manifest(directory)
    cfg = load_config(directory)
    try:
        src_vocab = Vocab.from_dict(_read_json(directory, SRC_VOCAB))
        tgt_vocab = Vocab.from_dict(_read_json(directory, TGT_VOCAB))
    except (TypeError, KeyError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"model directory {directory}: {e}") from None
    summary = _read_json(directory, SUMMARY)
    model = build_model(cfg, len(src_vocab), len(tgt_vocab))
    expected = _built_shapes(model, ctxs)
    params_path = os.path.join(directory, PARAMS)
    try:
        saved = {name: arr.shape for name, arr in mx.nd.load(params_path).items()}
    except mx.base.MXNetError:
        raise CheckpointError(f"model directory {directory}: {PARAMS} is not a parameter file") from None
    trainable = {k: v for k, v in expected.items() if not k.endswith(".P")}  # P: constants
    for name in sorted(set(trainable) | set(saved)):
        if name.endswith(".P"):
            continue
        if trainable.get(name) != saved.get(name):
            raise CheckpointError(
                f"model directory {directory}: parameter {name} is {saved.get(name)} in {PARAMS} but "
                f"{trainable.get(name)} for {CONFIG} and the vocabularies "
                f"({len(src_vocab)} source, {len(tgt_vocab)} target tokens)")
    model.load_parameters(params_path, ctx=ctxs, allow_missing=True)
    return model, src_vocab, tgt_vocab, cfg, summary


def load_trainer_states(directory, trainer):
    """Give `trainer` the Adam moments and update count saved with the model, if any.

    Returns True when the directory had trainer states."""
    path = os.path.join(os.path.abspath(directory), TRAINER)
    if not os.path.exists(path):
        return False
    trainer.load_states(path)
    return True
