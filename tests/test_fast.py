"""The fast path gives the faithful path's numbers; cached == uncached == batched decoding."""

import json
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as onp
import pytest
from conftest import trainable
from mxnet import autograd, gluon, init

import d2l_transformer as d2t

ROOT = Path(__file__).resolve().parents[1]
CTX = mx.cpu()


@pytest.fixture(scope="module")
def data():
    d2t.set_seed(0)
    return d2t.load_data_nmt(16, 10, 200)


def _model(src_vocab, tgt_vocab):
    d2t.set_seed(0)
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    model.initialize(init.Xavier(), ctx=CTX)
    return model


def _steps(model, batches, fast):
    """Run the train step of train_s2s_ch8 (faithful or fast) on fixed batches; per-step losses
    and the trainer."""
    trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.005})
    fast_step = d2t.training.steps._fast_step(model, trainer, d2t.MaskedSoftmaxCELoss())
    losses = []
    for X, X_vlen, Y, Y_vlen in batches:
        Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
        if fast:
            l, _ = fast_step(X, X_vlen, Y_input, Y_label, Y_vlen)
        else:
            with autograd.record():
                Y_hat, _ = model(X, Y_input, X_vlen, Y_vlen)
                l = d2t.MaskedSoftmaxCELoss()(Y_hat, Y_label, Y_vlen)
            l.backward()
            d2t.grad_clipping(model, 1)
            trainer.step(Y_vlen.sum())
            l = l.sum()
        losses.append(float(l))
    return losses, trainer


def test_fast_equals_faithful_per_step(data):
    src_vocab, tgt_vocab, it = data
    batches = [b for _, b in zip(range(4), it)]
    X, X_vlen, Y, Y_vlen = batches[0]
    models = [_model(src_vocab, tgt_vocab) for _ in range(2)]
    for model in models:  # finish the deferred initialisation imperatively
        model(X, Y[:, :-1], X_vlen, Y_vlen - 1)
    for a, b in zip(models[0].collect_params().values(),
                    models[1].collect_params().values()):  # identical weights
        b.set_data(a.data())
    slow, slow_trainer = _steps(models[0], batches, fast=False)
    fast, fast_trainer = _steps(models[1], batches, fast=True)
    assert slow[0] > 1.0 and slow[-1] < slow[0]
    onp.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)
    for a, b in zip(models[0].collect_params().values(), models[1].collect_params().values()):
        onp.testing.assert_allclose(b.data().asnumpy(), a.data().asnumpy(), rtol=1e-4, atol=1e-5)
    # ClipAdam keeps the trainer's own state: same update counts and Adam moments. A trainer
    # indexes parameters by their sorted names, which differ between the two models (global
    # name counters), so each parameter's state is looked up through its own trainer's index.
    assert fast_trainer._optimizer.num_update == slow_trainer._optimizer.num_update == 4
    for a, b in zip(trainable(models[0]), trainable(models[1])):
        slow_state = slow_trainer._updaters[0].states[slow_trainer._param2idx[a.name]]
        fast_state = fast_trainer._updaters[0].states[fast_trainer._param2idx[b.name]]
        for x, y in zip(slow_state, fast_state):  # Adam's mean and variance
            onp.testing.assert_allclose(y.asnumpy(), x.asnumpy(), rtol=1e-4,
                                        atol=1e-6 * float(abs(x).max().asscalar()) + 1e-12,
                                        err_msg=a.name)


def test_clip_adam_applies_and_clips():
    """The fused update is used for the chapter's Adam; it clips the gradient to norm 1 as
    `grad_clipping` does, before dividing by the number of tokens."""
    p = gluon.Parameter("w", shape=(3,))
    p.initialize(ctx=CTX)
    trainer = gluon.Trainer([p], "adam", {"learning_rate": 0.1})
    assert d2t.ClipAdam.supports(trainer)
    assert not d2t.ClipAdam.supports(gluon.Trainer([p], "sgd", {"learning_rate": 0.1}))
    p.grad()[:] = mx.np.array([30.0, 40.0, 0.0])  # norm 50 -> clipped to norm 1
    update = d2t.ClipAdam(trainer, [p], 1)
    rescale = update.rescale(mx.np.array(2.0)).asnumpy()
    onp.testing.assert_allclose(rescale, [1 / 50 / 2], rtol=1e-6)
    p.grad()[:] = mx.np.array([0.3, 0.4, 0.0])  # norm 0.5: not clipped
    onp.testing.assert_allclose(update.rescale(mx.np.array(2.0)).asnumpy(), [0.5], rtol=1e-6)


