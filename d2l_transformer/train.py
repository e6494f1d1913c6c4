"""9.3.7 Training with the semantics of d2l's `train_s2s_ch8` (the chapter calls it)."""

import math
import random
import time

import mxnet as mx
import numpy as onp
from mxnet import autograd, gluon, init

from . import kernels
from .config import TransformerConfig
from .distributed import GlobalSum, is_distributed
from .model import EncoderDecoder, TransformerDecoder, TransformerEncoder


def set_seed(seed):
    """Seed Python, NumPy (Gluon's shuffling) and MXNet, so that a run can be repeated."""
    random.seed(seed)
    onp.random.seed(seed)
    mx.random.seed(seed)


def build_model(cfg: TransformerConfig, src_vocab_size, tgt_vocab_size):
    """The chapter's EncoderDecoder; the only function that reads a config.

    ``cfg.exact_chapter`` builds the decoder with ``src_vocab_size`` as the book does (bug 1);
    otherwise its output layer has ``tgt_vocab_size`` entries.
    """
    args = (cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_heads, cfg.num_layers, cfg.dropout)
    variants = {"pre_norm": cfg.pre_norm, "norm": cfg.norm, "fixnorm": cfg.fixnorm,
                "layerdrop": cfg.layerdrop, "drophead": cfg.drophead, "fused_qkv": cfg.fused_qkv}
    encoder = TransformerEncoder(src_vocab_size, *args, exact_chapter=cfg.exact_chapter,
                                 **variants)
    decoder_vocab_size = src_vocab_size if cfg.exact_chapter else tgt_vocab_size
    decoder = TransformerDecoder(decoder_vocab_size, *args, exact_chapter=cfg.exact_chapter,
                                 **variants)
    return EncoderDecoder(encoder, decoder)


class MaskedSoftmaxCELoss(gluon.loss.SoftmaxCELoss):
    """Softmax cross-entropy with positions at or after `valid_length` weighted 0 (d2l).

    pred: (batch, seq_len, vocab); label: (batch, seq_len); valid_length: (batch,).
    Returns (batch,): each sequence's loss averaged over all seq_len positions, padding
    included, which is why the book's loss is the per-token cross-entropy / seq_len.

    ``label_smoothing`` = eps > 0 (not in the chapter; the paper's 5.4 uses 0.1) trains against
    ``(1 - eps) * one_hot(label) + eps / vocab``: loss ``(1 - eps) * nll + eps * mean(-log p)``.
    """

    def __init__(self, label_smoothing=0.0, **kwargs):
        super().__init__(**kwargs)
        self.label_smoothing = label_smoothing

    def hybrid_forward(self, F, pred, label, valid_length):
        """F: works imperatively and inside the fast path's hybridized graph (issue 4)."""
        weights = F.np.expand_dims(F.np.ones_like(label), axis=-1)  # (batch, seq_len, 1)
        weights = F.npx.sequence_mask(weights, valid_length, True, axis=1)
        if not self.label_smoothing:
            return super().hybrid_forward(F, pred, label, weights)
        eps = self.label_smoothing
        log_p = F.npx.log_softmax(pred)  # (batch, seq_len, vocab)
        nll = -F.npx.pick(log_p, label, axis=-1, keepdims=True)  # (batch, seq_len, 1)
        smooth = -log_p.mean(axis=-1, keepdims=True)  # (batch, seq_len, 1)
        loss = ((1 - eps) * nll + eps * smooth) * weights  # (batch, seq_len, 1)
        return loss.mean(axis=(1, 2))  # (batch,), as SoftmaxCELoss averages


