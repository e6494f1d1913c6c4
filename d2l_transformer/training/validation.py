"""Validation during training: the valid loss and a quick greedy BLEU on a fixed subset of the
valid part after some epochs, the best model kept, early stopping, and the average of the last
epochs' parameters (Vaswani et al. 2017, 6.1, averaged the last 5 or 20 checkpoints).

The BLEU is `evaluate.translate_and_score`, the pipeline of ``d2l-transformer evaluate``
(sacreBLEU on detokenized greedy translations against one reference each): the first
``cfg.valid_sentences`` pairs of the valid part, the same ones every time. It runs between
epochs, so the fast path keeps its one device read per epoch.
"""

import collections

import mxnet as mx
import numpy as onp
from mxnet import np

from .. import _gluon
from ..evaluate import translate_and_score
from ..inference.engines import MXNetEngine
from ..inference.limits import source_positions
from .averaging import average_arrays
from .loss import MaskedSoftmaxCELoss


class Validator:
    """``Validator(model, pairs, tokenizer, src_vocab, tgt_vocab, cfg, ctx)()`` ->
    ``{"valid_loss", "valid_bleu", "valid_chrf", "sentences", "seconds"}`` for the model as it
    is now. ``pairs``: the valid part (`data.Pairs` of text), of which the first
    ``cfg.valid_sentences`` are used. ``valid_loss`` is the cross-entropy per target token
    (no label smoothing, dropout off) of those pairs, whole (`batches`: by length, each padded to
    its longest; only a sentence beyond the model's positions, which it cannot encode, is cut
    there), the BLEU that of their greedy translations (`evaluate.translate_and_score`: such a
    sentence is translated as nothing)."""

    def __init__(self, model, pairs, tokenizer, src_vocab, tgt_vocab, cfg, ctx):
        n = cfg.valid_sentences
        self.sources, self.references = list(pairs.source[:n]), list(pairs.target[:n])
        if not self.sources:
            raise ValueError("no valid pairs to validate on")
        self.model, self.tokenizer, self.cfg, self.ctx = model, tokenizer, cfg, ctx
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        limit = source_positions(model)
        self.src = [src_vocab[tokenizer.encode(s)][:limit] for s in self.sources]
        bos, eos = tgt_vocab["<bos>"], tgt_vocab["<eos>"]
        self.tgt = [([bos] + tgt_vocab[tokenizer.encode_target(t)] + [eos])[:limit + 1]
                    for t in self.references]  # <bos> ... <eos>: the decoder reads all but one
        self.loss = MaskedSoftmaxCELoss(reduction="token")  # summed over the real tokens

    def batches(self):
        """``(X, X_vlen, Y, Y_vlen)`` host arrays of at most ``cfg.batch_size`` pairs of
        similar lengths, each padded to its longest."""
        order = sorted(range(len(self.src)), key=lambda i: (len(self.tgt[i]), len(self.src[i])))
        pads = self.src_vocab["<pad>"], self.tgt_vocab["<pad>"]
        for start in range(0, len(order), self.cfg.batch_size):
            rows = order[start:start + self.cfg.batch_size]
            out = []
            for seqs, pad in ((self.src, pads[0]), (self.tgt, pads[1])):
                width = max(len(seqs[i]) for i in rows)
                array = onp.full((len(rows), width), pad, dtype=onp.float32)  # (rows, width)
                for r, i in enumerate(rows):
                    array[r, :len(seqs[i])] = seqs[i]
                out += [array, onp.array([len(seqs[i]) for i in rows], dtype=onp.float32)]
            yield out

    def valid_loss(self):
        """Cross-entropy per target token of the subset (`validation_loss`)."""
        batches = ([np.array(a, ctx=self.ctx) for a in batch] for batch in self.batches())
        return validation_loss(self.model, batches, self.loss, self.ctx)

    def __call__(self):
        loss = self.valid_loss()
        engine = MXNetEngine(self.model, self.src_vocab, self.tgt_vocab, self.cfg, self.tokenizer,
                             self.ctx)
        result, _ = translate_and_score(engine, self.sources, self.references, 1,
                                        lowercase=self.tokenizer.lowercase)
        return {"valid_loss": loss, "valid_bleu": result["bleu"], "valid_chrf": result["chrf"],
                "sentences": result["sentences"], "seconds": result["seconds"]}