def test_hybridized_second_call_equals_first(data):
    src_vocab, tgt_vocab, it = data
    model = _model(src_vocab, tgt_vocab)
    graph = d2t.TrainGraph(model)
    graph.hybridize(static_alloc=True, static_shape=True)
    X, X_vlen, Y, Y_vlen = next(iter(it))
    args = (X, X_vlen, Y[:, :-1], Y[:, 1:], Y_vlen - 1)
    first, second = graph(*args).asnumpy(), graph(*args).asnumpy()
    onp.testing.assert_array_equal(first, second)


def test_fast_training_summary(data):
    src_vocab, tgt_vocab, it = data
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    summary = d2t.train_s2s_ch8(model, it, 0.005, 2, CTX, fast=True)
    assert 0 < summary["loss"] < 1 and summary["tokens_per_sec"] > 0


def _runs_from_seed(data, reduction="book"):
    """Per-batch losses of `train_s2s_ch8` (faithful, then fast) from seed 3, 3 batches, 2
    epochs, each run with its own `MaskedSoftmaxCELoss(reduction=...)`; and the last model."""
    src_vocab, tgt_vocab, it = data
    batches = [b for _, b in zip(range(3), it)]
    runs = []
    for fast in (False, True):
        d2t.set_seed(3)
        model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
        losses = []
        d2t.train_s2s_ch8(model, batches, 0.005, 2, CTX, fast=fast, report_every=1,
                          on_batch=lambda epoch, done, sums, out=losses:
                          sums and out.append(sums[0] / sums[1]),
                          loss=d2t.MaskedSoftmaxCELoss(reduction=reduction))
        runs.append(losses)
    assert len(runs[0]) == 6 and runs[0][-1] < runs[0][0]
    return runs, model, batches


def test_same_seed_same_run_fast_and_faithful(data):
    """train_s2s_ch8 from the same seed, no weights copied: the fast path initialises the
    deferred parameters in the faithful order, so every batch's loss is the same."""
    runs, _, _ = _runs_from_seed(data)
    onp.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)


def test_fast_training_leaves_the_callers_objects_their_classes(data):
    """The fast path puts its kernels in the traced graph, not on the caller's objects: after
    `train_s2s_ch8(fast=True)` every block of the model, and the loss, is of the class it was
    built with, with no attribute of the seam's left on it."""
    from d2l_transformer._graphs import walk

    src_vocab, tgt_vocab, it = data
    batches = [b for _, b in zip(range(2), it)]
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    loss = d2t.MaskedSoftmaxCELoss(0.1, reduction="token")
    built = [(block, type(block)) for block in walk(model)]
    d2t.train_s2s_ch8(model, batches, 0.005, 1, CTX, fast=True, loss=loss)
    assert [type(block) for block, _ in built] == [cls for _, cls in built]
    assert type(loss) is d2t.MaskedSoftmaxCELoss
    assert not any("sqrt_d" in vars(block) for block, _ in built)


def test_fast_equals_faithful_with_d2l_1_0_mean_loss(data):
    """d2l 1.0's loss (one mean per batch, ``trainer.step(1)``) trains the same on both paths;
    several devices refuse it (each part would be its own mean)."""
    runs, model, batches = _runs_from_seed(data, "mean")
    assert runs[0][0] < 10  # a batch's mean, not a sum over its tokens
    onp.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)
    with pytest.raises(ValueError, match="one device"):
        d2t.train_s2s_ch8(model, batches, 0.005, 1, [mx.cpu(0), mx.cpu(1)],
                          loss=d2t.MaskedSoftmaxCELoss(reduction="mean"))


