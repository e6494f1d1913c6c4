"""Shared helpers: seeds, the dataset, and copying weights between our blocks and the book's.
The book's own code per edition lives in oracles/ (chapter_0_11.py ...), put on sys.path here."""

import os
import sys

import d2l_transformer as d2t  # isort: skip  (first: its NumPy-alias shim must precede mxnet)
import mxnet as mx
import numpy as onp
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
ORACLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "oracles")
if ORACLES not in sys.path:
    sys.path.insert(0, ORACLES)


def trainable(block):
    """The block's learnable parameters in registration order (the book's P is no parameter)."""
    return [p for p in block.collect_params().values() if p.grad_req != "null"]


def copy_params(src, dst):
    """Give `dst` the weights of `src` (same architecture, both already initialised and run)."""
    src_params, dst_params = trainable(src), trainable(dst)
    assert len(src_params) == len(dst_params)
    for s, d in zip(src_params, dst_params):
        assert s.shape == d.shape, (s.name, s.shape, d.name, d.shape)
        d.set_data(s.data())


class ModelGraph(mx.gluon.HybridBlock):
    """A model's chapter call, the encoder then the decoder on a fresh state, as ONE graph
    (what the fast path traces): ``graph(X, Y, valid_length) -> logits``."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.decoder = model.encoder, model.decoder

    def hybrid_forward(self, F, X, Y, valid_length):
        state = self.decoder.init_state(self.encoder(X, valid_length), valid_length)
        return self.decoder(Y, state)[0]


def assert_close(a, b, tol=1e-5):
    a = a.asnumpy() if hasattr(a, "asnumpy") else onp.asarray(a)
    b = b.asnumpy() if hasattr(b, "asnumpy") else onp.asarray(b)
    assert a.shape == b.shape
    onp.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory):
    """The package's cache directory (`io.cache`), this session's own, so that what the tests
    measure (`io.measured`: CTranslate2's threads, the precision) never reaches the user's;
    the compiled kernels are built in the user's (once, as before) and linked in."""
    from d2l_transformer.io.cache import ENV, cache_dir
    try:
        d2t.kernels.build()
    except RuntimeError:  # no compiler: the tests that need the kernels say so
        pass
    real, ours = cache_dir(), tmp_path_factory.mktemp("cache")
    for name in os.listdir(real) if os.path.isdir(real) else ():
        if name.startswith("libd2t_kernels-") and name.endswith(".so"):
            os.symlink(os.path.join(real, name), ours / name)
    before = os.environ.get(ENV)
    os.environ[ENV] = str(ours)
    yield ours
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before


@pytest.fixture(autouse=True)
def _seed():
    d2t.set_seed(0)


@pytest.fixture(scope="session")
def nmt():
    """The chapter's data: (src_vocab, tgt_vocab, data_iter) with batch 64, num_steps 10."""
    return d2t.load_data_nmt(64, 10)


@pytest.fixture(scope="session")
def ctx():
    return mx.cpu()