class TrainGraph(gluon.HybridBlock):
    """Fast path (issue 4): encoder + causal graph decoder + masked loss as ONE hybrid graph.

    Holds the model's own encoder/decoder (no copied model code); returns the (batch,) loss.
    """

    def __init__(self, model, loss=None, **kwargs):
        super().__init__(**kwargs)
        self.encoder = model.encoder
        self.decoder = model.decoder
        self.loss = loss or MaskedSoftmaxCELoss()

    def hybrid_forward(self, F, X, X_vlen, Y_input, Y_label, Y_vlen):
        enc_outputs = self.encoder(X, X_vlen)  # (batch, num_steps, d)
        Y_hat = self.decoder(Y_input, enc_outputs, X_vlen)  # (batch, num_steps - 1, vocab)
        return self.loss(Y_hat, Y_label, Y_vlen)  # (batch,)


def _clip_global(params, theta):
    """One-pass global-norm clipping (gluon.utils.clip_global_norm), no host sync here."""
    grads = [p.grad().as_nd_ndarray() for p in params]  # legacy views, same memory
    gluon.utils.clip_global_norm(grads, theta, check_isfinite=False)


class ClipAdam:
    """The fast path's update (issue 4): the book's clipping and Adam in two fused operators.

    Same arithmetic as ``grad_clipping(model, theta); trainer.step(num_tokens)``: the gradient
    of the summed loss is scaled by ``theta / norm`` when its global norm exceeds theta, then
    Adam runs with ``rescale_grad = 1 / num_tokens``. Here the global norm is one
    ``multi_sum_sq`` over all gradients, the clip coefficient and ``1 / num_tokens`` become one
    (1,) array on the device that is Adam's ``rescale_grad``, and all parameters are updated by
    one ``multi_adamw_update`` (AdamW with eta=1 and the trainer's wd is Adam). No host sync.
    The trainer's own optimizer state, update counts and learning-rate schedule are used, so
    ``trainer.save_states`` and a resumed run see the same state as after ``trainer.step``.

    Several devices (issue 6, after ``trainer.allreduce_grads()`` has left the same summed
    gradient on each): every device's copy is clipped and updated the same way with that
    device's own Adam state, as ``trainer.update`` would.

    ``ClipAdam.supports(trainer)`` is False (use the unfused update) for anything but plain
    Adam updated by the workers (no update on a kvstore).
    """

    MAX_FUSED = 50  # multi_adamw_update's limit in MXNet 1.9 (more arrays crash)

    def __init__(self, trainer, params, theta, ctxs=None):
        opt = trainer._optimizer
        if not trainer._kv_initialized:
            trainer._init_kvstore()
        if trainer._params_to_init:
            trainer._init_params()
        self.trainer, self.opt, self.theta = trainer, opt, theta
        self.indices = [trainer._param2idx[p.name] for p in params]
        self.devices = []  # per device: (device_id, weights, grads, means, vars)
        for ctx, updater in zip(ctxs or [params[0].list_ctx()[0]], trainer._updaters):
            weights = [p.data(ctx).as_nd_ndarray() for p in params]  # legacy views, same memory
            grads = [p.grad(ctx).as_nd_ndarray() for p in params]
            opt._set_current_context(ctx.device_id)
            states = updater.states
            for i, w in zip(self.indices, weights):
                if i not in states:
                    states[i] = opt.create_state_multi_precision(i, w)
                    updater.states_synced[i] = True
            self.devices.append((ctx.device_id, weights, grads, [states[i][0] for i in self.indices],
                                 [states[i][1] for i in self.indices]))

    @staticmethod
    def supports(trainer):
        opt = trainer._optimizer
        one_device = len(trainer._contexts) == 1 and \
            trainer._kvstore_params.get("kvstore") in ("device", None)
        return (type(opt) is mx.optimizer.Adam and not opt.multi_precision
                and not opt.clip_gradient and (one_device or trainer._update_on_kvstore is False)
                and not getattr(trainer, "_amp_loss_scaler", None))

    def rescale(self, num_tokens, grads=None):
        """(1,): min(1, theta / global norm) / num_tokens, computed on the gradients' device."""
        grads = grads or self.devices[0][2]
        sum_sq = mx.nd.multi_sum_sq(*grads, num_arrays=len(grads))  # (num_params,)
        norm = mx.nd.sqrt(mx.nd.sum(sum_sq))  # (1,)
        coef = mx.nd.minimum(self.theta / norm, 1.0)  # theta / norm only if norm > theta
        if isinstance(num_tokens, (int, float)):
            return coef / num_tokens
        return coef / num_tokens.as_nd_ndarray().astype("float32")

    def __call__(self, num_tokens):
        opt = self.opt
        for device_id, weights, grads, means, variances in self.devices:
            opt._set_current_context(device_id)  # the update counts are per device, as in MXNet
            opt._update_count(self.indices)
            t = opt._index_update_count[self.indices[0]]
            bias = math.sqrt(1. - opt.beta2 ** t) / (1. - opt.beta1 ** t)  # as Adam.update
            lrs = [lr * bias for lr in opt._get_lrs(self.indices)]
            wds, rescale = opt._get_wds(self.indices), self.rescale(num_tokens, grads)
            for i in range(0, len(weights), self.MAX_FUSED):  # 64 parameters: 2 calls
                part = slice(i, i + self.MAX_FUSED)
                mx.nd.contrib.multi_adamw_update(
                    weights[part], grads[part], means[part], variances[part], rescale, lrs[part],
                    wds[part], [1.0] * len(lrs[part]), beta1=opt.beta1, beta2=opt.beta2,
                    epsilon=opt.epsilon, out=weights[part])


