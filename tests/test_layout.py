"""A model directory is a real directory that every common tool copies whole: a copy made with
`cp -r`, `cp -a`, `rsync -a`, `tar` or `zip -r` (or `shutil.copytree`) loads after the original
is gone, with the same parameters and translations, its `best/` and a user's file too; and the
layout before this one (a link to a hidden sibling version, `best/` inside it) loads and
migrates on its next save, loadable after an interruption at every step."""

import os
import re
import shutil
import subprocess

import mxnet as mx
import pytest

import d2l_transformer as d2t
from d2l_transformer import checkpoint
from d2l_transformer.io import atomic

SENTENCES = ["go .", "i lost .", "he's calm .", "i'm home ."]
FILES = ["config.json", "manifest.json", "params.params", "src_vocab.json", "summary.json",
         "tgt_vocab.json"]


def _versions(directory):
    return sorted(n for n in os.listdir(directory) if re.fullmatch(r"v-[0-9a-f]{16}", n))


@pytest.fixture(scope="module")
def tiny():
    """A TINY model (Xavier, seeded) and its vocabularies."""
    d2t.set_seed(3)
    cfg = d2t.TINY
    src_vocab, tgt_vocab, _ = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps, cfg.num_examples)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.initialize(mx.init.Xavier())
    X = mx.np.ones((1, 2))  # (batch, seq_len): every shape known
    model(X, X, mx.np.array([2]))
    return model, src_vocab, tgt_vocab, cfg


def _params(model):
    return {k: v.data().asnumpy() for k, v in model._collect_params_with_prefix().items()}


def _same_model(directory, tiny, summary):
    """The model directory loads: the same parameters, bit for bit, the same greedy
    translations, and `summary`."""
    model, src_vocab, tgt_vocab, cfg = tiny
    loaded, src2, tgt2, cfg2, summary2 = checkpoint.load(directory)
    assert cfg2 == cfg and summary2 == summary
    ours, theirs = _params(model), _params(loaded)
    assert sorted(ours) == sorted(theirs) and all((ours[k] == theirs[k]).all() for k in ours)
    assert [d2t.predict_s2s_ch8(loaded, s, src2, tgt2, cfg.num_steps, mx.cpu()) for s in SENTENCES] \
        == [d2t.predict_s2s_ch8(model, s, src_vocab, tgt_vocab, cfg.num_steps, mx.cpu())
            for s in SENTENCES]


def _tool(*names):
    missing = [n for n in names if shutil.which(n) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{' and '.join(missing)} not installed")


def _run(command, cwd):
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)


# each copies the model directory PARENT/out/m into PARENT/backup/m, seen from PARENT
COPIES = {
    "cp -r": [["cp", "-r", "out/m", "backup/m"]],
    "cp -a": [["cp", "-a", "out/m", "backup/m"]],
    "rsync -a": [["rsync", "-a", "out/m", "backup/"]],
    "tar": [["tar", "-cf", "m.tar", "-C", "out", "m"], ["tar", "-xf", "m.tar", "-C", "backup"]],
    "zip -r": [["sh", "-c", "cd out && zip -qr ../m.zip m"], ["unzip", "-q", "m.zip", "-d", "backup"]],
}
MARKS = {"rsync -a": _tool("rsync"), "tar": _tool("tar"), "zip -r": _tool("zip", "unzip")}


@pytest.mark.parametrize("tool", [pytest.param(t, marks=MARKS.get(t, ())) for t in COPIES] +
                         ["shutil.copytree"])
def test_a_copy_made_with_any_tool_loads_after_the_original_is_removed(tiny, tmp_path, tool):
    model, src_vocab, tgt_vocab, cfg = tiny
    out = tmp_path / "out" / "m"
    checkpoint.save(str(out), model, src_vocab, tgt_vocab, cfg, {"run": 1})
    checkpoint.save(str(out), model, src_vocab, tgt_vocab, cfg, {"run": 2})  # and its previous
    checkpoint.save(str(out / "best"), model, src_vocab, tgt_vocab, cfg, {"best": 1})
    (out / "notes.txt").write_text("mine")
    (tmp_path / "backup").mkdir()
    if tool == "shutil.copytree":
        shutil.copytree(out, tmp_path / "backup" / "m")  # follows the links, as zip does
    for command in COPIES.get(tool, []):
        _run(command, tmp_path)
    shutil.rmtree(tmp_path / "out")  # the original is gone
    copy = str(tmp_path / "backup" / "m")
    assert checkpoint.is_model_dir(copy)
    _same_model(copy, tiny, {"run": 2})
    _same_model(os.path.join(copy, "best"), tiny, {"best": 1})
    assert open(os.path.join(copy, "notes.txt")).read() == "mine"
    assert open(os.path.join(copy, "summary.json")).read() == '{\n  "run": 2\n}'
    # the copy is saved again like the original: its layout, the user's file and best/ kept
    checkpoint.save(copy, model, src_vocab, tgt_vocab, cfg, {"run": 3})
    _same_model(copy, tiny, {"run": 3})
    assert os.readlink(os.path.join(copy, "current")) in _versions(copy)
    assert sorted(set(os.listdir(copy)) - set(_versions(copy))) == sorted(
        FILES + ["best", "current", "notes.txt"])
    assert len(_versions(copy)) == 2 and open(os.path.join(copy, "notes.txt")).read() == "mine"
    _same_model(os.path.join(copy, "best"), tiny, {"best": 1})


