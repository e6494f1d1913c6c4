"""The English-French dataset exactly as the d2l library the chapter calls prepares it.

``fra-eng.zip`` is read from disk, never downloaded: the path given, else the environment
variable ``D2L_TRANSFORMER_DATA``, else ``data/fra-eng.zip`` in the source tree this package
sits in.
"""

import collections
import os
import warnings
import zipfile

import numpy as onp
from mxnet import gluon, np

RESERVED_TOKENS = ["<pad>", "<bos>", "<eos>"]
DATA_ENV = "D2L_TRANSFORMER_DATA"
_MEMBER = "fra-eng/fra.txt"


class DataError(ValueError):
    """The dataset cannot be read; the message is one line naming the path."""


def default_data_path():
    """Where `read_data_nmt` looks when no path is given."""
    if os.environ.get(DATA_ENV):
        return os.environ[DATA_ENV]
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "data", "fra-eng.zip")


def read_data_nmt(path=None):
    """The raw text of ``fra-eng/fra.txt`` inside the zip: one ``english<TAB>french`` pair a line."""
    path = path or default_data_path()
    try:
        with zipfile.ZipFile(path, "r") as f:
            return f.read(_MEMBER).decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"dataset not found: {path} (set {DATA_ENV} or pass the path)") from None
    except KeyError:
        raise DataError(f"dataset {path} has no {_MEMBER} inside") from None
    except (zipfile.BadZipFile, UnicodeDecodeError, OSError, EOFError) as e:
        raise DataError(f"dataset {path} is damaged or unreadable: {e}") from None


def preprocess_nmt(text):
    """Lower-case, replace non-breaking spaces, and put a space before , . ! (d2l)."""

    def no_space(char, prev_char):
        return char in set(",.!") and prev_char != " "

    text = text.replace("\u202f", " ").replace("\xa0", " ").lower()
    out = [" " + char if i > 0 and no_space(char, text[i - 1]) else char
           for i, char in enumerate(text)]
    return "".join(out)


def tokenize_nmt(text, num_examples=None):
    """Split lines into (source tokens, target tokens); keeps lines 0..num_examples (d2l)."""
    return tokenize_nmt_lines(text, 0, num_examples + 1 if num_examples else None)


def tokenize_nmt_lines(text, start=0, stop=None):
    """`tokenize_nmt` for the lines ``start <= i < stop`` of the text (all after start if None)."""
    source, target = [], []
    for i, line in enumerate(text.split("\n")):
        if stop is not None and i >= stop:
            break
        if i < start:
            continue
        parts = line.split("\t")
        if len(parts) == 2:
            source.append(parts[0].split(" "))
            target.append(parts[1].split(" "))
    return source, target


def count_corpus(sentences):
    """Token frequencies over a list of token lists."""
    return collections.Counter(tk for line in sentences for tk in line)


class Vocab:
    """d2l's vocabulary: ``<unk>`` = 0, the reserved tokens, then tokens with frequency >=
    `min_freq` by descending frequency, ties broken by the token itself."""

    def __init__(self, tokens, min_freq=0, reserved_tokens=None):
        reserved_tokens = list(reserved_tokens or [])
        counter = count_corpus(tokens)
        self.token_freqs = sorted(counter.items(), key=lambda x: x[0])
        self.token_freqs.sort(key=lambda x: x[1], reverse=True)
        self.unk, uniq_tokens = 0, ["<unk>"] + reserved_tokens
        uniq_tokens += [token for token, freq in self.token_freqs
                        if freq >= min_freq and token not in uniq_tokens]
        self.idx_to_token = uniq_tokens
        self.token_to_idx = {token: idx for idx, token in enumerate(uniq_tokens)}

    def __len__(self):
        return len(self.idx_to_token)

    def __getitem__(self, tokens):
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self.__getitem__(token) for token in tokens]

    def to_tokens(self, indices):
        if not isinstance(indices, (list, tuple)):
            return self.idx_to_token[indices]
        return [self.idx_to_token[index] for index in indices]

    def to_dict(self):
        """The tokens in id order (all that is needed to rebuild the vocabulary)."""
        return {"idx_to_token": list(self.idx_to_token)}

    @classmethod
    def from_dict(cls, d):
        vocab = cls([])
        vocab.idx_to_token = list(d["idx_to_token"])
        vocab.token_to_idx = {t: i for i, t in enumerate(vocab.idx_to_token)}
        if len(vocab.token_to_idx) != len(vocab.idx_to_token) or vocab.idx_to_token[0] != "<unk>":
            raise ValueError("vocabulary is malformed: duplicate tokens or no <unk> at id 0")
        return vocab


def truncate_pad(line, num_steps, padding_token):
    """Cut or pad a list of ids to exactly `num_steps` (d2l)."""
    if len(line) > num_steps:
        return line[:num_steps]  # Trim
    return line + [padding_token] * (num_steps - len(line))  # Pad


def build_array(lines, vocab, num_steps, is_source):
    """Ids (targets wrapped in <bos> ... <eos>), padded to num_steps, and valid lengths (d2l)."""
    lines = [vocab[line] for line in lines]
    if not is_source:
        lines = [[vocab["<bos>"]] + line + [vocab["<eos>"]] for line in lines]
    array = np.array([truncate_pad(line, num_steps, vocab["<pad>"]) for line in lines])
    valid_len = (array != vocab["<pad>"]).sum(axis=1)
    return array, valid_len


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


