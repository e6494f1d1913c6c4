"""9.3.7 Training with the semantics of d2l's `train_s2s_ch8` (the chapter calls it)."""

import math
import random
import time

import mxnet as mx
import numpy as onp
from mxnet import init

from .._runtime import threads as _threads
from ..distributed.kvstore import GlobalSum, is_distributed
from .loss import MaskedSoftmaxCELoss
from .optim import make_trainer
from .steps import (
    _fast_step,
    _imperative_step,
    _parallel_step,
    output_layer_width,
    static_batches,
    traceable,
)


def set_seed(seed):
    """Seed Python, NumPy (Gluon's shuffling) and MXNet, so that a run can be repeated."""
    random.seed(seed)
    onp.random.seed(seed)
    mx.random.seed(seed)


def rng_state():
    """The host random streams (Python's and NumPy's: the batch order) as JSON-able lists."""
    kind, keys, pos, has_gauss, cached = onp.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"numpy": [kind, keys.tolist(), pos, has_gauss, cached],
            "python": [version, list(internal), gauss_next]}


def set_rng_state(state):
    """Restore what `rng_state` returned (a resumed run continues the same batch order)."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    onp.random.set_state((kind, onp.array(keys, dtype=onp.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def data_parallel(ctxs, kvstore):
    """Whether batches train on `_parallel_step`: several devices, or a dist kvstore's workers."""
    return len(ctxs) > 1 or is_distributed(kvstore)


def check_one_device(reduction, ctxs, kvstore):
    """A mean loss needs one device: d2l 1.0's ``reduction="mean"`` (each batch's one mean,
    ``trainer.step(1)``) raises ValueError on `data_parallel` devices, where each device's part
    of a batch would be its own mean."""
    if reduction == "mean" and data_parallel(ctxs, kvstore):
        raise ValueError("d2l 1.0's loss (reduction='mean', each batch's mean: the exact 1.0 "
                         "run's) trains on one device, as d2l 1.0's code does: on several, each "
                         "device's part of a batch would be its own mean")


def train_s2s_ch8(model, data_iter, lr, num_epochs, ctx, on_epoch=None, *, trainer=None,
                  loss=None, start_epoch=1, epoch_seed=None, reseed_from=1, on_batch=None,
                  report_every=50, fast=False, kvstore=None, clip_per_token=False,
                  size_threads=True, output_width=None, work=None, precision="float32"):
    """Train as the chapter does (d2l's ``train_s2s_ch8``, 9.3.7): Xavier, Adam, masked CE,
    the gradient clipped to 1, ``trainer.step(num_tokens)``. The keyword-only options are not
    the chapter's; their defaults are its run.

    Returns `_summary`'s dict: ``loss`` as the book prints it and ``loss_per_token``, the true
    cross-entropy (docs/design.md, "The loss in the book's units"), ``perplexity``,
    ``tokens_per_sec`` (last epoch), ``history`` [(epoch, loss) every 10 epochs].

    * ``on_epoch(epoch, loss)`` after each epoch (True ends the training: early stopping);
      ``on_batch(epoch, batches_done, sums)`` after each batch, ``sums`` the epoch's running
      ``(loss_sum, num_tokens)`` every ``report_every`` batches and at its end, else None.
    * ``trainer``: the model is initialised (or loaded) already and trains with it; ``loss``
      replaces `MaskedSoftmaxCELoss()`; the epochs run from ``start_epoch``.
    * ``epoch_seed``: MXNet's RNG reseeded with ``epoch_seed + epoch`` from epoch
      ``reseed_from`` on (2: epoch 1's deferred Xavier draws from the caller's stream, as the
      chapter's run); NumPy's (the batch order) runs on, so `rng_state` and `set_rng_state` at
      an epoch boundary resume a run exactly.
    * ``fast``: the hybridized graph path (`steps._fast_step`: one graph with the kernels,
      `ClipAdam`, the losses read once per epoch; a non-finite gradient norm raises
      FloatingPointError at the epoch's end), its products in ``precision``
      (`training.precision`); a model it cannot trace (`steps.traceable`) steps imperatively.
    * ``size_threads``: OpenMP threads sized to the output layer's ``work`` (`_runtime.threads`;
      default: each epoch's first batch's rows x ``output_width`` x vocabulary); False keeps
      the process's count, whose rounding an exact run repeats.
    * ``clip_per_token``: the mean loss's gradient clipped per token (fairseq's), not the sum's.
    * ``ctx`` a list of devices or ``kvstore`` a dist kvstore: data parallel
      (`steps._parallel_step`), the loss and tokens summed over the workers.
    """
    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx]
    if trainer is None:
        model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
        trainer = make_trainer(model, lr, kvstore=kvstore)
    loss = loss or MaskedSoftmaxCELoss()
    parallel = data_parallel(ctxs, kvstore)
    check_one_device(getattr(loss, "reduction", None), ctxs, kvstore)
    fast = fast and traceable(model)
    step = _choose_step(model, trainer, loss, ctxs, parallel, fast, kvstore, clip_per_token,
                        precision, static_batches(data_iter))
    epoch = dict(parallel=parallel, per_width=getattr(loss, "reduction", "book") == "book",
                 thread_width=size_threads and (output_width or output_layer_width(model.decoder)),
                 work=work, on_batch=on_batch, report_every=report_every,
                 num_batches=len(data_iter) if hasattr(data_iter, "__len__") else None)
    global_sum = GlobalSum(kvstore, 3)  # (loss, cross-entropy, tokens) over workers
    history, totals, elapsed = [], (float("nan"), 0.0, 0.0), float("nan")
    for e in range(start_epoch, num_epochs + 1):
        if epoch_seed is not None and e >= reseed_from:
            mx.random.seed(epoch_seed + e)  # the in-graph random ops; NumPy's stream runs on
        tic = time.time()
        *sums, done = _train_epoch(model, data_iter, step, ctxs, e, **epoch)
        totals = _epoch_totals(sums, getattr(step, "health", None), global_sum, e, trainer)
        elapsed = time.time() - tic
        if on_batch is not None:
            on_batch(e, done, (totals[0], totals[2]))
        if e % 10 == 0:
            history.append((e, totals[0] / totals[2]))
        if on_epoch is not None and on_epoch(e, totals[0] / totals[2]) is True:
            break  # the caller stops here (early stopping)
    return _summary(*totals, elapsed, ctxs, fast, num_epochs, history)


