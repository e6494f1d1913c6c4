"""The fast path's one seam: `FastGraph(graph)` puts the fused CPU kernels (`kernels/`) in place.

A `FastGraph` calls its graph's own copy (`_mirror`), which it keeps: whoever keeps the
`FastGraph` (the fast training step) keeps the copy and its traced graph, and dropping it drops
them; nothing else holds them. In the copy, the chapter's `MultiHeadAttention`, `AddNorm` and
`DotProductAttention` blocks, and the loss, become new blocks of subclasses that run a
kernel where a graph traced inside ``kernels.fused(ctx)`` on a CPU computes the same function,
and the chapter's own code everywhere else (imperative calls, GPU contexts, kernels switched
off; in graphs, the attention's one exception below), sharing the caller's parameters. The
caller's blocks keep their class and state. The chapter's files do not know this module.

* attention with valid lengths (every attention of the chapter's training graph):
  ``transpose_qkv``, scores / sqrt(d), the masked softmax, the weights' dropout, the weighted
  sum and ``transpose_output`` as one operator (`kernels.attention`); in every graph where
  that kernel does not run (GPU, kernels off), the masked softmax is MXNet's
  ``softmax(length=...)`` (the same probabilities to 1e-7: exp(-1e6 - max) is 0 in float32)
  and sqrt(d) a Python float (`GraphDotProductAttention`, on purpose not behind `_kernels_on`);
* add & norm: ``LayerNorm(dropout(Y) + X)`` as one operator (`kernels.layer_norm`);
* the loss: a label-smoothed or per-token `MaskedSoftmaxCELoss` as one operator
  (`kernels.softmax_ce`); the chapter's own loss keeps MXNet's operators.
The `_FUSED` table matches a block's exact class: a variant's own blocks (the variants'
subclasses of these, `variants/`) keep their class and MXNet's operators, and the chapter's
blocks inside them are mirrored like any other (a pre-norm or fused-QKV attention without
DropHead or ALiBi computes its core in `GraphDotProductAttention`).
"""

import math
from collections import OrderedDict

import mxnet as mx

from .. import _gluon, _graphs, kernels
from ..attention import DotProductAttention, MultiHeadAttention
from ..layers import AddNorm
from . import bfloat16
from .loss import MaskedSoftmaxCELoss


def _kernels_on(F):
    """The one rule: a graph being traced with the kernels loaded and switched on."""
    return F is mx.sym and kernels.active()


class GraphDotProductAttention(DotProductAttention):
    """d2l 9.1's attention in a graph: sqrt(d) as a Python float and one
    ``softmax(length=...)``, the chapter's probabilities to 1e-7 (design.md, "Operator choices
    that give the same values"); imperatively, the chapter's code.

    It does not ask `_kernels_on`, on purpose: it calls no kernel, only MXNet's operators, so
    it is the fast path's attention in every graph a `FastGraph` traces — CPU or GPU, kernels
    on or off (with them on, `FusedMultiHeadAttention` replaces it where the kernel applies). The
    chapter's form traced in a graph reads sqrt(d) from the shape and masks with ``where`` and
    ``full_like``, whose broadcasting backward passes cost more than the softmax; the fast path
    promises the chapter's values to float rounding only (tests/test_fast.py), and the exact
    runs never use a `FastGraph`."""

    sqrt_d = None  # set by `_mirror` from the attention holding this block

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        if F is mx.nd:
            return super().hybrid_forward(F, query, key, value, valid_length)
        scores = F.npx.batch_dot(query, key, transpose_b=True) / self.sqrt_d  # (batch, q, k)
        if valid_length is None:
            self.attention_weights = F.npx.softmax(scores)
        else:  # (batch,) or (batch, q) -> (batch, q), broadcast along the queries
            lengths = F.npx.reshape(valid_length, (-2, -1)).astype("float32") + \
                F.np.zeros_like(scores[:, :, 0])
            self.attention_weights = F.npx.softmax(scores, length=lengths.astype("int32"),
                                                   use_length=True)
        return F.npx.batch_dot(self.dropout(self.attention_weights), value)  # (batch, q, d_v)


