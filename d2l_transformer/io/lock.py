"""One writer per model directory: an OS advisory lock held while a run trains it (or an
export writes it; the measurement cache, `measured`, is written under one too, waiting its turn).

The lock is ``fcntl.flock`` on ``.NAME.lock`` beside the model directory ``NAME`` (in its
parent: it exists only while the run trains, and it is no part of the model, so that a copy of
the directory never takes one along; it can be taken before the directory exists). The
operating system releases it when the process ends, however it ends, so a killed run never
leaves a stale lock; the file holds the pid of its holder, for the refusal's message, and is
removed by the holder when it is done. A file of that name the package did not write is never
overwritten: it is refused.

POSIX only (``fcntl``): on Windows `locked` takes no lock, and two runs into one directory are
the user's to avoid.
"""

import contextlib
import os
import re
import time

from . import atomic

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

_TEXT = "d2l_transformer, pid {pid}\n"
_LINE = re.compile(r"d2l_transformer(?: training)?, pid (\d+)\n\Z")  # an older holder's too
_POLL = 0.01  # seconds between tries while waiting


class Locked(Exception):
    """Another process holds the lock (or the lock file is not the package's); one line."""


def lock_path(directory):
    """``PARENT/.NAME.lock`` for the directory ``PARENT/NAME``."""
    parent, base = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{base}.lock")


def _holder(fd):
    """The pid written in the open lock file, or None (not written yet, or not ours)."""
    match = _LINE.match(os.pread(fd, 200, 0).decode("utf-8", "replace"))
    return int(match.group(1)) if match else None


def _take(fd, wait):
    """Take the lock on `fd`, trying for up to `wait` seconds; whether it was taken."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)


@contextlib.contextmanager
def locked(directory, what="written", wait=0.0):
    """Hold the lock of `directory` for the ``with`` block, else raise `Locked`, at once or
    after waiting up to `wait` seconds for its holder: "DIRECTORY is being WHAT by another
    process (pid N)". Creates the parent directory if it is missing (`atomic.makedirs`: a model
    directory whose migration was interrupted is put back first)."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = lock_path(directory)
    atomic.makedirs(os.path.dirname(path))
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size and _holder(fd) is None:
                raise Locked(f"{path} exists and was not written by d2l_transformer: remove it, "
                             "or give another directory")
            if not _take(fd, wait):
                pid = _holder(fd)
                raise Locked(f"{directory} is being {what} by another process"
                             + (f" (pid {pid})" if pid else "")) from None
            try:  # the holder before us may have removed the file we opened: then again
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, _TEXT.format(pid=os.getpid()).encode("utf-8"), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # still ours: we hold its lock
        os.close(fd)
