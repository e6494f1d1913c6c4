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
from .keys import fold_sentence, normalize_sentence, strict_sentence
from .sources import DataError, progress
from .text import preprocess_fast, read_data_nmt, tokenize_nmt_lines

Pairs = collections.namedtuple("Pairs", ["source", "target"])
Split = collections.namedtuple("Split", ["train", "valid", "test"])
Overlap = collections.namedtuple("Overlap", ["sources", "references", "unseen"])


def read_pairs(path=None, num_examples=None):
    """The sentence pairs of fra.txt (or of any corpus, `corpus.read_corpus`) as they are kept
    (`corpus.clean_text`), uncleaned otherwise: ``Pairs(source, target)`` of the first
    ``num_examples + 1`` pairs (all when None), numbered as `tokenize_nmt` numbers them."""
    corpus = read_corpus(path)
    stop = None if num_examples is None else num_examples + 1
    sources, targets, _ = clean_pairs(corpus.sources[:stop], corpus.targets[:stop], clean=False)
    return Pairs(sources, targets)


def _strict(sentence):  # text, or d2l tokens
    return strict_sentence(sentence if isinstance(sentence, str) else " ".join(sentence))


def overlap(sentences, seen):
    """How many of `sentences` (text or d2l tokens) also occur among `seen` under the strict
    key (`keys.strict_sentence`, stricter than any split's): the test sources (or references) a
    model may have memorised rather than translated."""
    keys = {_strict(s) for s in seen}
    return sum(_strict(s) in keys for s in sentences)


