"""Held-out data that is held out: splits by SOURCE SENTENCE, not by pair.

fra.txt has 167,130 pairs but only ~117k distinct English sentences: one sentence often comes
with several French translations. A split of pairs puts the same sentence in the training and
the test part (half of a 2,000-pair random test set), so the test would measure memory, not
translation. Here every pair whose normalised source is the same lands in the same part, and
`source_overlap` counts what a test part shares with training (0 for these splits).
"""

import collections
import os

import numpy as onp

from .batches import load_array, load_bucketed, shard
from .sources import open_data, progress
from .text import (
    RESERVED_TOKENS,
    Vocab,
    build_array,
    fra_pairs,
    plain_spaces,
    preprocess_fast,
    read_data_nmt,
    tokenize_nmt_lines,
)
from .tokenize import TOKENIZERS, SubwordTokenizer, TokenizerError, WordTokenizer

Pairs = collections.namedtuple("Pairs", ["source", "target"])
Split = collections.namedtuple("Split", ["train", "valid", "test"])
SplitData = collections.namedtuple("SplitData", ["src_vocab", "tgt_vocab", "train_iter", "valid",
                                                 "test", "tokenizer"])


def normalize_source(sentence):
    """The key that decides "same source sentence": d2l's preprocessing (lower case, a space
    before ``, . !``) with whitespace collapsed. `sentence`: text, or d2l tokens."""
    if not isinstance(sentence, str):
        return " ".join(" ".join(sentence).split())  # already preprocessed tokens
    return " ".join(preprocess_fast(sentence).split())


def clean_text(text):
    """A sentence as it is kept: non-breaking spaces (French ``Va\\u202f!``) made plain, and
    whitespace collapsed; case and punctuation untouched."""
    return " ".join(plain_spaces(text).split())


def _pairs_of(text, start=0, stop=None):
    pairs = [(clean_text(english), clean_text(french))
             for english, french in fra_pairs(text, start, stop)]
    return Pairs([s for s, _ in pairs], [t for _, t in pairs])


def read_pairs(path=None, num_examples=None, start=0):
    """The sentence pairs of fra.txt (or of any corpus, `sources.open_data`) as cleaned text
    (`clean_text`): ``Pairs(source, target)`` of the lines ``start .. num_examples`` (to the end
    when None), numbered as `tokenize_nmt` numbers them."""
    sources, targets = open_data(path).pairs()
    stop = None if num_examples is None else num_examples + 1
    return Pairs([clean_text(s) for s in progress(sources[start:stop], "cleaning", "pair")],
                 [clean_text(t) for t in targets[start:stop]])


def source_overlap(sources, train_sources):
    """How many of `sources` (text or d2l tokens) also occur, normalised, among
    `train_sources`: the test pairs a model may have memorised rather than translated."""
    seen = {normalize_source(s) for s in train_sources}
    return sum(normalize_source(s) in seen for s in sources)


def heldout_nmt(src_vocab, tgt_vocab, num_examples=1000, num_heldout=None, path=None):
    """Pairs the chapter run never trains on: lines after its ``num_examples + 1`` pairs whose
    source sentence is not among the training pairs' sources (``Go.`` has more translations
    further down; those are left out).

    Returns ``{"unfiltered": (source, target), "in_vocab": (source, target), "excluded": n}``
    with d2l's tokens, plus ``"unfiltered_text"`` and ``"in_vocab_text"``: the same pairs as
    cleaned text (`read_pairs`), the references for sacreBLEU. ``num_heldout``: at most this
    many pairs (None: all). ``in_vocab`` keeps the pairs whose every source and target token is
    in the vocabularies (a fair test of a small-vocabulary model). The same on every machine.
    """
    text = read_data_nmt(path)
    pre = preprocess_fast(text)  # = preprocess_nmt(text)
    start = num_examples + 1  # the chapter keeps lines 0..num_examples
    train_src, _ = tokenize_nmt_lines(pre, 0, start)
    seen = {normalize_source(s) for s in train_src}
    tok_src, tok_tgt = tokenize_nmt_lines(pre, start)
    raw = _pairs_of(text, start)
    keep = [i for i in range(len(tok_src)) if normalize_source(tok_src[i]) not in seen]
    excluded = len(tok_src) - len(keep)
    keep = keep[:num_heldout] if num_heldout is not None else keep
    in_vocab = [i for i in keep if src_vocab.unk not in src_vocab[tok_src[i]]
                and tgt_vocab.unk not in tgt_vocab[tok_tgt[i]]]

    def pick(lists, idx):
        return tuple([lst[i] for i in idx] for lst in lists)
    return {"unfiltered": pick((tok_src, tok_tgt), keep), "in_vocab": pick((tok_src, tok_tgt), in_vocab),
            "unfiltered_text": pick(raw, keep), "in_vocab_text": pick(raw, in_vocab),
            "excluded": excluded}


