"""Batch normalization in place of 9.3.3's layer normalization (exercise 9.3.9.3;
docs/variants.md): ``norm="batch"`` (Ioffe & Szegedy 2015, Gluon's ``nn.BatchNorm`` over the
feature axis: statistics over every position of the batch, padding included) and
``norm="masked_batch"`` (`MaskedBatchNorm`: statistics over the real tokens only, as in
PowerNorm's discussion of padding, Shen et al. 2020). Both normalize with running statistics
at inference, so a translation does not depend on its batch.
"""

from mxnet.gluon import nn

from ..attention import _F
from .names import SameNames

PAD_ID = 1  # <pad> in the package's vocabularies (data.Vocab: <unk> 0, then <pad>; sentencepiece
# is told the same); not in d2l 1.0's sorted vocabularies (config.check refuses that edition)


def token_mask(X, valid_length):
    """(batch, seq_len) float: 1 where position t < valid_length (a real token), else 0; X:
    (batch, seq_len, ...), valid_length: (batch,)."""
    F = _F(X)
    positions = F.npx.arange_like(X, axis=1)  # (seq_len,)
    lengths = F.np.expand_dims(valid_length.astype("float32"), -1)  # (batch, 1)
    return (positions < lengths).astype("float32")  # (batch, seq_len)


def id_mask(ids, pad_id=PAD_ID):
    """(batch, seq_len) float: 1 where the token id is not ``<pad>`` (the decoder's input:
    ``<bos>`` and the target's tokens, padding only after them)."""
    F = _F(ids)
    return F.np.not_equal(ids, pad_id).astype("float32")


class MaskedBatchNorm(SameNames, nn.BatchNorm):
    """Batch normalization whose statistics count the real tokens only: the mean and (biased)
    variance of each feature over the positions where ``mask`` (batch, seq_len) is 1, used in
    training and folded into the running statistics (momentum 0.9); the running statistics at
    inference. ``mask=None``: every position is real. Gluon's BatchNorm parameters
    (gamma, beta, running_mean, running_var).

    One graph for both paths, imperative and hybridized: MXNet's BatchNorm operator (with
    gamma, beta 0) normalizes, uses the running statistics at inference and updates them in
    its backward pass. In training it is fed ``x' = m + (x - m) * sqrt(N / n)`` at the n real
    positions and m at the N - n others (m the masked mean), whose plain mean and variance
    are the masked ones; its output is divided by sqrt(N / n) again, then beta added (the
    padding comes out as beta). Whether the graph runs in training is read from a dropout of
    a one (2 or 0 in training, 1 at inference: the graph's own switch, as LayerDrop's)."""

    def __init__(self, in_channels, momentum=0.9, epsilon=1e-5, **kwargs):
        super().__init__(axis=-1, momentum=momentum, epsilon=epsilon, in_channels=in_channels,
                         **kwargs)
        self.momentum, self.epsilon = momentum, epsilon
        self.probe = nn.Dropout(0.5)  # draws only in training

    def hybrid_forward(self, F, x, mask=None, gamma=None, beta=None, running_mean=None,
                       running_var=None):
        """x: (batch, seq_len, C); mask: (batch, seq_len) or None -> x's shape."""
        w = F.np.expand_dims(F.np.ones_like(x[:, :, 0]) if mask is None else mask, -1)  # (b, t, 1)
        one = F.np.ones_like(F.np.mean(w, axis=(0, 1, 2), keepdims=True))  # (1, 1, 1)
        t = F.np.not_equal(self.probe(one), 1).astype("float32")  # 1 in training, else 0
        n = F.np.maximum(F.np.sum(w), 1)  # real positions, ()
        mean = F.np.sum(x * w, axis=(0, 1)) / n  # (C,), the real tokens' mean
        s = 1 + t * (F.np.sqrt(F.np.sum(F.np.ones_like(w)) / n) - 1)  # sqrt(N / n), or 1
        c = t * mean  # (1, 1, C): the centre of the rescaling, 0 at inference
        scale = w * s + (1 - w) * (1 - t)  # (b, t, 1): padding to the mean in training
        z = F.npx.batch_norm(c + (x - c) * scale, gamma, F.np.zeros_like(beta),
                             running_mean, running_var, eps=self.epsilon, momentum=self.momentum,
                             fix_gamma=False, use_global_stats=False, axis=-1)  # (b, t, C)
        return z / s + beta


def make_batch_norm(norm, hidden_size):
    """``"batch"``: Gluon's BatchNorm over the last axis; ``"masked_batch"``: `MaskedBatchNorm`."""
    if norm == "batch":
        return nn.BatchNorm(axis=-1, in_channels=hidden_size)
    return MaskedBatchNorm(hidden_size)
