"""Held-out data: the lines after the chapter's pairs, and train/valid/test splits of a corpus."""

import numpy as onp

from .batches import load_array, load_bucketed, shard
from .text import (
    RESERVED_TOKENS,
    Vocab,
    build_array,
    preprocess_nmt,
    read_data_nmt,
    tokenize_nmt,
    tokenize_nmt_lines,
)


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
