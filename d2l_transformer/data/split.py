"""Held-out parts that are held out: splits by GROUPS of pairs that share a source or a target
sentence, so that no test sentence, source or reference, was seen in training.

fra.txt has 167,130 pairs but only ~117k distinct English sentences: one sentence often comes
with several French translations, and one French sentence translates several English ones
("tu es" and "vous êtes"). A split of pairs puts the same sentence in training and test (half of
a 2,000-pair random test set); a split by source sentence still lets a test REFERENCE be a
training target (52% of them from French to English). `split_by_group` joins the pairs that
share a normalised source or a normalised target (`normalize_sentence`) and keeps each connected
group in one part: 109,686 groups on fra.txt, the largest of 56 pairs, so parts of exactly 2,000
pairs are easy to draw. `split_by_source` and `split_by_pair` are the splits model directories
were trained on before (``split_by`` in their config), kept so that they are still evaluated on
their own parts. `overlaps` counts what a part shares with training; paraphrases are not caught.
"""

import collections
import os

import numpy as onp

from .corpus import clean_pairs, read_corpus
from .sources import DataError, progress
from .text import preprocess_fast, read_data_nmt, tokenize_nmt_lines

Pairs = collections.namedtuple("Pairs", ["source", "target"])
Split = collections.namedtuple("Split", ["train", "valid", "test"])
Overlap = collections.namedtuple("Overlap", ["sources", "references", "unseen"])


def normalize_sentence(sentence):
    """The key that decides "the same sentence", on either side: d2l's preprocessing (lower
    case, a space before ``, . !``) with whitespace collapsed. `sentence`: text, or d2l tokens."""
    if not isinstance(sentence, str):
        return " ".join(" ".join(sentence).split())  # already preprocessed tokens
    return " ".join(preprocess_fast(sentence).split())


def read_pairs(path=None, num_examples=None):
    """The sentence pairs of fra.txt (or of any corpus, `corpus.read_corpus`) as they are kept
    (`corpus.clean_text`), uncleaned otherwise: ``Pairs(source, target)`` of the first
    ``num_examples + 1`` pairs (all when None), numbered as `tokenize_nmt` numbers them."""
    corpus = read_corpus(path)
    stop = None if num_examples is None else num_examples + 1
    sources, targets, _ = clean_pairs(corpus.sources[:stop], corpus.targets[:stop], clean=False)
    return Pairs(sources, targets)


def overlap(sentences, seen):
    """How many of `sentences` (text or d2l tokens) also occur, normalised, among `seen`: the
    test sources (or references) a model may have memorised rather than translated."""
    keys = {normalize_sentence(s) for s in seen}
    return sum(normalize_sentence(s) in keys for s in sentences)


def overlaps(part, train):
    """The `Overlap` of a part (`Pairs`; a target may be a list of references) with the training
    part: its sources seen as training sources, its references seen as training targets (a
    pair's, when any of them is), and the indices of its pairs unseen on both sides."""
    sources = {normalize_sentence(s) for s in train.source}
    targets = {normalize_sentence(t) for t in train.target}
    seen_s = [normalize_sentence(s) in sources for s in part.source]
    seen_t = [any(normalize_sentence(r) in targets for r in ([t] if isinstance(t, str) else t))
              for t in part.target]  # a pair's references: one, or a list
    return Overlap(sum(seen_s), sum(seen_t),
                   [i for i, (a, b) in enumerate(zip(seen_s, seen_t)) if not (a or b)])


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
    corpus = read_corpus(path)
    pre = preprocess_fast(read_data_nmt(corpus))  # = preprocess_nmt(text)
    start = num_examples + 1  # the chapter keeps lines 0..num_examples
    train_src, _ = tokenize_nmt_lines(pre, 0, start)
    seen = {normalize_sentence(s) for s in train_src}
    tok_src, tok_tgt = tokenize_nmt_lines(pre, start)
    raw = tuple(side[start:] for side in read_pairs(corpus))
    keep = [i for i in range(len(tok_src)) if normalize_sentence(tok_src[i]) not in seen]
    excluded = len(tok_src) - len(keep)
    keep = keep[:num_heldout] if num_heldout is not None else keep
    in_vocab = [i for i in keep if src_vocab.unk not in src_vocab[tok_src[i]]
                and tgt_vocab.unk not in tgt_vocab[tok_tgt[i]]]

    def pick(lists, idx):
        return tuple([lst[i] for i in idx] for lst in lists)
    return {"unfiltered": pick((tok_src, tok_tgt), keep), "in_vocab": pick((tok_src, tok_tgt), in_vocab),
            "unfiltered_text": pick(raw, keep), "in_vocab_text": pick(raw, in_vocab),
            "excluded": excluded}