def grad_clipping(model, theta):
    """Scale all gradients so that their global L2 norm is at most theta (d2l)."""
    params = [p.data() for p in model.collect_params().values() if p.grad_req != "null"]
    norm = math.sqrt(sum((p.grad ** 2).sum() for p in params))
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


def make_trainer(model, lr, warmup_steps=0, kvstore=None):
    """The chapter's Adam trainer; with ``warmup_steps > 0`` on the paper's schedule.

    ``kvstore`` (issue 6): ``None``/``"device"`` (gradients of several devices summed in this
    process) or a dist kvstore from `distributed.create_kvstore`. Updates never run on the
    kvstore (``update_on_kvstore=False``): see `distributed`.
    """
    params = {"learning_rate": lr}
    if warmup_steps:
        params["lr_scheduler"] = WarmupInverseSqrt(lr, warmup_steps)
    return gluon.Trainer(model.collect_params(), "adam", params, kvstore=kvstore or "device",
                         update_on_kvstore=False)


def _fast_step(model, trainer, loss):
    """The fast path's train step (issue 4): one hybridized graph, `ClipAdam` (or one-pass
    clipping + ``trainer.step`` where it does not apply); loss and token count stay on the
    device. Same signature and meaning as the faithful step in `train_s2s_ch8`."""
    graph = TrainGraph(model, loss)
    graph.hybridize(static_alloc=True, static_shape=True)
    params = [p for p in model.collect_params().values() if p.grad_req != "null"]
    update = []  # the ClipAdam, built after the first step's deferred initialisation

    def step(X, X_vlen, Y_input, Y_label, Y_vlen):
        if any(p._data is None for p in params):  # deferred init in the faithful order
            model(X, Y_input, X_vlen, Y_vlen)
        with autograd.record(), kernels.fused(X.ctx):  # traced once, with the CPU kernels
            l = graph(X, X_vlen, Y_input, Y_label, Y_vlen)  # (batch,)
        l.backward()
        num_tokens = Y_vlen.sum()
        if not update:
            update.append(ClipAdam(trainer, params, 1) if ClipAdam.supports(trainer) else None)
        if update[0] is not None:
            update[0](num_tokens)
        else:
            _clip_global(params, 1)
            trainer.step(num_tokens)
        return l.sum(), num_tokens  # stay on the device
    return step


