"""Batches: d2l's DataLoader, the same batches cut faster (`ArrayBatches`), batches of similar
lengths padded to a few fixed shapes (`BucketBatches`) over sentences kept compactly
(`Ragged`), and one worker's shard."""

import itertools

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
    and stacks ``batch_size`` single-row arrays per field, which at the chapter's sizes costs
    a good part of a fast training step (docs/benchmarks.md). Same shuffle here, then
    ``array.take(indices)``: identical batches (tests/test_data.py).
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
    """Worker `rank`'s part of a list: every `num_workers`-th item from `rank`, and
    the same number of items for every worker (up to num_workers - 1 items are left out), so
    that all workers run the same number of steps, as ``dist_sync`` requires."""
    if not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} is not in 0..{num_workers - 1}")
    per_worker = len(items) // num_workers
    return items[rank::num_workers][:per_worker]


def bucket_widths(src_lengths, tgt_lengths, num_buckets):
    """``[(src_width, tgt_width), ...]``, increasing: the padded shapes of `BucketBatches`.

    Bucket ``i`` is sized at the ``1 - (1 - (i + 1) / num_buckets) ** 2`` quantile of each
    length: finer where lengths spread out (the long tail), the last at the longest; equal keys
    merge. A pair goes to the first bucket it fits in both ways (gluonnlp's FixedBucketSampler
    assigns the same way, with equal-width keys). On the full presets' training part this pads
    12% of the positions (18% with evenly spaced quantiles)."""
    src, tgt = onp.asarray(src_lengths), onp.asarray(tgt_lengths)
    q = [1 - (1 - (i + 1) / num_buckets) ** 2 for i in range(num_buckets)]
    keys = zip(onp.ceil(onp.quantile(src, q)).astype(int), onp.ceil(onp.quantile(tgt, q)).astype(int))
    # both quantiles grow with q: the keys form a chain, the last one (q = 1) fits every pair
    return sorted(set((int(s), int(t)) for s, t in keys))


