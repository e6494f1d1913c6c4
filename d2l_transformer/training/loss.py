"""9.3.7's loss: d2l's masked softmax cross-entropy (with optional label smoothing)."""

from mxnet import gluon


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