def _parallel_step(model, trainer, loss, ctxs, fast, global_tokens):
    """Data parallelism (issue 6): the same step as on one device, on several at once.

    The batch is split across ``ctxs`` (`gluon.utils.split_and_load`); every device runs the
    forward and backward passes on its part (the hybridized `TrainGraph` with ``fast``);
    ``trainer.allreduce_grads()`` sums the gradients over the devices and, with a dist kvstore,
    over all workers, and leaves the sum on every device; each device clips that same sum by
    its global norm (so all copies stay equal); ``trainer.update`` divides by the global token
    count. With the same weights and batches the update equals the single-device one on the
    whole batch (tests/test_distributed.py, 1e-5).
    """
    params = [p for p in model.collect_params().values() if p.grad_req != "null"]
    update = []  # the ClipAdam, built after the first allreduce (the kvstore exists then)
    if fast:
        graph = TrainGraph(model, loss)
        graph.hybridize(static_alloc=True, static_shape=True)
    else:
        def graph(X, X_vlen, Y_input, Y_label, Y_vlen):
            return loss(model(X, Y_input, X_vlen, Y_vlen)[0], Y_label, Y_vlen)

    def step(X, X_vlen, Y_input, Y_label, Y_vlen):
        used = ctxs[:min(len(ctxs), X.shape[0])]  # a last batch smaller than the device count
        parts = [gluon.utils.split_and_load(a, used, even_split=False)
                 for a in (X, X_vlen, Y_input, Y_label, Y_vlen)]
        if any(p._data is None for p in params):  # deferred init in the faithful order
            model(*(parts[i][0] for i in (0, 2, 1, 4)))
        with autograd.record(), kernels.fused(used):
            losses = [graph(*part) for part in zip(*parts)]  # (batch_i,) per device
        autograd.backward(losses)
        for c in ctxs[len(used):]:  # devices without data add nothing to the sum
            for p in params:
                p.grad(c)[:] = 0
                p.data(c)._fresh_grad = True  # and are updated like the others
        trainer.allreduce_grads()  # every device now holds the sum over devices and workers
        num_tokens = float(Y_vlen.sum())
        if not update:  # fused clip + Adam on every device (issue 4's ClipAdam) when it applies
            update.append(ClipAdam(trainer, params, 1, ctxs) if fast and ClipAdam.supports(trainer)
                          else None)
        if update[0] is not None:
            update[0](global_tokens(num_tokens)[0])
        else:
            for c in ctxs:
                gluon.utils.clip_global_norm([p.grad(c).as_nd_ndarray() for p in params], 1,
                                             check_isfinite=False)
            trainer.update(global_tokens(num_tokens)[0])
        return sum(float(l.sum()) for l in losses), num_tokens
    return step


