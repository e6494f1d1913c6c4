"""Devices: the chapter's `try_gpu`, and the ``--ctx`` option of every entry point."""

import mxnet as mx
from mxnet import npx


def try_gpu(i=0):
    """GPU i when MXNet sees one, else the CPU (d2l)."""
    return npx.gpu(i) if npx.num_gpus() >= i + 1 else npx.cpu()


def parse_ctx(spec="auto"):
    """``auto`` (default: `try_gpu`), ``cpu``, ``cpu:N``, ``gpu``, ``gpu:N`` -> an MXNet context.

    Raises ValueError with one line for anything else, or for a GPU MXNet cannot see.
    """
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return try_gpu()
    kind, _, index = spec.partition(":")
    if kind not in ("cpu", "gpu") or (index and not index.isdigit()):
        raise ValueError(f"unknown context {spec!r}: use auto, cpu, cpu:N, gpu or gpu:N")
    i = int(index or 0)
    if kind == "gpu" and i >= npx.num_gpus():
        raise ValueError(f"context {spec} asked for, but MXNet sees {npx.num_gpus()} GPU(s)")
    return mx.gpu(i) if kind == "gpu" else mx.cpu(i)


def parse_ctx_list(spec="auto"):
    """``--ctx`` with one or more devices: ``gpu:0,gpu:1`` or ``cpu:0,cpu:1`` -> a list of contexts
    (data parallelism; each part as in `parse_ctx`, ``auto`` alone means `try_gpu`).

    Raises ValueError with one line for a bad or repeated device.
    """
    parts = [part.strip() for part in (spec or "auto").split(",")]
    if "" in parts:
        raise ValueError(f"bad device list {spec!r}: use e.g. gpu:0,gpu:1 or cpu:0,cpu:1")
    ctxs = [parse_ctx(part) for part in parts]
    if len(set(ctxs)) != len(ctxs):
        raise ValueError(f"device list {spec!r} names a device twice")
    return ctxs