def overlaps(part, train):
    """The `Overlap` of a part (`Pairs`; a target may be a list of references) with the training
    part: its sources seen as training sources, its references seen as training targets (a
    pair's, when any of them is), and the indices of its pairs unseen on both sides; under the
    strict key (`overlap`)."""
    sources = {_strict(s) for s in train.source}
    targets = {_strict(t) for t in train.target}
    seen_s = [_strict(s) in sources for s in part.source]
    seen_t = [any(_strict(r) in targets for r in ([t] if isinstance(t, str) else t))
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


def _groups(source, target, key, skip=frozenset(), idx=None):
    """The pairs `idx` (all when None) joined when they share a source or a target under `key`
    (union-find; `skip`: keys that join nothing), as index lists in order of first occurrence."""
    idx = range(len(source)) if idx is None else idx
    parent = {i: i for i in idx}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    first = {}
    for i in progress(idx, "splitting by sentence groups", "pair"):
        for k in (("s", key(source[i])), ("t", key(target[i]))):
            if k not in skip:
                a, b = root(first.setdefault(k, i)), root(i)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups = collections.defaultdict(list)
    for i in idx:
        groups[root(i)].append(i)  # in order of first occurrence: deterministic
    return list(groups.values())


def _break_giant(groups, source, target, key):
    """``(groups, note)``: each group holding over a tenth of the pairs (a few very common
    sentences, ``Yes.``, join most pairs) split again by its own structure (`_regroup`);
    ``note`` (None when no group is that large) says so in one line."""
    n = sum(len(g) for g in groups)
    giants = [g for g in groups if 10 * len(g) > n]
    if not giants:
        return groups, None
    kept, notes = [g for g in groups if 10 * len(g) <= n], []
    for giant in giants:
        pieces, hubs, shown, most = _regroup(giant, n, source, target, key)
        kept += pieces
        notes.append(f"one group of pairs joined by shared sentences holds {len(giant):,} of "
                     f"the {n:,} pairs (its most common sentence: {shown!r}, in {most:,} "
                     f"pairs): split again by its own structure, its {hubs:,} most common "
                     f"sentences joining nothing, into {len(pieces):,} groups")
    kept.sort(key=lambda g: g[0])  # in order of first occurrence, as `_groups` gives them
    return kept, "; ".join(notes) + ("; a held-out pair may share one of those sentences with "
                                     "training")


def _regroup(giant, n, source, target, key):
    """``(pieces, hubs, its most common sentence, its pairs)``: the pairs of `giant` grouped
    anew with its most common sentences (each in at least the square root of the largest
    piece's size of pairs) joining nothing, up to 3 rounds, until no piece holds over a tenth
    of the `n` pairs."""
    counts = collections.Counter(k for i in giant for k in (("s", key(source[i])),
                                                            ("t", key(target[i]))))
    (side, top), most = counts.most_common(1)[0]
    text = source if side == "s" else target
    shown = next(text[i] for i in giant if key(text[i]) == top)
    hubs, pieces = set(), [giant]
    for _ in range(3):
        largest = max(pieces, key=len)
        if 10 * len(largest) <= n:
            break
        hubs |= {k for k, c in counts.items() if c * c >= len(largest) and c > 1}
        pieces = _groups(source, target, key, frozenset(hubs), sorted(giant))
    return pieces, len(hubs), shown, most


def group_split(source, target, num_valid, num_test, seed=0, key=fold_sentence):
    """``(Split, note)``: `split_by_group` with `key`, and the note of `_break_giant` (None
    unless one group held over a tenth of the pairs)."""
    groups = _groups(source, target, key)
    note = None
    if groups and (num_valid or num_test):
        groups, note = _break_giant(groups, source, target, key)
    return _pick(source, target, _assign(groups, num_valid, num_test, seed)), note


def split_by_group(source, target, num_valid, num_test, seed=0, key=fold_sentence):
    """A deterministic random ``(train, valid, test)`` split in which no sentence of a held-out
    part, source or target, is in another part: the pairs are joined when they share a source
    or a target under `key` (`keys.fold_sentence`; `keys.normalize_sentence` for model
    directories split by ``group`` before it), and each connected group goes to one part
    (`_assign`, groups in order of first occurrence). Each part is ``Pairs(source, target)``,
    exactly `num_valid` / `num_test` pairs when enough small groups remain (as in fra.txt). A
    group of over a tenth of the pairs is split again (`_break_giant`)."""
    return group_split(source, target, num_valid, num_test, seed, key)[0]


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


def _d2l_groups(source, target, num_valid, num_test, seed=0):
    """The split ``group`` as model directories were split by it: d2l's key, no group split
    again."""
    groups = _groups(source, target, normalize_sentence)
    return _pick(source, target, _assign(groups, num_valid, num_test, seed))


def _noted(split):
    return lambda *args: (split(*args), None)


# each split's ``(Split, note)`` of ``(source, target, num_valid, num_test, seed)``
SPLITS = {"folded": group_split, "group": _noted(_d2l_groups),
          "source": _noted(split_by_source), "pair": _noted(split_by_pair)}
# the key of each split's "same sentence" (`keys`): "group" and "source" are d2l's, kept for the
# model directories split by them
SPLIT_KEYS = {"folded": fold_sentence, "group": normalize_sentence,
              "source": normalize_sentence, "pair": normalize_sentence}


def _without_heldout(source, target, heldout, key):
    """The pairs sharing no source or target (under `key`) with the user's own sets `heldout`
    (``(sources, targets, record)`` each), and how many were dropped."""
    sources = {key(s) for h in heldout for s in h[0]}
    targets = {key(t) for h in heldout for t in h[1]}
    keep = [i for i, (s, t) in enumerate(zip(source, target))
            if key(s) not in sources and key(t) not in targets]
    return [source[i] for i in keep], [target[i] for i in keep], len(source) - len(keep)


def make_parts(data, num_examples=None, num_valid=0, num_test=0, by="folded", *, clean=True,
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
        source, target, counts["shared_with_heldout"] = _without_heldout(source, target, given,
                                                                     SPLIT_KEYS[by])
    n = len(source)
    asked = (0 if valid else num_valid, 0 if test else num_test)
    (train, part_v, part_t), note = SPLITS[by](source, target, *(min(a, n // 10) for a in asked),
                                               SPLIT_SEED)
    _check_parts(corpus, n, asked, (part_v, part_t), train)
    parts = Split(train, Pairs(*valid[:2]) if valid else part_v, Pairs(*test[:2]) if test else part_t)
    report = {"split": by, "counts": counts, "kept": n,
              "valid": valid[2] if valid else {"from": "split", "pairs": len(part_v.source)},
              "test": test[2] if test else {"from": "split", "pairs": len(part_t.source)}}
    if note:
        report["note"] = f"{corpus.shown}: {note}"
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


def split_corpus(num_examples=None, num_valid=0, num_test=0, path=None, by="folded", *,
                 clean=True):
    """The `Split` of `make_parts` (train, valid and test `Pairs` of cleaned text) of the
    corpus at `path` (fra-eng.zip by default; a `corpus.Corpus`)."""
    return make_parts(path, num_examples, num_valid, num_test, by, clean=clean)[0]


def evaluation_sets(cfg, src_vocab, tgt_vocab, data=None, *, valid=None, test=None,
                    trained=None, max_sentences=None):
    """``([(name, Pairs of text, Overlap or None)], note)``: what ``evaluate`` scores of a model
    trained with `cfg` on `data`: its valid and test parts (`make_parts`; `valid`, `test`: the
    user's own sets it was trained with, named by their source file), or the chapter's training
    pairs and the pairs held out after them; ``note`` describes the chapter's held-out lines
    (None otherwise). Each part's `Overlap` (`overlaps`), over its first `max_sentences` pairs
    (the ones scored; None: all), with the pairs trained on: `trained` (a function) of the
    training part, the pairs its length filters kept (`pipeline.trained_part`)."""
    if cfg.held_out or valid or test:
        parts, _ = make_parts(data, cfg.num_examples, cfg.num_valid, cfg.num_test, cfg.split_by,
                              clean=cfg.clean, valid=valid, test=test)
        train = trained(parts.train) if trained else parts.train
        names = [os.path.basename(h[2]["files"][0]) if h else name
                 for name, h in (("valid", valid), ("test", test))]
        return [(name, part, overlaps(scored(part, max_sentences), train))
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
        (name, Pairs(*held[key]), overlaps(scored(Pairs(*held[key]), max_sentences), train))
        for name, key in (("held-out, in vocabulary", "in_vocab_text"),
                          ("held-out, unfiltered", "unfiltered_text"))], note


def scored(part, max_sentences=None):
    """The first `max_sentences` pairs of `part` (all when None): the ones ``evaluate`` scores."""
    return Pairs(part.source[:max_sentences], part.target[:max_sentences])
