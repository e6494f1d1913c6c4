"""How long a training pair may be, which pairs are kept, and how long a translation may grow:
each from the training part's own token lengths (docs/data.md, "Lengths").

A pair's length is its longer row: the source's tokens, or the target's with ``<bos>`` and
``<eos>`` (what a batch holds). `length_limit`: the preset's ``num_steps`` when it gives one,
else twice the 99th percentile of the training part's pair lengths, so that only outliers (a
misaligned or concatenated line) pass it: 154 tokens on the Bible of `../shared/data/bible.sh`
(its longest pair has 122), 54 on fra-eng.zip (whose longest has 97 in the `full` preset's
training part; 102 on the split by d2l's key). `keep_pairs` drops and
counts the pairs over the limit (never cut: a cut target loses its ``<eos>``, and a model that
never sees a long sentence end does not end one) and those whose sides' lengths differ too
much (`RATIO`). `length_ratio`: the target/source ratio a translation may reach
(`inference.limits.decode_limit`).
"""

import math

import numpy as onp

LIMIT_FACTOR, LIMIT_QUANTILE = 2, 0.99  # length_limit: LIMIT_FACTOR x that quantile
# a pair whose longer side's tokens + RATIO_SLACK exceed RATIO x the shorter's + RATIO_SLACK is
# misaligned (on the Bible: a psalm's title against a verse, "(*)" against a verse); the slack
# keeps short pairs, whose subword counts vary most ("We talked." is 3 pieces, "Nous nous
# entretînmes." 10): it drops 4 of the Bible's 29,359 training pairs and 1 of fra-eng.zip's
RATIO, RATIO_SLACK = 3, 5
RATIO_FROM, RATIO_QUANTILE = 10, 0.999  # length_ratio: over sources of 10 tokens or more


def pair_lengths(src_lengths, tgt_lengths):
    """Each pair's longer row: its source tokens, or its target's with ``<bos>`` and ``<eos>``."""
    return onp.maximum(onp.asarray(src_lengths), onp.asarray(tgt_lengths) + 2)


def length_limit(src_lengths, tgt_lengths, num_steps=0):
    """``(limit, why)``: `num_steps` when it is a number (a preset's or ``--set``'s), else
    `LIMIT_FACTOR` x the `LIMIT_QUANTILE` quantile of the pairs' lengths (`pair_lengths`),
    rounded up; ``why`` says which, for the log."""
    if num_steps:
        return num_steps, "num_steps"
    lengths = pair_lengths(src_lengths, tgt_lengths)
    if not len(lengths):
        return 1, "no pairs"
    limit = int(math.ceil(LIMIT_FACTOR * onp.quantile(lengths, LIMIT_QUANTILE)))
    return limit, (f"{LIMIT_FACTOR} x the {LIMIT_QUANTILE * 100:g}th percentile of the training "
                   f"pairs' lengths; the longest has {int(lengths.max())}")


def keep_pairs(src_lengths, tgt_lengths, limit, ratio=True):
    """``(kept indices, counts)``: the pairs within `limit` (`pair_lengths`) and, with `ratio`,
    within `RATIO`; ``counts``: ``over_limit``, ``bad_ratio`` (a pair over both counts as over
    the limit)."""
    src, tgt = onp.asarray(src_lengths), onp.asarray(tgt_lengths)
    fits = pair_lengths(src, tgt) <= limit
    longer, shorter = onp.maximum(src, tgt), onp.minimum(src, tgt)
    aligned = longer + RATIO_SLACK <= RATIO * (shorter + RATIO_SLACK) if ratio else fits | True
    keep = onp.flatnonzero(fits & aligned)
    return keep, {"over_limit": int((~fits).sum()), "bad_ratio": int((fits & ~aligned).sum())}


def length_ratio(src_lengths, tgt_lengths):
    """The target/source token ratio a translation may reach: the `RATIO_QUANTILE` quantile of
    the ratios of the pairs whose source has `RATIO_FROM` tokens or more (shorter ones vary
    too much), rounded up to a tenth, at least 1 (1 when there are none)."""
    src, tgt = onp.asarray(src_lengths), onp.asarray(tgt_lengths)
    long = src >= RATIO_FROM
    if not long.any():
        return 1.0
    ratio = onp.quantile(tgt[long] / src[long], RATIO_QUANTILE)
    return max(1.0, math.ceil(ratio * 10 - 1e-9) / 10)


def format_lengths(limit, why, counts, num_pairs):
    """The log's line on lengths: the limit and why, what it and the ratio dropped."""
    dropped = [f"{counts[key]:,} {label}" for key, label in (
        ("over_limit", f"over {limit} tokens"), ("bad_ratio", "with a length ratio over "
                                                              f"{RATIO}")) if counts.get(key)]
    return (f"lengths: training pairs of at most {limit} tokens ({why}): "
            + (f"dropped {', '.join(dropped)} of {num_pairs:,}" if dropped else "none dropped"))
