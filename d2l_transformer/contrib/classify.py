"""An encoder-only task built offline from fra-eng: is a sentence English (0) or French (1)?

Both sides of the first `num_examples` + 1 pairs share one vocabulary (min_freq as the chapter);
whole pairs go to the held-out split, so no test sentence's translation is seen in training.
"""

import time

from mxnet import autograd, gluon, init, np
from mxnet.gluon import nn

from ..data import RESERVED_TOKENS, Vocab, build_array, preprocess_nmt, read_data_nmt, tokenize_nmt


class TransformerClassifier(nn.HybridBlock):
    """Encoder-only classifier (BERT-style use of 9.3.5's encoder): the TransformerEncoder, the
    mean of its outputs over the valid positions, and a Dense head to `num_classes` logits."""

    def __init__(self, encoder, num_classes, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.output = nn.Dense(num_classes)

    def hybrid_forward(self, F, X, valid_length):
        """X: (batch, seq_len) ids; valid_length: (batch,) -> (batch, num_classes)."""
        H = self.encoder(X, valid_length)  # (batch, seq_len, d)
        mask = F.np.expand_dims(F.npx.arange_like(H, axis=1), 0) \
            < F.np.expand_dims(valid_length.astype("float32"), 1)  # (batch, seq_len)
        mask = F.np.expand_dims(mask.astype("float32"), -1)  # (batch, seq_len, 1)
        pooled = F.np.sum(H * mask, axis=1) / F.np.sum(mask, axis=1)  # (batch, d)
        return self.output(pooled)


def load_data_lang_id(batch_size, num_steps, num_examples=1000, test_fraction=0.2, path=None):
    """(vocab, train_iter, (X_test, valid_len_test, y_test)) for English-vs-French."""
    source, target = tokenize_nmt(preprocess_nmt(read_data_nmt(path)), num_examples)
    num_test = int(len(source) * test_fraction)
    # every 1/test_fraction-th pair is held out (deterministic, spread over the file)
    step = max(1, round(1 / test_fraction)) if test_fraction > 0 else len(source) + 1
    test_ids = set(range(0, len(source), step)[:num_test])
    split = {True: ([], []), False: ([], [])}
    for i, (en, fr) in enumerate(zip(source, target)):
        lines, labels = split[i in test_ids]
        lines += [en, fr]
        labels += [0, 1]
    vocab = Vocab(split[False][0], min_freq=3, reserved_tokens=RESERVED_TOKENS)

    def arrays(lines, labels):
        X, valid_len = build_array(lines, vocab, num_steps, True)
        # an all-unknown sentence still has one valid position (pooling divides by the length)
        return X, np.maximum(valid_len, 1), np.array(labels, dtype="float32")

    train = arrays(*split[False])
    train_iter = gluon.data.DataLoader(gluon.data.ArrayDataset(*train), batch_size, shuffle=True)
    return vocab, train_iter, arrays(*split[True])


def accuracy(model, X, valid_len, y):
    """Fraction of sentences whose arg-max class equals the label."""
    pred = model(X, valid_len).argmax(axis=1).astype("float32")  # (batch,)
    return float((pred == y).mean())


def train_classifier(model, train_iter, lr, num_epochs, ctx):
    """Xavier, Adam, softmax cross-entropy; returns {loss, train_acc, seconds}."""
    model.initialize(init.Xavier(), force_reinit=True, ctx=ctx)
    trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": lr})
    loss = gluon.loss.SoftmaxCELoss()
    tic = time.time()
    for _ in range(num_epochs):
        loss_sum, correct, n = 0.0, 0.0, 0
        for X, valid_len, y in train_iter:
            X, valid_len, y = X.as_in_context(ctx), valid_len.as_in_context(ctx), y.as_in_context(ctx)
            with autograd.record():
                logits = model(X, valid_len)  # (batch, num_classes)
                l = loss(logits, y)
            l.backward()
            trainer.step(X.shape[0])
            loss_sum += float(l.sum())
            correct += float((logits.argmax(axis=1).astype("float32") == y).sum())
            n += X.shape[0]
    return {"loss": loss_sum / n, "train_acc": correct / n, "seconds": time.time() - tic}
