"""9.3.2-9.3.4: position-wise FFN, add & norm, positional encoding."""

import math

import chapter_0_11 as book
import numpy as onp
from conftest import assert_close, copy_params
from mxnet import init, np

import d2l_transformer as d2t


def test_ffn_toy_output_and_names():
    ffn = d2t.PositionWiseFFN(4, 8)
    ffn.initialize()
    Y = ffn(np.ones((2, 3, 4)))
    assert Y.shape == (2, 3, 8)
    assert_close(Y[0, 0], Y[1, 2], tol=0)  # identical positions give identical outputs
    theirs = book.PositionWiseFFN(4, 8)
    theirs.initialize()
    theirs(np.ones((2, 3, 4)))
    copy_params(theirs, ffn)
    assert_close(ffn(np.ones((2, 3, 4))), theirs(np.ones((2, 3, 4))), tol=0)
    assert list(ffn._children) == ["ffn_1", "ffn_2"]


def test_addnorm_toy_shape_and_value():
    add_norm = d2t.AddNorm(0.5)
    add_norm.initialize()
    assert add_norm(np.ones((2, 3, 4)), np.ones((2, 3, 4))).shape == (2, 3, 4)
    X = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    expected = (onp.array([1, 2, 3, 4]) * 2 - 5) / math.sqrt(onp.var([2, 4, 6, 8]) + 1e-5)
    assert_close(add_norm(X, X)[0, 0], expected, tol=1e-5)  # eval mode: no dropout


def test_P_is_the_sin_cos_formula():
    pe = d2t.PositionalEncoding(20, 0)
    pe.initialize()
    P = pe.P.data().asnumpy()[0]
    i = onp.arange(1000)[:, None]
    j = onp.arange(0, 20, 2)[None, :]
    onp.testing.assert_allclose(P[:, 0::2], onp.sin(i / 10000 ** (j / 20)), atol=2e-4)
    onp.testing.assert_allclose(P[:, 1::2], onp.cos(i / 10000 ** (j / 20)), atol=2e-4)
    onp.testing.assert_allclose(P[:50, 0::2], onp.sin(i[:50] / 10000 ** (j / 20)), atol=2e-6)


def test_positional_encoding_equals_the_book_and_offset_shifts_rows():
    pe, theirs = d2t.PositionalEncoding(20, 0), book.PositionalEncoding(20, 0)
    pe.initialize()
    theirs.initialize()
    X = np.random.normal(size=(2, 7, 20))
    assert_close(pe(X), theirs(X), tol=0)
    shifted = pe(X[:, 3:4], np.array([3]))
    assert_close(shifted, theirs(X)[:, 3:4], tol=0)


def test_positional_encoding_survives_force_reinit():
    pe = d2t.PositionalEncoding(8, 0)
    pe.initialize()
    before = pe.P.data().asnumpy().copy()
    pe.initialize(init.Xavier(), force_reinit=True)
    onp.testing.assert_array_equal(pe.P.data().asnumpy(), before)
