"""9.3.1: masked softmax, dot-product attention, the head transposes, multi-head attention."""

import chapter_0_11 as book
import d2l
import numpy as onp
import pytest
from conftest import assert_close, copy_params
from mxnet import autograd, np

import d2l_transformer as d2t
from d2l_transformer.model import causal_valid_length


@pytest.mark.parametrize("valid_length", [None, [2, 3], [[1, 3], [2, 4]]])
def test_masked_softmax_equals_d2l(valid_length):
    X = np.random.uniform(size=(2, 2, 4))
    v = None if valid_length is None else np.array(valid_length)
    assert_close(d2t.masked_softmax(X, v), d2l.masked_softmax(X, v), tol=0)


def test_masked_positions_get_exactly_zero_weight():
    X = np.random.normal(size=(2, 3, 5))
    W = d2t.masked_softmax(X, np.array([2, 4])).asnumpy()
    assert (W[0, :, 2:] == 0).all() and (W[1, :, 4:] == 0).all()
    assert (W[0, :, :2] > 0).all()
    onp.testing.assert_allclose(W.sum(-1), 1, rtol=1e-6)


def test_causal_valid_lengths_align_queries_with_the_newest_keys():
    X = np.zeros((1, 2, 4))  # two new queries after two kept positions
    lengths = causal_valid_length(X, 2)
    assert lengths.asnumpy().tolist() == [[3, 4]]
    W = d2t.masked_softmax(X, lengths).asnumpy()[0]
    onp.testing.assert_allclose(W, [[1 / 3, 1 / 3, 1 / 3, 0], [0.25] * 4], rtol=1e-6)


def test_dot_product_attention_equals_d2l():
    q, k, v = np.random.normal(size=(2, 1, 2)), np.ones((2, 10, 2)), np.arange(40).reshape(1, 10, 4)
    v = np.repeat(v, 2, axis=0)
    ours, theirs = d2t.DotProductAttention(0.0), d2l.DotProductAttention(0.0)
    ours.initialize()
    theirs.initialize()
    vl = np.array([2, 6])
    assert_close(ours(q, k, v, vl), theirs(q, k, v, vl), tol=0)


def test_transposes_are_exact_inverses_and_match_the_book():
    X = np.random.normal(size=(2, 3, 8))
    Y = d2t.transpose_qkv(X, 4)
    assert Y.shape == (8, 3, 2)
    assert_close(Y, book.transpose_qkv(X, 4), tol=0)
    assert_close(d2t.transpose_output(Y, 4), X, tol=0)


def test_multi_head_attention_toy_shape():
    cell = d2t.MultiHeadAttention(100, 10, 0.5)
    cell.initialize()
    X = np.ones((2, 4, 5))
    assert cell(X, X, X, np.array([2, 3])).shape == (2, 4, 100)
    assert [c for c in cell._children] == ["attention", "W_q", "W_k", "W_v", "W_o"]


def _mha_pair(exact):
    ours = d2t.MultiHeadAttention(8, 2, 0.0, tile_valid_lengths=exact)
    theirs = book.MultiHeadAttention(8, 2, 0.0)
    ours.initialize()
    theirs.initialize()
    X = np.random.normal(size=(3, 4, 8))
    vl = np.array([1, 4, 2])
    theirs(X, X, X, vl), ours(X, X, X, vl)
    copy_params(theirs, ours)
    return ours, theirs, X, vl


def test_bug2_exact_mode_reproduces_the_books_np_tile():
    ours, theirs, X, vl = _mha_pair(exact=True)
    assert_close(ours(X, X, X, vl), theirs(X, X, X, vl), tol=0)


def test_bug2_fixed_each_head_gets_its_own_examples_length():
    ours, theirs, X, vl = _mha_pair(exact=False)
    batched = ours(X, X, X, vl)
    # one example at a time has no mixing to get wrong, in the book's code and ours
    for b in range(3):
        xb, vb = X[b:b + 1], vl[b:b + 1]
        assert_close(batched[b:b + 1], theirs(xb, xb, xb, vb))
    assert not onp.allclose(batched.asnumpy(), theirs(X, X, X, vl).asnumpy(), atol=1e-4)


def test_hybridized_attention_equals_imperative():
    cell = d2t.MultiHeadAttention(16, 4, 0.0)
    cell.initialize()
    X, vl = np.random.normal(size=(2, 5, 16)), np.array([3, 5])
    expected = cell(X, X, X, vl)
    cell.hybridize(static_alloc=True, static_shape=True)
    assert_close(cell(X, X, X, vl), expected, tol=1e-6)
    assert_close(cell(X, X, X, vl), expected, tol=1e-6)  # second call, cached graph


@pytest.mark.parametrize("valid_length", [[2, 3], [[1, 3], [2, 4]]])
def test_masked_softmax_gradient_equals_d2l(valid_length):
    X, v = np.random.normal(size=(2, 2, 4)), np.array(valid_length)
    grads = []
    for f in (d2t.masked_softmax, d2l.masked_softmax):
        x = X.copy()
        x.attach_grad()
        with autograd.record():
            y = (f(x, v) * np.arange(4)).sum()
        y.backward()
        grads.append(x.grad)
    assert_close(grads[0], grads[1], tol=1e-6)
    assert float(np.abs(grads[0]).sum()) > 0.1


def test_causal_softmax_gradient_reaches_only_visible_keys():
    x = np.random.normal(size=(1, 3, 3))
    x.attach_grad()
    with autograd.record():
        y = (d2t.masked_softmax(x, causal_valid_length(x, 0)) * np.arange(3)).sum()
    y.backward()
    g = x.grad.asnumpy()[0]
    assert (g[onp.triu_indices(3, 1)] == 0).all() and abs(g[1, :2]).sum() > 0
