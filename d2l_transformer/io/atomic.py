"""Crash-safe writes: a file or a directory appears whole (old or new), never half written.

Files (`write_file`, `write_text`): written under a temporary name in the same directory,
fsynced, renamed onto the final name with ``os.replace``, then the directory is fsynced, so
that the rename itself survives a power cut.

Directories (`write_dir`, for model directories): the path is a symbolic link to a versioned
sibling ``.NAME.v-XXXXXXXXXXXXXXXX``. A save writes a complete new version (every file
fsynced), points a new link at it and renames that link onto the path with one ``os.replace``:
at every instant the path resolves to a complete directory. A reader resolves the path once
(`resolve_dir`, the real version directory) and reads every file from there; the previous
version stays on disk until the next save is complete, so a reader that started on it
finishes on it. Older versions and leftovers of an interrupted save (versions nothing points
to, ``.tmp-`` and ``.old-`` siblings) are removed once a save is in place.

A save replaces only what this package wrote (`check_replaceable`): nothing, an empty
directory, its own link, or a directory the caller's test recognises (a model directory). A
plain model directory written by an older release is migrated: it is renamed to a version
and the link renamed in right after; `resolve_dir` covers the instant between the two
renames. One writer at a time per path (the next save treats another writer's unfinished
version as a leftover).
"""

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil

_KINDS = ("v", "tmp", "old")


def fsync_dir(path):
    """Make the entries of directory `path` (new names, renames) durable."""
    if os.name == "nt":  # Windows cannot open a directory; NTFS journals the rename itself
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems do not fsync directories
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def _fsync_file(path):
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sibling(path, kind):
    """A new name ``.BASE.KIND-<16 hex digits>`` beside `path`."""
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.{kind}-{secrets.token_hex(8)}")


def write_file(path, write):
    """``write(tmp)`` creates the file at the temporary path `tmp` (a name in `path`'s
    directory); it is then fsynced and renamed onto `path`. Returns the absolute `path`.

    On any exception (KeyboardInterrupt too) the temporary file is removed and `path` is
    untouched."""
    path = os.path.abspath(path)
    tmp = _sibling(path, "tmp")
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))
    return path


def write_text(path, text, encoding="utf-8"):
    """`write_file` for a text file."""
    def write(tmp):
        with open(tmp, "x", encoding=encoding) as f:
            f.write(text)
    return write_file(path, write)


# ---------------------------------------------------------------------------------- directories
class NotReplaceable(FileExistsError):
    """A save must not replace what is at the path: a file, or a directory this package did not
    write (`check_replaceable`)."""


def _pending_link(path):
    """The link a save renames onto `path`; it stands for `path` while a migration swaps."""
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.link")


def _own_version(path):
    """The version directory `path` links to when it is a link to one of its own versioned
    siblings (written by `write_dir`), else None."""
    if not os.path.islink(path):
        return None
    parent, base = os.path.split(os.path.abspath(path))
    target = os.path.realpath(path)
    if os.path.dirname(target) == os.path.realpath(parent) and os.path.isdir(target) and \
            re.fullmatch(rf"\.{re.escape(base)}\.v-[0-9a-z_]+", os.path.basename(target)):
        return target
    return None


def resolve_dir(path):
    """The real directory to read for `path`, resolved once (``os.path.realpath``): the version
    its link names (or, after a save was interrupted between the two renames of a migration,
    the version of the pending link), or a plain directory itself. A reader that reads every
    file from it reads one version: a version stays on disk until the save after the one that
    replaced it is complete."""
    path = os.path.abspath(path)
    if not os.path.lexists(path) and os.path.lexists(_pending_link(path)):
        path = _pending_link(path)
    return os.path.realpath(path)


def check_replaceable(path, replaceable=None):
    """Raise NotReplaceable (naming `path`) unless `write_dir` may put a new version at `path`:
    nothing there, an empty directory, a link to one of its own versions, or a directory (or a
    link to one) for which ``replaceable(path)`` is true (for model directories: one written by
    this package, in the current or an older layout)."""
    path = os.path.abspath(path)
    if not os.path.lexists(path) or _own_version(path):
        return
    if not os.path.isdir(path):
        raise NotReplaceable(errno.EEXIST, "exists and is not a directory", path)
    if not os.path.islink(path) and not os.listdir(path):
        return
    if replaceable is None or not replaceable(path):
        raise NotReplaceable(errno.EEXIST, "exists and was not written by d2l_transformer; "
                                           "not replaced", path)


def _leftovers(path):
    """Siblings of `path` that a save of `path` made: ``[full path]``."""
    parent, base = os.path.split(path)
    pattern = re.compile(rf"\.{re.escape(base)}\.({'|'.join(_KINDS)})-[0-9a-z_]+")
    return [os.path.join(parent, n) for n in os.listdir(parent) if pattern.fullmatch(n)]


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def _recover(path):
    """Finish a migration interrupted between its two renames; remove a stale pending link."""
    pending = _pending_link(path)
    if not os.path.lexists(path) and os.path.isdir(pending):
        os.replace(pending, path)
        fsync_dir(os.path.dirname(path))
    if os.path.lexists(pending):
        os.remove(pending)


def write_dir(path, fill, replaceable=None):
    """Write the directory `path` as one unit: ``fill(tmp_dir)`` writes the files into a new
    empty directory (with `write_file`, so each is fsynced); then `path` is switched to it in
    one ``os.replace`` (see the module's docstring). Returns the absolute `path`.

    What is at `path` is replaced only if `check_replaceable` allows it (``replaceable``: the
    test of a directory this package wrote), else NotReplaceable is raised before anything is
    written. The previous version stays on disk until the next save is complete (readers that
    resolved it finish on it); older ones and the leftovers of interrupted saves are removed
    once this one is in place. An exception at any point leaves `path` resolving to the
    previous complete directory (or to nothing, if there was none), or, once the switch has
    happened, to the new one."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    _recover(path)
    check_replaceable(path, replaceable)
    version, pending = _sibling(path, "v"), _pending_link(path)
    os.mkdir(version)
    previous = _own_version(path)
    try:
        fill(version)
        fsync_dir(version)
        os.symlink(os.path.basename(version), pending)  # relative: the parent may move
        if os.path.isdir(path) and not os.path.islink(path):
            if os.listdir(path):  # a model directory of an older release: it becomes a version
                previous = _sibling(path, "v")
                os.replace(path, previous)  # `resolve_dir` reads the pending link until the next line
            else:
                os.rmdir(path)  # fails if a file appeared in it meanwhile
        os.replace(pending, path)
        fsync_dir(parent)
    except BaseException:
        live = path if os.path.lexists(path) else pending  # what `resolve_dir` reads now
        if not os.path.exists(live) or os.path.realpath(live) != os.path.realpath(version):
            _remove(version)
            with contextlib.suppress(OSError):
                if os.path.islink(pending):
                    os.remove(pending)
        raise
    keep = {os.path.realpath(version), os.path.realpath(previous) if previous else None}
    for leftover in _leftovers(path):  # only our own siblings: a link's foreign target stays
        if os.path.realpath(leftover) not in keep:
            _remove(leftover)
    return path


def sha256(path):
    """The SHA-256 hex digest of a file, read in 1 MB chunks (the manifests' checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
