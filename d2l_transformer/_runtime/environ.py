"""The environment variables set before MXNet loads, under one policy, and the user's own back.

MXNet's libraries read their settings from the environment: OpenMP its threads and OpenBLAS its
kernels when MXNet loads, oneDNN its instruction set at its first kernel. So `threads` and
`cpu_math` set them there, before MXNet's import, with one policy for all of them: a value the
user set is kept (the modules say so in one line, `notice`, when it may change the numbers),
and a value this package sets is marked (`claim`, in ``D2L_TRANSFORMER_SET``), so that a child
process that imports the package knows it for the package's, not the user's, and decides again.

A child process that is not the package's (PyTorch, CTranslate2) gets the environment the user
had from `user_environ`; a library loaded later in this process, after `restore_user_environ`.
Standard library only.
"""

import json
import os
import sys

MARK = "D2L_TRANSFORMER_SET"  # JSON {name: the value this package set}, inherited by children


def _marked():
    """{name: value} of the variables this package (this process or a parent) set."""
    try:
        marked = json.loads(os.environ.get(MARK) or "{}")
    except ValueError:
        return {}
    return marked if isinstance(marked, dict) else {}


def _write(marked):
    if marked:
        os.environ[MARK] = json.dumps(marked, sort_keys=True)
    else:
        os.environ.pop(MARK, None)


def is_ours(name):
    """Whether `name` holds the value this package (this process or a parent) set."""
    value = _marked().get(name)
    return value is not None and os.environ.get(name) == value


def users(name):
    """The user's value of `name`: None when it is unset or holds the package's value."""
    return None if is_ours(name) else os.environ.get(name)


def claim(name, value):
    """Set `name` to `value`, marked as the package's."""
    marked = _marked()
    marked[name] = os.environ[name] = value
    _write(marked)


def release(name):
    """Unset `name` where it holds the package's value (a value the user set stays)."""
    marked = _marked()
    if is_ours(name):
        del os.environ[name]
    if marked.pop(name, None) is not None:
        _write(marked)


def user_environ():
    """This process's environment as the user had it (a copy): without the variables the
    package set, nor their mark. For a child process that is not the package's."""
    marked = _marked()
    return {k: v for k, v in os.environ.items() if k != MARK and marked.get(k) != v}


def restore_user_environ():
    """Give this process's environment back to the user (`user_environ`), for a library it
    loads later (the settings MXNet has read already stay as they are)."""
    for name in _marked():
        release(name)
    os.environ.pop(MARK, None)


def kernels_enabled():
    """``D2L_TRANSFORMER_KERNELS=0`` turns the package's fused kernels off (`kernels`)."""
    return os.environ.get("D2L_TRANSFORMER_KERNELS", "1") != "0"


def notice(text):
    """One line on stderr: ``d2l_transformer: TEXT``."""
    print(f"d2l_transformer: {text}", file=sys.stderr, flush=True)
