"""The fast path's one seam: `run(graph, ...)` puts the fused CPU kernels (`kernels/`) in place.

While a graph traces, `run` gives the chapter's `MultiHeadAttention`, `AddNorm` and
`DotProductAttention` blocks in it, and the loss, subclasses that run a kernel where a graph
traced inside ``kernels.fused(ctx)`` on a CPU computes the same function, and the chapter's own
code everywhere else (imperative calls, GPU contexts, kernels switched off); once traced, each
block is again of its own class (the graph keeps the kernels). The chapter's files do not know
this module.

* attention with valid lengths (every attention of the chapter's training graph):
  ``transpose_qkv``, scores / sqrt(d), the masked softmax, the weights' dropout, the weighted
  sum and ``transpose_output`` as one operator (`kernels.attention`); without the kernels, a
  graph's masked softmax is MXNet's ``softmax(length=...)`` (the same probabilities to 1e-7:
  exp(-1e6 - max) is 0 in float32) and sqrt(d) a Python float;
* add & norm: ``LayerNorm(dropout(Y) + X)`` as one operator (`kernels.layer_norm`);
* the loss: a label-smoothed or per-token `MaskedSoftmaxCELoss` as one operator
  (`kernels.softmax_ce`); the chapter's own loss keeps MXNet's operators.
Variants' blocks (other subclasses) are left as they are: MXNet's operators.
"""

import contextlib
import math

import mxnet as mx

from .. import _graphs, kernels
from ..attention import DotProductAttention, MultiHeadAttention
from ..layers import AddNorm
from .loss import MaskedSoftmaxCELoss


def _kernels_on(F):
    """The one rule: a graph being traced with the kernels loaded and switched on."""
    return F is mx.sym and kernels.active()


class GraphDotProductAttention(DotProductAttention):
    """In a graph: sqrt(d) as a Python float and one ``softmax(length=...)``."""

    sqrt_d = None  # set by `fuse` from the attention holding this block

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
        rate = self.attention.dropout._rate
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
        return kernels.layer_norm(F, Y, X, gamma, beta, self.norm._epsilon, self.dropout._rate)


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


@contextlib.contextmanager
def _kernels_in_place(graph):
    """While `graph` traces: every chapter block in it (exactly of the chapter's class) as its
    fused subclass, with the scalar sqrt(d) its attention needs. After, every block is again
    of the class its owner built: the traced graph keeps the kernels, the user's objects do not
    change type."""
    swapped, scaled = [], {}
    for block in _graphs.walk(graph):
        if isinstance(block, MultiHeadAttention):  # d of the heads, for the scalar sqrt(d)
            block.attention.sqrt_d = math.sqrt(block.W_o._units // block.num_heads)
            scaled[id(block.attention)] = block.attention
        if type(block) in _FUSED:
            swapped.append((block, type(block)))
            block.__class__ = _FUSED[type(block)]
    try:
        yield graph
    finally:
        for block, cls in swapped:
            block.__class__ = cls
        for block in scaled.values():
            del block.sqrt_d


def run(graph, *args):
    """``graph(*args)``, the chapter's blocks in it fused while it traces (`_kernels_in_place`);
    traced again first if the kernels were switched since its trace (``D2L_TRANSFORMER_KERNELS``,
    a CPU or GPU context). A graph not hybridized runs the chapter's code."""
    mode = kernels.active()
    if getattr(graph, "_traced_with_kernels", mode) != mode:
        graph._clear_cached_op()
    graph._traced_with_kernels = mode
    if graph._cached_op is not None:  # traced already: the kernels are in the graph
        return graph(*args)
    with _kernels_in_place(graph):
        return graph(*args)
