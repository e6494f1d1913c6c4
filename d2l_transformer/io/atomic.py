"""Crash-safe writes: a file or a directory appears whole (old or new), never half written.

Files (`write_file`, `write_text`): written under a temporary name in the same directory,
fsynced, renamed onto the final name with ``os.replace``, then the directory is fsynced, so
that the rename itself survives a power cut.

Directories (`write_dir`, for model directories and exports; docs/safety.md): the path is a
real directory holding its versions, a relative link ``current`` to one, and a link
``NAME -> current/NAME`` for each entry of it (``current -> v-0123456789abcdef``, ...). A save
writes a complete new version inside the directory (every file fsynced) and renames a new link
onto ``current`` with one ``os.replace``. Every link is relative and inside the directory, so
any copy is whole: ``cp -r``, ``cp -a``, ``rsync -a``, ``tar`` keep the links; ``zip -r`` and
``shutil.copytree`` follow them, and such a copy is read as a plain directory. A reader resolves
the path once (`resolve_dir`) and reads every file from that version; the previous version
stays until the next save is complete. Older versions and leftovers of interrupted saves are
removed once a save is in place; what else the directory holds (``best/``, a user's file) is
never touched. A save replaces only what this package wrote (`check_replaceable`). One writer
at a time per path.

Older layouts load, and migrate on their next save, loadable at every step: a plain directory
(a version of hard links to its files, ``current`` renamed in, each file replaced by its link)
and a link to a hidden sibling version ``.NAME.v-...`` (its entries hard-linked into
``.NAME.pending``, renamed in place of the link; `resolve_dir` reads it in between).
"""

import contextlib
import errno
import filecmp
import hashlib
import os
import re
import secrets
import shutil

_KINDS = ("v", "tmp", "old")
CURRENT = "current"  # the link inside a directory to the version to read
_VERSION = re.compile(r"v-[0-9a-f]{16}")  # a version inside the directory
_TEMPORARY = re.compile(r"\..+\.(tmp|old)-[0-9a-z_]+")  # a temporary inside it


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


def _pendings(path):
    """``.NAME.pending`` and ``.NAME.link`` (the link layout's): a migration renames it onto `path`."""
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.pending"), os.path.join(parent, f".{base}.link")


def _own_version(path):
    """The version `path` links to in the link layout (its sibling ``.NAME.v-...``), else None."""
    if not os.path.islink(path):
        return None
    parent, base = os.path.split(os.path.abspath(path))
    target = os.path.realpath(path)
    if os.path.dirname(target) == os.path.realpath(parent) and os.path.isdir(target) and \
            re.fullmatch(rf"\.{re.escape(base)}\.v-[0-9a-z_]+", os.path.basename(target)):
        return target
    return None


def _current(directory):
    """The version ``directory/current`` links to when it is one of its own, else None."""
    link = os.path.join(directory, CURRENT)
    if os.path.islink(link) and _VERSION.fullmatch(os.readlink(link)) and os.path.isdir(link):
        return os.path.join(directory, os.readlink(link))
    return None


def _own_link(path, name):
    """True when `path` is the link ``name -> current/name`` a save makes."""
    return os.path.islink(path) and os.readlink(path) == os.path.join(CURRENT, name)


def _only_leftovers(directory):
    """True when `directory` holds nothing, or only what interrupted saves of it left."""
    return all(_VERSION.fullmatch(n) or _TEMPORARY.fullmatch(n) or
               _own_link(os.path.join(directory, n), n) for n in os.listdir(directory))


def resolve_dir(path):
    """The real directory to read for `path`, resolved once: the version its ``current`` names,
    the link layout's version, or a plain directory (a copy that followed the links too); while
    a migration has `path` missing, the pending one's. A version stays on disk until the save
    after the one that replaced it is complete."""
    real = os.path.realpath(_standing(os.path.abspath(path)))
    version = _current(real)
    return os.path.realpath(version) if version else real


def check_replaceable(path, replaceable=None):
    """Raise NotReplaceable (naming `path`) unless `write_dir` may save a version at `path`:
    nothing, a directory empty but for what interrupted saves left, one with this package's
    ``current`` or a link to its sibling version, or a directory for which ``replaceable(path)``
    is true (model directories: `checkpoint.is_model_dir`) and no foreign ``current``."""
    path = os.path.abspath(path)
    if not os.path.lexists(path) or _own_version(path):
        return
    if not os.path.isdir(path):
        raise NotReplaceable(errno.EEXIST, "exists and is not a directory", path)
    current = os.path.join(path, CURRENT)
    if _current(path) or _only_leftovers(path):
        return
    if (replaceable is None or not replaceable(path) or os.path.islink(current)
            or os.path.lexists(current) and not os.path.isdir(current)):
        raise NotReplaceable(errno.EEXIST, "exists and was not written by d2l_transformer; "
                                           "not replaced", path)