def split_pairs(source, target, num_valid, num_test, seed=0):
    """A deterministic random ``(train, valid, test)`` split that keeps every source sentence
    in one part: the pairs are grouped by `normalize_source`, the groups taken in a fixed-seed
    random order (independent of the global RNGs), and a group goes to valid while it fits in
    `num_valid` pairs, else to test while it fits in `num_test`, else to train. Each part is
    ``Pairs(source, target)`` (exactly `num_valid` / `num_test` pairs when enough single-pair
    groups remain, as in fra.txt)."""
    groups = collections.defaultdict(list)
    for i, s in enumerate(progress(source, "splitting by source sentence", "pair")):
        groups[normalize_source(s)].append(i)
    members = list(groups.values())  # in order of first occurrence: deterministic
    parts = ([], [], [])  # valid, test, train
    for g in onp.random.RandomState(seed).permutation(len(members)):
        idx = members[g]
        if len(parts[0]) + len(idx) <= num_valid:
            parts[0].extend(idx)
        elif len(parts[1]) + len(idx) <= num_test:
            parts[1].extend(idx)
        else:
            parts[2].extend(idx)
    valid, test, train = (Pairs([source[i] for i in idx], [target[i] for i in idx]) for idx in parts)
    return Split(train, valid, test)


def split_by_pair(source, target, num_valid, num_test, seed=0):
    """A fixed-seed random permutation of the PAIRS cut into ``(train, valid, test)``: how the
    full presets were split before `split_pairs`. It leaks (a source sentence can be in two
    parts); kept to evaluate model directories trained on it honestly."""
    order = onp.random.RandomState(seed).permutation(len(source))
    parts = (order[num_valid + num_test:], order[:num_valid], order[num_valid:num_valid + num_test])
    return Split(*(Pairs([source[i] for i in idx], [target[i] for i in idx]) for idx in parts))


SPLIT_SEED = 0  # the valid/test split is the same for every run, whatever its --seed
SPLITS = {"source": split_pairs, "pair": split_by_pair}


