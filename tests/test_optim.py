"""The fused update `ClipAdam` against the chapter's ``grad_clipping`` + MXNet's Adam
(``trainer.step``), with and without weight decay; non-finite gradients are reported."""

import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, gluon

import d2l_transformer as d2t
from d2l_transformer.training.optim import grad_clipping


def _net(seed):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="tanh", in_units=5), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    return net


def _params(net):
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def _backward(net, X, scale):
    with autograd.record():
        loss = (net(X) ** 2).sum() * scale  # scale: gradients above or below the clip norm
    loss.backward()


@pytest.mark.parametrize("wd,per_token", [(0.0, False), (1e-2, False), (0.0, True)])
def test_clip_adam_equals_clipping_then_trainer_step(wd, per_token):
    """per_token: the clip of the mean loss's gradient (norm 1 per token) is the chapter's
    clipping of the summed gradient at num_tokens."""
    rng = onp.random.RandomState(0)
    nets = [_net(1), _net(2)]
    for a, b in zip(_params(nets[0]), _params(nets[1])):
        b.set_data(a.data())
    opt = {"learning_rate": 0.05, "wd": wd}
    if per_token:  # with the paper's Adam settings (config fields beta2, epsilon)
        opt.update(beta2=0.98, epsilon=1e-9)
    plain = gluon.Trainer(nets[0].collect_params(), "adam", dict(opt))
    fused_trainer = gluon.Trainer(nets[1].collect_params(), "adam", dict(opt))
    assert d2t.ClipAdam.supports(fused_trainer)
    fused = d2t.ClipAdam(fused_trainer, _params(nets[1]), 1, per_token=per_token)
    for step in range(6):
        X = mx.np.array(rng.normal(size=(4, 5)), dtype="float32")
        scale = 10.0 if step % 2 else 0.01  # clipped, then not clipped
        num_tokens = 7 + step
        _backward(nets[0], X, scale)
        grad_clipping(nets[0], num_tokens if per_token else 1)
        plain.step(num_tokens)
        _backward(nets[1], X, scale)
        fused(mx.np.array(float(num_tokens)))
    # float32 rounding, amplified by Adam where gradients are tiny: ~6e-6 here; the decoupled
    # decay of multi_adamw_update (what wd did before) is ~0.5 away with wd = 1e-2
    for a, b in zip(_params(nets[0]), _params(nets[1])):
        onp.testing.assert_allclose(b.data().asnumpy(), a.data().asnumpy(), rtol=1e-4, atol=3e-5,
                                    err_msg=a.name)


def _adam_run(monkeypatch, kernels_on, wd):
    """Weights and Adam's moments after 4 `ClipAdam` updates of a net with a large and a
    small layer (the large one split between the threads), kernels on or off."""
    monkeypatch.setenv("D2L_TRANSFORMER_KERNELS", "1" if kernels_on else "0")
    mx.random.seed(5)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(300, activation="tanh", in_units=400), gluon.nn.Dense(3, in_units=300))
    net.initialize(mx.init.Xavier())
    params = _params(net)
    trainer = gluon.Trainer(net.collect_params(), "adam",
                            {"learning_rate": 0.01, "wd": wd, "beta2": 0.98, "epsilon": 1e-9})
    update = d2t.ClipAdam(trainer, params, 1)
    rng = onp.random.RandomState(0)
    for step in range(4):
        _backward(net, mx.np.array(rng.normal(size=(6, 400)), dtype="float32"),
                  10.0 if step % 2 else 0.01)
        update(mx.np.array(5.0 + step))
    states = [s for st in trainer._updaters[0].states.values() for s in st]
    return [p.data().asnumpy() for p in params] + [s.asnumpy() for s in states]


