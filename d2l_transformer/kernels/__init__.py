"""Fused CPU kernels for the fast path's graphs, built against the installed MXNet.

MXNet 1.9's CPU ``LayerNorm`` backward reduces through its generic broadcast reducer, a large
part of a fast training step at the chapter's sizes (docs/benchmarks.md). MXNet's wheel ships
its custom-operator library API (``include/mxnet/lib_api.h``, ``src/lib_api.cc``), so
`layer_norm.cc` here adds ``d2t_add_layer_norm``, the chapter's post-norm AddNorm (LayerNorm of
a sum) in one operator with one pass over the rows, forward and backward; `attention.cc` adds
``d2t_attention``: the multi-head attention core with valid lengths (split heads, scores /
sqrt(d), d2l's masked softmax, weighted sum, merge heads — 12 MXNet operators and their
backward passes) reading the heads in place; `softmax_ce.cc` adds ``d2t_softmax_ce``: the
masked (label-smoothed) softmax cross-entropy, whose MXNet form (log_softmax, pick, mean over
the vocabulary) weighed most in a `full`-preset step; `adam.cc` adds ``d2t_adam``, Adam's
update of every parameter in one operator, multi_adamw_update's arithmetic bit for bit, a
contiguous pass per tensor (`adam`). Dropout inside the kernels (d2l 9.1's on the
attention weights, 9.3.3's AddNorm on the sublayer's output): MXNet's Dropout distribution,
drawn from MXNet's seeded random states when MXNet is training (`training_flag`), the mask
kept for the backward pass.
Same functions, same parameters; values equal MXNet's to float32 rounding
(tests/test_kernels.py).

How it is used: `load()` compiles the library once per MXNet install into a cache directory
(``$D2L_TRANSFORMER_CACHE`` or ``~/.cache/d2l_transformer``; if that is not writable, this
user's private directory under the temporary one, `private_dir`: created mode 0700, and used
only while it is a real directory owned by this user that no one else can write, since the
library found there is loaded into the process; ~10 s with ``c++``/``$CXX``) and loads it.
Graphs traced inside ``with fused(ctx):`` — the fast training step does this — use the
kernels when `ctx` is a CPU; everything else (imperative calls, the faithful path,
``--exact-chapter``, GPU contexts, graphs a user hybridizes, the translator) runs MXNet's own
operators. No compiler, a failed build or ``D2L_TRANSFORMER_KERNELS=0``: MXNet's operators
(after a one-line warning when the build fails), the same numbers, only slower.
"""

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import warnings

import mxnet as mx

from .._runtime import environ as _environ
from .._runtime import threads as _threads
from ..io import atomic
from ..io.cache import cache_dir

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, name)
           for name in ("layer_norm.cc", "attention.cc", "softmax_ce.cc", "threads.cc",
                        "adam.cc")]
HEADERS = [os.path.join(HERE, "common.h")]
# -fno-trapping-math: no FP exception is ever read, so float selects and compares may be
# vectorized (the softmax loops); it changes no value. -fopenmp (MXNet's own libgomp) when the
# compiler has it: the kernels share their rows/heads between threads; without it, one thread.
FLAGS = ["-O3", "-std=c++14", "-fno-trapping-math", "-shared", "-fPIC"]
OPENMP = ["-fopenmp"]
_state = {"loaded": None,  # None = not tried, True/False = the outcome
          "active": 0}  # the `fused` blocks now open


def _mxnet_dir():
    return os.path.dirname(os.path.abspath(mx.__file__))


