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
from .steps import _fast_step, _imperative_step, _parallel_step, output_layer_width, traceable


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
    """Train as the chapter does: Xavier, Adam, masked CE, clip to 1, ``step(num_tokens)``.

    Returns a summary: ``loss`` as the book prints it (summed sequence losses / tokens, last
    epoch), ``loss_per_token`` (the true cross-entropy per target token: summed over the real
    tokens, divided by their number, whatever the padding) and its ``perplexity``,
    ``tokens_per_sec`` (last epoch, like the book), ``history`` ``[(epoch, loss), ...]`` every
    10 epochs. With a ``reduction="token"`` loss, ``loss`` is that cross-entropy too (the
    book's units average over the padded width, which only the chapter's fixed width makes a
    fixed scale); with label smoothing both stay the plain cross-entropy.
    ``on_epoch(epoch, loss)`` is called after every epoch; if it returns True, the training
    ends after that epoch (early stopping; not in the chapter).

    Options beyond the chapter (keyword-only; the defaults are the chapter's run): ``trainer``
    given means the model is already initialised (or loaded) and is trained as it is, with this
    trainer; ``loss`` replaces `MaskedSoftmaxCELoss()`; epochs run from ``start_epoch``;
    ``epoch_seed`` reseeds MXNet's RNG (dropout, LayerDrop, DropHead) with ``epoch_seed +
    epoch`` before each epoch from epoch ``reseed_from`` on, while NumPy's stream (the batch
    order) runs on as in the chapter (``reseed_from=2``: epoch 1 draws the deferred Xavier
    initialisation from the stream the caller seeded, as the chapter's run does);
    with `rng_state` saved at an epoch boundary and restored by `set_rng_state`, a resumed run
    repeats an uninterrupted one exactly; ``on_batch(epoch,
    batches_done, sums)`` is called after every batch: ``sums`` is the epoch's running
    ``(loss_sum, num_tokens)`` as host floats every ``report_every`` batches and after the
    epoch's last batch (then summed over all workers), else None, so that a progress bar never
    makes the fast path read the device every batch.

    ``fast=True`` runs the same arithmetic as one hybridized graph
    (:class:`TrainGraph`, ``static_alloc/static_shape``), clips and updates all parameters in
    fused operators (:class:`ClipAdam`, no host sync) and reads the losses back once per epoch
    (and every ``report_every`` batches for ``on_batch``); a gradient whose global norm is not
    finite raises FloatingPointError at the end of its epoch, before ``on_epoch``;
    on a CPU the graph's LayerNorms and attention cores are the fused kernels of `kernels`
    (same function; MXNet's operators when they cannot be built). It needs the corrected model
    (the graph call raises in exact mode). A model the graph cannot trace (`steps.traceable`:
    the 2019 book's seq2seq models) trains on the imperative step with ``fast=True`` too; the
    summary's ``fast`` says which ran. The loop below is shared: only the step function
    (chosen once, `_choose_step`) differs.

    ``size_threads=False`` keeps the process's OpenMP thread count (``OMP_NUM_THREADS``, one
    unless set) instead of sizing it to the work (`_runtime.threads`): what the chapter's own code runs
    with, whose float rounding an exact run must repeat. The work is the output layer's
    products: ``work``, the run's (`_runtime.threads.run_work`: `train_model` gives it, the
    number that also settled oneDNN's cap), else each epoch's first batch's rows x
    ``output_width`` x vocabulary, the width by default the model's own
    (`steps.output_layer_width`: the Transformer's ``embedding_size``, a seq2seq model's LSTM
    units).

    ``precision="bfloat16"`` (not in the chapter; `training.precision` decides it for a run,
    `train_model` passes its choice): the graph path's matrix products in bfloat16, the
    weights, Adam and everything else float32 (`training.bfloat16`); the imperative step
    ignores it.

    ``clip_per_token=True`` (not in the chapter) clips the gradient of the MEAN loss per target
    token to norm 1, as fairseq's and PyTorch's recipes do, instead of the chapter's gradient of
    the SUMMED loss (which, divided by the token count afterwards, is clipped at every step).

    Scale-out: ``ctx`` may be a list of devices; each batch is split across them and
    `_parallel_step` sums the gradients through the trainer's kvstore. ``kvstore`` is a dist
    kvstore (`distributed.create_kvstore`) when several processes train together: each feeds
    its own shard of the data, and the reported loss and tokens are sums over all workers.
    """
    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx]
    if trainer is None:
        model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
        trainer = make_trainer(model, lr, kvstore=kvstore)
    loss = loss or MaskedSoftmaxCELoss()
    per_width = getattr(loss, "reduction", "book") == "book"  # the book's mean over positions
    global_sum = GlobalSum(kvstore, 3)  # (loss, cross-entropy, tokens) over workers
    parallel = data_parallel(ctxs, kvstore)
    check_one_device(getattr(loss, "reduction", None), ctxs, kvstore)
    fast = fast and traceable(model)
    step = _choose_step(model, trainer, loss, ctxs, parallel, fast, kvstore, clip_per_token,
                        precision)
    width = size_threads and (output_width or output_layer_width(model.decoder))
    history = []
    health = getattr(step, "health", None)  # `ClipAdam.health` of a fast step, or None
    num_batches = len(data_iter) if hasattr(data_iter, "__len__") else None
    epoch_loss, ce_sum, num_tokens_sum, elapsed = float("nan"), 0.0, 0.0, float("nan")
    for epoch in range(start_epoch, num_epochs + 1):
        if epoch_seed is not None and epoch >= reseed_from:
            mx.random.seed(epoch_seed + epoch)  # the in-graph random ops; NumPy's stream runs on
        tic = time.time()
        *sums, done = _train_epoch(
            model, data_iter, step, ctxs, epoch, parallel=parallel, per_width=per_width,
            thread_width=width, work=work, on_batch=on_batch, report_every=report_every,
            num_batches=num_batches)
        loss_sum, ce_sum, num_tokens_sum = _epoch_totals(sums, health, global_sum, epoch, trainer)
        elapsed = time.time() - tic
        epoch_loss = loss_sum / num_tokens_sum
        if on_batch is not None:
            on_batch(epoch, done, (loss_sum, num_tokens_sum))
        if epoch % 10 == 0:
            history.append((epoch, epoch_loss))
        if on_epoch is not None and on_epoch(epoch, epoch_loss) is True:
            break  # the caller stops here (early stopping)
    return {
        "loss": epoch_loss,
        "loss_per_token": ce_sum / num_tokens_sum if num_tokens_sum else float("nan"),
        "perplexity": math.exp(min(ce_sum / num_tokens_sum, 700)) if num_tokens_sum else float("nan"),
        "tokens_per_sec": num_tokens_sum / elapsed if num_tokens_sum else 0.0,
        "ctx": ",".join(str(c) for c in ctxs),
        "fast": fast,
        "epochs": num_epochs,
        "history": history,
    }


def _choose_step(model, trainer, loss, ctxs, parallel, fast, kvstore, clip_per_token,
                 precision="float32"):
    """The step of one batch, chosen once: `_parallel_step` on several devices or workers,
    `_fast_step` (the graph) on one, else the chapter's imperative step. Each returns the
    batch's summed loss and its number of tokens (device arrays on the fast path)."""
    if parallel:
        return _parallel_step(model, trainer, loss, ctxs, fast, GlobalSum(kvstore, 1),
                              clip_per_token, precision)
    if fast:
        return _fast_step(model, trainer, loss, clip_per_token, precision)
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

