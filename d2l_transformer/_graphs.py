"""Cached graphs stay fresh when a block they contain changes what it computes.

A hybridized block traces its computation once (`_gluon.has_graph`). A block that changes
its own computation (the variants' `set_drophead` and `prune`) can clear its own graph, but not
the graph of a block that contains it — the fast training step's `TrainGraph`, the translator's
encoder and step graphs. Here:

* `track(graph)` registers `graph`, and every hybrid block inside it, as containing each of
  its descendants (weakly: nothing is kept alive);
* `invalidate(block)` clears the cached graph of `block` and of every tracked block that
  contains it: the next call traces again, with the change;
"""

import weakref

from mxnet.gluon import HybridBlock

from . import _gluon

_CONTAINERS = weakref.WeakKeyDictionary()  # block -> WeakSet of tracked blocks containing it


def walk(block):
    """`block` and all its descendants (Gluon's ``Block.apply``: each child before its parent)."""
    found = []
    block.apply(found.append)
    return found


def track(graph):
    """Register `graph` and each hybrid block inside it as containing their descendants."""
    for outer in walk(graph):
        if isinstance(outer, HybridBlock):  # it may hold a graph
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
    _gluon.clear_graph(block)
    for outer in list(_CONTAINERS.get(block, ())):
        _gluon.clear_graph(outer)

