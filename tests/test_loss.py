"""The loss's units: d2l's mean over the padded width (the book's), the per-token sum, label
smoothing that is optimised but not reported."""

import math

import mxnet as mx
import numpy as onp
import pytest
from conftest import trainable
from mxnet import autograd, gluon, init, np

import d2l_transformer as d2t
from d2l_transformer.data import ArrayBatches, BucketBatches

V_SRC, V_TGT = 23, 19
SRC = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]  # three source sentences (ids)
TGT = [[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 10, 11, 12, 3]]  # targets with <bos>=2 ... <eos>=3


def _model():
    d2t.set_seed(0)
    cfg = d2t.TINY  # dropout 0: the same weights give the same function
    model = d2t.build_model(cfg, V_SRC, V_TGT)
    model.initialize(init.Xavier(), ctx=mx.cpu())
    return model


def _batch(src_width, tgt_width, pad=1):
    """The three sentences padded to the given widths: (X, X_vlen, Y, Y_vlen)."""
    X = onp.full((3, src_width), pad, dtype="float32")  # (batch, src_width)
    Y = onp.full((3, tgt_width), pad, dtype="float32")  # (batch, tgt_width)
    for i, (s, t) in enumerate(zip(SRC, TGT)):
        X[i, :len(s)], Y[i, :len(t)] = s, t
    return (np.array(X), np.array([len(s) for s in SRC], dtype="float32"), np.array(Y),
            np.array([len(t) for t in TGT], dtype="float32"))


def _grads(model, loss, batch):
    X, X_vlen, Y, Y_vlen = batch
    Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
    with autograd.record():
        Y_hat, _ = model(X, Y_input, X_vlen, Y_vlen)
        l = loss(Y_hat, Y_label, Y_vlen)  # (batch,)
    l.backward()
    return l.asnumpy(), [p.grad().asnumpy().copy() for p in trainable(model)]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_reduction_gradient_does_not_depend_on_padding(smoothing):
    """The same three sentences padded to widths (6, 7) and (10, 12): the per-token loss gives
    the same values and the same gradient; the book's mean scales both by 1 / width."""
    model = _model()
    token = d2t.MaskedSoftmaxCELoss(smoothing, reduction="token")
    narrow, g_narrow = _grads(model, token, _batch(6, 7))
    wide, g_wide = _grads(model, token, _batch(10, 12))
    onp.testing.assert_allclose(narrow, wide, rtol=1e-5)
    scale = max(abs(g).max() for g in g_narrow)
    assert scale > 1e-3
    for a, b in zip(g_narrow, g_wide):  # float32 sums in another order: 1e-5 of the largest
        onp.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)
    book = d2t.MaskedSoftmaxCELoss(smoothing)
    book_narrow, gb_narrow = _grads(model, book, _batch(6, 7))
    book_wide, gb_wide = _grads(model, book, _batch(10, 12))
    onp.testing.assert_allclose(book_narrow * 6, narrow, rtol=1e-5)  # 6 label positions
    onp.testing.assert_allclose(book_wide * 11, narrow, rtol=1e-5)  # 11 label positions
    for a, b, c in zip(g_narrow, gb_narrow, gb_wide):  # the book's gradient: 1 / width
        onp.testing.assert_allclose(b * 6, a, rtol=1e-4, atol=1e-5 * scale)
        onp.testing.assert_allclose(c * 11, a, rtol=1e-4, atol=1e-5 * scale)


def test_token_loss_is_the_summed_cross_entropy():
    pred = np.random.normal(size=(2, 4, 5))  # (batch, seq_len, vocab)
    label = np.array([[1, 2, 3, 4], [0, 1, 2, 3]])
    valid = np.array([3, 1])
    log_p = mx.npx.log_softmax(pred).asnumpy()  # (batch, seq_len, vocab)
    nll = -onp.take_along_axis(log_p, label.asnumpy().astype(int)[..., None], -1)[..., 0]
    expected = [nll[0, :3].sum(), nll[1, :1].sum()]
    got = d2t.MaskedSoftmaxCELoss(reduction="token")(pred, label, valid).asnumpy()
    onp.testing.assert_allclose(got, expected, rtol=1e-5)
    book = d2t.MaskedSoftmaxCELoss()(pred, label, valid).asnumpy()
    onp.testing.assert_allclose(book, onp.array(expected) / 4, rtol=1e-5)  # the book's mean
    # d2l 1.0's loss: one number, the mean over every position, nothing masked
    mean = d2t.MaskedSoftmaxCELoss(reduction="mean")(pred, label, valid)
    assert mean.shape == () and abs(float(mean) - nll.mean()) < 1e-5
    with pytest.raises(ValueError, match="unknown loss reduction 'sum'"):
        d2t.MaskedSoftmaxCELoss(reduction="sum")