def format_validation(what, record, best):
    """``epoch 3: valid loss 2.8571, BLEU 21.40, chrF 45.10 on 500 valid pairs (best so far)``
    (the training log); `what`: an epoch number or a label."""
    what = f"epoch {what}" if isinstance(what, int) else what
    return (f"{what}: valid loss {record['valid_loss']:.4f}, BLEU "
            f"{record['valid_bleu']:.2f}, chrF {record['valid_chrf']:.2f} on "
            f"{record['sentences']} valid pairs" + (" (best so far)" if best else ""))


class EarlyStopping:
    """Keeps the best valid BLEU and counts the validations since it last improved:
    ``update(epoch, bleu)`` -> True when this one is the best so far (strictly better);
    ``should_stop`` once ``patience`` validations in a row did not improve (never when
    patience is None). ``state``/``from_state``: the JSON kept in summary.json, for --resume."""

    def __init__(self, patience=None, best_bleu=None, best_epoch=None, stale=0):
        self.patience, self.best_bleu, self.best_epoch, self.stale = patience, best_bleu, best_epoch, stale

    def update(self, epoch, bleu):
        if self.best_bleu is None or bleu > self.best_bleu:
            self.best_bleu, self.best_epoch, self.stale = bleu, epoch, 0
            return True
        self.stale += 1
        return False

    @property
    def should_stop(self):
        return self.patience is not None and self.stale >= self.patience

    def state(self):
        return {"best_bleu": self.best_bleu, "best_epoch": self.best_epoch,
                "validations_without_improvement": self.stale}

    @classmethod
    def from_state(cls, patience, state):
        state = state or {}
        return cls(patience, state.get("best_bleu"), state.get("best_epoch"),
                   state.get("validations_without_improvement", 0))


class LastParameters:
    """The parameters of the last `n` epochs, copied to the host at each epoch's end (one read
    per epoch, between epochs), for `average`. A resumed run starts with none: its average
    covers the epochs trained since it resumed (``epochs``)."""

    def __init__(self, model, n):
        self.model, self.kept = model, collections.deque(maxlen=n)

    def add(self, epoch):
        params = _gluon.structural_params(self.model)  # save_parameters' names
        self.kept.append((epoch, {k: p.data().as_nd_ndarray().copyto(mx.cpu())
                                  for k, p in params.items()}))

    @property
    def epochs(self):
        return [e for e, _ in self.kept]

    def average(self):
        """``{name: mean NDArray}`` of the kept epochs (`averaging.average_arrays`)."""
        return average_arrays([p for _, p in self.kept])

    def swapped_in(self, arrays):
        """A context in which the model holds `arrays` (``{name: NDArray}``), its own
        parameters restored afterwards."""
        return _Swap(self.model, arrays)


class _Swap:
    def __init__(self, model, arrays):
        self.params, self.arrays = _gluon.structural_params(model), arrays

    def __enter__(self):
        self.saved = {k: p.data().copy() for k, p in self.params.items()}
        for k, p in self.params.items():
            if k in self.arrays:
                p.set_data(self.arrays[k].as_np_ndarray())
        return self

    def __exit__(self, *exc):
        for k, p in self.params.items():
            p.set_data(self.saved[k])
        return False


def validation_loss(model, batches, loss, ctx):
    """The one validation loss (d2l 1.0's validation; `Validator.valid_loss`): the batches'
    ``(X, X_vlen, Y, Y_vlen)`` loss outside ``autograd.record`` (no dropout; in exact mode the
    chapter's decoder then drops its causal mask, as the book's does), averaged as the loss
    reduces: the mean of the batch means (``"mean"``: what d2l 1.0 plots), else per target
    token."""
    total, count = 0.0, 0.0
    for batch in batches:
        X, X_vlen, Y, Y_vlen = [x.as_in_context(ctx) for x in batch]
        Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1  # as the training loop
        Y_hat, _ = model(X, Y_input, X_vlen)  # <bos> and the target, teacher forced
        total += float(loss(Y_hat, Y_label, Y_vlen).sum())
        count += 1 if loss.reduction == "mean" else float(Y_vlen.sum())
    return total / max(count, 1.0)