class _HostReads:
    """Counts every read of a device array by the host (asnumpy, item, float, asscalar, print
    all copy through MXNDArraySyncCopyToCPU) and every explicit wait."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("MXNDArraySyncCopyToCPU", "MXNDArrayWaitToRead", "MXNDArrayWaitAll"):
            monkeypatch.setattr(mx.base._LIB, name, self._wrap(getattr(mx.base._LIB, name)))

    def _wrap(self, real):
        def call(*args):
            self.count += 1
            return real(*args)
        return call


def test_fast_loop_with_progress_bar_reads_the_device_once_per_report(data, monkeypatch):
    """No per-batch host sync on the fast path, progress bar on: the bar shows the sums the
    loop reads every `report_every` batches and at each epoch's end."""
    import io

    from d2l_transformer.training.progress import ProgressBar

    src_vocab, tgt_vocab, it = data
    batches = [b for b in it]  # 13 batches of 16 pairs
    epochs, every = 2, 5
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    d2t.train_s2s_ch8(model, batches[:1], 0.005, 1, CTX, fast=True)  # initialised and traced
    trainer = d2t.make_trainer(model, 0.005)
    counts = {}
    for fast, bar in ((True, True), (True, False), (False, False)):
        out = io.StringIO()
        progress = ProgressBar(epochs, len(batches), file=out) if bar else None
        with monkeypatch.context() as mp:
            reads = _HostReads(mp)
            summary = d2t.train_s2s_ch8(model, batches, 0.005, epochs, CTX, fast=fast,
                                        trainer=trainer, on_batch=progress, report_every=every)
        counts[fast, bar] = reads.count
        if bar:
            progress.close()
            assert f"loss {summary['loss']:.4f}" in out.getvalue()
            assert f"{epochs * len(batches)}/{epochs * len(batches)}" in out.getvalue()
    per_epoch = -(-len(batches) // every)  # ceil: reads at batches 5 and 10, and at the end
    assert counts[True, True] <= epochs * per_epoch + 2, counts
    assert counts[True, False] <= epochs + 2, counts  # without a bar: the epoch's end only
    assert counts[False, False] >= epochs * len(batches), counts  # the imperative loop: per batch


def test_batches_by_length_train_a_dynamic_graph_to_the_same_numbers(data):
    """Batches by length (`BucketBatches`, many shapes) train a graph that plans its buffers
    per call, and batches of one shape a static one (`steps.static_batches`, the one rule);
    over batches whose shape changes at every step, both give the same losses and weights,
    bit for bit: the switch changes memory, not numbers."""
    src_vocab, tgt_vocab, it = data
    pairs = [(list(X[i, :int(Xl[i])].asnumpy().astype(int)),
              list(Y[i, :int(Yl[i])].asnumpy().astype(int))) for X, Xl, Y, Yl in it
             for i in range(X.shape[0])]
    buckets = d2t.data.BucketBatches([s for s, _ in pairs], [t for _, t in pairs], 16, 4,
                                     src_vocab["<pad>"], tgt_vocab["<pad>"])
    assert len(buckets.shapes) > 2 and not d2t.training.steps.static_batches(buckets)
    assert d2t.training.steps.static_batches(it)
    onp.random.seed(0)
    batches = list(buckets)  # one epoch
    assert len({b[0].shape for b in batches}) > 2
    runs = []
    for static in (True, False):
        model = _model(src_vocab, tgt_vocab)
        trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.005})
        step = d2t.training.steps._fast_step(model, trainer, d2t.MaskedSoftmaxCELoss(),
                                             static=static)
        losses = [float(step(X, Xl, Y[:, :-1], Y[:, 1:], Yl - 1)[0]) for X, Xl, Y, Yl in batches]
        weights = model.decoder.dense.weight.data().asnumpy()
        runs.append((losses, weights))
    assert runs[0][0] == runs[1][0]
    assert onp.array_equal(runs[0][1], runs[1][1])


