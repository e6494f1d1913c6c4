"""`io.atomic`: a file is written whole or not at all, fsynced before and after its rename, and
every writer of the package goes through it."""

import os
import stat

import mxnet as mx
import pytest

from d2l_transformer.contrib import averaging
from d2l_transformer.io import atomic


def _record(monkeypatch):
    """Log os.fsync (of a file or a directory) and os.replace calls, in order."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        return real_fsync(fd)

    def replace(src, dst):
        events.append("replace")
        return real_replace(src, dst)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_write_text_fsyncs_the_file_then_renames_then_fsyncs_the_directory(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    path.write_text("old")
    events = _record(monkeypatch)
    assert atomic.write_text(str(path), "new") == str(path)
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["a.json"]
    assert events == ["fsync file", "replace", "fsync dir"]


@pytest.mark.parametrize("where", ["write", "replace"])
def test_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, where):
    path = tmp_path / "a.params"
    path.write_text("old")

    def write(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        if where == "write":
            raise KeyboardInterrupt

    def replace(src, dst):
        raise KeyboardInterrupt
    if where == "replace":
        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_file(str(path), write)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["a.params"]


def test_resolve_dir_reads_the_pending_link_only_while_the_path_is_missing(tmp_path):
    version = tmp_path / ".m.v-0123456789abcdef"
    version.mkdir()
    os.symlink(version.name, tmp_path / ".m.link")
    assert atomic.resolve_dir(str(tmp_path / "m")) == str(tmp_path / ".m.link")
    (tmp_path / "m").mkdir()
    assert atomic.resolve_dir(str(tmp_path / "m")) == str(tmp_path / "m")


def test_averaged_checkpoint_is_written_through_the_helper(tmp_path, monkeypatch):
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"{i}.params"))
        mx.nd.save(paths[-1], {"w": mx.nd.array([float(i), 2.0 * i])})
    written = []
    real = atomic.write_file
    monkeypatch.setattr(atomic, "write_file", lambda path, write: written.append(path) or real(path, write))
    out = str(tmp_path / "avg.params")
    averaging.average_checkpoints(paths, out)
    assert written == [out]
    assert mx.nd.load(out)["w"].asnumpy().tolist() == [0.5, 1.0]
    assert sorted(os.listdir(tmp_path)) == ["0.params", "1.params", "avg.params"]
