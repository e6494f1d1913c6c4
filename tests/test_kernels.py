"""The fused kernels (LayerNorm, add + LayerNorm, multi-head attention) compute what
MXNet's operators / the chapter's ops compute, forward and backward, and are used exactly where
they should be (graphs traced under `kernels.fused` on a CPU)."""

import json
import os
import shutil
import subprocess
import sys

import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, np, npx
from mxnet.gluon import nn

from d2l_transformer import kernels
from d2l_transformer._gluon import graph_json
from d2l_transformer.attention import MultiHeadAttention
from d2l_transformer.layers import AddNorm
from d2l_transformer.model import causal_valid_length
from d2l_transformer.training.fused import FastGraph

COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")  # as kernels.build


@pytest.fixture(scope="module")
def loaded():
    """The kernels built and loaded: skipped without a C++ compiler (the fallback test below
    runs anyway); with one, a failed build is a failure."""
    if not COMPILER:
        pytest.skip("no C++ compiler (c++, g++ or $CXX): the fused kernels cannot be built")
    assert kernels.load(), "the kernels must build and load on a machine with a C++ compiler"


needs_kernels = pytest.mark.usefixtures("loaded")


class Norm(nn.HybridBlock):
    """MXNet's own LayerNorm of X + Y: the reference for the fused AddNorm."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm()

    def hybrid_forward(self, F, X, Y):
        return self.norm(X + Y)


def _fused_addnorm(dropout=0.0):
    """The chapter's AddNorm; `FastGraph` puts the fast path's kernel in place where it traces it."""
    return AddNorm(dropout)


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
        fast = FastGraph(block)
        out = fast(X, Y)
    out.backward(dout)
    graph = graph_json(fast.traced)
    return [out, X.grad, Y.grad, block.norm.gamma.grad(), block.norm.beta.grad()], graph


def _inputs(shape=(64, 10, 32)):
    rng = onp.random.RandomState(0)
    X, Y, dout = (np.array(rng.normal(size=shape) * 3 + 1, dtype="float32") for _ in range(3))
    return X, Y, dout


@needs_kernels
def test_fused_add_layer_norm_equals_mxnet_forward_and_backward():
    X, Y, dout = _inputs()
    ref, ref_graph = _run(Norm(), X, Y, dout, fused=True)
    ours, graph = _run(_fused_addnorm(), X, Y, dout, fused=True)
    assert "d2t_add_layer_norm" in graph and "LayerNorm" not in graph.replace("d2t_add_layer", "")
    assert "d2t_" not in ref_graph  # nn.LayerNorm itself never switches
    for name, a, b in zip(["out", "dX", "dY", "dgamma", "dbeta"], ref, ours):
        scale = max(1.0, float(abs(a).max()))
        onp.testing.assert_allclose(b.asnumpy(), a.asnumpy(), atol=2e-6 * scale, err_msg=name)
    onp.testing.assert_array_equal(ours[1].asnumpy(), ours[2].asnumpy())  # d/dX == d/dY


@needs_kernels
def test_not_fused_outside_the_scope_on_gpu_and_imperative():
    X, Y, dout = _inputs((4, 3, 32))
    _, graph = _run(_fused_addnorm(), X, Y, dout, fused=False)  # a GPU context: MXNet's op
    assert "d2t_" not in graph and "LayerNorm" in graph
    with kernels.fused(mx.gpu(0)):
        assert not kernels.active()
    with kernels.fused([mx.cpu(0), mx.cpu(1)]):
        assert kernels.active()
    assert not kernels.active()
    addnorm = _fused_addnorm()
    addnorm.initialize(ctx=mx.cpu())
    with kernels.fused(mx.cpu()):  # imperative calls never use the kernels
        out = FastGraph(addnorm)(X, Y)
    assert type(addnorm) is AddNorm  # after the call, the class it was built with
    ref = nn.LayerNorm()
    ref.initialize(ctx=mx.cpu())
    onp.testing.assert_array_equal(out.asnumpy(), ref(Y + X).asnumpy())


@needs_kernels
def test_shape_mismatch_is_an_error():
    block = _fused_addnorm()
    block.initialize(ctx=mx.cpu())
    block.hybridize()
    with kernels.fused(mx.cpu()), pytest.raises((mx.MXNetError, ValueError), match="same shape"):
        FastGraph(block)(np.ones((2, 3, 32)), np.ones((2, 4, 32)))


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_disabled_or_unbuildable_falls_back_with_one_line(tmp_path):
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from d2l_transformer import kernels\nprint('loaded', kernels.load())")
    off = _python(code, D2L_TRANSFORMER_KERNELS="0")
    assert off.returncode == 0 and "loaded False" in off.stdout and "kernels unavailable" not in off.stderr
    # no working compiler: one warning line, then a fused-scope graph holds MXNet's LayerNorm
    # and gives nn.LayerNorm's numbers
    code += ("\nimport mxnet as mx\nfrom mxnet import np\nfrom mxnet.gluon import nn\n"
             "from d2l_transformer.layers import AddNorm\n"
             "from d2l_transformer.training.fused import FastGraph\n"
             "from d2l_transformer._gluon import graph_json\n"
             "X = np.arange(24, dtype='float32').reshape(2, 3, 4) ** 1.5\n"
             "ours, ref = AddNorm(0.0), nn.LayerNorm()\nours.initialize(); ref.initialize()\n"
             "ours.hybridize()\nfast = FastGraph(ours)\nwith kernels.fused(mx.cpu()):\n"
             "    got = fast(X, X)\ngraph = graph_json(fast.traced)\n"
             "print('mxnet op', 'LayerNorm' in graph and 'd2t_' not in graph)\n"
             "print('max diff', float(abs(got - ref(X + X)).max()))")
    broken = _python(code, CXX="/bin/false", D2L_TRANSFORMER_CACHE=str(tmp_path))
    assert broken.returncode == 0 and "loaded False" in broken.stdout, broken.stderr
    lines = [line for line in broken.stderr.splitlines() if "kernels unavailable" in line]
    assert len(lines) == 1 and "Traceback" not in broken.stderr
    assert "mxnet op True" in broken.stdout and "max diff 0.0" in broken.stdout, broken.stdout
    assert not list(tmp_path.glob("*.so"))  # no half-written library left behind


def _attention_run(query, key, valid_length, fused, dout):
    """MultiHeadAttention(hidden 32, 4 heads) with fixed weights: imperative (the chapter's
    ops) or with the kernel put in place and hybridized inside `kernels.fused`; output and
    gradients of inputs and weights."""
    mx.random.seed(0)
    attention = MultiHeadAttention(32, 4, 0.0)
    attention.initialize(mx.init.Xavier(), ctx=mx.cpu())
    attention(query, key, key, valid_length)  # deferred init, same seed: same weights
    if fused:
        attention.hybridize(static_alloc=True, static_shape=True)
    query, key = query.copy(), key.copy()
    query.attach_grad()
    key.attach_grad()
    args = (query, key, key) if valid_length is None else (query, key, key, valid_length)
    fast = FastGraph(attention)
    with autograd.record(), kernels.fused(mx.cpu()):
        out = fast(*args) if fused else attention(*args)
    out.backward(dout)
    if fused:
        assert "d2t_attention" in graph_json(fast.traced)
        assert type(attention) is MultiHeadAttention  # the kernel is in the copy, not the object
    return [out, query.grad, key.grad] + [p.grad() for p in attention.collect_params().values()]


@needs_kernels
@pytest.mark.parametrize("case", ["lengths", "causal", "cross", "per_query", "step", "empty"])
def test_fused_attention_equals_the_chapter_ops(case):
    """Forward and backward of the one-operator attention == the chapter's imperative ops."""
    rng = onp.random.RandomState(3)
    batch, tq, tk = 5, 7, 7
    valid_length = np.array([7, 3, 1, 5, 2])
    if case == "causal":  # the decoder's self-attention in training
        valid_length = causal_valid_length(np.zeros((batch, tq, 1)), 0)
    elif case == "cross":
        tq = 4
    elif case == "per_query":
        valid_length = np.array(rng.randint(1, tk + 1, size=(batch, tq)))
    elif case == "step":  # a decoder's past: one query after 8 kept positions
        tq, tk = 1, 9
        valid_length = causal_valid_length(np.zeros((batch, tq, 1)), 8)
    elif case == "empty":  # d2l: a fully masked row gets uniform weights
        valid_length = np.array([0, 3, 7, 0, 2])
    query = np.array(rng.normal(size=(batch, tq, 32)), dtype="float32")
    key = np.array(rng.normal(size=(batch, tk, 32)), dtype="float32")
    dout = np.array(rng.normal(size=(batch, tq, 32)), dtype="float32")
    ref = _attention_run(query, key, valid_length, False, dout)
    ours = _attention_run(query, key, valid_length, True, dout)
    for i, (a, b) in enumerate(zip(ref, ours)):
        onp.testing.assert_allclose(b.asnumpy(), a.asnumpy(), atol=2e-5, rtol=1e-5, err_msg=i)