def _leftovers(path):
    """Siblings of `path` that a save of the link layout made: ``[full path]``."""
    parent, base = os.path.split(path)
    pattern = re.compile(rf"\.{re.escape(base)}\.({'|'.join(_KINDS)})-[0-9a-z_]+")
    return [os.path.join(parent, n) for n in os.listdir(parent) if pattern.fullmatch(n)]


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def _link_or_copy(src, dst):
    """`dst` a hard link to `src` (files are replaced, never changed), else a fsynced copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
        _fsync_file(dst)


def _standing(path):
    """`path`, or what stands for it while a migration of it, or of a directory above it, has it
    missing: the pending directory or link."""
    parent, base = os.path.split(path)
    if os.path.lexists(path) or parent == path:
        return path
    path = os.path.join(_standing(parent), base)
    return next((p for p in (path, *_pendings(path)) if os.path.lexists(p)), path)


def _finish(path):
    """Finish a migration of `path`, or of a directory above it, interrupted between its two
    renames (another process may be finishing it at the same moment)."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.lexists(parent):
        _finish(parent)
    for pending in _pendings(path):
        if not os.path.lexists(path) and os.path.isdir(pending):
            with contextlib.suppress(FileNotFoundError):  # finished by the other process
                os.replace(pending, path)
            fsync_dir(parent)


def makedirs(path):
    """``os.makedirs(path, exist_ok=True)``, after `_finish`: a directory whose migration was
    interrupted is put back, not made anew, empty, in its place."""
    path = os.path.abspath(path)
    _finish(path)
    os.makedirs(path, exist_ok=True)


def _from_link_layout(path):
    """Make the link `path` to its sibling version a real directory of the version's entries,
    hard-linked: built as ``.NAME.pending``, renamed in place of the link. Returns the sibling
    version, which readers may still read."""
    version, parent = _own_version(path), os.path.dirname(path)
    tmp, pending = _sibling(path, "tmp"), _pendings(path)[0]
    try:
        shutil.copytree(version, tmp, symlinks=True, copy_function=_link_or_copy)
        for directory, _, _ in os.walk(tmp):
            fsync_dir(directory)
        os.replace(tmp, pending)
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(parent)
    os.remove(path)  # `resolve_dir` reads the pending directory until the next line
    _finish(path)
    return version


def _point(directory, version):
    """Rename a new link ``current -> version`` onto ``directory/current``: one atomic step."""
    link = _sibling(os.path.join(directory, CURRENT), "tmp")
    os.symlink(os.path.basename(version), link, target_is_directory=True)  # relative
    os.replace(link, os.path.join(directory, CURRENT))  # an interrupted one: a leftover
    fsync_dir(directory)


def _same_bytes(copy, original):
    """True when `copy` is a plain file with the bytes of `original` (a link to it or a copy)."""
    if os.path.islink(copy) or not os.path.isfile(copy) or not os.path.isfile(original):
        return False
    return os.path.samefile(copy, original) or filecmp.cmp(copy, original, shallow=False)


def _link_entries(directory):
    """Give each entry of the current version the link ``NAME -> current/NAME`` in `directory`,
    in place of a plain file of the same bytes (an older layout's, or a copy's that followed
    the links); remove the links to names the version no longer has. Anything else is left."""
    version = _current(directory)
    names = {n for n in os.listdir(version) if n != CURRENT and not _VERSION.fullmatch(n)}
    for name in os.listdir(directory):
        if name not in names and _own_link(os.path.join(directory, name), name):
            os.remove(os.path.join(directory, name))
    for name in sorted(names):
        entry = os.path.join(directory, name)
        if _own_link(entry, name) or (os.path.lexists(entry) and
                                      not _same_bytes(entry, os.path.join(version, name))):
            continue
        link = _sibling(entry, "tmp")
        os.symlink(os.path.join(CURRENT, name), link)
        os.replace(link, entry)
    fsync_dir(directory)


