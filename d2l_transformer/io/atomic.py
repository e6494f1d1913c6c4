"""Crash-safe writes: a file or a directory appears whole (old or new), never half written.

Files (`write_file`, `write_text`): written under a temporary name in the same directory,
fsynced, renamed onto the final name with ``os.replace``, then the directory is fsynced, so
that the rename itself survives a power cut.

Directories (`write_dir`, for model directories): the path is a symbolic link to a versioned
sibling ``.NAME.v-XXXXXXXXXXXXXXXX``. A save writes a complete new version (every file
fsynced), points a new link at it and renames that link onto the path with one ``os.replace``:
at every instant the path resolves to a complete directory. The previous version is removed
after the swap; leftovers of an interrupted save (versions nothing points to, ``.tmp-`` and
``.old-`` siblings) are removed by the next save. A plain directory written by an older release
is migrated: it is moved aside and the link renamed in right after; `resolve_dir` covers the
instant between the two renames, so readers always find a complete model. One writer at a
time per path (the next save treats another writer's unfinished version as a leftover).
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
def _pending_link(path):
    """The link a save renames onto `path`; it stands for `path` while a migration swaps."""
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.link")


def resolve_dir(path):
    """The directory to read for `path`: `path` itself, or (after a save was interrupted
    between the two renames of a migration) the new version's pending link."""
    path = os.path.abspath(path)
    if not os.path.lexists(path) and os.path.isdir(_pending_link(path)):
        return _pending_link(path)
    return path


def _leftovers(path):
    """Siblings of `path` that a save of `path` made: ``[(name, full path)]``."""
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
    """Finish a migration interrupted between its two renames, then remove leftovers."""
    pending = _pending_link(path)
    if not os.path.lexists(path) and os.path.isdir(pending):
        os.replace(pending, path)
        fsync_dir(os.path.dirname(path))
    live = os.path.realpath(path) if os.path.exists(path) else None
    for leftover in _leftovers(path):
        if os.path.realpath(leftover) != live:
            _remove(leftover)
    if os.path.lexists(pending):
        os.remove(pending)


def write_dir(path, fill):
    """Write the directory `path` as one unit: ``fill(tmp_dir)`` writes the files into a new
    empty directory (with `write_file`, so each is fsynced); then `path` is switched to it in
    one ``os.replace`` (see the module's docstring). Returns the absolute `path`.

    An exception at any point leaves `path` resolving to the previous complete directory (or
    to nothing, if there was none), or, once the switch has happened, to the new one."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    if os.path.lexists(path) and not os.path.isdir(path) and not os.path.islink(path):
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", path)
    _recover(path)
    version, pending = _sibling(path, "v"), _pending_link(path)
    os.mkdir(version)
    old = None
    try:
        fill(version)
        fsync_dir(version)
        os.symlink(os.path.basename(version), pending)  # relative: the parent may move
        if os.path.islink(path):
            old = os.path.realpath(path)
        elif os.path.isdir(path):  # a plain directory from an older release: migrate it
            old = _sibling(path, "old")
            os.replace(path, old)  # `resolve_dir` finds the pending link until the next line
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
    if old and os.path.basename(old).startswith(f".{os.path.basename(path)}."):
        _remove(old)  # only our own versions: a link the user made to elsewhere stays
    return path


def sha256(path):
    """The SHA-256 hex digest of a file, read in 1 MB chunks (the manifests' checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
