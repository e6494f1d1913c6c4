"""Batches: d2l's DataLoader, the same batches cut faster (`ArrayBatches`), bucketed batches of
similar lengths (gluonnlp), and one worker's shard."""

import warnings

import numpy as onp
from mxnet import gluon, np


def load_array(data_arrays, batch_size, is_train=True):
    """A Gluon DataLoader over the arrays, shuffled when training (d2l)."""
    dataset = gluon.data.ArrayDataset(*data_arrays)
    return gluon.data.DataLoader(dataset, batch_size, shuffle=is_train)


class ArrayBatches:
    """The batches of `load_array` — the same batches, from the same NumPy random draws — cut
    with one ``take`` per array instead of the DataLoader's slicing and stacking of every row.

    Gluon's DataLoader shuffles with ``np.random.shuffle(np.arange(n))`` (its RandomSampler)
    and stacks ``batch_size`` single-row arrays per field: ~2.5 ms a batch at the chapter's
    sizes, which on a 2-core CPU slowed the fast path's whole step by ~15% (issue 4). Same
    shuffle here, then ``array.take(indices)``: identical batches (tests/test_data.py).
    """

    def __init__(self, data_arrays, batch_size, is_train=True):
        self.arrays, self.batch_size, self.shuffle = data_arrays, batch_size, is_train
        self.length = len(data_arrays[0])

    def __len__(self):
        return (self.length + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        indices = onp.arange(self.length)
        if self.shuffle:
            onp.random.shuffle(indices)  # RandomSampler's draw, exactly
        for start in range(0, self.length, self.batch_size):
            rows = np.array(indices[start:start + self.batch_size], dtype="int64")  # (batch,)
            yield [a.take(rows, axis=0) for a in self.arrays]


def shard(items, rank, num_workers):
    """Worker `rank`'s part of a list (issue 6): every `num_workers`-th item from `rank`, and
    the same number of items for every worker (up to num_workers - 1 items are left out), so
    that all workers run the same number of steps, as ``dist_sync`` requires."""
    if not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} is not in 0..{num_workers - 1}")
    per_worker = len(items) // num_workers
    return items[rank::num_workers][:per_worker]


class _PadBatch:
    """Batchify ``[(src_ids, tgt_ids), ...]`` into ``(X, X_valid_len, Y, Y_valid_len)`` padded
    to the longest in the batch (gluonnlp's Pad, converted to numpy-mode arrays)."""

    def __init__(self, pad):
        from gluonnlp.data import batchify
        pad_fn = batchify.Pad(pad_val=pad, ret_length=True, dtype="float32")
        self.fn = batchify.Tuple(pad_fn, pad_fn)

    def __call__(self, samples):
        (X, X_len), (Y, Y_len) = self.fn(samples)  # X: (batch, max_src_len), X_len: (batch,)
        return tuple(a.as_np_ndarray().astype("float32") for a in (X, X_len, Y, Y_len))


def load_bucketed(source, target, src_vocab, tgt_vocab, batch_size, num_steps, num_buckets,
                  shuffle=True):
    """A DataLoader of batches of similar lengths (gluonnlp FixedBucketSampler), each padded to
    its own longest sentence instead of `num_steps`. Sentences are cut at `num_steps` tokens
    (targets counting <bos> and <eos>) as `build_array` does; batches are those of
    `load_data_nmt`: ``(X, X_valid_len, Y, Y_valid_len)``."""
    from gluonnlp.data import FixedBucketSampler
    bos, eos = tgt_vocab["<bos>"], tgt_vocab["<eos>"]
    src = [src_vocab[s][:num_steps] for s in source]
    tgt = [([bos] + tgt_vocab[t] + [eos])[:num_steps] for t in target]
    with warnings.catch_warnings():  # small slices leave some buckets empty: not a problem
        warnings.filterwarnings("ignore", "Some buckets are empty")
        sampler = FixedBucketSampler([(len(s), len(t)) for s, t in zip(src, tgt)], batch_size,
                                     num_buckets=num_buckets, shuffle=shuffle)
    dataset = gluon.data.SimpleDataset(list(zip(src, tgt)))
    return gluon.data.DataLoader(dataset, batch_sampler=sampler,
                                 batchify_fn=_PadBatch(src_vocab["<pad>"]))