def _heads(X, num_heads):
    """(batch, T, H*d) -> (batch*H, T, d), the chapter's layout (`transpose_qkv`)."""
    from d2l_transformer.attention import transpose_qkv
    return transpose_qkv(X, num_heads)


def _dropout_case(p=0.3, batch=16, tq=9, tk=11, heads=4, width=32, seed=5):
    rng = onp.random.RandomState(seed)
    q = np.array(rng.normal(size=(batch, tq, width)), dtype="float32")
    k = np.array(rng.normal(size=(batch, tk, width)), dtype="float32")
    v = np.array(rng.normal(size=(batch, tk, width)), dtype="float32")
    length = np.array(rng.randint(0, tk + 1, size=batch), dtype="float32")  # 0: uniform rows
    return q, k, v, length


def _kernel_attention(q, k, v, length, p, train, heads=4):
    """The operator called directly: (out, keep, dq, dk, dv) for the output gradient `dout`."""
    q, k, v = q.copy(), k.copy(), v.copy()
    for x in (q, k, v):
        x.attach_grad()
    flag = np.array([1.0 if train else 0.0])
    with autograd.record():
        out, keep = mx.nd.d2t_attention(
            q.as_nd_ndarray(), k.as_nd_ndarray(), v.as_nd_ndarray(), length.as_nd_ndarray(),
            flag.as_nd_ndarray(), num_heads=heads,
            scale=repr(float(onp.sqrt(q.shape[-1] // heads))), dropout=repr(p))
    out = out.as_np_ndarray()
    dout = np.array(onp.random.RandomState(9).normal(size=out.shape), dtype="float32")
    out.backward(dout)
    return out, keep.as_np_ndarray(), q.grad, k.grad, v.grad, dout


@needs_kernels
def test_attention_dropout_drops_a_fraction_p_of_the_weights():
    """In training, each weight a query sees is dropped with probability p: the fraction of
    dropped weights over ~20,000 draws is p within 5 standard deviations; keys a query
    cannot see are never counted; a fixed MXNet seed gives the same mask, another seed another."""
    p = 0.3
    q, k, v, length = _dropout_case(p, batch=96)
    mx.random.seed(1)
    _, keep, *_ = _kernel_attention(q, k, v, length, p, train=True)
    keep = keep.asnumpy()  # (batch, heads, tq, tk)
    L = length.asnumpy().astype(int)
    seen = onp.zeros(keep.shape, dtype=bool)
    for b in range(keep.shape[0]):  # valid length 0: d2l's uniform weights over all keys
        seen[b, :, :, :L[b] if L[b] else keep.shape[-1]] = True
    n = seen.sum()
    dropped = 1 - keep[seen].mean()
    assert n > 15000 and abs(dropped - p) < 5 * onp.sqrt(p * (1 - p) / n), (dropped, n)
    assert not keep[~seen].any()
    mx.random.seed(1)
    onp.testing.assert_array_equal(_kernel_attention(q, k, v, length, p, True)[1].asnumpy(), keep)
    mx.random.seed(2)
    assert (_kernel_attention(q, k, v, length, p, True)[1].asnumpy() != keep).any()


@needs_kernels
def test_attention_dropout_equals_mxnet_ops_with_the_same_mask():
    """Output and gradients of q, k, v == MXNet's ops (d2l's masked softmax, the kernel's keep
    mask applied as Dropout applies its mask: kept weights times 1 / (1 - p), batch_dot)."""
    from d2l_transformer.attention import masked_softmax, repeat_valid_length, transpose_output
    p, heads = 0.25, 4
    q, k, v, length = _dropout_case(p, tq=11)
    mx.random.seed(3)
    out, keep, dq, dk, dv, dout = _kernel_attention(q, k, v, length, p, True, heads)
    assert 0 < keep.asnumpy().mean() < 1
    mask = keep.astype("float32").reshape(-1, q.shape[1], k.shape[1]) / (1 - p)  # (batch*h, q, k)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for x in (q2, k2, v2):
        x.attach_grad()
    with autograd.record():
        scores = npx.batch_dot(_heads(q2, heads), _heads(k2, heads), transpose_b=True)
        weights = masked_softmax(scores / onp.sqrt(q.shape[-1] // heads),
                                 repeat_valid_length(length, heads))
        ref = transpose_output(npx.batch_dot(weights * mask, _heads(v2, heads)), heads)
    ref.backward(dout)
    for name, a, b in [("out", ref, out), ("dq", q2.grad, dq), ("dk", k2.grad, dk),
                       ("dv", v2.grad, dv)]:
        onp.testing.assert_allclose(b.asnumpy(), a.asnumpy(), atol=2e-5, rtol=1e-5, err_msg=name)


@needs_kernels
def test_attention_dropout_inactive_at_inference():
    """A block with attention dropout, hybridized in the fused scope, traced ONCE: outside
    training it gives the chapter's imperative output (no dropout); in training (the same
    graph) it drops weights, so the output differs."""
    rng = onp.random.RandomState(4)
    query = np.array(rng.normal(size=(6, 5, 32)), dtype="float32")
    valid_length = np.array([5, 2, 1, 4, 3, 5])
    mx.random.seed(0)
    attention = MultiHeadAttention(32, 4, 0.4)
    attention.initialize(mx.init.Xavier(), ctx=mx.cpu())
    expected = attention(query, query, query, valid_length)  # imperative, not training
    attention.hybridize(static_alloc=True, static_shape=True)
    fast = FastGraph(attention)
    with kernels.fused(mx.cpu()):
        got = fast(query, query, query, valid_length)
        with autograd.record(train_mode=False):
            got_recorded = fast(query, query, query, valid_length)
        with autograd.record():
            trained = fast(query, query, query, valid_length)
    assert "d2t_attention" in graph_json(fast.traced)
    for out in (got, got_recorded):
        onp.testing.assert_allclose(out.asnumpy(), expected.asnumpy(), atol=2e-6, rtol=1e-5)
    assert float(abs(trained - expected).max()) > 1e-2


@needs_kernels
def test_addnorm_dropout_in_the_layer_norm_kernel():
    """``d2t_add_layer_norm`` with dropout = AddNorm's ``LayerNorm(Dropout(Y) + X)``: in
    training a fraction p of Y is dropped (within 5 standard deviations over ~46,000 draws),
    and the output and the gradients of Y, X, gamma, beta equal MXNet's ops applying the same
    mask (kept elements times 1 / (1 - p)); with the train flag 0 nothing is dropped."""
    p = 0.2
    Y, X, dout = _inputs((40, 9, 128))
    rng = onp.random.RandomState(1)
    gamma = np.array(rng.uniform(0.5, 1.5, 128), dtype="float32")
    beta = np.array(rng.uniform(-1, 1, 128), dtype="float32")
    results = {}
    for train in (True, False):
        args = [a.copy() for a in (Y, X, gamma, beta)]
        for a in args:
            a.attach_grad()
        with autograd.record():
            out, keep = mx.nd.d2t_add_layer_norm(*[a.as_nd_ndarray() for a in args],
                                                 np.array([float(train)]).as_nd_ndarray(),
                                                 eps=1e-5, dropout=repr(p))
        out.backward(dout.as_nd_ndarray())
        results[train] = [out.as_np_ndarray()] + [a.grad for a in args], keep.asnumpy()
    ours, keep = results[True]
    dropped = 1 - keep.mean()
    assert abs(dropped - p) < 5 * onp.sqrt(p * (1 - p) / keep.size), dropped
    assert results[False][1].all()  # not training: every element kept
    ref = nn.LayerNorm()
    ref.initialize(ctx=mx.cpu())
    ref.gamma.set_data(gamma)
    ref.beta.set_data(beta)
    for train, mask in ((True, np.array(keep, dtype="float32") / (1 - p)), (False, 1.0)):
        Y2, X2 = Y.copy(), X.copy()
        Y2.attach_grad()
        X2.attach_grad()
        with autograd.record():
            r = ref(Y2 * mask + X2)
        r.backward(dout)
        expected = [r, Y2.grad, X2.grad, ref.gamma.grad(), ref.beta.grad()]
        for name, a, b in zip(["out", "dY", "dX", "dgamma", "dbeta"], expected, results[train][0]):
            scale = max(1.0, float(abs(a).max()))
            onp.testing.assert_allclose(b.asnumpy(), a.asnumpy(), atol=4e-6 * scale,
                                        err_msg=f"{name} train={train}")


@needs_kernels
def test_addnorm_dropout_fused_in_graphs_and_inactive_at_inference():
    """An AddNorm with dropout, hybridized in the fused scope and traced once, runs ONE
    operator (no separate Dropout on Y): outside training it gives the imperative block's
    output; in training (the same graph) it drops."""
    X, Y, _ = _inputs((8, 5, 32))
    addnorm = _fused_addnorm(0.3)
    addnorm.initialize(ctx=mx.cpu())
    expected = addnorm(X, Y)  # imperative, not training: no dropout
    addnorm.hybridize(static_alloc=True, static_shape=True)
    fast = FastGraph(addnorm)
    with kernels.fused(mx.cpu()):
        got = fast(X, Y)
        with autograd.record():
            trained = fast(X, Y)
    nodes = json.loads(graph_json(fast.traced))["nodes"]
    ops = [n["op"] for n in nodes]
    assert ops.count("d2t_add_layer_norm") == 1 and ops.count("Dropout") == 1  # the train flag's
    dropout_input = [n for n in nodes if n["op"] == "Dropout"][0]["inputs"][0][0]
    assert nodes[dropout_input]["op"] == "_npi_ones"  # the flag's (1,) ones, not Y
    onp.testing.assert_allclose(got.asnumpy(), expected.asnumpy(), atol=2e-6)
    assert float(abs(trained - expected).max()) > 1e-2


@needs_kernels
@pytest.mark.parametrize("smoothing,reduction", [(0.0, "book"), (0.1, "book"), (0.0, "token"),
                                                 (0.1, "token")])
def test_fused_loss_equals_masked_softmax_ce(smoothing, reduction):
    """`kernels.softmax_ce` (the fast path's loss) == MaskedSoftmaxCELoss: the value (the plain
    cross-entropy over the valid positions) and the gradient (of the smoothed objective);
    zero-length sentences and labels at both ends of the vocabulary included."""
    from mxnet import gluon

    from d2l_transformer.training.loss import MaskedSoftmaxCELoss

    class Fused(gluon.HybridBlock):
        def __init__(self, loss):
            super().__init__()
            self.loss = loss

        def hybrid_forward(self, F, pred, label, valid_length):
            return kernels.softmax_ce(F, pred, label, valid_length, self.loss.label_smoothing,
                                      self.loss.reduction == "token")

    rng = onp.random.RandomState(6)
    batch, T, V = 7, 6, 53
    pred = np.array(rng.normal(size=(batch, T, V)) * 4, dtype="float32")
    label = rng.randint(0, V, size=(batch, T)).astype("float32")
    label[0, :2] = [0, V - 1]
    label = np.array(label)
    valid_length = np.array([6, 3, 0, 1, 5, 2, 4], dtype="float32")
    dl = np.array(rng.uniform(0.5, 2, size=batch), dtype="float32")
    loss = MaskedSoftmaxCELoss(smoothing, reduction=reduction)
    results = []
    for block in (loss, Fused(loss)):
        if isinstance(block, Fused):
            block.hybridize(static_alloc=True, static_shape=True)
        x = pred.copy()
        x.attach_grad()
        with autograd.record():
            value = block(x, label, valid_length)
        value.backward(dl)
        results.append((value.asnumpy(), x.grad.asnumpy()))
    (ref, dref), (ours, dours) = results
    assert ref[2] == 0 and ours[2] == 0 and not dours[2].any() and not dours[3, 1:].any()
    onp.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    onp.testing.assert_allclose(dours, dref, rtol=1e-5, atol=1e-6)


def _full_batches(cfg, src_vocab, tgt_vocab, shapes, seed=7):
    """Bucket-padded batches ``(X, X_valid_len, Y, Y_valid_len)`` of the given
    ``(rows, src_width, tgt_width)`` shapes, random ids and lengths (some rows fully padded)."""
    rng = onp.random.RandomState(seed)
    batches = []
    for rows, ws, wt in shapes:
        X_len = rng.randint(1, ws + 1, size=rows)
        Y_len = rng.randint(2, wt + 1, size=rows)
        X = rng.randint(3, src_vocab, size=(rows, ws)) * (onp.arange(ws) < X_len[:, None])
        Y = rng.randint(3, tgt_vocab, size=(rows, wt)) * (onp.arange(wt) < Y_len[:, None])
        batches.append([np.array(a, dtype="float32") for a in (X, X_len, Y, Y_len)])
    return batches


@needs_kernels
def test_fast_full_step_equals_the_imperative_step():
    """The `full` preset's architecture (d=128, 4 heads, 2 layers, FFN 512) at a small
    vocabulary with its label-smoothed per-token loss and warmup schedule, at dropout 0:
    the fast step (one graph with the fused attention, LayerNorm and loss kernels, bucketed
    shapes changing between steps) gives the imperative step's loss at every step and the
    same weights after 4 steps."""
    import d2l_transformer as d2t
    from d2l_transformer.training.loss import MaskedSoftmaxCELoss
    from d2l_transformer.training.optim import grad_clipping, make_trainer
    from d2l_transformer.training.steps import TrainGraph, _fast_step

    cfg = d2t.FULL.replace(dropout=0.0, batch_size=24)
    src_vocab, tgt_vocab = 40, 50
    batches = _full_batches(cfg, src_vocab, tgt_vocab, [(24, 5, 8), (24, 9, 12), (17, 5, 8),
                                                        (24, 9, 12)])
    runs = []
    for fast in (False, True):
        d2t.set_seed(0)
        model = d2t.build_model(cfg, src_vocab, tgt_vocab)
        model.initialize(mx.init.Xavier(), ctx=mx.cpu())
        trainer = make_trainer(model, cfg.lr, cfg.warmup_steps)
        loss = MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=cfg.loss_reduction)
        fast_step = _fast_step(model, trainer, loss)
        losses = []
        for X, X_vlen, Y, Y_vlen in batches:
            Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
            if fast:
                l, _ = fast_step(X, X_vlen, Y_input, Y_label, Y_vlen)
            else:
                with autograd.record():
                    l = loss(model(X, Y_input, X_vlen, Y_vlen)[0], Y_label, Y_vlen)
                l.backward()
                grad_clipping(model, 1)
                trainer.step(Y_vlen.sum())
            losses.append(float(l.sum()))
        runs.append((losses, [p.data().asnumpy() for p in model.collect_params().values()]))
    (slow, slow_params), (fast, fast_params) = runs
    assert trainer._optimizer.num_update == 4 and 0 < trainer._optimizer.learning_rate < cfg.lr
    onp.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)
    for a, b in zip(slow_params, fast_params):
        onp.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    # the graph that ran: every fused kernel, and with the preset's dropout the attention's too
    for dropout in (0.0, cfg.dropout):
        model = d2t.build_model(cfg.replace(dropout=dropout), src_vocab, tgt_vocab)
        model.initialize(mx.init.Xavier(), ctx=mx.cpu())
        graph = TrainGraph(model, MaskedSoftmaxCELoss(0.1, reduction="token"))
        graph.hybridize(static_alloc=True, static_shape=True)
        X, X_vlen, Y, Y_vlen = batches[0]
        fast = FastGraph(graph)
        with autograd.record(), kernels.fused(mx.cpu()):
            fast(X, X_vlen, Y[:, :-1], Y[:, 1:], Y_vlen - 1)
        ops = [node["op"] for node in json.loads(graph_json(fast.traced))["nodes"]]
        assert {"d2t_attention", "d2t_add_layer_norm", "d2t_softmax_ce"} <= set(ops)
        assert "log_softmax" not in ops and "batch_dot" not in ops
        assert ("Dropout" in ops) == (dropout > 0)


@needs_kernels
def test_fast_full_training_with_dropout_learns_and_repeats():
    """`train_s2s_ch8(fast=True)` on the `full` architecture with its dropout 0.1 (drawn inside
    the attention and AddNorm kernels): the loss falls over 3 passes of 4 batches, and the
    same seed repeats the run exactly (the kernels draw from MXNet's seeded random states)."""
    import d2l_transformer as d2t
    from d2l_transformer.training.loss import MaskedSoftmaxCELoss
    from d2l_transformer.training.optim import make_trainer

    cfg = d2t.FULL.replace(batch_size=24, warmup_steps=4)
    batches = _full_batches(cfg, 40, 50, [(24, 5, 8), (24, 9, 12), (17, 5, 8), (24, 9, 12)])
    runs = []
    for _ in range(2):
        d2t.set_seed(0)
        model = d2t.build_model(cfg, 40, 50)
        model.initialize(mx.init.Xavier(), ctx=mx.cpu())
        losses = []
        d2t.train_s2s_ch8(model, batches, cfg.lr, 3, mx.cpu(), fast=True,
                          trainer=make_trainer(model, cfg.lr, cfg.warmup_steps),
                          loss=MaskedSoftmaxCELoss(cfg.label_smoothing, reduction="token"),
                          on_epoch=lambda epoch, loss, out=losses: out.append(loss))
        runs.append(losses)
    assert onp.isfinite(runs[0]).all() and runs[0][-1] < runs[0][0] - 0.1, runs[0]
    assert runs[0] == runs[1]


def test_private_dir_is_created_0700_and_refused_when_others_could_plant_a_library(tmp_path):
    import stat
    fresh = str(tmp_path / "fresh")
    assert kernels.private_dir(fresh) == fresh and kernels.private_dir(fresh) == fresh
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone may write in it
    with pytest.raises(RuntimeError, match=r"writable by other users \(mode 777\)"):
        kernels.private_dir(str(shared))
    os.symlink(fresh, tmp_path / "link")  # a link, even to a good directory
    with pytest.raises(RuntimeError, match="is not a directory of this user"):
        kernels.private_dir(str(tmp_path / "link"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(RuntimeError, match="is not a directory of this user"):
        kernels.private_dir(str(tmp_path / "file"))


def test_unwritable_cache_falls_back_to_a_private_temporary_dir_or_mxnet(tmp_path, monkeypatch):
    """A cache that cannot be written: the kernels go to this user's 0700 directory under the
    temporary one; if that one is not private, nothing is loaded from it (one warning line,
    MXNet's operators)."""
    import tempfile
    import warnings
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(tmp_path / "readonly"))
    monkeypatch.setattr(kernels.os, "access", lambda path, mode: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = tmp_path / f"d2l_transformer-{os.getuid()}"
    assert os.path.dirname(kernels.library_path()) == str(private)
    assert (os.lstat(private).st_mode & 0o777) == 0o700
    os.chmod(private, 0o777)  # as if another user had made it
    monkeypatch.setattr(kernels, "_state", dict(kernels._state, loaded=None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernels.load() is False
    assert len(caught) == 1 and "writable by other users" in str(caught[0].message)
    assert os.listdir(private) == []  # nothing was built or loaded there
