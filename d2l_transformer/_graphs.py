"""Cached graphs stay fresh when a block they contain changes what it computes.

A hybridized block traces its computation once (`HybridBlock._cached_op`). A block that changes
its own computation (the variants' `set_drophead` and `prune`) can clear its own graph, but not
the graph of a block that contains it — the fast training step's `TrainGraph`, the translator's
encoder and step graphs. Here:

* `track(graph)` registers `graph`, and every hybrid block inside it, as containing each of
  its descendants (weakly: nothing is kept alive);
* `invalidate(block)` clears the cached graph of `block` and of every tracked block that
  contains it: the next call traces again, with the change;
"""

import weakref

_CONTAINERS = weakref.WeakKeyDictionary()  # block -> WeakSet of tracked blocks containing it


def walk(block):
    """`block` and all its descendants."""
    yield block
    for child in block._children.values():
        yield from walk(child)


def track(graph):
    """Register `graph` and each hybrid block inside it as containing their descendants."""
    for outer in walk(graph):
        if hasattr(outer, "_clear_cached_op"):  # a HybridBlock: it may hold a graph
            for inner in walk(outer):
                _CONTAINERS.setdefault(inner, weakref.WeakSet()).add(outer)
    return graph


def track_copy(copy, original):
    """Register `copy`, a graph built from `original`'s blocks, as containing every one of them:
    a change to one of the caller's blocks clears the copy's graph too."""
    for inner in walk(original):
        _CONTAINERS.setdefault(inner, weakref.WeakSet()).add(copy)


def invalidate(block):
    """`block` computes something else now: drop its graph and every tracked one containing it."""
    block._clear_cached_op()
    for outer in list(_CONTAINERS.get(block, ())):
        outer._clear_cached_op()