def _summary(loss_sum, ce_sum, num_tokens, elapsed, ctxs, fast, num_epochs, history):
    """What `train_s2s_ch8` returns, from its last epoch's sums (NaN before any epoch)."""
    return {
        "loss": loss_sum / num_tokens if num_tokens else float("nan"),
        "loss_per_token": ce_sum / num_tokens if num_tokens else float("nan"),
        "perplexity": math.exp(min(ce_sum / num_tokens, 700)) if num_tokens else float("nan"),
        "tokens_per_sec": num_tokens / elapsed if num_tokens else 0.0,
        "ctx": ",".join(str(c) for c in ctxs),
        "fast": fast,
        "epochs": num_epochs,
        "history": history,
    }


def _choose_step(model, trainer, loss, ctxs, parallel, fast, kvstore, clip_per_token,
                 precision="float32", static=True):
    """The step of one batch, chosen once: `_parallel_step` on several devices or workers,
    `_fast_step` (the graph, static for batches of one shape: `steps.static_batches`) on one,
    else the chapter's imperative step. Each returns the batch's summed loss and its number of
    tokens (device arrays on the fast path)."""
    if parallel:
        return _parallel_step(model, trainer, loss, ctxs, fast, GlobalSum(kvstore, 1),
                              clip_per_token, precision, static)
    if fast:
        return _fast_step(model, trainer, loss, clip_per_token, precision, static)
    return _imperative_step(model, trainer, loss, clip_per_token)


def _train_epoch(model, data_iter, step, ctxs, epoch, *, parallel, per_width, thread_width,
                 work, on_batch, report_every, num_batches):
    """One epoch: `step` on every batch of `data_iter`, then ``(loss_sum, ce_sum,
    num_tokens_sum, batches)``, this worker's, unread (device arrays on the fast path: no host
    sync but ``on_batch``'s reports every ``report_every`` batches). ``thread_width``: the
    output layer's input width to size the threads by, or False to keep them; ``work``: the
    run's work to size them by instead of the first batch's (None)."""
    loss_sum, ce_sum, num_tokens_sum, done = 0.0, 0.0, 0.0, 0
    for batch in data_iter:
        # a single device gets the batch here; `_parallel_step` splits it across devices
        X, X_vlen, Y, Y_vlen = batch if parallel else [x.as_in_context(ctxs[0]) for x in batch]
        Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
        if not done and thread_width:  # threads for this size (`_runtime.threads`), each epoch
            _threads.size_for(work or X.shape[0] // len(ctxs) * Y_label.shape[1] * thread_width
                              * model.decoder.dense.weight.shape[0])  # V: its units
        batch_loss, num_tokens = step(X, X_vlen, Y_input, Y_label, Y_vlen)
        loss_sum += batch_loss  # device arrays on the fast path: no sync here
        ce_sum += batch_loss * (Y_label.shape[1] if per_width else 1)  # undo the mean over positions
        num_tokens_sum += num_tokens
        done += 1
        if on_batch is not None:
            report = done % report_every == 0 and done != num_batches  # the end reads anyway
            on_batch(epoch, done, _read(loss_sum, num_tokens_sum) if report else None)
    return loss_sum, ce_sum, num_tokens_sum, done


def _epoch_totals(sums, health, global_sum, epoch, trainer):
    """The epoch's ``(loss_sum, ce_sum, num_tokens_sum)`` read once and summed over all
    workers; FloatingPointError when a fast step's `health` counted a gradient whose global
    norm was not finite."""
    flags = None if health is None else health()
    values = _read(*sums, *(() if flags is None else (flags,)))
    totals = global_sum(*values[:3])
    if flags is not None and values[3]:
        raise FloatingPointError(
            f"epoch {epoch}: the gradient's global norm was not finite (NaN or Inf) at "
            f"{values[3]:.0f} of {trainer.optimizer.num_update} updates so far, first at update "
            f"{values[4]:.0f}; those updates were skipped. Lower the learning rate or check "
            "the data")
    return totals


def _read(*values):
    """Host floats of `values` (host numbers and device arrays, flattened) with ONE device read:
    the only host syncs of the fast path."""
    arrays = [v for v in values if isinstance(v, mx.nd.NDArray)]
    flat = iter(mx.nd.concat(*[a.as_nd_ndarray().reshape((-1,)).astype("float64") for a in arrays],
                             dim=0).asnumpy().tolist() if arrays else [])
    out = []
    for v in values:
        out.extend([next(flat) for _ in range(v.size)] if isinstance(v, mx.nd.NDArray) else [float(v)])
    return out

