"""Model directories: save -> load gives the same translations; damage fails in one line."""

import json
import os
import re
import shutil

import mxnet as mx
import pytest
from mxnet import np

import d2l_transformer as d2t
from d2l_transformer import checkpoint
from d2l_transformer.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d2t.set_seed(0)
    cfg = d2t.TINY.replace(num_epochs=2)
    src_vocab, tgt_vocab, data_iter = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps,
                                                        cfg.num_examples)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    summary = d2t.train_s2s_ch8(model, data_iter, cfg.lr, cfg.num_epochs, mx.cpu())
    directory = str(tmp_path_factory.mktemp("ck") / "model")
    checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, summary)
    return model, src_vocab, tgt_vocab, cfg, summary, directory


def _copy(src, tmp_path, name="copy"):
    """A plain copy of the model directory `src`'s files (its links followed)."""
    dst = str(tmp_path / name)
    os.makedirs(dst)
    for name in os.listdir(src):
        if os.path.isfile(os.path.join(src, name)):
            with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
                g.write(f.read())
    return dst


def test_save_load_same_translations(trained):
    model, src_vocab, tgt_vocab, cfg, summary, directory = trained
    assert _entries(directory) == ENTRIES[:-1]  # each file a link into the version `current` names
    assert sorted(os.listdir(os.path.join(directory, "current"))) == FILES
    model2, src2, tgt2, cfg2, summary2 = checkpoint.load(directory)
    assert cfg2 == cfg and summary2["loss"] == summary["loss"]
    assert src2.idx_to_token == src_vocab.idx_to_token and tgt2.idx_to_token == tgt_vocab.idx_to_token
    sentences = ["go .", "i lost .", "i won !", "he's calm .", "wow !", "i'm home ."]
    ours = [d2t.predict_s2s_ch8(model, s, src_vocab, tgt_vocab, cfg.num_steps, mx.cpu())
            for s in sentences]
    theirs = [d2t.predict_s2s_ch8(model2, s, src2, tgt2, cfg.num_steps, mx.cpu()) for s in sentences]
    assert ours == theirs
    X = np.array([[5, 6, 7, 1], [8, 4, 1, 1]])  # and the logits are bit-identical
    valid_length = np.array([3, 2])
    assert (model(X, X, valid_length)[0] == model2(X, X, valid_length)[0]).all()


def test_save_replaces_atomically(trained, tmp_path, monkeypatch):
    model, src_vocab, tgt_vocab, cfg, _, _ = trained
    directory = str(tmp_path / "m")
    checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 1})

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the save is interrupted half-way, after the params
    monkeypatch.setattr(checkpoint, "_write_text", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 2})
    assert os.listdir(tmp_path) == ["m"] and _entries(directory) == ENTRIES[:-1]  # no leftover
    assert checkpoint.load(directory)[4] == {"run": 1}  # the previous model, whole


FILES = ["config.json", "manifest.json", "params.params", "src_vocab.json", "summary.json",
         "tgt_vocab.json"]
ENTRIES = sorted(FILES + ["current"]) + ["v", "v"]  # after two saves: two versions


def _entries(directory):
    """What a model directory holds, each version as "v", last."""
    names = os.listdir(directory)
    versions = [n for n in names if re.fullmatch(r"v-[0-9a-f]{16}", n)]
    return sorted(set(names) - set(versions)) + ["v"] * len(versions)


class _Interrupter:
    """Raises KeyboardInterrupt at the k-th file-system step of a save (os.replace, rename,
    fsync, symlink, mkdir), as a kill or a power cut at that instant would stop it."""

    STEPS = ("replace", "rename", "fsync", "symlink", "mkdir")

    def __init__(self, monkeypatch, k):
        self.calls, self.k = 0, k
        for name in self.STEPS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real):
        def step(*args, **kwargs):
            self.calls += 1
            if self.calls == self.k:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return step


def _legacy_dir(trained, path, layout="plain"):
    """A model directory as older releases wrote it: a plain directory (the files in it), or
    a link to its hidden sibling version ``.NAME.v-<hex>``."""
    model, src_vocab, tgt_vocab, cfg, _, _ = trained
    made = checkpoint.save(path + "-new", model, src_vocab, tgt_vocab, cfg, {"run": 1})
    parent, base = os.path.split(path)
    real = path if layout == "plain" else os.path.join(parent, f".{base}.v-00000000000000ff")
    shutil.copytree(checkpoint.atomic.resolve_dir(made), real)
    shutil.rmtree(made)
    if layout != "plain":
        os.symlink(os.path.basename(real), path)


