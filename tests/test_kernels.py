"""Issue 4: the fused kernels (LayerNorm, add + LayerNorm, multi-head attention) compute what
MXNet's operators / the chapter's ops compute, forward and backward, and are used exactly where
they should be (graphs traced under `kernels.fused` on a CPU)."""

import os
import subprocess
import sys

import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, np
from mxnet.gluon import nn

from d2l_transformer import kernels
from d2l_transformer.attention import MultiHeadAttention
from d2l_transformer.layers import AddNorm, LayerNorm


@pytest.fixture(scope="module", autouse=True)
def loaded():
    assert kernels.load(), "the kernels must build and load on a machine with a C++ compiler"


class Norm(nn.HybridBlock):
    """LayerNorm(X + Y) with our block, or MXNet's own op on the sum (the reference)."""

    def __init__(self, ours):
        super().__init__()
        self.ours = ours
        self.norm = LayerNorm() if ours else nn.LayerNorm()

    def hybrid_forward(self, F, X, Y):
        return self.norm(X, Y) if self.ours else self.norm(X + Y)


def _run(block, X, Y, dout, fused):
    """Output and the gradients of X, Y, gamma, beta (gamma, beta set to fixed values)."""
    block.initialize(ctx=mx.cpu())
    block(X, Y)  # deferred init
    rng = onp.random.RandomState(1)
    block.norm.gamma.set_data(np.array(rng.uniform(0.5, 1.5, 32), dtype="float32"))
    block.norm.beta.set_data(np.array(rng.uniform(-1, 1, 32), dtype="float32"))
    block.hybridize(static_alloc=True, static_shape=True)
    X, Y = X.copy(), Y.copy()
    X.attach_grad()
    Y.attach_grad()
    with autograd.record(), kernels.fused(mx.cpu() if fused else mx.gpu(0)):
        out = block(X, Y)
    out.backward(dout)
    graph = block._cached_graph[1].tojson()
    return [out, X.grad, Y.grad, block.norm.gamma.grad(), block.norm.beta.grad()], graph


def _inputs(shape=(64, 10, 32)):
    rng = onp.random.RandomState(0)
    X, Y, dout = (np.array(rng.normal(size=shape) * 3 + 1, dtype="float32") for _ in range(3))
    return X, Y, dout


def test_fused_add_layer_norm_equals_mxnet_forward_and_backward():
    X, Y, dout = _inputs()
    ref, ref_graph = _run(Norm(False), X, Y, dout, fused=True)
    ours, graph = _run(Norm(True), X, Y, dout, fused=True)
    assert "d2t_add_layer_norm" in graph and "LayerNorm" not in graph.replace("d2t_add_layer", "")
    assert "d2t_" not in ref_graph  # nn.LayerNorm itself never switches
    for name, a, b in zip(["out", "dX", "dY", "dgamma", "dbeta"], ref, ours):
        scale = max(1.0, float(abs(a).max()))
        onp.testing.assert_allclose(b.asnumpy(), a.asnumpy(), atol=2e-6 * scale, err_msg=name)
    onp.testing.assert_array_equal(ours[1].asnumpy(), ours[2].asnumpy())  # d/dX == d/dY


def test_plain_layer_norm_kernel_and_odd_width():
    """One input (pre-norm's use), a width that is not a multiple of 8, rows of one position."""
    block = LayerNorm()
    block.initialize(ctx=mx.cpu())
    rng = onp.random.RandomState(2)
    X = np.array(rng.normal(size=(7, 1, 13)) * 5, dtype="float32")
    ref = nn.LayerNorm()
    ref.initialize(ctx=mx.cpu())
    expected = ref(X)
    block.hybridize(static_alloc=True, static_shape=True)
    with kernels.fused(mx.cpu()):
        got = block(X)
    assert "d2t_layer_norm" in block._cached_graph[1].tojson()
    onp.testing.assert_allclose(got.asnumpy(), expected.asnumpy(), atol=2e-6)
    # by hand: each row has mean 0 and variance 1 (gamma 1, beta 0)
    onp.testing.assert_allclose(got.asnumpy().mean(-1), 0, atol=1e-6)
    onp.testing.assert_allclose(got.asnumpy().var(-1), 1, atol=1e-4)