def _link_layout(tiny, path, summary, best=None):
    """A model directory as the previous release wrote it: `path` a link to the hidden sibling
    version ``.NAME.v-<hex>``; with `best`, the model directory ``best`` inside that version,
    itself a link to its sibling ``.best.v-<hex>``. Returns the version."""
    model, src_vocab, tgt_vocab, cfg = tiny
    parent, base = os.path.split(path)
    version = os.path.join(parent, f".{base}.v-0123456789abcdef")
    made = checkpoint.save(path + "-made", model, src_vocab, tgt_vocab, cfg, summary)
    shutil.copytree(atomic.resolve_dir(made), version)
    shutil.rmtree(made)
    if best is not None:
        _link_layout(tiny, os.path.join(version, "best"), best)
    os.symlink(os.path.basename(version), path)
    return version


def test_the_previous_layout_loads_and_migrates_on_its_next_save(tiny, tmp_path):
    model, src_vocab, tgt_vocab, cfg = tiny
    path = str(tmp_path / "m")
    old = _link_layout(tiny, path, {"run": 1}, best={"best": 1})
    assert checkpoint.is_model_dir(path) and os.path.islink(path)
    _same_model(path, tiny, {"run": 1})
    _same_model(os.path.join(path, "best"), tiny, {"best": 1})
    reader = atomic.resolve_dir(path)  # a reader that resolved the old version
    checkpoint.save(path, model, src_vocab, tgt_vocab, cfg, {"run": 2})
    assert not os.path.islink(path) and os.path.isdir(path)
    assert os.readlink(os.path.join(path, "current")) in _versions(path)
    _same_model(path, tiny, {"run": 2})
    _same_model(os.path.join(path, "best"), tiny, {"best": 1})  # carried, still loadable
    assert open(os.path.join(reader, "summary.json")).read() == '{\n  "run": 1\n}'
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(old), "m"]  # kept for its readers
    checkpoint.save(path, model, src_vocab, tgt_vocab, cfg, {"run": 3})
    assert os.listdir(tmp_path) == ["m"]  # the next save removes it
    checkpoint.save(os.path.join(path, "best"), model, src_vocab, tgt_vocab, cfg, {"best": 2})
    _same_model(os.path.join(path, "best"), tiny, {"best": 2})  # best/ migrates on its save
    best = os.path.join(path, "best")
    assert os.path.isdir(best) and not os.path.islink(best) and _versions(best)
    assert [n for n in os.listdir(path) if n[0] == "."] == [".best.v-0123456789abcdef"]
    checkpoint.save(best, model, src_vocab, tgt_vocab, cfg, {"best": 3})
    assert [n for n in os.listdir(path) if n[0] == "."] == []


class _Interrupter:
    """Raises KeyboardInterrupt at the k-th file-system step of a save (os.replace, rename,
    fsync, symlink, mkdir, link, remove), as a kill or a power cut at that instant would."""

    STEPS = ("replace", "rename", "fsync", "symlink", "mkdir", "link", "remove")

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


@pytest.mark.slow
def test_a_migration_interrupted_at_every_step_leaves_a_loadable_model(tiny, tmp_path):
    model, src_vocab, tgt_vocab, cfg = tiny
    k, completed = 0, False
    while not completed:
        k += 1
        path = str(tmp_path / f"k{k}" / "m")
        os.makedirs(os.path.dirname(path))
        _link_layout(tiny, path, {"run": 1}, best={"best": 1})
        with pytest.MonkeyPatch.context() as mp:
            interrupter = _Interrupter(mp, k)
            try:
                checkpoint.save(path, model, src_vocab, tgt_vocab, cfg, {"run": 2})
                completed = True
            except KeyboardInterrupt:
                pass
        assert checkpoint.load(path)[4] in ({"run": 1}, {"run": 2}), k  # manifest, hashes, shapes
        assert checkpoint.load(os.path.join(path, "best"))[4] == {"best": 1}, k
        checkpoint.save(path, model, src_vocab, tgt_vocab, cfg, {"run": 3})  # completes
        assert checkpoint.load(path)[4] == {"run": 3} and checkpoint.is_model_dir(
            os.path.join(path, "best"))
        assert sorted(set(os.listdir(path)) - set(_versions(path))) == sorted(  # best/ as it was
            FILES + ["best", ".best.v-0123456789abcdef", "current"]), (k, os.listdir(path))
        assert 1 <= len(_versions(path)) <= 2 and not os.path.islink(path)
    assert interrupter.calls == k - 1 and k > 20  # every step was interrupted once