def test_cached_uncached_batched_greedy_identical(data):
    """The translator's batched greedy decoding (one key/value-cache step graph) == each
    sentence alone (`predict_s2s_ch8`) == the chapter's state re-projecting its cached inputs ==
    the whole prefix recomputed every step, on 50 sentences of a trained model."""
    import decoding_reference as reference

    src_vocab, tgt_vocab, it = data
    d2t.set_seed(0)
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    d2t.train_s2s_ch8(model, it, 0.005, 15, CTX, fast=True)
    sentences = []
    for X, X_vlen, _, _ in it:
        for row, n in zip(X.asnumpy().tolist(), X_vlen.asnumpy().tolist()):
            sentences.append(" ".join(src_vocab.to_tokens([int(t) for t in row[:int(n) - 1]])))
    sentences = sentences[:50]
    model.hybridize(False)  # the references decode imperatively, as the chapter does
    one = [d2t.predict_s2s_ch8(model, s, src_vocab, tgt_vocab, 10, CTX) for s in sentences]
    assert len(set(one)) > 5  # non-trivial outputs
    translator = d2t.Translator(model, src_vocab, tgt_vocab, CTX, num_steps=10, max_length=10,
                                suppress=False)  # nothing masked, as the chapter's argmax
    tokens = [s.split(" ") for s in sentences]  # as predict_s2s_ch8 splits ("" -> [""])
    batched = [" ".join(h.tokens) for h in translator.translate(tokens)]
    assert batched == one
    for mode in ("state", "prefix"):
        ref = [" ".join(reference.greedy(model, t, src_vocab, tgt_vocab, 10, CTX, mode))
               for t in tokens]
        assert ref == one, mode


@pytest.mark.parametrize("where", ["no kernels scope", "gpu graph", "kernels switched off"])
def test_masked_softmax_in_graph_equals_imperative(where, monkeypatch):
    """The fast path's graph attention (one softmax(length=...), sqrt(d) a Python float:
    `GraphDotProductAttention`) is in every graph a `FastGraph` traces without the attention kernel —
    outside `kernels.fused`, a GPU graph, the kernels switched off — on purpose, and gives the
    chapter's -1e6-fill attention: valid lengths of both shapes, causal with and without kept
    positions."""
    from d2l_transformer import kernels
    from d2l_transformer._gluon import graph_json
    from d2l_transformer.model import causal_valid_length
    from d2l_transformer.training.fused import FastGraph, GraphDotProductAttention

    scope = {"no kernels scope": None, "gpu graph": mx.gpu(0), "kernels switched off": CTX}[where]
    if where == "kernels switched off":
        monkeypatch.setenv("D2L_TRANSFORMER_KERNELS", "0")
    X = mx.np.random.normal(size=(4, 3, 16))
    K = mx.np.random.normal(size=(4, 5, 16))
    for valid_length in (None, mx.np.array([1, 2, 5, 3]), causal_valid_length(X, 2)):
        attention = d2t.MultiHeadAttention(16, 4, 0.0)
        attention.initialize()
        args = (X, K, K) if valid_length is None else (X, K, K, valid_length)
        expected = attention(*args).asnumpy()
        attention.hybridize()
        fast = FastGraph(attention)
        if scope is None:
            got = fast(*args)
        else:
            with kernels.fused(scope):
                assert not kernels.active()
                got = fast(*args)
        graph = graph_json(fast.traced)
        assert type(fast.traced.attention) is GraphDotProductAttention
        assert "shape_array" not in graph and "d2t_" not in graph  # sqrt(d) a float; no kernel
        assert ('"use_length": "True"' in graph) == (valid_length is not None), graph
        assert type(attention.attention) is d2t.DotProductAttention  # the class it was built with
        onp.testing.assert_allclose(got.asnumpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_bench_quick_prints_every_row(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick",
                          "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    for row in ("train faithful", "train fast", "train ratio", "key/value cache", "batch=1 ",
                "batch=64", "batch=256", "no fused kernels", "fast/fast without kernels",
                "Translator, greedy", "Translator, beam 4"):
        assert row in out, row
    figures = json.loads((tmp_path / "b.json").read_text())
    assert figures["train_fast"]["value"] > 0 and figures["(a) train ratio fast/faithful"] > 0
