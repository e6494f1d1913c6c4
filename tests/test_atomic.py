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


def test_resolve_dir_gives_the_real_version_of_the_link_or_of_the_pending_one(tmp_path):
    version = tmp_path / ".m.v-0123456789abcdef"
    version.mkdir()
    os.symlink(version.name, tmp_path / ".m.link")  # a migration between its two renames
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(version)
    (tmp_path / "m").mkdir()  # a plain directory (an older layout) is read where it is
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(tmp_path / "m")
    (tmp_path / "m").rmdir()
    os.symlink(version.name, tmp_path / "m")
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(version)


def _fill(text):
    return lambda d: atomic.write_text(os.path.join(d, "a.txt"), text)


def _tree(root):
    """Every file under `root` (links not followed) with its bytes."""
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


def test_write_dir_replaces_only_what_it_wrote(tmp_path):
    user = tmp_path / "user"
    (user / "sub").mkdir(parents=True)
    (user / "notes.txt").write_text("mine")
    (user / "sub" / "data.bin").write_bytes(b"\x00\x01")
    (tmp_path / "file").write_text("a file")
    before = _tree(tmp_path)
    for path in (user, tmp_path / "file", tmp_path):
        with pytest.raises(atomic.NotReplaceable) as e:
            atomic.write_dir(str(path), _fill("new"))
        assert e.value.filename == str(path)
    with pytest.raises(atomic.NotReplaceable):  # the caller's test says no
        atomic.write_dir(str(user), _fill("new"), replaceable=lambda p: False)
    os.symlink("user", tmp_path / "link")  # a user's link to a user's directory
    with pytest.raises(atomic.NotReplaceable):
        atomic.write_dir(str(tmp_path / "link"), _fill("new"))
    assert _tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["file", "link", "user"]
    # an empty directory, and a directory the caller's test recognises, are replaced
    (tmp_path / "empty").mkdir()
    atomic.write_dir(str(tmp_path / "empty"), _fill("new"))
    assert (tmp_path / "empty" / "a.txt").read_text() == "new"
    atomic.write_dir(str(user), _fill("new"), replaceable=lambda p: (user / "notes.txt").exists())
    assert os.listdir(user) == ["a.txt"] and os.path.islink(user)


def test_the_previous_version_stays_until_the_next_save_is_complete(tmp_path):
    path = str(tmp_path / "m")
    readers = []
    for i in range(4):
        atomic.write_dir(path, _fill(f"v{i}"))
        readers.append(atomic.resolve_dir(path))  # a reader that started on version i
        versions = sorted(n for n in os.listdir(tmp_path) if n.startswith(".m.v-"))
        assert len(versions) == min(i + 1, 2) and "m" in os.listdir(tmp_path)
        assert open(os.path.join(readers[-1], "a.txt")).read() == f"v{i}"
        if i:  # the reader of the previous version still finds it whole
            assert open(os.path.join(readers[-2], "a.txt")).read() == f"v{i - 1}"
        if i > 1:  # two saves later it is gone
            assert not os.path.exists(readers[-3])


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
