"""9.3.7 Training with the semantics of d2l's `train_s2s_ch8` (the chapter calls it)."""

import math
import random
import time

import mxnet as mx
import numpy as onp
from mxnet import autograd, gluon, init

from .config import TransformerConfig
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


def make_trainer(model, lr, warmup_steps=0):
    """The chapter's Adam trainer; with ``warmup_steps > 0`` on the paper's schedule."""
    params = {"learning_rate": lr}
    if warmup_steps:
        params["lr_scheduler"] = WarmupInverseSqrt(lr, warmup_steps)
    return gluon.Trainer(model.collect_params(), "adam", params)


def train_s2s_ch8(model, data_iter, lr, num_epochs, ctx, on_epoch=None, *, trainer=None,
                  loss=None, start_epoch=1, epoch_seed=None, on_batch=None,
                  fast=False):
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
    (:class:`TrainGraph`, ``static_alloc/static_shape``), clips in one pass and reads the
    losses back once per epoch; it needs the corrected model (the graph call raises in exact
    mode). The loop below is shared: only the step function differs.
    """
    if trainer is None:
        model.initialize(init.Xavier(), force_reinit=True, ctx=ctx)
        trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": lr})
    loss = loss or MaskedSoftmaxCELoss()
    if fast:
        graph = TrainGraph(model, loss)
        graph.hybridize(static_alloc=True, static_shape=True)
        params = [p for p in model.collect_params().values() if p.grad_req != "null"]

        def step(X, X_vlen, Y_input, Y_label, Y_vlen):
            if not params[0]._data:  # deferred init in the faithful order: same weights
                model(X, Y_input, X_vlen, Y_vlen)
            with autograd.record():
                l = graph(X, X_vlen, Y_input, Y_label, Y_vlen)  # (batch,)
            l.backward()
            _clip_global(params, 1)
            num_tokens = Y_vlen.sum()
            trainer.step(num_tokens)
            return l.sum(), num_tokens  # stay on the device
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
            X, X_vlen, Y, Y_vlen = [x.as_in_context(ctx) for x in batch]
            Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
            batch_loss, num_tokens = step(X, X_vlen, Y_input, Y_label, Y_vlen)
            loss_sum += batch_loss
            ce_sum += batch_loss * Y_label.shape[1]  # undo the mean over positions
            num_tokens_sum += num_tokens
            if on_batch is not None:
                on_batch(epoch, float(loss_sum), float(num_tokens_sum))
        loss_sum, ce_sum, num_tokens_sum = float(loss_sum), float(ce_sum), float(num_tokens_sum)
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
        "ctx": str(ctx),
        "epochs": num_epochs,
        "history": history,
    }


def book_line(summary):
    """The line the book prints after training."""
    return "loss %.3f, %d tokens/sec on %s " % (
        summary["loss"], summary["tokens_per_sec"], summary["ctx"])
