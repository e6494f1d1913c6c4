"""The chapter's optimisation: gradient clipping and Adam (`make_trainer`), the fused `ClipAdam`
update of the graph path, and the paper's warmup schedule (Vaswani et al. 2017, 5.3)."""

import math

import mxnet as mx
from mxnet import gluon

from .. import _gluon, kernels

CLIP_THETA = 1  # the chapter's threshold: ``grad_clipping(model, 1)`` (9.3.7)


def clip_threshold(num_tokens, per_token=False, theta=CLIP_THETA):
    """The global-norm limit on the gradient of the SUMMED loss, for all three clips
    (`grad_clipping`, `clip_global`, `ClipAdam`): the chapter's ``theta``; with ``per_token``
    (``clip_per_token``, not in the chapter) ``theta`` on the gradient of the MEAN loss per
    token, as fairseq's and PyTorch's recipes clip, i.e. ``theta * num_tokens`` on the sum's.
    ``num_tokens``: a host number, or a device array (the limit is then one too)."""
    return theta * num_tokens if per_token else theta


def clip_global(params, theta, ctxs=None):
    """Scale the gradients of `params` to global L2 norm at most theta on each device of `ctxs`
    (default: the first), in one pass (gluon's ``clip_global_norm``), no host sync: where
    `ClipAdam` does not apply. The chapter's own clip, with its host sync, is `grad_clipping`."""
    for ctx in ctxs or [params[0].list_ctx()[0]]:
        grads = [p.grad(ctx).as_nd_ndarray() for p in params]  # legacy views, same memory
        gluon.utils.clip_global_norm(grads, theta, check_isfinite=False)


class ClipAdam:
    """The fast path's update: the book's clipping and MXNet's Adam in fused operators.

    Same arithmetic as ``grad_clipping(model, theta); trainer.step(num_tokens)``: the gradient
    of the summed loss is scaled by ``theta / norm`` when its global norm exceeds theta, then
    Adam runs with ``rescale_grad = 1 / num_tokens``. Here the global norm is one
    ``multi_sum_sq`` over all gradients, the clip coefficient and ``1 / num_tokens`` become one
    (1,) array on the device that is Adam's ``rescale_grad``, and all parameters are updated in
    one operator on a CPU (`kernels.adam`: ``multi_adamw_update``'s arithmetic bit for bit, a
    contiguous pass per tensor), else by ``multi_adamw_update`` calls. No host sync. The
    trainer's own optimizer state, update counts and learning-rate schedule are used, so
    ``trainer.save_states`` and a resumed run see the same state as after ``trainer.step``.

    Weight decay: MXNet's Adam adds ``wd * weight`` to the rescaled gradient (L2), while
    ``multi_adamw_update`` decays the weight itself (AdamW). With ``wd == 0`` the two are the same
    update; with ``wd != 0`` the gradient is first rescaled and given ``wd * weight`` here, and
    the fused update runs with ``rescale_grad = 1`` and no decay: MXNet's Adam for any wd.

    A non-finite global norm (NaN or Inf in a gradient): that update is skipped (a non-finite
    ``rescale_grad`` makes ``multi_adamw_update`` leave the weights and the moments as they
    are) and counted on the device; `health` gives ``[skipped updates, first skipped update
    number]`` as a device array, which the training loop reads with the epoch's losses (no
    extra sync) and reports by raising FloatingPointError.

    Several devices (after ``trainer.allreduce_grads()`` has left the same summed gradient on
    each): every device's copy is clipped and updated the same way with that device's own Adam
    state, as ``trainer.update`` would.

    ``ClipAdam.supports(trainer)`` is False (use the unfused update) for anything but plain
    Adam updated by the workers (no update on a kvstore).
    """

    MAX_FUSED = 50  # multi_adamw_update's limit in MXNet 1.9 (more arrays crash)

    def __init__(self, trainer, params, theta, ctxs=None, *, per_token=False):
        opt = trainer.optimizer
        _gluon.init_kvstore(trainer)
        self.trainer, self.opt, self.theta, self.per_token = trainer, opt, theta, per_token
        self.indices = [_gluon.trainer_index(trainer, p) for p in params]
        self.devices = []  # per device: (device_id, weights, grads, means, vars)
        for ctx, updater in zip(ctxs or [params[0].list_ctx()[0]], _gluon.updaters(trainer)):
            weights = [p.data(ctx).as_nd_ndarray() for p in params]  # legacy views, same memory
            grads = [p.grad(ctx).as_nd_ndarray() for p in params]
            _gluon.set_optimizer_device(opt, ctx.device_id)
            states = updater.states
            for i, w in zip(self.indices, weights):
                if i not in states:
                    states[i] = opt.create_state_multi_precision(i, w)
                    updater.states_synced[i] = True
            self.devices.append((ctx.device_id, weights, grads, [states[i][0] for i in self.indices],
                                 [states[i][1] for i in self.indices]))
        # (2,) on the first device: [updates skipped for a non-finite norm, first such update]
        self._health = mx.nd.zeros((2,), ctx=self.devices[0][1][0].context)

    @staticmethod
    def supports(trainer):
        opt, setup = trainer.optimizer, _gluon.trainer_setup(trainer)
        one_device = setup.devices == 1 and setup.kvstore in ("device", None)
        return (type(opt) is mx.optimizer.Adam and not opt.multi_precision
                and not opt.clip_gradient and (one_device or setup.update_on_kvstore is False)
                and not setup.loss_scaler)

    def rescale(self, num_tokens, grads=None):
        """(1,): min(1, limit / global norm) / num_tokens, computed on the gradients' device,
        the limit `clip_threshold`'s (``theta``, or ``theta * num_tokens`` with ``per_token``:
        the clip of the mean's gradient); NaN when the global norm is not finite (the update
        is then skipped)."""
        grads = grads or self.devices[0][2]
        sum_sq = mx.nd.multi_sum_sq(*grads, num_arrays=len(grads))  # (num_params,)
        norm = mx.nd.sqrt(mx.nd.sum(sum_sq))  # (1,)
        if not isinstance(num_tokens, (int, float)):
            num_tokens = num_tokens.as_nd_ndarray().astype("float32").reshape((1,))
        limit = clip_threshold(num_tokens, self.per_token, self.theta)
        coef = mx.nd.minimum(limit / norm, 1.0)  # limit / norm only if norm > limit
        scale = _gluon.trainer_setup(self.trainer).scale
        if scale != 1:  # the Trainer's own rescale_grad, as trainer.step uses it
            coef = coef * scale
        rescale = coef / num_tokens
        return rescale + 0 * norm  # + 0 when the norm is finite, NaN when it is not

    def health(self):
        """(2,) device array: ``[updates skipped for a non-finite gradient norm, the number of
        the first one]`` (0 when none). Reading it is the caller's (one) host sync."""
        return self._health

    def __call__(self, num_tokens):
        opt = self.opt
        for k, (device_id, weights, grads, means, variances) in enumerate(self.devices):
            t, lrs, wds = _gluon.optimizer_step(opt, self.indices, device_id)  # per device
            bias = math.sqrt(1. - opt.beta2 ** t) / (1. - opt.beta1 ** t)  # as Adam.update
            lrs, rescale = [lr * bias for lr in lrs], self.rescale(num_tokens, grads)
            if k == 0:
                skipped = rescale != rescale  # (1,): 1 when NaN
                first = mx.nd.where(self._health[1:] > 0, self._health[1:], skipped * t)
                self._health[:] = mx.nd.concat(self._health[:1] + skipped, first, dim=0)
            if any(wds):  # MXNet's Adam: grad * rescale_grad + wd * weight, then the moments
                for g, w, wd in zip(grads, weights, wds):
                    g[:] = mx.nd.broadcast_mul(g, rescale) + wd * w
                rescale, wds = rescale * 0 + 1, [0.0] * len(wds)  # 1, or NaN to skip
            if kernels.adam(weights[0].context, weights, grads, means, variances, rescale, lrs,
                            wds, opt.beta1, opt.beta2, opt.epsilon):
                continue  # one operator, the same arithmetic, a pass per tensor (CPU)
            for i in range(0, len(weights), self.MAX_FUSED):  # 64 parameters: 2 calls
                part = slice(i, i + self.MAX_FUSED)
                mx.nd.contrib.multi_adamw_update(
                    weights[part], grads[part], means[part], variances[part], rescale, lrs[part],
                    wds[part], [1.0] * len(lrs[part]), beta1=opt.beta1, beta2=opt.beta2,
                    epsilon=opt.epsilon, out=weights[part])


