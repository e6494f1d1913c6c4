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
                       and averaging), beside the model's files; a save keeps them
                       unless asked to drop them (``drop``)
    ctranslate2/       optional: the CTranslate2 export `inference.export.kept_export` keeps

Saving is atomic and durable (`atomic.write_dir`): every file is fsynced into a new version
inside the directory (``v-XXXXXXXXXXXXXXXX``), and the relative link ``current`` is switched to
it with one rename; each file above is also a link ``NAME -> current/NAME``. So the directory
always holds a complete model, the previous one or the new one, even if the save is
interrupted; leftovers of an interrupted save are removed by the next one; and a copy made
with any tool (``cp -r``, ``cp -a``, ``rsync -a``, ``tar``, ``zip -r``) loads. A save replaces
a model directory only (`is_model_dir`), never a directory or file it did not write, and never
what else the directory holds. Directories of older layouts (a link to a hidden sibling
version, or the files directly in the directory) load, and migrate on their next save.
Loading resolves the path once and reads every file from that version (the previous version
stays until the next save is complete), checks the manifest, then the shapes of the parameters
against the model the config and vocabularies build; any mismatch is one line.

A model with tied embeddings (``tie_embeddings``, `build.tie_embeddings`) holds one Parameter
in several places: params.params has it under each structural name that uses it (the same
bytes), and `load` builds the tied model and fills each of those names into that Parameter,
so the tie holds after loading; an ``"all"`` model's two vocabularies must be one.
"""

import errno
import json
import logging
import os

import mxnet as mx
from mxnet import init, np

from . import _gluon
from ._runtime import cpu_math as _cpu_math
from .build import build_model
from .config import TransformerConfig
from .data import Vocab
from .data.provenance import PARTS, read_recorded_heldout, read_trained_corpus
from .data.tokenize import TokenizerError
from .data.tokenize import load_tokenizer as _load_tokenizer
from .io import atomic
from .io.manifest import MANIFEST, ManifestError, build_manifest, listed_files, read_checked

log = logging.getLogger(__name__)

PARAMS, SRC_VOCAB, TGT_VOCAB = "params.params", "src_vocab.json", "tgt_vocab.json"
CONFIG, SUMMARY, TRAINER = "config.json", "summary.json", "trainer.states"


class CheckpointError(ValueError):
    """A model directory cannot be loaded; the message is one line naming the directory."""


def _write(path, write):
    """``write(tmp_path)``, fsynced and renamed onto `path`: the file appears whole or not at all."""
    atomic.write_file(path, write)


def _save_parameters(model, path):
    """``model.save_parameters(path)``; MXNet's C++ writer reports a failed write (disk full,
    file size limit) as an MXNetError: it becomes the OSError it is, naming the file."""
    try:
        model.save_parameters(path)
    except mx.base.MXNetError as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        cause = lines[-1].rsplit(": ", 1)[-1] if lines else "write failed"
        raise OSError(errno.EIO, f"cannot write the parameters ({cause}; disk full or file "
                                 "size limit?)", path) from None


def _write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _write_text(path, text):
    atomic.write_text(path, text)


def is_model_dir(path):
    """True when `path` (a directory, or a link to one) holds a model directory this package
    wrote, in the current layout or an older one: a config.json and a manifest.json that lists
    the size and SHA-256 of config.json and params.params, as `save` writes it."""
    real = atomic.resolve_dir(path)
    try:
        with open(os.path.join(real, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and os.path.isfile(os.path.join(real, CONFIG)) and all(
        isinstance(manifest.get(name), dict) and {"bytes", "sha256"} <= set(manifest[name])
        for name in (CONFIG, PARAMS))


def save(directory, model, src_vocab, tgt_vocab, cfg, summary=None, trainer=None, tokenizer=None,
         *, drop=()):
    """Write the model directory `directory` atomically (replacing an existing model directory,
    never anything else: `atomic.NotReplaceable`, see `is_model_dir`). ``tokenizer``: its
    files (the sentencepiece models of a subword tokenizer) are kept too. What else the
    directory holds stays, but ``drop``: names of model directories inside it (``best``,
    ``average``) removed once the new version is in place (those of a model it replaces)."""
    _check_joint(cfg, src_vocab, tgt_vocab, os.path.abspath(directory))

    def fill(tmp_dir):
        _write(os.path.join(tmp_dir, PARAMS), lambda tmp: _save_parameters(model, tmp))
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
    path = atomic.write_dir(directory, fill, replaceable=is_model_dir, owned=listed_files)
    for name in drop:
        if is_model_dir(os.path.join(path, name)):
            atomic.remove_dir(os.path.join(path, name))
    return path


def _check_joint(cfg, src_vocab, tgt_vocab, shown):
    """CheckpointError (one line) when a model with ``tie_embeddings="all"`` (one matrix for
    both languages' tokens, `build.tie_embeddings`) has two different vocabularies: its source
    id i and target id i must be one token (a joint sentencepiece model, `data.tokenize`)."""
    if cfg.tie_embeddings == "all" and \
            src_vocab.idx_to_token != tgt_vocab.idx_to_token:
        raise CheckpointError(f"model directory {shown}: tie_embeddings all shares one embedding "
                              "between the languages, but the source and target vocabularies "
                              "differ (train it with one joint subword vocabulary)")


class _Dir:
    """A model directory as one reader sees it: `real`, the version resolved once
    (`atomic.resolve_dir`), where every file is read; `shown`, the path the user gave, in
    messages; `blobs`, once `verify` ran, the bytes of every file the manifest lists."""

    def __init__(self, directory):
        self.shown = os.path.abspath(directory)
        self.real = atomic.resolve_dir(directory)
        self.blobs = {}
        if os.path.exists(self.real) and not os.path.isdir(self.real):
            raise CheckpointError(f"{self.shown} is a file, not a model directory (give the "
                                  "directory `train --out` wrote)")
        if not os.path.isdir(self.real):
            raise CheckpointError(f"model directory {self.shown} does not exist")

    def path(self, name):
        return os.path.join(self.real, name)

    def read_json(self, name):
        try:
            if name in self.blobs:
                return json.loads(self.blobs[name].decode("utf-8"))
            with open(self.path(name), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise CheckpointError(f"model directory {self.shown} has no {name}") from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"model directory {self.shown}: cannot read {name}: "
                                  f"{str(e).replace(self.real, self.shown)}") from None

    def verify(self):
        """Read every file the manifest lists, once, into `blobs`, checking its size and
        SHA-256: what is parsed afterwards is what was checked, all of one version."""
        for name, entry in self.read_json(MANIFEST).items():
            try:
                data = read_checked(self.real, name, entry)
            except ManifestError as e:
                raise CheckpointError(f"model directory {self.shown}: {e}") from None
            self.blobs[name] = data

    def config(self):
        try:
            return TransformerConfig.from_json(json.dumps(self.read_json(CONFIG)))
        except CheckpointError:
            raise
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"model directory {self.shown}: {CONFIG}: {e}") from None

    def moved(self):
        """True when the directory resolves to another version now (two saves completed while
        this one was read, or a migration): read the directory again."""
        return atomic.resolve_dir(self.shown) != self.real


def _built_shapes(model, ctxs):
    """Initialise the model and run it once on dummy input so that every shape is known."""
    model.initialize(init.Xavier(), ctx=ctxs)
    X = np.ones((1, 2), ctx=ctxs[0])  # (batch, seq_len)
    model(X, X, np.array([2], ctx=ctxs[0]))
    # the structural names save_parameters writes ("decoder.blks.0.ffn.ffn_1.weight")
    return {name: p.shape for name, p in _gluon.structural_params(model).items()}


def _retrying(read, directory, attempts=3):
    """``read(_Dir(directory))``, again on a fresh resolution if the directory moved to another
    version meanwhile (a reader slower than two saves)."""
    for attempt in range(attempts):
        d = _Dir(directory)
        try:
            return read(d)
        except (CheckpointError, OSError, mx.base.MXNetError):
            if attempt == attempts - 1 or not d.moved():
                raise


def load_config(directory):
    """The TransformerConfig saved in a model directory (CheckpointError if unreadable)."""
    return _retrying(_Dir.config, directory)


def load_summary(directory):
    """The training summary saved in a model directory (summary.json: the run's figures and its
    ``data``); CheckpointError if unreadable."""
    return _retrying(lambda d: d.read_json(SUMMARY), directory)


def trained_data(directory, data=None, flags=(None, None), how="evaluate"):
    """The `data.Corpus` the model in `directory` was trained on, in its direction (config.json's
    languages): read from `data` (its new place) when given, else from the corpora its
    summary.json records (a model trained before they were recorded: the default
    fra-eng.zip), and checked against the recorded SHA-256 (`data.provenance`; `flags`: the
    user's ``--source-lang``/``--target-lang`` for `data`, `how` names the command). DataError,
    one line, when the recorded files are gone or the data is not the recorded one."""
    cfg = load_config(directory)
    records = recorded_corpora(load_summary(directory))
    return read_trained_corpus(records, cfg.pair, data, os.path.abspath(directory), flags, how)


def recorded_corpora(summary):
    """The records of the corpora a summary names (``data.corpora``; a summary written before
    several corpora: its one ``data`` record; none recorded: [])."""
    data = summary.get("data") or {}
    return list(data["corpora"]) if "corpora" in data else [data] if data.get("files") else []


def trained_heldout(directory, given=None):
    """``{"valid": ..., "test": ...}``: the user's own dev and test sets the model in
    `directory` was trained with (`data.read_heldout`), None for a part drawn from the corpus;
    `given`: ``{part: [its two files' new place]}``. Each is checked against its recorded
    SHA-256 (`data.provenance`): DataError, one line, when a file is gone or changed."""
    data = load_summary(directory).get("data") or {}
    given = given or {}
    return {part: read_recorded_heldout(data.get(part), given.get(part), part,
                                        os.path.abspath(directory)) for part in PARTS}


def _vocabs(d):
    """``(src_vocab, tgt_vocab)`` of a resolved model directory `d` (`_Dir`)."""
    try:
        return tuple(Vocab.from_dict(d.read_json(name)) for name in (SRC_VOCAB, TGT_VOCAB))
    except (TypeError, KeyError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"model directory {d.shown}: {e}") from None


def _load(d, ctxs):
    d.verify()
    cfg = d.config()
    src_vocab, tgt_vocab = _vocabs(d)
    _check_joint(cfg, src_vocab, tgt_vocab, d.shown)
    summary = d.read_json(SUMMARY)
    _cpu_math.settle(cfg, len(tgt_vocab))  # oneDNN's instruction set, before the first kernel
    model = build_model(cfg, len(src_vocab), len(tgt_vocab))
    expected = _built_shapes(model, ctxs)
    if PARAMS not in d.blobs:
        raise CheckpointError(f"model directory {d.shown}: its {MANIFEST} does not list {PARAMS}")
    try:  # the checked bytes, parsed in memory: no second read, no temporary file
        saved = mx.nd.load_frombuffer(d.blobs[PARAMS])
    except mx.base.MXNetError:
        raise CheckpointError(f"model directory {d.shown}: {PARAMS} is not a parameter "
                              "file") from None
    trainable = {k: v for k, v in expected.items() if not k.endswith(".P")}  # P: constants
    for name in sorted(set(trainable) | set(saved)):
        if name.endswith(".P"):
            continue
        shape = saved[name].shape if name in saved else None
        if trainable.get(name) != shape:
            raise CheckpointError(
                f"model directory {d.shown}: parameter {name} is {shape} in {PARAMS} "
                f"but {trainable.get(name)} for {CONFIG} and the vocabularies "
                f"({len(src_vocab)} source, {len(tgt_vocab)} target tokens)")
    params = _gluon.structural_params(model)  # what `load_parameters` fills, by name
    for name, array in saved.items():
        if name in params:
            params[name].set_data(array.as_np_ndarray())  # onto every context of `ctxs`
    return model, src_vocab, tgt_vocab, cfg, summary


def load(directory, ctx=None):
    """``(model, src_vocab, tgt_vocab, cfg, summary)`` from a model directory.

    Every file comes from one version (resolved once, `atomic.resolve_dir`, each file read
    once and checked against the manifest), even while a training run saves the directory
    again. Raises CheckpointError (one line) for a missing
    directory or file, a damaged or truncated file, or parameters that do not fit the model
    built from config.json and the vocabularies. ``ctx``: a context or a list of them (the
    parameters are loaded onto each).
    """
    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx or mx.cpu()]
    return _retrying(lambda d: _load(d, ctxs), directory)


def load_vocabs(directory):
    """``(src_vocab, tgt_vocab)`` of the model in `directory` (CheckpointError if unreadable)."""
    return _retrying(_vocabs, directory)


def load_tokenizer(directory, cfg=None):
    """The tokenizer the model in `directory` was trained with (`data.load_tokenizer`), checked
    against its vocabularies; CheckpointError (one line) when it is missing or does not fit."""
    def read(d):
        try:
            tok = _load_tokenizer(d.real, cfg or d.config())
        except TokenizerError as e:  # "DIR has no spm_src.model", or what is wrong with a file
            what = str(e)
            what = what[len(d.real):] if what.startswith(d.real) else f": {what}"
            raise CheckpointError(f"model directory {d.shown}{what.replace(d.real, d.shown)}") \
                from None
        if tok.kind == "subword":
            for name, vocab in ((SRC_VOCAB, tok.src_vocab()), (TGT_VOCAB, tok.tgt_vocab())):
                if d.read_json(name).get("idx_to_token") != vocab.idx_to_token:
                    raise CheckpointError(f"model directory {d.shown}: {name} is not the "
                                          "vocabulary of its sentencepiece model")
        return tok
    return _retrying(read, directory)


def load_trainer_states(directory, trainer):
    """Give `trainer` the Adam moments and update count saved with the model, if any.

    Returns True when the directory had trainer states."""
    path = os.path.join(atomic.resolve_dir(directory), TRAINER)
    if not os.path.exists(path):
        return False
    trainer.load_states(path)
    return True