def test_not_fused_outside_the_scope_on_gpu_and_imperative():
    X, Y, dout = _inputs((4, 3, 32))
    _, graph = _run(Norm(True), X, Y, dout, fused=False)  # a GPU context: MXNet's op
    assert "d2t_" not in graph and "LayerNorm" in graph
    with kernels.fused(mx.gpu(0)):
        assert not kernels.active()
    with kernels.fused([mx.cpu(0), mx.cpu(1)]):
        assert kernels.active()
    assert not kernels.active()
    addnorm = AddNorm(0.0)
    addnorm.initialize(ctx=mx.cpu())
    with kernels.fused(mx.cpu()):  # imperative calls never use the kernels
        out = addnorm(X, Y)
    ref = nn.LayerNorm()
    ref.initialize(ctx=mx.cpu())
    onp.testing.assert_array_equal(out.asnumpy(), ref(Y + X).asnumpy())


def test_shape_mismatch_is_an_error():
    block = Norm(True)
    block.initialize(ctx=mx.cpu())
    block.hybridize()
    with kernels.fused(mx.cpu()), pytest.raises((mx.MXNetError, ValueError), match="same shape"):
        block(np.ones((2, 3, 32)), np.ones((2, 4, 32)))


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_disabled_or_unbuildable_falls_back_with_one_line(tmp_path):
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from d2l_transformer import kernels\nprint('loaded', kernels.load())")
    off = _python(code, D2L_TRANSFORMER_KERNELS="0")
    assert off.returncode == 0 and "loaded False" in off.stdout and "kernels unavailable" not in off.stderr
    broken = _python(code, CXX="/bin/false", D2L_TRANSFORMER_CACHE=str(tmp_path))
    assert broken.returncode == 0 and "loaded False" in broken.stdout, broken.stderr
    lines = [line for line in broken.stderr.splitlines() if "kernels unavailable" in line]
    assert len(lines) == 1 and "Traceback" not in broken.stderr
    assert not list(tmp_path.glob("*.so"))  # no half-written library left behind


def _attention_run(query, key, valid_length, causal, fused, dout):
    """MultiHeadAttention(hidden 32, 4 heads) with fixed weights: imperative (the chapter's
    ops) or hybridized inside `kernels.fused`; output and gradients of inputs and weights."""
    mx.random.seed(0)
    attention = MultiHeadAttention(32, 4, 0.0, causal=causal)
    attention.initialize(mx.init.Xavier(), ctx=mx.cpu())
    attention(query, key, key, valid_length)  # deferred init, same seed: same weights
    if fused:
        attention.hybridize(static_alloc=True, static_shape=True)
    query, key = query.copy(), key.copy()
    query.attach_grad()
    key.attach_grad()
    args = (query, key, key) if valid_length is None else (query, key, key, valid_length)
    with autograd.record(), kernels.fused(mx.cpu()):
        out = attention(*args)
    out.backward(dout)
    if fused:
        assert "d2t_attention" in attention._cached_graph[1].tojson()
    return [out, query.grad, key.grad] + [p.grad() for p in attention.collect_params().values()]


@pytest.mark.parametrize("case", ["lengths", "causal", "cross", "per_query", "step", "empty"])
def test_fused_attention_equals_the_chapter_ops(case):
    """Forward and backward of the one-operator attention == the chapter's imperative ops."""
    rng = onp.random.RandomState(3)
    batch, tq, tk = 5, 7, 7
    valid_length, causal = np.array([7, 3, 1, 5, 2]), False
    if case == "causal":
        valid_length, causal = None, True
    elif case == "cross":
        tq = 4
    elif case == "per_query":
        valid_length = np.array(rng.randint(1, tk + 1, size=(batch, tq)))
    elif case == "step":  # the cached decoder: one query, a key buffer, the filled length
        tq, tk, causal = 1, 9, True
    elif case == "empty":  # d2l: a fully masked row gets uniform weights
        valid_length = np.array([0, 3, 7, 0, 2])
    query = np.array(rng.normal(size=(batch, tq, 32)), dtype="float32")
    key = np.array(rng.normal(size=(batch, tk, 32)), dtype="float32")
    dout = np.array(rng.normal(size=(batch, tq, 32)), dtype="float32")
    ref = _attention_run(query, key, valid_length, causal, False, dout)
    ours = _attention_run(query, key, valid_length, causal, True, dout)
    for i, (a, b) in enumerate(zip(ref, ours)):
        onp.testing.assert_allclose(b.asnumpy(), a.asnumpy(), atol=2e-5, rtol=1e-5, err_msg=i)
