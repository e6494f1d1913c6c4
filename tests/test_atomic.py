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


def test_resolve_dir_gives_the_real_version_of_every_layout(tmp_path):
    version = tmp_path / "m" / "v-0123456789abcdef"
    version.mkdir(parents=True)
    os.symlink(version.name, tmp_path / "m" / "current")  # this layout
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(version)
    os.remove(tmp_path / "m" / "current")
    (tmp_path / "m" / "current").mkdir()  # a copy that followed the links: read where it is,
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(tmp_path / "m")
    (tmp_path / "m" / "current").rmdir()  # as a plain directory (an older layout) is
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(tmp_path / "m")
    os.replace(tmp_path / "m", tmp_path / ".m.pending")  # a migration between its two renames
    assert atomic.resolve_dir(str(tmp_path / "m")) == os.path.realpath(tmp_path / ".m.pending")
    assert atomic.resolve_dir(str(tmp_path / "m" / "best")) == os.path.realpath(
        tmp_path / ".m.pending" / "best")  # inside it too
    old = tmp_path / ".n.v-0123456789abcdef"
    old.mkdir()
    os.symlink(old.name, tmp_path / ".n.link")  # the link layout, between its migration's renames
    assert atomic.resolve_dir(str(tmp_path / "n")) == os.path.realpath(old)
    os.replace(tmp_path / ".n.link", tmp_path / "n")  # the link layout
    assert atomic.resolve_dir(str(tmp_path / "n")) == os.path.realpath(old)


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
    # an empty directory, and a directory the caller's test recognises, are written; in the
    # latter only the files `owned` names (an older layout's) become the version's links
    (tmp_path / "empty").mkdir()
    atomic.write_dir(str(tmp_path / "empty"), _fill("new"))
    assert (tmp_path / "empty" / "a.txt").read_text() == "new"
    (user / "a.txt").write_text("old")
    atomic.write_dir(str(user), _fill("new"), replaceable=lambda p: (user / "notes.txt").exists(),
                     owned=lambda p: {"a.txt"})
    assert (user / "a.txt").read_text() == "new" and os.readlink(user / "a.txt") == os.path.join(
        "current", "a.txt")
    tree = _tree(user)  # the user's files left as they were
    assert tree["notes.txt"] == b"mine" and tree[os.path.join("sub", "data.bin")] == b"\x00\x01"
    assert sorted(n for n in os.listdir(user) if not n.startswith("v-")) == [
        "a.txt", "current", "notes.txt", "sub"]
    atomic.write_dir(str(user), _fill("newer"))  # its own layout now: no test needed
    assert (user / "a.txt").read_text() == "newer" and (user / "notes.txt").read_text() == "mine"


def test_the_previous_version_stays_until_the_next_save_is_complete(tmp_path):
    path = str(tmp_path / "m")
    readers = []
    for i in range(4):
        atomic.write_dir(path, _fill(f"v{i}"))
        readers.append(atomic.resolve_dir(path))  # a reader that started on version i
        versions = sorted(n for n in os.listdir(path) if n.startswith("v-"))
        assert len(versions) == min(i + 1, 2) and os.listdir(tmp_path) == ["m"]
        assert os.readlink(os.path.join(path, "current")) == os.path.basename(readers[-1])
        assert open(os.path.join(readers[-1], "a.txt")).read() == f"v{i}"
        if i:  # the reader of the previous version still finds it whole
            assert open(os.path.join(readers[-2], "a.txt")).read() == f"v{i - 1}"
        if i > 1:  # two saves later it is gone
            assert not os.path.exists(readers[-3])


def _interrupt_at(monkeypatch, k):
    """KeyboardInterrupt at the k-th call of os.mkdir, symlink, replace or fsync (a kill at that
    instant); returns the list of the calls' names, as they are made."""
    steps = []

    def wrap(real):
        def step(*args, **kwargs):
            steps.append(real.__name__)
            if len(steps) == k:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return step
    for name in ("mkdir", "symlink", "replace", "fsync"):
        monkeypatch.setattr(os, name, wrap(getattr(os, name)))
    return steps


def test_a_first_save_interrupted_at_every_step_leaves_nothing_or_the_whole_directory(tmp_path):
    k, completed = 0, False
    while not completed:
        k += 1
        path = tmp_path / f"k{k}" / "m"
        with pytest.MonkeyPatch.context() as mp:
            steps = _interrupt_at(mp, k)
            try:
                atomic.write_dir(str(path), _fill("new"))
                completed = True
            except KeyboardInterrupt:
                pass
        if os.path.lexists(path):  # whole: the rename of the directory was done
            assert (path / "a.txt").read_text() == "new" and steps[k - 1:] in ([], ["fsync"]), k
        atomic.write_dir(str(path), _fill("next"))  # the next save removes every leftover
        assert os.listdir(path.parent) == ["m"] and (path / "a.txt").read_text() == "next"
    assert k > 8


def test_a_directory_between_the_two_renames_of_its_migration_is_put_back_not_made_anew(tmp_path):
    pending = tmp_path / ".m.pending"  # `m` was removed, its new directory not yet renamed in
    pending.mkdir()
    (pending / "a.txt").write_text("the model")
    assert atomic.resolve_dir(str(tmp_path / "m" / "ctranslate2")) == str(pending / "ctranslate2")
    atomic.makedirs(str(tmp_path / "m" / "ctranslate2"))  # e.g. a lock inside it (`io.lock`)
    assert sorted(os.listdir(tmp_path)) == ["m"]
    assert sorted(os.listdir(tmp_path / "m")) == ["a.txt", "ctranslate2"]


def test_remove_dir_removes_every_layout_at_once(tmp_path):
    atomic.write_dir(str(tmp_path / "m" / "best"), _fill("best"))
    atomic.remove_dir(str(tmp_path / "m" / "best"))
    assert os.listdir(tmp_path / "m") == []
    old = tmp_path / "m" / ".best.v-0123456789abcdef"  # the link layout
    old.mkdir()
    os.symlink(old.name, tmp_path / "m" / "best")
    (tmp_path / "m" / ".best.tmp-0123456789abcdef").write_text("a leftover")
    atomic.remove_dir(str(tmp_path / "m" / "best"))
    assert os.listdir(tmp_path / "m") == []


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