def _assign(members, num_valid, num_test, seed):
    """``Split`` of index groups: the groups taken in a fixed-seed random order (independent of
    the global RNGs), a group to valid while it fits in `num_valid` pairs, else to test while it
    fits in `num_test`, else to train."""
    parts = ([], [], [])  # valid, test, train
    for g in onp.random.RandomState(seed).permutation(len(members)):
        idx = members[g]
        if len(parts[0]) + len(idx) <= num_valid:
            parts[0].extend(idx)
        elif len(parts[1]) + len(idx) <= num_test:
            parts[1].extend(idx)
        else:
            parts[2].extend(idx)
    return Split(parts[2], parts[0], parts[1])


def _pick(source, target, split):
    return Split(*(Pairs([source[i] for i in idx], [target[i] for i in idx]) for idx in split))


def split_by_group(source, target, num_valid, num_test, seed=0):
    """A deterministic random ``(train, valid, test)`` split in which no sentence of a held-out
    part, source or target, is in another part: the pairs are joined when they share a
    normalised source or a normalised target (`normalize_sentence`; union-find), and each
    connected group goes to one part (`_assign`, groups in order of first occurrence). Each part
    is ``Pairs(source, target)``, exactly `num_valid` / `num_test` pairs when enough small
    groups remain (as in fra.txt)."""
    parent = list(range(len(source)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    first = {}
    for i, pair in enumerate(progress(zip(source, target), "splitting by sentence groups", "pair")):
        for key in (("s", normalize_sentence(pair[0])), ("t", normalize_sentence(pair[1]))):
            a, b = root(first.setdefault(key, i)), root(i)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups = collections.defaultdict(list)
    for i in range(len(source)):
        groups[root(i)].append(i)  # in order of first occurrence: deterministic
    return _pick(source, target, _assign(list(groups.values()), num_valid, num_test, seed))


def split_by_source(source, target, num_valid, num_test, seed=0):
    """`split_by_group` with the pairs grouped by their normalised source alone: a test
    reference may be a training target. How model directories were split before the groups."""
    groups = collections.defaultdict(list)
    for i, s in enumerate(progress(source, "splitting by source sentence", "pair")):
        groups[normalize_sentence(s)].append(i)
    return _pick(source, target, _assign(list(groups.values()), num_valid, num_test, seed))


def split_by_pair(source, target, num_valid, num_test, seed=0):
    """A fixed-seed random permutation of the PAIRS cut into ``(train, valid, test)``: how the
    full presets were split before `split_by_source`. It leaks (a source sentence can be in two
    parts); kept to evaluate model directories trained on it honestly."""
    order = onp.random.RandomState(seed).permutation(len(source))
    parts = (order[num_valid + num_test:], order[:num_valid], order[num_valid:num_valid + num_test])
    return _pick(source, target, parts)


SPLIT_SEED = 0  # the valid/test split is the same for every run, whatever its --seed
SPLITS = {"group": split_by_group, "source": split_by_source, "pair": split_by_pair}


def _without_heldout(source, target, heldout):
    """The pairs sharing no normalised source or target with the user's own sets `heldout`
    (``(sources, targets, record)`` each), and how many were dropped."""
    sources = {normalize_sentence(s) for h in heldout for s in h[0]}
    targets = {normalize_sentence(t) for h in heldout for t in h[1]}
    keep = [i for i, (s, t) in enumerate(zip(source, target))
            if normalize_sentence(s) not in sources and normalize_sentence(t) not in targets]
    return [source[i] for i in keep], [target[i] for i in keep], len(source) - len(keep)


def make_parts(data, num_examples=None, num_valid=0, num_test=0, by="group", *, clean=True,
               valid=None, test=None):
    """``(Split, report)``: the held-out parts of `data` (a `corpus.Corpus`, or what
    `corpus.read_corpus` reads), as a run trains on them. Its first ``num_examples + 1`` pairs
    (all when None), cleaned (`corpus.clean_pairs`, with `clean`), split by `by` (`SPLITS`);
    valid and test get at most a tenth of the pairs each. `valid`, `test`: the user's own sets
    (`corpus.read_heldout`), which replace the split's parts, and training pairs sharing a
    sentence with them are dropped. ``report``: the counts and records of summary.json's
    ``data``. DataError, one line, when an asked part would be empty."""
    if by not in SPLITS:
        raise ValueError(f"unknown split {by!r}: use one of {', '.join(SPLITS)}")
    corpus = read_corpus(data)
    stop = None if num_examples is None else num_examples + 1
    source, target, counts = clean_pairs(corpus.sources[:stop], corpus.targets[:stop], clean)
    counts = dict(corpus.counts, **counts)
    if stop is not None and stop < len(corpus.sources):
        counts["first"] = stop  # the first num_examples + 1 pairs (--max-pairs)
    given = [h for h in (valid, test) if h is not None]
    if given:
        source, target, counts["shared_with_heldout"] = _without_heldout(source, target, given)
    n = len(source)
    asked = (0 if valid else num_valid, 0 if test else num_test)
    train, part_v, part_t = SPLITS[by](source, target, *(min(a, n // 10) for a in asked), SPLIT_SEED)
    _check_parts(corpus, n, asked, (part_v, part_t), train)
    parts = Split(train, Pairs(*valid[:2]) if valid else part_v, Pairs(*test[:2]) if test else part_t)
    report = {"split": by, "counts": counts, "kept": n,
              "valid": valid[2] if valid else {"from": "split", "pairs": len(part_v.source)},
              "test": test[2] if test else {"from": "split", "pairs": len(part_t.source)}}
    return parts, report


def _check_parts(corpus, n, asked, parts, train):
    """DataError (one line, naming the corpus and what it needs) when a held-out part asked
    for is empty, or no training pair is left."""
    for name, want, part in zip(("valid", "test"), asked, parts):
        if want and not part.source:
            raise DataError(
                f"{corpus.shown}: {n:,} pairs (after cleaning) are too few for a {name} part: "
                f"it takes at most a tenth of the pairs, so it needs at least 10 (the preset's "
                f"{want:,} {name} pairs need {10 * want:,}); give more data or --set "
                f"num_{name}=0")
    if not train.source:
        raise DataError(f"{corpus.shown}: no training pairs are left after the held-out parts")


def split_corpus(num_examples=None, num_valid=0, num_test=0, path=None, by="group", *,
                 clean=True):
    """The `Split` of `make_parts` (train, valid and test `Pairs` of cleaned text) of the
    corpus at `path` (fra-eng.zip by default; a `corpus.Corpus`)."""
    return make_parts(path, num_examples, num_valid, num_test, by, clean=clean)[0]


def evaluation_sets(cfg, src_vocab, tgt_vocab, data=None, *, valid=None, test=None):
    """``([(name, Pairs of text, Overlap or None)], note)``: what ``evaluate`` scores of a model
    trained with `cfg` on `data`: its valid and test parts (`make_parts`; `valid`, `test`: the
    user's own sets it was trained with, named by their source file), or the chapter's training
    pairs and the pairs held out after them; ``note`` describes the chapter's held-out lines
    (None otherwise). Each part's `Overlap` with the training part (`overlaps`)."""
    if cfg.held_out or valid or test:
        parts, _ = make_parts(data, cfg.num_examples, cfg.num_valid, cfg.num_test, cfg.split_by,
                              clean=cfg.clean, valid=valid, test=test)
        names = [os.path.basename(h[2]["files"][0]) if h else name
                 for name, h in (("valid", valid), ("test", test))]
        return [(name, part, overlaps(part, parts.train))
                for name, part in zip(names, parts[1:])], None
    corpus = read_corpus(data)
    train = read_pairs(corpus, cfg.num_examples)
    held = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, path=corpus)
    shown = os.path.basename(corpus.origins[0].member or corpus.origins[0].files[0]) \
        if corpus.origins else "the corpus"
    note = (f"held-out: lines {cfg.num_examples + 1}.. of {shown}: {len(held['unfiltered'][0])} "
            f"pairs ({held['excluded']} more, whose source is a training pair's, left out), "
            f"{len(held['in_vocab'][0])} with every token in the vocabularies")
    return [("training pairs", train, None)] + [
        (name, Pairs(*held[key]), overlaps(Pairs(*held[key]), train))
        for name, key in (("held-out, in vocabulary", "in_vocab_text"),
                          ("held-out, unfiltered", "unfiltered_text"))], note