def split_corpus(num_examples=None, num_valid=0, num_test=0, path=None, by="source"):
    """`Split` of the first ``num_examples + 1`` pairs of fra.txt (all when None), as cleaned
    text; valid and test get at most a tenth of the pairs each. ``by``: "source" (`split_pairs`)
    or "pair" (`split_by_pair`, for model directories trained on it)."""
    if by not in SPLITS:
        raise ValueError(f"unknown split {by!r}: use one of {', '.join(SPLITS)}")
    pairs = read_pairs(path, num_examples)
    n = len(pairs.source)
    return SPLITS[by](pairs.source, pairs.target, min(num_valid, n // 10), min(num_test, n // 10),
                      SPLIT_SEED)


def make_tokenizer(kind, train, vocab_size, joint=False):
    """A tokenizer of `kind` ("word" or "subword"), subwords trained on the `train` Pairs;
    ``joint``: one sentencepiece model of both languages (``tie_embeddings="all"``)."""
    if joint and kind != "subword":
        raise TokenizerError(f"a joint vocabulary needs the subword tokenizer, not {kind!r}")
    if kind == "word":
        return WordTokenizer()
    if kind == "subword":
        if vocab_size < 1:
            raise TokenizerError("the subword tokenizer needs vocab_size >= 1")
        return SubwordTokenizer.train(train.source, train.target, vocab_size, joint)
    raise TokenizerError(f"unknown tokenizer {kind!r}: use one of {', '.join(TOKENIZERS)}")


def load_data_split(batch_size, num_steps, num_examples=None, min_freq=3, num_valid=0,
                    num_test=0, num_buckets=0, path=None, *, rank=0, num_workers=1,
                    tokenizer="word", vocab_size=0, split_by="source", joint_vocab=False):
    """`load_data_nmt` with a held-out split (`split_corpus`) and optional bucketing, for
    corpora beyond the chapter's 1001 pairs: a `SplitData` ``(src_vocab, tgt_vocab,
    train_iter, valid, test, tokenizer)``; valid and test are `Pairs` of text.

    ``tokenizer``: "word" (d2l's lower-cased words, vocabularies of the training part with
    `min_freq`), "subword" (sentencepiece models of `vocab_size` pieces trained on the training
    part; the vocabularies are its pieces), or a tokenizer object (one loaded from a model
    directory, to resume). ``num_buckets > 0``: `BucketBatches`, whose list of batches is
    sharded between ``num_workers`` workers; else the chapter's padded arrays, whose
    sentences are sharded (`shard`). ``split_by``: see `split_corpus`. ``joint_vocab``: a new
    subword tokenizer is one model of both languages, one vocabulary (``tie_embeddings="all"``:
    ``joint_vocab=cfg.tie_embeddings == "all"``); a tokenizer object is used as it is.
    """
    train, valid, test = split_corpus(num_examples, num_valid, num_test, path, split_by)
    tok = (make_tokenizer(tokenizer, train, vocab_size, joint_vocab) if isinstance(tokenizer, str)
           else tokenizer)
    if tok.kind == "subword" and num_buckets:  # ids straight from sentencepiece, compactly
        src_vocab, tgt_vocab = tok.src_vocab(), tok.tgt_vocab()
        train_iter = load_bucketed(tok.encode_ids(train.source), tok.encode_ids(train.target, True),
                                   src_vocab, tgt_vocab, batch_size, num_steps, num_buckets,
                                   rank=rank, num_workers=num_workers)
        return SplitData(src_vocab, tgt_vocab, train_iter, valid, test, tok)
    source = [tok.encode(s) for s in train.source]
    target = [tok.encode_target(t) for t in train.target]
    if tok.kind == "subword":
        src_vocab, tgt_vocab = tok.src_vocab(), tok.tgt_vocab()
    else:
        src_vocab = Vocab(source, min_freq=min_freq, reserved_tokens=RESERVED_TOKENS)
        tgt_vocab = Vocab(target, min_freq=min_freq, reserved_tokens=RESERVED_TOKENS)
    if num_buckets:
        train_iter = load_bucketed([src_vocab[s] for s in source], [tgt_vocab[t] for t in target],
                                   src_vocab, tgt_vocab, batch_size, num_steps, num_buckets,
                                   rank=rank, num_workers=num_workers)
    else:
        if num_workers > 1:
            source, target = shard(source, rank, num_workers), shard(target, rank, num_workers)
        src_array, src_valid_len = build_array(source, src_vocab, num_steps, True)
        tgt_array, tgt_valid_len = build_array(target, tgt_vocab, num_steps, False)
        train_iter = load_array((src_array, src_valid_len, tgt_array, tgt_valid_len), batch_size)
    return SplitData(src_vocab, tgt_vocab, train_iter, valid, test, tok)


def evaluation_sets(cfg, src_vocab, tgt_vocab, data_path=None):
    """``([(name, Pairs of text, sources seen in training or None)], note)``: the preset's own
    valid and test parts, or the chapter's training pairs and the pairs held out after them;
    ``note`` describes the chapter's held-out lines (None for the presets' own split)."""
    if cfg.num_valid or cfg.num_test or cfg.num_buckets:  # the full presets' own split
        train, valid, test = split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test, data_path,
                                          cfg.split_by)
        return [(name, part, source_overlap(part.source, train.source))
                for name, part in (("valid", valid), ("test", test))], None
    train = read_pairs(data_path, cfg.num_examples)
    held = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, path=data_path)
    data = open_data(data_path)
    shown = os.path.basename(data.member or data.files[0])
    note = (f"held-out: lines {cfg.num_examples + 1}.. of {shown}: {len(held['unfiltered'][0])} "
          f"pairs ({held['excluded']} more, whose source is a training pair's, left out), "
            f"{len(held['in_vocab'][0])} with every token in the vocabularies")
    return [("training pairs", train, None)] + [
        (name, Pairs(*held[key]), source_overlap(held[key][0], train.source))
        for name, key in (("held-out, in vocabulary", "in_vocab_text"),
                          ("held-out, unfiltered", "unfiltered_text"))], note
