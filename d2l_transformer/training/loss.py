"""9.3.7's loss: d2l's masked softmax cross-entropy (with optional label smoothing)."""

from mxnet import gluon

REDUCTIONS = ("book", "token", "mean")


class MaskedSoftmaxCELoss(gluon.loss.SoftmaxCELoss):
    """Softmax cross-entropy with positions at or after `valid_length` weighted 0 (d2l).

    pred: (batch, seq_len, vocab); label: (batch, seq_len); valid_length: (batch,).
    Returns (batch,): each sequence's loss averaged over all seq_len positions, padding
    included, which is why the book's loss is the per-token cross-entropy / seq_len.

    ``reduction="token"`` (not in the chapter): each sequence's loss SUMMED over its real
    tokens. Divided by the batch's token count (``trainer.step(num_tokens)``) that is the mean
    cross-entropy per token, and each token's gradient no longer depends on the padded width
    (d2l's mean weighs a token by 1 / seq_len, so buckets of short sentences would count more).

    ``label_smoothing`` = eps > 0 (not in the chapter; the paper's 5.4 uses 0.1) trains against
    ``(1 - eps) * one_hot(label) + eps / vocab``: gradient of ``(1 - eps) * nll + eps *
    mean(-log p)``. ``reduction="mean"``: d2l 1.0's loss (its ``Classifier.loss``, which its
    ``Seq2Seq`` inherits): ONE number, the mean over every position of the batch, ``<pad>``
    labels included (nothing masked), for ``trainer.step(1)``. The VALUE returned stays the
    plain cross-entropy (``nll``), so that the reported loss and perplexity are the model's,
    not the smoothed objective's.
    """

    def __init__(self, label_smoothing=0.0, *, reduction="book", **kwargs):
        super().__init__(**kwargs)
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown loss reduction {reduction!r}: use one of {', '.join(REDUCTIONS)}")
        self.label_smoothing, self.reduction = label_smoothing, reduction

    def hybrid_forward(self, F, pred, label, valid_length):
        """F: works imperatively and inside the fast path's hybridized graph."""
        if self.reduction == "mean":
            flat = super().hybrid_forward(F, F.npx.reshape(pred, (-5, -2)),  # (batch * seq_len, vocab)
                                          F.npx.reshape(label, (-1,)))  # -> (batch * seq_len,)
            return flat.mean()
        weights = F.np.expand_dims(F.np.ones_like(label), axis=-1)  # (batch, seq_len, 1)
        weights = F.npx.sequence_mask(weights, valid_length, True, axis=1)
        if not self.label_smoothing and self.reduction == "book":
            return super().hybrid_forward(F, pred, label, weights)
        log_p = F.npx.log_softmax(pred)  # (batch, seq_len, vocab)
        loss = -F.npx.pick(log_p, label, axis=-1, keepdims=True)  # nll: (batch, seq_len, 1)
        if self.label_smoothing:
            eps = self.label_smoothing
            smoothed = (1 - eps) * loss + eps * -log_p.mean(axis=-1, keepdims=True)  # (batch, seq_len, 1)
            # value nll, gradient of `smoothed`: nll + (smoothed - smoothed), the second copy blocked
            blocked = F.BlockGrad(smoothed.as_nd_ndarray()).as_np_ndarray()
            loss = F.BlockGrad(loss.as_nd_ndarray()).as_np_ndarray() + (smoothed - blocked)
        loss = loss * weights  # (batch, seq_len, 1)
        if self.reduction == "token":
            return loss.sum(axis=(1, 2))  # (batch,)
        return loss.mean(axis=(1, 2))  # (batch,), as SoftmaxCELoss averages


def step_size(loss, valid_length):
    """What ``trainer.step`` divides a batch's summed gradients by: its target tokens
    (``valid_length.sum()``, a device array), or 1 for ``reduction="mean"``, already the batch's
    mean (d2l 1.0's ``trainer.step(1)``)."""
    return 1 if getattr(loss, "reduction", None) == "mean" else valid_length.sum()