@pytest.mark.parametrize("wd", [0.0, 1e-2])
def test_the_update_in_one_kernel_is_multi_adamw_update_bit_for_bit(monkeypatch, wd):
    """On a CPU with the kernels, `ClipAdam` updates every parameter in one operator
    (`kernels.adam`): the same weights and moments, bit for bit, as MXNet's
    multi_adamw_update (the kernels off), on one thread and on every core."""
    from d2l_transformer import kernels
    from d2l_transformer._runtime import threads
    if not kernels.load():
        pytest.skip("the kernels are not built here (no C++ compiler)")
    reference = _adam_run(monkeypatch, False, wd)
    ran, adam = [], kernels.adam
    monkeypatch.setattr(kernels, "adam", lambda *args: ran.append(adam(*args)) or ran[-1])
    try:
        for work in (1, threads.BIG_WORK):  # one thread, then every core
            threads.size_for(work)
            got = _adam_run(monkeypatch, True, wd)
            assert all((a == b).all() for a, b in zip(got, reference)), work
    finally:
        threads.size_for(1)
    assert ran == [True] * 8  # the kernel updated: 4 steps, twice
    assert any((a != b).any() for a, b in zip(_adam_run(monkeypatch, True, wd + 1e-3),
                                                reference))  # the comparison can tell


def test_weight_decay_makes_a_difference_the_fused_update_reproduces():
    """The test above would pass if wd were ignored on both sides: check it is not."""
    finals = []
    for wd in (0.0, 1e-2):
        net = _net(3)
        trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.05, "wd": wd})
        update = d2t.ClipAdam(trainer, _params(net), 1)
        X = mx.np.ones((2, 5))
        for _ in range(3):
            _backward(net, X, 0.01)
            update(4.0)
        finals.append(_params(net)[0].data().asnumpy())
    assert abs(finals[0] - finals[1]).max() > 1e-4


def test_non_finite_norm_skips_the_update_and_is_counted():
    net = _net(4)
    params = _params(net)
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.05})
    update = d2t.ClipAdam(trainer, params, 1)
    X = mx.np.ones((2, 5))
    _backward(net, X, 1.0)
    update(4.0)  # update 1: finite
    before = [p.data().asnumpy().copy() for p in params]
    for bad in (float("nan"), float("inf")):  # updates 2 and 3
        _backward(net, X, 1.0)
        params[0].grad()[0, 0] = bad
        update(4.0)
    for p, w in zip(params, before):  # skipped: the weights did not move, nor became NaN
        onp.testing.assert_array_equal(p.data().asnumpy(), w)
    onp.testing.assert_array_equal(update.health().asnumpy(), [2, 2])
    _backward(net, X, 1.0)
    update(4.0)  # finite again: trains on, the count stays
    assert abs(params[0].data().asnumpy() - before[0]).max() > 0
    onp.testing.assert_array_equal(update.health().asnumpy(), [2, 2])


def test_fast_loop_raises_on_a_non_finite_gradient_norm():
    """The loop reads the count with the epoch's losses and raises, naming the update."""
    src_vocab, tgt_vocab, it = d2t.load_data_nmt(16, 10, 100)
    batches = [b for _, b in zip(range(3), it)]
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    epochs = []
    d2t.train_s2s_ch8(model, batches, 0.005, 1, mx.cpu(), fast=True,
                      on_epoch=lambda e, loss: epochs.append(e))
    assert epochs == [1]
    embed = model.encoder.embed.weight
    embed.set_data(embed.data() * float("nan"))  # every gradient NaN from now on
    trainer = d2t.make_trainer(model, 0.005)
    with pytest.raises(FloatingPointError, match=r"not finite .* 3 of 3 updates .*first at update 1"):
        d2t.train_s2s_ch8(model, batches, 0.005, 2, mx.cpu(), fast=True, trainer=trainer,
                          on_epoch=lambda e, loss: epochs.append(e))
    assert epochs == [1]  # raised before the epoch's callback (no checkpoint of it)


def test_config_trainer_takes_adams_settings_from_the_config():
    from d2l_transformer.training.optim import config_trainer

    net = _net(0)
    cfg = d2t.TINY.replace(lr=0.01, warmup_steps=10, beta1=0.8, beta2=0.98, epsilon=1e-9)
    opt = config_trainer(net, cfg)._optimizer
    assert type(opt) is mx.optimizer.Adam
    assert (opt.beta1, opt.beta2, opt.epsilon) == (0.8, 0.98, 1e-9)
    assert opt.lr_scheduler(10) == pytest.approx(0.01)  # the warmup's peak
    chapter = config_trainer(net, d2t.CHAPTER)._optimizer  # MXNet's defaults: the chapter's
    assert (chapter.beta1, chapter.beta2, chapter.epsilon, chapter.lr) == (0.9, 0.999, 1e-8, 0.005)
