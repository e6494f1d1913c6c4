"""Keep a trained model as a directory, written atomically, and load it back.

A model directory holds::

    params.params      the parameters (``save_parameters``)
    src_vocab.json     the source vocabulary (`Vocab.to_dict`)
    tgt_vocab.json     the target vocabulary
    config.json        the TransformerConfig (`TransformerConfig.to_json`)
    summary.json       the training summary (loss, tokens/s, epochs done, ...)
    trainer.states     optional: the Adam moments and update count, to resume training
    spm_src.model      subword presets: the sentencepiece models (`data.tokenize`)
    spm_tgt.model
    manifest.json      size and SHA-256 of every file above
    best/, average/    optional: model directories of their own (training with validation
                       and averaging), carried into each new save of the directory (``keep``)

Saving is atomic and durable (`atomic.write_dir`): every file is fsynced into a new versioned
sibling directory, and the model path, a symbolic link, is switched to it with one rename, so
the path always names a complete model, the previous one or the new one, even if the save is
interrupted; leftovers of an interrupted save are removed by the next one. Loading checks the
manifest, then the shapes of the parameters against the model the config and vocabularies
build; any mismatch is one line.
"""

import json
import os
import shutil

import mxnet as mx
from mxnet import init, np

from ..config import TransformerConfig
from ..data import Vocab
from ..data.tokenize import TokenizerError
from ..data.tokenize import load_tokenizer as _load_tokenizer
from ..model import build_model
from . import atomic
from .manifest import ManifestError, build_manifest, check_manifest

PARAMS, SRC_VOCAB, TGT_VOCAB = "params.params", "src_vocab.json", "tgt_vocab.json"
CONFIG, SUMMARY, TRAINER = "config.json", "summary.json", "trainer.states"


class CheckpointError(ValueError):
    """A model directory cannot be loaded; the message is one line naming the directory."""


def _write(path, write):
    """``write(tmp_path)``, fsynced and renamed onto `path`: the file appears whole or not at all."""
    atomic.write_file(path, write)


def _write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _write_text(path, text):
    atomic.write_text(path, text)


def _carry(old_dir, new_dir, name):
    """Put the model directory `name` inside `old_dir` (a link to its versioned sibling, as
    `atomic.write_dir` makes it, or a plain directory) into `new_dir` the same way, its files
    hard-linked (copied where links are not possible)."""
    src = os.path.join(old_dir, name)
    if not os.path.isdir(src):
        return
    target = os.readlink(src) if os.path.islink(src) else name  # ".best.v-..." or "best"
    if os.path.isabs(target) or os.sep in target:
        return  # a link the package did not make: not ours to copy
    shutil.copytree(os.path.join(old_dir, target), os.path.join(new_dir, target),
                    copy_function=_link_or_copy)
    if target != name:
        os.symlink(target, os.path.join(new_dir, name))


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def save(directory, model, src_vocab, tgt_vocab, cfg, summary=None, trainer=None, tokenizer=None,
         *, keep=()):
    """Write the model directory `directory` atomically (replacing an existing one).
    ``tokenizer``: its files (the sentencepiece models of a subword tokenizer) are kept too.
    ``keep``: names of model directories inside the existing `directory` (``best``,
    ``average``) that the new version keeps (outside the manifest: each has its own)."""
    old = atomic.resolve_dir(directory) if keep else None

    def fill(tmp_dir):
        _write(os.path.join(tmp_dir, PARAMS), model.save_parameters)
        for name, data in (tokenizer.files() if tokenizer is not None else {}).items():
            _write(os.path.join(tmp_dir, name), lambda tmp, data=data: _write_bytes(tmp, data))
        for name, vocab in ((SRC_VOCAB, src_vocab), (TGT_VOCAB, tgt_vocab)):
            _write_text(os.path.join(tmp_dir, name), json.dumps(vocab.to_dict(), ensure_ascii=False))
        _write_text(os.path.join(tmp_dir, CONFIG), cfg.to_json())
        _write_text(os.path.join(tmp_dir, SUMMARY),
                    json.dumps(summary or {}, indent=2, ensure_ascii=False))
        if trainer is not None:
            _write(os.path.join(tmp_dir, TRAINER), trainer.save_states)
        build_manifest(tmp_dir)
        if old is not None and os.path.isdir(old):
            for name in keep:
                _carry(old, tmp_dir, name)
    return atomic.write_dir(directory, fill)


def _read_json(directory, name):
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"model directory {directory} has no {name}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"model directory {directory}: cannot read {name}: {e}") from None


def _check_manifest(directory):
    try:
        check_manifest(directory)
    except ManifestError as e:
        raise CheckpointError(f"model directory {directory}: {e}") from None


def _built_shapes(model, ctxs):
    """Initialise the model and run it once on dummy input so that every shape is known."""
    model.initialize(init.Xavier(), ctx=ctxs)
    X = np.ones((1, 2), ctx=ctxs[0])  # (batch, seq_len)
    model(X, X, np.array([2], ctx=ctxs[0]))
    # the structural names save_parameters writes ("decoder.blks.0.ffn.ffn_1.weight")
    return {name: p.shape for name, p in model._collect_params_with_prefix().items()}


def load_config(directory):
    """The TransformerConfig saved in a model directory (CheckpointError if unreadable)."""
    directory = atomic.resolve_dir(directory)
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
    directory = atomic.resolve_dir(directory)
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


def load_tokenizer(directory, cfg=None):
    """The tokenizer the model in `directory` was trained with (`data.load_tokenizer`), checked
    against its vocabularies; CheckpointError (one line) when it is missing or does not fit."""
    directory = atomic.resolve_dir(directory)
    cfg = cfg or load_config(directory)
    try:
        tok = _load_tokenizer(directory, cfg)
    except TokenizerError as e:
        raise CheckpointError(f"model directory {directory}: {e}") from None
    if tok.kind == "subword":
        for name, vocab in ((SRC_VOCAB, tok.src_vocab()), (TGT_VOCAB, tok.tgt_vocab())):
            if _read_json(directory, name).get("idx_to_token") != vocab.idx_to_token:
                raise CheckpointError(f"model directory {directory}: {name} is not the vocabulary "
                                      "of its sentencepiece model")
    return tok


def load_trainer_states(directory, trainer):
    """Give `trainer` the Adam moments and update count saved with the model, if any.

    Returns True when the directory had trainer states."""
    path = os.path.join(atomic.resolve_dir(directory), TRAINER)
    if not os.path.exists(path):
        return False
    trainer.load_states(path)
    return True
