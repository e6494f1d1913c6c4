"""Cached graphs stay fresh when a block they contain changes what it computes.

A hybridized block traces its computation once (`HybridBlock._cached_op`). A block that changes
its own computation (`MultiHeadAttention.set_drophead`, `_BlockStack.prune`) can clear its own
graph, but not the graph of a block that contains it — the fast training step's `TrainGraph`,
the translator's encoder and step graphs. Here:

* `track(graph)` registers `graph`, and every hybrid block inside it, as containing each of
  its descendants (weakly: nothing is kept alive);
* `invalidate(block)` clears the cached graph of `block` and of every tracked block that
  contains it: the next call traces again, with the change;
* `call(graph, *args)` runs `graph`, first clearing it if it was traced with the fused CPU
  kernels switched the other way (`kernels.active()`, e.g. ``D2L_TRANSFORMER_KERNELS=0``);
* `bound(graph)` is a call of the graph as traced, with its weights looked up once, for a loop
  that runs one graph many times with the same weights (a translation's decoding steps).
"""

import weakref

from . import kernels

_CONTAINERS = weakref.WeakKeyDictionary()  # block -> WeakSet of tracked blocks containing it


def _walk(block):
    """`block` and all its descendants."""
    yield block
    for child in block._children.values():
        yield from _walk(child)


def track(graph):
    """Register `graph` and each hybrid block inside it as containing their descendants."""
    for outer in _walk(graph):
        if hasattr(outer, "_clear_cached_op"):  # a HybridBlock: it may hold a graph
            for inner in _walk(outer):
                _CONTAINERS.setdefault(inner, weakref.WeakSet()).add(outer)
    return graph


def invalidate(block):
    """`block` computes something else now: drop its graph and every tracked one containing it."""
    block._clear_cached_op()
    for outer in list(_CONTAINERS.get(block, ())):
        outer._clear_cached_op()


def traced_with(graph):
    """Whether `graph` was (last) called with the fused kernels on; None if never by `call`."""
    return getattr(graph, "_traced_with_kernels", None)


def call(graph, *args):
    """``graph(*args)``, traced again first if the kernel switch differs from its trace's."""
    mode = kernels.active()
    if getattr(graph, "_traced_with_kernels", mode) != mode:
        graph._clear_cached_op()
    graph._traced_with_kernels = mode
    return graph(*args)


def bound(graph):
    """``run(*arrays)``: `graph`'s traced operator (``_cached_op``, after a `call`) on these
    positional arrays and the weights it holds now, returning its outputs as a list.

    Gluon's call (``HybridBlock._call_cached_op``, MXNet 1.9) flattens and checks the inputs and
    looks up every weight (``Parameter.data()``) at each call: ~0.4 ms per step of the `full`
    model at batch 64 (a step is ~5 ms), during which the device has nothing to do. Valid while
    the graph and its weights stay as they are (one translation call: the translator runs one
    call at a time per model, and `invalidate` never runs inside one); positional arrays only.
    """
    op = graph._cached_op
    if op is None:
        raise RuntimeError("bound(): call the graph once first (it traces on its first call)")
    slots = [(is_arg, x if is_arg else x.data()) for is_arg, x in graph._cached_op_args]

    def run(*args):
        out = op(*[args[x] if is_arg else x for is_arg, x in slots])
        return out if isinstance(out, list) else [out]
    return run