@pytest.mark.parametrize("hybridize", [False, True])
def test_label_smoothing_is_optimised_but_not_reported(hybridize):
    """Value: the plain cross-entropy. Gradient: that of (1-eps) nll + eps mean(-log p)."""
    eps = 0.1
    pred = np.random.normal(size=(2, 3, 6))  # (batch, seq_len, vocab)
    label = np.array([[1, 2, 3], [4, 5, 0]])
    valid = np.array([3, 2])
    loss = d2t.MaskedSoftmaxCELoss(eps, reduction="token")
    if hybridize:
        loss.hybridize(static_alloc=True, static_shape=True)
    pred.attach_grad()
    with autograd.record():
        value = loss(pred, label, valid)  # (batch,)
    value.backward()
    got_grad = pred.grad.asnumpy().copy()
    plain = d2t.MaskedSoftmaxCELoss(reduction="token")(pred, label, valid)
    onp.testing.assert_allclose(value.asnumpy(), plain.asnumpy(), rtol=1e-6)
    mask = (onp.arange(3)[None, :] < valid.asnumpy()[:, None]).astype("float32")  # (batch, seq)
    x = np.array(pred.asnumpy())
    x.attach_grad()
    with autograd.record():
        log_p = mx.npx.log_softmax(x)  # (batch, seq_len, vocab)
        nll = -mx.npx.pick(log_p, label, axis=-1)  # (batch, seq_len)
        objective = (((1 - eps) * nll - eps * log_p.mean(axis=-1)) * np.array(mask)).sum()
    objective.backward()
    onp.testing.assert_allclose(got_grad, x.grad.asnumpy(), rtol=1e-5, atol=1e-7)
    assert not onp.allclose(objective.item(), plain.sum().item())  # the objective differs


def _loader_pair():
    """The same 40 sentence pairs as the chapter's fixed-width arrays and as buckets."""
    rng = onp.random.RandomState(1)
    src = [list(rng.randint(4, V_SRC, size=rng.randint(1, 9))) for _ in range(40)]
    tgt = [[2] + list(rng.randint(4, V_TGT, size=rng.randint(1, 8))) + [3] for _ in range(40)]
    width = 10

    def padded(rows):
        return np.array([r + [1] * (width - len(r)) for r in rows], dtype="float32")
    arrays = (padded(src), np.array([len(s) for s in src], dtype="float32"),
              padded(tgt), np.array([len(t) for t in tgt], dtype="float32"))
    return ArrayBatches(arrays, 8, is_train=False), BucketBatches(src, tgt, 8, 3, 1, 1)


def test_reported_cross_entropy_is_the_same_for_padded_and_bucketed_batches():
    """One epoch at learning rate 0 over the same pairs, padded to 10 or to their buckets:
    the reported per-token cross-entropy and perplexity agree (they differ in book units)."""
    padded, bucketed = _loader_pair()
    assert len({w for w in bucketed.widths}) > 1  # several widths really are used
    results = {}
    for name, loader in (("padded", padded), ("bucketed", bucketed)):
        for reduction in ("book", "token"):
            model = _model()
            trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.0})
            s = d2t.train_s2s_ch8(model, loader, 0.0, 1, mx.cpu(), trainer=trainer,
                                  loss=d2t.MaskedSoftmaxCELoss(0.1, reduction=reduction))
            results[name, reduction] = s
    ce = results["padded", "token"]["loss_per_token"]
    assert 1.0 < ce < 10.0
    for key, s in results.items():
        assert s["loss_per_token"] == pytest.approx(ce, rel=1e-5), key
        assert s["perplexity"] == pytest.approx(math.exp(ce), rel=1e-5), key
    assert results["padded", "token"]["loss"] == pytest.approx(ce, rel=1e-5)
    assert results["bucketed", "token"]["loss"] == pytest.approx(ce, rel=1e-5)
    assert results["padded", "book"]["loss"] == pytest.approx(ce / 9, rel=1e-5)  # 9 positions
    assert results["bucketed", "book"]["loss"] != pytest.approx(ce / 9, rel=1e-3)