class FusedMultiHeadAttention(MultiHeadAttention):
    """Projections, then the attention core with valid lengths as one kernel, then W_o."""

    def hybrid_forward(self, F, query, key, value, valid_length=None):
        rate = _gluon.dropout_rate(self.attention.dropout)
        if not _kernels_on(F) or self.tile_valid_lengths or valid_length is None \
                or not 0 <= rate < 1:
            return super().hybrid_forward(F, query, key, value, valid_length)
        output = kernels.attention(F, self.W_q(query), self.W_k(key), self.W_v(value),
                                   valid_length, self.num_heads, self.attention.sqrt_d,
                                   rate)  # (batch, q, hidden), the heads read in place
        return self.W_o(output)


class FusedAddNorm(AddNorm):
    """``LayerNorm(dropout(Y) + X)`` as one kernel, the dropout drawn inside it."""

    def hybrid_forward(self, F, X, Y):
        if not _kernels_on(F):
            return super().hybrid_forward(F, X, Y)
        gamma, beta = (p.var().as_np_ndarray() for p in (self.norm.gamma, self.norm.beta))
        return kernels.layer_norm(F, Y, X, gamma, beta, _gluon.layer_norm_eps(self.norm),
                                  _gluon.dropout_rate(self.dropout))


class FusedMaskedSoftmaxCELoss(MaskedSoftmaxCELoss):
    """The label-smoothed or per-token loss (and its gradient) as one kernel."""

    def hybrid_forward(self, F, pred, label, valid_length):
        if not (_kernels_on(F) and (self.label_smoothing > 0 or self.reduction == "token")):
            return super().hybrid_forward(F, pred, label, valid_length)
        return kernels.softmax_ce(F, pred, label, valid_length, self.label_smoothing,
                                  self.reduction == "token")  # (batch,)


_FUSED = {MultiHeadAttention: FusedMultiHeadAttention, AddNorm: FusedAddNorm,
          DotProductAttention: GraphDotProductAttention,
          MaskedSoftmaxCELoss: FusedMaskedSoftmaxCELoss}


_BFLOAT16 = {**_FUSED, **bfloat16.CLASSES}  # the products in bfloat16 too


def _mirror(block, memo, classes=_FUSED):
    """The fast graph's own copy of `block`: `block` itself where nothing under it is fused;
    else a new block of its fused class (or its own) with `block`'s state and parameters (the
    same Parameter objects) and its children mirrored (`_gluon.copy_block`). The caller's
    blocks are not changed."""
    if id(block) in memo:
        return memo[id(block)]
    own = _gluon.children(block)
    children = OrderedDict((n, _mirror(c, memo, classes)) for n, c in own.items())
    cls = classes.get(type(block), type(block))
    if cls is type(block) and all(c is own[n] for n, c in children.items()):
        memo[id(block)] = block
        return block
    copy = _gluon.copy_block(block, cls, children)  # its own graph, traced with the kernels
    if isinstance(copy, MultiHeadAttention) and isinstance(copy.attention,
                                                          GraphDotProductAttention):
        hidden = copy.W_o.weight.shape[0]  # W_o's units: (units, in_units) before init too
        copy.attention.sqrt_d = math.sqrt(hidden // copy.num_heads)  # d of the heads
    memo[id(block)] = copy
    return copy


class FastGraph:
    """``FastGraph(graph)(*args)`` is ``graph(*args)`` on the graph's own blocks (`_mirror`):
    the chapter's blocks in it fused, sharing `graph`'s parameters; the copy is made at the
    first call and again when the kernels were switched since its trace
    (``D2L_TRANSFORMER_KERNELS``, a CPU or GPU context) or a block changed
    (`_graphs.invalidate`). A graph not hybridized runs the chapter's code. ``traced`` is the
    graph called: the copy with the kernels (`graph` itself when nothing in it is fused), None
    before the first call. The copy is this object's alone (no cache keyed by `graph` holds
    it): dropping the `FastGraph` and `graph` frees both, their traced graphs and buffers.
    ``precision="bfloat16"``: the Dense layers and the FFN in it too become `bfloat16.CLASSES`'
    blocks (their products in bfloat16, `training.precision`), decided once per run."""

    def __init__(self, graph, precision="float32"):
        self.graph, self.precision = graph, precision
        self.classes = _BFLOAT16 if precision == "bfloat16" else _FUSED
        self.traced = None
        self._mode = None  # the kernels' mode `traced` was made with

    def __call__(self, *args):
        mode = kernels.active()
        if self.traced is None or self._mode != mode or not _gluon.has_graph(self.traced):
            self.traced = _mirror(self.graph, {}, self.classes)
            if self.traced is not self.graph:
                _graphs.track_copy(self.traced, self.graph)  # weakly: nothing kept alive
            self._mode = mode
        return self.traced(*args)