class Ragged:
    """Sequences of ids as one flat int32 array and their offsets: what a list of id lists
    holds, at 4 bytes an id (a Python int in a list costs 36), so that a corpus of millions of
    sentences fits in memory. ``ragged[i]`` is sequence i (a view), ``lengths`` their lengths."""

    def __init__(self, flat, lengths):
        self.flat = onp.asarray(flat, dtype=onp.int32)
        self.lengths = onp.asarray(lengths, dtype=onp.int64)
        self.offsets = onp.concatenate([[0], onp.cumsum(self.lengths)])  # (n + 1,)

    @classmethod
    def of(cls, sequences):
        """The Ragged of a list of id lists (or a Ragged, returned as it is)."""
        if isinstance(sequences, cls):
            return sequences
        lengths = onp.fromiter(map(len, sequences), dtype=onp.int64, count=len(sequences))
        flat = onp.fromiter(itertools.chain.from_iterable(sequences), dtype=onp.int32,
                            count=int(lengths.sum()))
        return cls(flat, lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def wrap(self, bos=None, eos=None):
        """Each sequence with `bos` before it and `eos` after it (each when not None): the
        targets of `BucketBatches`, all at once."""
        flat, lengths = self.flat, self.lengths
        if bos is not None:  # before each sequence's first id
            flat = onp.insert(flat, self.offsets[:-1], bos)
            lengths = lengths + 1
        if eos is not None:  # after each sequence's last id
            flat = onp.insert(flat, onp.cumsum(lengths), eos)
            lengths = lengths + 1
        return Ragged(flat, lengths)

    def take(self, indices):
        """The sequences at `indices`, in that order, as a new Ragged."""
        indices = onp.asarray(indices, dtype=onp.int64)
        lengths = self.lengths[indices]
        starts = onp.repeat(self.offsets[:-1][indices], lengths)
        within = onp.arange(int(lengths.sum())) - onp.repeat(onp.cumsum(lengths) - lengths, lengths)
        return Ragged(self.flat[starts + within], lengths)


class BucketBatches:
    """Batches of pairs of similar lengths, each padded to its BUCKET's widths.

    ``src``/``tgt``: lists of id lists, or `Ragged` (targets with <bos> ... <eos>). Batches are
    ``(X, X_valid_len, Y, Y_valid_len)`` as `load_data_nmt`'s, float32. Padding to the bucket
    rather than to the batch's longest pair keeps the shapes to a small fixed set
    (`shapes`: at most two batch sizes per bucket): a graph meets tens of shapes, not thousands. A
    batch holds `batch_size` pairs, and with ``batch_tokens`` at most that many padded tokens
    of its longer side (`batch_rows`: fairseq's ``--max-tokens``), so that long pairs come in
    fewer rows and a batch's memory does not grow with its pairs' length.

    Every epoch the pairs of each bucket are shuffled, cut into batches, and the batches of all
    buckets shuffled together, with NumPy's global random state (as Gluon's samplers). With
    ``num_workers > 1`` that list of batches is built from ALL pairs on every worker and worker
    ``rank`` takes every ``num_workers``-th batch, the same number on every worker: the step
    count cannot differ between workers (``dist_sync`` would wait forever for the missing
    step), whatever the lengths. The workers must seed NumPy alike (the CLI does: the same
    ``--seed``) for their batches to be disjoint; the count does not depend on it.
    """

    def __init__(self, src, tgt, batch_size, num_buckets, src_pad, tgt_pad, *, batch_tokens=0,
                 shuffle=True, rank=0, num_workers=1):
        if not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} is not in 0..{num_workers - 1}")
        if not len(src):
            raise ValueError("no training pairs")
        self.src, self.tgt = Ragged.of(src), Ragged.of(tgt)
        self.batch_size, self.shuffle = batch_size, shuffle
        self.rank, self.num_workers = rank, num_workers
        self.src_pad, self.tgt_pad = src_pad, tgt_pad
        src_len, tgt_len = self.src.lengths, self.tgt.lengths
        widths = bucket_widths(src_len, tgt_len, num_buckets)
        # the first bucket a pair fits both ways: the widths form a chain, growing both ways
        ws, wt = (onp.array(w) for w in zip(*widths))
        bucket = onp.maximum(onp.searchsorted(ws, src_len), onp.searchsorted(wt, tgt_len))
        order = onp.argsort(bucket, kind="stable")  # each bucket's pairs in corpus order
        found, starts = onp.unique(bucket[order], return_index=True)
        self.widths = [widths[b] for b in found]
        self.buckets = onp.split(order, starts[1:])
        self.rows = [batch_rows(batch_size, batch_tokens, w) for w in self.widths]
        self.num_batches = sum((len(b) + n - 1) // n for b, n in zip(self.buckets, self.rows))

    def __len__(self):
        """Batches per epoch for this worker (the same for every worker)."""
        return self.num_batches // self.num_workers

    @property
    def shapes(self):
        """The set of ``(rows, src_width, tgt_width)`` this loader's batches can have."""
        out = set()
        for (ws, wt), members, n in zip(self.widths, self.buckets, self.rows):
            if len(members) >= n:
                out.add((n, ws, wt))
            if len(members) % n:
                out.add((len(members) % n, ws, wt))
        return out

    def __iter__(self):
        batches = []
        for b, (members, n) in enumerate(zip(self.buckets, self.rows)):
            if self.shuffle:
                members = members.copy()
                onp.random.shuffle(members)
            batches += [(b, members[i:i + n]) for i in range(0, len(members), n)]
        order = onp.random.permutation(len(batches)) if self.shuffle else onp.arange(len(batches))
        for k in order[self.rank::self.num_workers][:len(self)]:
            yield self._pad(*batches[k])

    def _pad(self, bucket, rows):
        ws, wt = self.widths[bucket]
        X = onp.full((len(rows), ws), self.src_pad, dtype=onp.float32)  # (batch, src_width)
        Y = onp.full((len(rows), wt), self.tgt_pad, dtype=onp.float32)  # (batch, tgt_width)
        X_len = onp.empty(len(rows), dtype=onp.float32)
        Y_len = onp.empty(len(rows), dtype=onp.float32)
        for r, i in enumerate(rows):
            s, t = self.src[i], self.tgt[i]
            X[r, :len(s)], Y[r, :len(t)], X_len[r], Y_len[r] = s, t, len(s), len(t)
        return tuple(np.array(a, dtype="float32") for a in (X, X_len, Y, Y_len))


def batch_rows(batch_size, batch_tokens, widths):
    """The pairs a batch of a bucket of `widths` ``(src, tgt)`` holds: `batch_size`, and with
    `batch_tokens` at most that many padded tokens of its longer side (at least one pair)."""
    if not batch_tokens:
        return batch_size
    return max(1, min(batch_size, batch_tokens // max(widths)))


def load_bucketed(source, target, src_vocab, tgt_vocab, batch_size, num_buckets, shuffle=True,
                  *, batch_tokens=0, rank=0, num_workers=1):
    """`BucketBatches` of id sequences (`Ragged`, or lists of id lists), the targets wrapped in
    ``<bos>`` ... ``<eos>``, none cut (`data.lengths` keeps the pairs that fit); batches are
    those of `load_data_nmt`: ``(X, X_valid_len, Y, Y_valid_len)``, padded to their bucket's
    widths."""
    src = Ragged.of(source)
    tgt = Ragged.of(target).wrap(tgt_vocab["<bos>"], tgt_vocab["<eos>"])
    return BucketBatches(src, tgt, batch_size, num_buckets, src_vocab["<pad>"], tgt_vocab["<pad>"],
                         batch_tokens=batch_tokens, shuffle=shuffle, rank=rank,
                         num_workers=num_workers)