def private_dir(path):
    """`path`, a directory only this user can write: created with mode 0700 if missing; an
    existing one must be a directory (not a symbolic link) owned by this user and writable by
    no other (`os.lstat`). Else RuntimeError (one line): another local user could have put a
    library there for `load` to run."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"{path} is not a directory of this user (a link or a file); "
                           "not used for the kernel cache")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise RuntimeError(f"{path} belongs to user id {st.st_uid}, not to this user; "
                           "not used for the kernel cache")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeError(f"{path} is writable by other users (mode "
                           f"{stat.S_IMODE(st.st_mode):o}); not used for the kernel cache")
    return path


def library_path():
    """Where the compiled library for this source and this MXNet install lives."""
    key = hashlib.sha1(mx.__version__.encode() + _mxnet_dir().encode() + " ".join(FLAGS).encode())
    for source in SOURCES + HEADERS:
        with open(source, "rb") as f:
            key.update(f.read())
    cache = cache_dir()
    try:
        os.makedirs(cache, exist_ok=True)
        writable = os.access(cache, os.W_OK)
    except OSError:
        writable = False
    if not writable:  # a read-only home: this user's private directory under the temporary one
        user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
        cache = private_dir(os.path.join(tempfile.gettempdir(), f"d2l_transformer-{user}"))
    return os.path.join(cache, f"libd2t_kernels-{key.hexdigest()[:12]}.so")


def build(force=False):
    """Compile `SOURCES` with MXNet's ``lib_api.cc`` into one library; returns its path.

    Written atomically (`io.atomic.write_file`: temporary name, fsync, rename), so that processes
    building at once (several workers) never load a half-written library.
    Raises RuntimeError with the compiler's message.
    """
    path = library_path()
    if os.path.exists(path) and not force:
        return path
    mxdir = _mxnet_dir()
    lib_api = os.path.join(mxdir, "src", "lib_api.cc")
    if not os.path.exists(lib_api):
        raise RuntimeError(f"this MXNet install has no {lib_api}")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise RuntimeError("no C++ compiler (c++, g++ or $CXX)")
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def compile_to(tmp):
        for extra in (OPENMP, []):  # with OpenMP, else without
            cmd = [cxx, *FLAGS, *extra, *SOURCES, lib_api,
                   "-I" + os.path.join(mxdir, "include"), "-o", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if not proc.returncode:
                return
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        raise RuntimeError(f"{cxx} failed: {(errors or proc.stderr.splitlines() or [''])[0]}")
    atomic.write_file(path, compile_to)
    return path


def _enabled():
    """``D2L_TRANSFORMER_KERNELS=0`` turns the kernels off (read at every `fused`)."""
    return _environ.kernels_enabled()


def load():
    """Build (once) and load the kernels into MXNet; True when they are usable.

    Never raises: on any failure it warns once, in one line, and returns False (MXNet's own
    operators are used then)."""
    if _state["loaded"] is None:
        if not _enabled():
            return False  # not recorded: the variable is read again next time
        try:
            mx.library.load(build(), verbose=False)
            _state["loaded"] = all(hasattr(mx.sym, op) for op in (
                "d2t_add_layer_norm", "d2t_attention", "d2t_softmax_ce",
                "d2t_omp_threads", "d2t_adam"))
        except Exception as e:  # noqa: BLE001 - any failure means: use MXNet's operators
            warnings.warn(f"d2l_transformer: fused kernels unavailable ({e}); "
                          "using MXNet's operators (same numbers, slower)", stacklevel=2)
            _state["loaded"] = False
    return _state["loaded"]


@contextlib.contextmanager
def fused(ctx):
    """Graphs traced inside this block use the kernels, if `ctx` (a device or a list of
    devices) is CPU only and the kernels load. Nestable; the graphs stay as traced."""
    ctxs = ctx if isinstance(ctx, (list, tuple)) else [ctx]
    on = all(c.device_type == "cpu" for c in ctxs) and _enabled() and load()
    _state["active"] += on
    try:
        yield
    finally:
        _state["active"] -= on


def _switch_threads(n):
    """`_runtime.threads`' switch: the engine's CPU worker's OpenMP threads set to n by the
    ``d2t_omp_threads`` operator, which the engine runs on that worker in order with the
    others (`threads.cc`); False when the library does not load."""
    if not load():
        return False
    mx.nd.d2t_omp_threads(mx.nd.zeros((1,), ctx=mx.cpu()), threads=n)
    return True


_threads.set_switch(_switch_threads)  # the threads' one door is `_runtime.threads.size_for`


def active():
    """True while a graph may use the kernels (inside `fused` on a CPU, library loaded)."""
    return _state["active"] > 0


def layer_norm(F, data, residual, gamma, beta, eps, dropout=0.0):
    """``LayerNorm(data + residual)`` over the last axis (the chapter's AddNorm), in a graph.

    F: the graph's operator module (``mx.sym``); numpy symbols in and out. ``dropout`` p > 0:
    ``LayerNorm(Dropout(data) + residual)``, AddNorm's dropout drawn inside the operator when
    MXNet is training (`training_flag`), MXNet's Dropout distribution."""
    nd = [x.as_nd_ndarray() for x in (data, residual, gamma, beta)]
    if dropout > 0:
        out = F.d2t_add_layer_norm(*nd, training_flag(F).as_nd_ndarray(), eps=eps,
                                   dropout=repr(float(dropout)))
        return out[0].as_np_ndarray()  # out[1]: the keep mask the backward pass reads
    return F.d2t_add_layer_norm(*nd, eps=eps).as_np_ndarray()


def attention(F, query, key, value, valid_length, num_heads, scale, dropout=0.0):
    """The chapter's multi-head attention core, from projected queries/keys/values to the
    concatenated heads, in one operator (`attention.cc`), in a graph.

    query: (batch, Tq, hidden); key, value: (batch, Tk, hidden); valid_length: (batch,) or
    (batch, Tq) per example (not repeated per head; the decoder's causal lengths are (batch,
    Tq)). Returns (batch, Tq, hidden): what ``transpose_output(attention(transpose_qkv(...)))``
    returns, with the scores divided by `scale` (sqrt(d)) and d2l's masked softmax.
    ``dropout`` p > 0: the weights' dropout (d2l 9.1), drawn inside the operator when MXNet is
    training; the graph tells the operator whether it is by a one-element MXNet Dropout
    (identity at inference, 0 or 2 in training), so a graph traced once serves both modes."""
    nd = [query.as_nd_ndarray(), key.as_nd_ndarray(), value.as_nd_ndarray(),
          valid_length.astype("float32").as_nd_ndarray()]  # (batch,) or (batch, Tq)
    attrs = {"num_heads": num_heads, "scale": repr(float(scale))}
    if dropout > 0:
        attrs["dropout"] = repr(float(dropout))
        nd.append(training_flag(F).as_nd_ndarray())  # (1,)
    out = F.d2t_attention(*nd, **attrs)
    return (out[0] if dropout > 0 else out).as_np_ndarray()  # (batch, Tq, hidden)


def training_flag(F):
    """(1,) in a graph: 1 while MXNet is training (``autograd.record()``, ``train_mode()``), 0
    otherwise, read at run time: |Dropout(1, p=0.5) - 1|, whose draw is 0 or 2 in training
    and which is the identity at inference."""
    one = F.np.ones((1,))
    return F.np.abs(F.npx.dropout(one, p=0.5) - 1)


def softmax_ce(F, pred, label, valid_length, smoothing=0.0, per_token=False):
    """`training.loss.MaskedSoftmaxCELoss` in one operator (`softmax_ce.cc`), in a graph.

    pred: (batch, T, vocab) logits; label: (batch, T); valid_length: (batch,). Returns the
    (batch,) loss: each sentence's cross-entropy summed over its valid positions, divided by T
    unless ``per_token``; its gradient is that of the label-smoothed objective (`smoothing`)."""
    nd = [pred.as_nd_ndarray(), label.astype("float32").as_nd_ndarray(),
          valid_length.astype("float32").as_nd_ndarray()]
    out = F.d2t_softmax_ce(*nd, smoothing=repr(float(smoothing)), per_token=int(bool(per_token)))
    return out[0].as_np_ndarray()  # (batch,); out[1]: the log-sum-exps the backward pass reads


def adam(ctx, weights, grads, means, variances, rescale, lrs, wds, beta1, beta2, epsilon):
    """Adam's update of every parameter in one operator (`adam.cc`): ``multi_adamw_update``'s
    arithmetic bit for bit (eta 1, no clipping), its skip of a rescale (a (1,) array) that is
    not finite or 0 too, with each tensor in one contiguous pass; legacy arrays, updated in
    place (weights, means, variances). False, updating nothing, where `ctx` is not a CPU or
    the kernels are off or do not load: the caller runs ``multi_adamw_update``."""
    if ctx.device_type != "cpu" or not _enabled() or not load():
        return False
    mx.nd.d2t_adam(*weights, *grads, *means, *variances, rescale, num=len(weights),
                   lrs=",".join(repr(float(x)) for x in lrs),
                   wds=",".join(repr(float(x)) for x in wds), beta1=repr(float(beta1)),
                   beta2=repr(float(beta2)), epsilon=repr(float(epsilon)))
    return True
