"""The graph path's blocks whose matrix products compute in bfloat16 (`fused.run` with
``precision="bfloat16"``, `precision`): mixed precision (Micikevicius et al. 2018), bfloat16's
(Kalamkar et al. 2019).

Each product takes its input and weight rounded to bfloat16 (MXNet's ``amp_cast``) and runs
oneDNN's bfloat16 FullyConnected, which accumulates in float32 but hands back bfloat16: its
output is rounded to bfloat16 (8 bits of mantissa) and only then cast to float32, which
restores no bits. So the output layer's logits reach the loss as float32 numbers with
bfloat16's 8-bit mantissas (tests/test_precision.py checks it). The master weights stay
float32 (their gradients come back through the casts as float32), and so does everything
around the products: the fused kernels, the softmax, the layer norms, the loss. Where two
products follow each other (9.3.2's FFN, the ReLU between them) the hidden layer stays
bfloat16: one cast in and one out instead of two each.
"""

import mxnet as mx
import numpy as onp
from mxnet.gluon import nn

from .. import _gluon
from ..layers import PositionWiseFFN

BFLOAT16 = onp.dtype([("bfloat16", onp.uint16)])  # MXNet 1.9's name for it (contrib.amp)


def to_bfloat16(F, x):
    """`x` (a graph's symbol) rounded to bfloat16, a legacy symbol for FullyConnected."""
    return F.amp_cast(x.as_nd_ndarray(), dtype=BFLOAT16)


def to_float32(F, x):
    """`x` (bfloat16) as float32, a numpy symbol as the graph's blocks take them."""
    return F.amp_cast(x.as_nd_ndarray(), dtype="float32").as_np_ndarray()


def product(F, dense, x, weight, bias=None):
    """`dense`'s product of bfloat16 `x` with `weight` (+ `bias`), then its activation, in
    bfloat16 (``flatten`` as `dense` has it): a numpy symbol of bfloat16."""
    args = [x.as_nd_ndarray(), to_bfloat16(F, weight)]
    args += [] if bias is None else [to_bfloat16(F, bias)]
    out = F.FullyConnected(*args, no_bias=bias is None, num_hidden=dense.weight.shape[0],
                           flatten=_gluon.dense_flatten(dense)).as_np_ndarray()
    return out if dense.act is None else dense.act(out)


class Bfloat16Dense(nn.Dense):
    """A Dense layer whose product runs in bfloat16 (`product`) between a cast of its input
    and one of its output back to float32; imperatively, the float32 layer."""

    def hybrid_forward(self, F, x, weight, bias=None):
        if F is not mx.sym:
            return super().hybrid_forward(F, x, weight, bias)
        return to_float32(F, product(F, self, to_bfloat16(F, x), weight, bias))


class Bfloat16PositionWiseFFN(PositionWiseFFN):
    """9.3.2's FFN with both products and the ReLU between them in bfloat16: one cast in, one
    out; imperatively, the chapter's."""

    def hybrid_forward(self, F, X):
        if F is not mx.sym:
            return super().hybrid_forward(F, X)
        hidden = product(F, self.ffn_1, to_bfloat16(F, X), *_variables(self.ffn_1))
        return to_float32(F, product(F, self.ffn_2, hidden, *_variables(self.ffn_2)))


def _variables(dense):
    """`dense`'s weight and bias (or None) as the traced graph's variables."""
    return dense.weight.var(), None if dense.bias is None else dense.bias.var()


CLASSES = {nn.Dense: Bfloat16Dense, PositionWiseFFN: Bfloat16PositionWiseFFN}