def load_data_nmt(batch_size, num_steps, num_examples=1000, path=None, *, rank=0, num_workers=1,
                  fast_loader=False):
    """(src_vocab, tgt_vocab, data_iter) for the first `num_examples` + 1 pairs (d2l).

    With the chapter's arguments: 180 source tokens, 162 target tokens, 1001 pairs.
    ``rank``/``num_workers`` (issue 6): the vocabularies come from all pairs, the batches only
    from this worker's `shard`. ``fast_loader`` (issue 4): `ArrayBatches` instead of Gluon's
    DataLoader (the same batches, faster).
    """
    text = preprocess_nmt(read_data_nmt(path))
    source, target = tokenize_nmt(text, num_examples)
    src_vocab = Vocab(source, min_freq=3, reserved_tokens=RESERVED_TOKENS)
    tgt_vocab = Vocab(target, min_freq=3, reserved_tokens=RESERVED_TOKENS)
    if num_workers > 1:
        source, target = shard(source, rank, num_workers), shard(target, rank, num_workers)
    src_array, src_valid_len = build_array(source, src_vocab, num_steps, True)
    tgt_array, tgt_valid_len = build_array(target, tgt_vocab, num_steps, False)
    data_arrays = (src_array, src_valid_len, tgt_array, tgt_valid_len)
    data_iter = (ArrayBatches if fast_loader else load_array)(data_arrays, batch_size)
    return src_vocab, tgt_vocab, data_iter


def heldout_nmt(src_vocab, tgt_vocab, num_examples=1000, num_heldout=None, path=None):
    """Pairs the chapter run never trains on: lines ``num_examples + 1 ...`` of fra.txt.

    Returns ``{"unfiltered": (source, target), "in_vocab": (source, target)}`` for the next
    `num_heldout` lines (``None``: all the rest); ``in_vocab`` keeps the pairs whose every
    source and target token is in the vocabularies (a fair test of a small-vocabulary model).
    The split is a fixed range of lines, so it is the same on every machine and every run.
    """
    text = preprocess_nmt(read_data_nmt(path))
    start = num_examples + 1  # the chapter keeps lines 0..num_examples
    stop = None if num_heldout is None else start + num_heldout
    source, target = tokenize_nmt_lines(text, start, stop)
    keep = [i for i in range(len(source))
            if src_vocab.unk not in src_vocab[source[i]] and tgt_vocab.unk not in tgt_vocab[target[i]]]
    return {"unfiltered": (source, target),
            "in_vocab": ([source[i] for i in keep], [target[i] for i in keep])}


def split_pairs(source, target, num_valid, num_test, seed=0):
    """A deterministic random (train, valid, test) split of parallel lists (a fixed-seed
    permutation, independent of the global RNGs). Each part is ``(source, target)``."""
    order = onp.random.RandomState(seed).permutation(len(source))
    parts = (order[num_valid + num_test:], order[:num_valid], order[num_valid:num_valid + num_test])
    return tuple(([source[i] for i in idx], [target[i] for i in idx]) for idx in parts)


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


SPLIT_SEED = 0  # the valid/test split is the same for every run, whatever its --seed


def load_data_split(batch_size, num_steps, num_examples=None, min_freq=3, num_valid=0,
                    num_test=0, num_buckets=0, path=None, *, rank=0, num_workers=1):
    """`load_data_nmt` with a held-out split and optional bucketing, for corpora beyond the
    chapter's 1001 pairs: ``(src_vocab, tgt_vocab, train_iter, valid, test)``.

    The first ``num_examples + 1`` pairs (all when None) are split at random, with a fixed seed,
    into train / `num_valid` / `num_test` pairs; the vocabularies see only the training part.
    valid and test are ``(source tokens, target tokens)``. ``rank``/``num_workers``: as in
    `load_data_nmt`, only the training batches are this worker's shard.
    """
    text = preprocess_nmt(read_data_nmt(path))
    source, target = tokenize_nmt(text, num_examples)
    num_valid, num_test = min(num_valid, len(source) // 10), min(num_test, len(source) // 10)
    train, valid, test = split_pairs(source, target, num_valid, num_test, SPLIT_SEED)
    src_vocab = Vocab(train[0], min_freq=min_freq, reserved_tokens=RESERVED_TOKENS)
    tgt_vocab = Vocab(train[1], min_freq=min_freq, reserved_tokens=RESERVED_TOKENS)
    if num_workers > 1:
        train = (shard(train[0], rank, num_workers), shard(train[1], rank, num_workers))
    if num_buckets:
        train_iter = load_bucketed(*train, src_vocab, tgt_vocab, batch_size, num_steps, num_buckets)
    else:
        src_array, src_valid_len = build_array(train[0], src_vocab, num_steps, True)
        tgt_array, tgt_valid_len = build_array(train[1], tgt_vocab, num_steps, False)
        train_iter = load_array((src_array, src_valid_len, tgt_array, tgt_valid_len), batch_size)
    return src_vocab, tgt_vocab, train_iter, valid, test