def _adopt(path, owned):
    """Give the real, non-empty directory `path` a ``current`` (the module's docstring): a
    plain directory (or a copy that followed the links, whose ``current/`` is set aside) gets a
    version of hard links to the files ``owned(path)`` names (what this package wrote; None:
    every file). Returns the version ``current`` names (None: only leftovers there)."""
    current = os.path.join(path, CURRENT)
    if not _current(path):
        if _only_leftovers(path):
            return None
        version = os.path.join(path, f"v-{secrets.token_hex(8)}")
        os.mkdir(version)
        for name in owned(path) if owned else os.listdir(path):
            entry = os.path.join(path, name)
            if os.path.isfile(entry) and not os.path.islink(entry):
                _link_or_copy(entry, os.path.join(version, name))
        fsync_dir(version)
        if os.path.isdir(current) and not os.path.islink(current):
            os.replace(current, _sibling(current, "old"))  # a leftover, removed by `_clean`
        _point(path, version)
    _link_entries(path)
    return _current(path)


def _first_version(path, fill):
    """Nothing at `path`, or an empty directory: the whole directory is made beside it
    (``.NAME.tmp-...``) and renamed onto it; returns its version."""
    tmp = _sibling(path, "tmp")
    os.mkdir(tmp)
    try:
        version = _next_version(tmp, fill)
        os.replace(tmp, path)  # fails if a file appeared in the empty directory meanwhile
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))
    return os.path.join(path, os.path.basename(version))


def _next_version(path, fill):
    """A new version inside the directory `path`, switched in with `_point`; returns it."""
    version = os.path.join(path, f"v-{secrets.token_hex(8)}")
    os.mkdir(version)
    try:
        fill(version)
        fsync_dir(version)
        _point(path, version)
    except BaseException:
        if _current(path) != version:
            _remove(version)
        raise
    _link_entries(path)
    return version


def _clean(path, keep, outside):
    """Remove the versions of `path` but those in `keep`, the temporaries of interrupted saves
    inside it, and the link layout's siblings but `outside` (a version readers may still read)."""
    keep = {os.path.basename(v) for v in keep if v}
    for name in os.listdir(path):
        if _VERSION.fullmatch(name) and name not in keep or _TEMPORARY.fullmatch(name):
            _remove(os.path.join(path, name))
    for leftover in _leftovers(path):  # only our own siblings: a link's foreign target stays
        if os.path.realpath(leftover) != outside:
            _remove(leftover)


def write_dir(path, fill, replaceable=None, owned=None):
    """Write the directory `path` as one unit: ``fill(version)`` writes the files into a new
    empty version (with `write_file`), then ``path/current`` is switched to it in one
    ``os.replace`` (the module's docstring). Returns the absolute `path`. NotReplaceable, before
    anything is written, unless `check_replaceable(path, replaceable)`; only ``current``, the
    versions and their links are replaced. ``owned(directory)``: the files this package wrote in
    a plain directory of an older layout (`manifest.listed_files`; None: every file). An
    exception at any point leaves `path` resolving to the previous complete version (or to
    nothing), or, once switched, to the new one."""
    path = os.path.abspath(path)
    makedirs(os.path.dirname(path))
    _finish(path)
    for pending in _pendings(path):  # a stale one (its migration did not remove the link)
        if os.path.lexists(pending):
            _remove(pending)
    check_replaceable(path, replaceable)
    where = path  # a user's link to a directory: written in that directory, the link kept
    if os.path.islink(path) and not _own_version(path):
        where = os.path.realpath(path)
    outside = _from_link_layout(where) if _own_version(where) else None
    if not os.path.lexists(where) or not os.listdir(where):
        previous, version = None, _first_version(where, fill)
    else:
        previous = _adopt(where, owned)
        version = _next_version(where, fill)
    _clean(where, {version, previous}, outside)
    return path


def remove_dir(path):
    """Remove the directory `path` that `write_dir` wrote (the caller checks it), in any layout:
    renamed at once to ``.NAME.old-...`` (the link layout: its link removed), then deleted."""
    path = os.path.abspath(path)
    if _own_version(path):
        os.remove(path)
    elif os.path.isdir(path) and not os.path.islink(path):
        gone = _sibling(path, "old")
        os.replace(path, gone)
        fsync_dir(os.path.dirname(path))
        _remove(gone)
    for leftover in _leftovers(path):
        _remove(leftover)


def sha256(path):
    """The SHA-256 hex digest of a file, read in 1 MB chunks (the manifests' checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
