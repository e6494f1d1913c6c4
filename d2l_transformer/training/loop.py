"""9.3.7 Training with the semantics of d2l's `train_s2s_ch8` (the chapter calls it)."""

import random
import time

import mxnet as mx
import numpy as onp
from mxnet import autograd, init

from ..dist.kvstore import GlobalSum, is_distributed
from .loss import MaskedSoftmaxCELoss
from .optim import grad_clipping, make_trainer
from .steps import _fast_step, _parallel_step


def set_seed(seed):
    """Seed Python, NumPy (Gluon's shuffling) and MXNet, so that a run can be repeated."""
    random.seed(seed)
    onp.random.seed(seed)
    mx.random.seed(seed)


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