def grad_clipping(model, theta):
    """Scale all gradients so that their global L2 norm is at most theta (d2l). `theta` may be
    a device array (`clip_threshold` per token): read after the norm, which waits anyway."""
    params = [p.data() for p in model.collect_params().values() if p.grad_req != "null"]
    norm = math.sqrt(sum((p.grad ** 2).sum() for p in params))
    theta = theta if isinstance(theta, (int, float)) else float(theta)
    if norm > theta:
        for param in params:
            param.grad[:] *= theta / norm


class WarmupInverseSqrt(mx.lr_scheduler.LRScheduler):
    """The paper's schedule (5.3) with its peak given: ``lr * min(step / warmup_steps,
    sqrt(warmup_steps / step))``, linear warmup then inverse-square-root decay."""

    def __init__(self, lr, warmup_steps):
        super().__init__(base_lr=lr)
        self.warmup_steps = warmup_steps

    def __call__(self, num_update):
        step = max(num_update, 1)
        return self.base_lr * min(step / self.warmup_steps, math.sqrt(self.warmup_steps / step))


def make_trainer(model, lr, warmup_steps=0, kvstore=None, *, beta1=0.9, beta2=0.999,
                 epsilon=1e-8):
    """The chapter's Adam trainer; with ``warmup_steps > 0`` on the paper's schedule.

    ``beta1``, ``beta2``, ``epsilon``: Adam's (keyword-only; the defaults are MXNet's, the
    chapter's; the paper's 5.3 uses 0.9, 0.98 and 1e-9). ``kvstore``: ``None``/``"device"``
    (gradients of several devices summed in this process) or a dist kvstore from
    `distributed.create_kvstore`. Updates never run on the kvstore
    (``update_on_kvstore=False``): see `distributed`.
    """
    params = {"learning_rate": lr, "beta1": beta1, "beta2": beta2, "epsilon": epsilon}
    if warmup_steps:
        params["lr_scheduler"] = WarmupInverseSqrt(lr, warmup_steps)
    return gluon.Trainer(model.collect_params(), "adam", params, kvstore=kvstore or "device",
                         update_on_kvstore=False)


def config_trainer(model, cfg, kvstore=None):
    """`make_trainer` with the learning rate, warmup and Adam settings of config `cfg`."""
    return make_trainer(model, cfg.lr, cfg.warmup_steps, kvstore, beta1=cfg.beta1,
                        beta2=cfg.beta2, epsilon=cfg.epsilon)