def train_s2s_ch8(model, data_iter, lr, num_epochs, ctx, on_epoch=None, *, trainer=None,
                  loss=None, start_epoch=1, epoch_seed=None, on_batch=None,
                  fast=False, kvstore=None):
    """Train as the chapter does: Xavier, Adam, masked CE, clip to 1, ``step(num_tokens)``.

    Returns a summary: ``loss`` as the book prints it (summed sequence losses / tokens, last
    epoch), ``loss_per_token`` (the true cross-entropy per target token), ``tokens_per_sec``
    (last epoch, like the book), ``history`` ``[(epoch, loss), ...]`` every 10 epochs.
    ``on_epoch(epoch, loss)`` is called after every epoch.

    Options beyond the chapter (keyword-only; the defaults are the chapter's run): ``trainer``
    given means the model is already initialised (or loaded) and is trained as it is, with this
    trainer; ``loss`` replaces `MaskedSoftmaxCELoss()`; epochs run from ``start_epoch``;
    ``epoch_seed`` reseeds every RNG with ``epoch_seed + epoch`` before each epoch, so that a run
    resumed at an epoch boundary repeats an uninterrupted one exactly; ``on_batch(epoch,
    loss_sum, num_tokens)`` is called after every batch with the epoch's running sums.

    ``fast=True`` (issue 4) runs the same arithmetic as one hybridized graph
    (:class:`TrainGraph`, ``static_alloc/static_shape``), clips and updates all parameters in
    fused operators (:class:`ClipAdam`, no host sync) and reads the losses back once per epoch;
    on a CPU the graph's LayerNorms and attention cores are the fused kernels of `kernels`
    (same function; MXNet's operators when they cannot be built). It needs the corrected model
    (the graph call raises in exact mode). The loop below is
    shared: only the step function (chosen once, `_fast_step`) differs.

    Scale-out (issue 6): ``ctx`` may be a list of devices; each batch is split across them and
    `_parallel_step` sums the gradients through the trainer's kvstore. ``kvstore`` is a dist
    kvstore (`distributed.create_kvstore`) when several processes train together: each feeds
    its own shard of the data, and the reported loss and tokens are sums over all workers.
    """
    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx]
    if trainer is None:
        model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
        trainer = make_trainer(model, lr, kvstore=kvstore)
    loss = loss or MaskedSoftmaxCELoss()
    global_sum = GlobalSum(kvstore, 3)  # (loss, cross-entropy, tokens) over workers
    parallel = len(ctxs) > 1 or is_distributed(kvstore)
    if parallel:
        step = _parallel_step(model, trainer, loss, ctxs, fast, GlobalSum(kvstore, 1))
    elif fast:
        step = _fast_step(model, trainer, loss)
    else:
        def step(X, X_vlen, Y_input, Y_label, Y_vlen):
            with autograd.record():
                Y_hat, _ = model(X, Y_input, X_vlen, Y_vlen)
                l = loss(Y_hat, Y_label, Y_vlen)  # (batch,)
            l.backward()
            grad_clipping(model, 1)
            num_tokens = Y_vlen.sum()
            trainer.step(num_tokens)
            return float(l.sum()), float(num_tokens)
    history = []
    epoch_loss, ce_sum, num_tokens_sum, elapsed = float("nan"), 0.0, 0.0, float("nan")
    for epoch in range(start_epoch, num_epochs + 1):
        if epoch_seed is not None:
            set_seed(epoch_seed + epoch)
        tic = time.time()
        loss_sum, ce_sum, num_tokens_sum = 0.0, 0.0, 0.0
        for batch in data_iter:
            # a single device gets the batch here; `_parallel_step` splits it across devices
            X, X_vlen, Y, Y_vlen = batch if parallel else [x.as_in_context(ctxs[0]) for x in batch]
            Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
            batch_loss, num_tokens = step(X, X_vlen, Y_input, Y_label, Y_vlen)
            loss_sum += batch_loss
            ce_sum += batch_loss * Y_label.shape[1]  # undo the mean over positions
            num_tokens_sum += num_tokens
            if on_batch is not None:
                on_batch(epoch, float(loss_sum), float(num_tokens_sum))
        loss_sum, ce_sum, num_tokens_sum = global_sum(float(loss_sum), float(ce_sum),
                                                      float(num_tokens_sum))
        elapsed = time.time() - tic
        epoch_loss = loss_sum / num_tokens_sum
        if epoch % 10 == 0:
            history.append((epoch, epoch_loss))
        if on_epoch is not None:
            on_epoch(epoch, epoch_loss)
    return {
        "loss": epoch_loss,
        "loss_per_token": ce_sum / num_tokens_sum if num_tokens_sum else float("nan"),
        "tokens_per_sec": num_tokens_sum / elapsed if num_tokens_sum else 0.0,
        "ctx": ",".join(str(c) for c in ctxs),
        "epochs": num_epochs,
        "history": history,
    }


def book_line(summary):
    """The line the book prints after training."""
    return "loss %.3f, %d tokens/sec on %s " % (
        summary["loss"], summary["tokens_per_sec"], summary["ctx"])