@pytest.mark.parametrize("layout", ["versioned", "plain", "link"])
def test_interrupted_at_every_step_the_path_is_a_complete_model(trained, tmp_path, layout):
    model, src_vocab, tgt_vocab, cfg, _, _ = trained
    k, completed = 0, False
    while not completed:
        k += 1
        parent = tmp_path / f"k{k}"
        parent.mkdir()
        directory = str(parent / "m")
        if layout == "versioned":
            checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 1})
        else:  # an older release's: a plain directory, or a link to a hidden sibling version
            _legacy_dir(trained, directory, layout)
            assert os.path.islink(directory) == (layout == "link")
        with pytest.MonkeyPatch.context() as mp:
            interrupter = _Interrupter(mp, k)
            try:
                checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 2})
                completed = True  # fewer than k steps: the save ran to its end
            except KeyboardInterrupt:
                pass
        summary = checkpoint.load(directory)[4]  # manifest, hashes, shapes: a complete model
        assert summary in ({"run": 1}, {"run": 2}), k
        if completed:
            assert summary == {"run": 2}
            assert interrupter.calls == k - 1 and k > 20  # every step was interrupted once
        # the next save completes and leaves only the links, its version and the previous one
        # (and the link layout's version, for its readers, when this save migrated it)
        previous = checkpoint.atomic.resolve_dir(directory)
        checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 3})
        assert json.loads((parent / "m" / "summary.json").read_text()) == {"run": 3}
        assert _entries(directory) == ENTRIES, (k, os.listdir(directory))
        assert sorted(os.listdir(parent)) in (["m"], [".m.v-00000000000000ff", "m"]), k
        if re.fullmatch(r"(\.m\.)?v-[0-9a-f]{16}", os.path.basename(previous)):  # a version:
            # a reader of it finishes on it (of a plain or pending directory: it reads again)
            assert json.loads(open(os.path.join(previous, "summary.json")).read()) == summary


def test_stale_leftovers_are_removed_by_the_next_save(trained, tmp_path):
    model, src_vocab, tgt_vocab, cfg, _, _ = trained
    directory = str(tmp_path / "m")
    checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 1})
    for stale in (".m.tmp-k3j_x9qa", ".m.old-0a1b2c3d", ".m.v-00000000000000aa",  # beside it
                  "m/v-00000000000000aa", "m/.current.tmp-0123456789abcdef"):  # inside it
        os.makedirs(os.path.join(tmp_path, stale, "junk"))
    (tmp_path / ".m.tmp-1234abcd5678ef90").write_text("half a file")
    (tmp_path / "m" / ".params.params.tmp-k3j_x9qa").symlink_to("current/params.params")
    (tmp_path / ".mm.tmp-k3j_x9qa").mkdir()  # another model's: not ours to remove
    (tmp_path / "m" / "v-1").mkdir()  # not a version's name: the user's
    checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"run": 2})
    assert sorted(os.listdir(tmp_path)) == [".mm.tmp-k3j_x9qa", "m"]
    assert _entries(directory) == sorted(FILES + ["current", "v-1"]) + ["v", "v"]  # runs 2, 1
    assert checkpoint.load(directory)[4] == {"run": 2}


def test_save_refuses_to_replace_a_file(trained, tmp_path):
    model, src_vocab, tgt_vocab, cfg, _, _ = trained
    path = tmp_path / "m"
    path.write_text("not a model")
    with pytest.raises(FileExistsError):
        checkpoint.save(str(path), model, src_vocab, tgt_vocab, cfg)
    assert path.read_text() == "not a model"


def test_save_replaces_a_model_directory_only(trained, tmp_path):
    """A plain directory is migrated only when it is a model directory this package wrote (a
    manifest listing config.json and params.params); any other is left byte for byte."""
    model, src_vocab, tgt_vocab, cfg, _, _ = trained
    legacy = str(tmp_path / "legacy")
    _legacy_dir(trained, legacy)
    assert checkpoint.is_model_dir(legacy) and not os.path.islink(legacy)
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    (user / "config.json").write_text("{}")
    (user / "manifest.json").write_text('{"notes.txt": {"bytes": 4}}')  # not our manifest
    assert not checkpoint.is_model_dir(str(user)) and not checkpoint.is_model_dir(str(tmp_path))
    assert not checkpoint.is_model_dir(str(tmp_path / "nope"))
    with pytest.raises(checkpoint.atomic.NotReplaceable, match="not written by d2l_transformer"):
        checkpoint.save(str(user), model, src_vocab, tgt_vocab, cfg)
    assert sorted(os.listdir(user)) == ["config.json", "manifest.json", "notes.txt"]
    assert (user / "notes.txt").read_text() == "mine"
    checkpoint.save(legacy, model, src_vocab, tgt_vocab, cfg, {"run": 2})
    assert os.path.islink(os.path.join(legacy, "current")) and checkpoint.load(legacy)[4] == {
        "run": 2}
    assert checkpoint.is_model_dir(legacy) and _entries(legacy) == ENTRIES


def test_truncated_params_fail_cleanly(trained, tmp_path):
    directory = _copy(trained[5], tmp_path)
    path = os.path.join(directory, "params.params")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError, match=r"params.params is damaged or truncated") as e:
        checkpoint.load(directory)
    assert "\n" not in str(e.value)
    os.remove(os.path.join(directory, "manifest.json"))  # no manifest: not a model directory
    with pytest.raises(CheckpointError, match="has no manifest.json"):
        checkpoint.load(directory)


def test_mismatched_vocab_or_config_fails_in_one_line(trained, tmp_path):
    model, src_vocab, tgt_vocab, cfg, summary, _ = trained
    bigger = d2t.Vocab.from_dict({"idx_to_token": src_vocab.idx_to_token + ["zzz"]})
    for args, pattern in [((bigger, tgt_vocab, cfg), r"encoder.embed.weight is \(43, 16\) in "
                                                      r"params.params but \(44, 16\)"),
                          ((src_vocab, tgt_vocab, cfg.replace(ffn_hidden_size=24)), "ffn")]:
        saved = str(tmp_path / f"bad{len(pattern)}")
        checkpoint.save(saved, model, src_vocab, tgt_vocab, cfg, summary)
        directory = _copy(saved, tmp_path, f"plain{len(pattern)}")
        # overwrite vocabulary / config, keeping the manifest consistent: a wrong *pairing*
        checkpoint.save(saved + "-other", model, *args, summary)
        for name in ("src_vocab.json", "config.json", "manifest.json"):
            shutil.copyfile(os.path.join(saved + "-other", name), os.path.join(directory, name))
        with open(os.path.join(directory, "manifest.json")) as f:
            manifest = json.load(f)
        from d2l_transformer.io.atomic import sha256 as _sha256  # the params hash is the real one
        manifest["params.params"]["sha256"] = _sha256(os.path.join(directory, "params.params"))
        with open(os.path.join(directory, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        with pytest.raises(CheckpointError, match=pattern) as e:
            checkpoint.load(directory)
        assert "\n" not in str(e.value)


def test_missing_directory_and_files(tmp_path, trained):
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(str(tmp_path / "nope"))
    directory = _copy(trained[5], tmp_path)
    os.remove(os.path.join(directory, "tgt_vocab.json"))
    with pytest.raises(CheckpointError, match="tgt_vocab.json is missing"):
        checkpoint.load(directory)


def test_resume_after_building_other_models_in_the_same_process(tmp_path):
    """The Adam state saved with a model is matched to its parameters by the trainer's order,
    which MXNet takes from the parameters' names; `build_model` names them as a fresh process
    does, so that a run resumed after other models were built (a notebook, a test session)
    continues exactly: the same parameters as the run never interrupted."""
    from d2l_transformer.training.run import train_model

    cfg = d2t.TINY.replace(num_epochs=3)
    whole, part = str(tmp_path / "whole"), str(tmp_path / "part")
    train_model(cfg, whole, ctx=mx.cpu(), progress=False)
    train_model(cfg.replace(num_epochs=2), part, ctx=mx.cpu(), progress=False)
    for size in (8, 16, 24):  # move MXNet's global name counters past another digit
        d2t.build_model(d2t.TINY.replace(embedding_size=size), 40 + size, 50)
    names = sorted(d2t.build_model(cfg, 30, 30).collect_params())
    assert names[0] == "dense0_weight"  # as in a fresh process
    train_model(cfg, part, ctx=mx.cpu(), progress=False, resume=True)
    a = mx.nd.load(os.path.join(whole, "params.params"))
    b = mx.nd.load(os.path.join(part, "params.params"))
    assert sorted(a) == sorted(b)
    assert all((a[k] == b[k]).asnumpy().all() for k in a)
