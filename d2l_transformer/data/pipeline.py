"""The data a config trains on, through the pipeline its fields choose: the chapter's (each
edition's, d2l 9.5), d2l 1.0's with its validation pairs, or the held-out pipeline (a split or
the user's own dev and test sets, a tokenizer, the lengths the training part allows, buckets of
batches by tokens); any corpus or corpora, in the config's direction, read once (`corpus`)."""

import collections

import numpy as onp
from mxnet import np

from .batches import Ragged, load_array, load_bucketed, shard
from .corpus import read_corpus
from .lengths import keep_pairs, length_limit, length_ratio
from .sources import DataError
from .split import make_parts
from .text import RESERVED_TOKENS, Vocab, load_data_mt_fra_eng, load_data_nmt
from .tokenize import TOKENIZERS, SubwordTokenizer, TokenizerError, WordTokenizer, words_problem

SplitData = collections.namedtuple("SplitData", ["src_vocab", "tgt_vocab", "train_iter", "valid",
                                                 "test", "tokenizer", "report"])
Data = collections.namedtuple("Data", ["src_vocab", "tgt_vocab", "train_iter", "tokenizer",
                                       "edition_valid", "corpus", "parts", "report"])


def load_data(cfg, batch_size, data_path=None, *, rank=0, num_workers=1, fast=False,
              tokenizer=None, vocabs=None, valid=None, test=None):
    """The `Data` a run of `cfg` trains on: ``src_vocab``, ``tgt_vocab``, ``train_iter``,
    ``tokenizer``, ``edition_valid`` (d2l 1.0's validation batches, else None), the `Corpus`
    read, the held-out ``parts`` (`split.Split`, None for the chapter's pipeline) and the
    ``report`` of what was read, cleaned, held out and dropped (summary.json's ``data``).
    ``data_path``: what `corpus.read_corpus` reads, in `cfg`'s direction. ``tokenizer``: the
    one a resumed or fine-tuned run was trained with (else `cfg`'s, a subword one trained on
    the training part), ``vocabs`` its ``(src_vocab, tgt_vocab)`` (a fine-tuned run goes through
    the held-out pipeline with them). ``valid``, ``test``: the user's own sets
    (`corpus.read_heldout`)."""
    corpus = read_corpus(data_path, cfg.source_lang, cfg.target_lang)
    report = {"counts": dict(corpus.counts)}
    used = None if cfg.num_examples is None else cfg.num_examples + 1 + (  # d2l: 0..num_examples
        cfg.num_valid if cfg.edition == "1.0" else 0)  # 1.0: its validation pairs after them
    if used is not None and used < len(corpus.sources):
        report["counts"]["first"] = used
    if cfg.tokenizer == "word":  # the chapter's words are what lies between spaces: DataError
        problem = words_problem(corpus)
        if problem:
            raise DataError(problem)
    if cfg.edition == "1.0":
        if num_workers > 1:
            raise DataError("edition 1.0 trains in one process (its validation is d2l's)")
        src_vocab, tgt_vocab, train_iter, valid_iter = load_data_mt_fra_eng(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.num_valid, corpus, fast_loader=fast)
        return Data(src_vocab, tgt_vocab, train_iter, WordTokenizer("1.0"), valid_iter, corpus,
                    None, report)
    if cfg.held_out or valid or test or vocabs:
        data = load_data_split(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.min_freq, cfg.num_valid,
            cfg.num_test, cfg.num_buckets, corpus, rank=rank, num_workers=num_workers,
            tokenizer=tokenizer or cfg.tokenizer, vocab_size=cfg.vocab_size, split_by=cfg.split_by,
            joint_vocab=cfg.tie_embeddings == "all", batch_tokens=cfg.batch_tokens,
            clean=cfg.clean, valid=valid, test=test, vocabs=vocabs)
        return Data(data.src_vocab, data.tgt_vocab, data.train_iter, data.tokenizer, None,
                    corpus, (data.valid, data.test), data.report)
    src_vocab, tgt_vocab, train_iter = load_data_nmt(
        batch_size, cfg.num_steps, cfg.num_examples, corpus, rank=rank, num_workers=num_workers,
        fast_loader=fast, min_freq=cfg.min_freq, edition=cfg.edition)
    return Data(src_vocab, tgt_vocab, train_iter, WordTokenizer(cfg.edition), None, corpus, None,
                report)


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


def _encode(tok, train, min_freq, vocabs=None):
    """``(source ids, target ids, src_vocab, tgt_vocab)`` of the training `Pairs`: subwords
    straight from sentencepiece (`Ragged`), or words whose vocabularies keep `min_freq` (or are
    `vocabs`, a trained model's)."""
    if tok.kind == "subword":
        return (tok.encode_ids(train.source), tok.encode_ids(train.target, True), tok.src_vocab(),
                tok.tgt_vocab())
    source = [tok.encode(s) for s in train.source]
    target = [tok.encode_target(t) for t in train.target]
    src_vocab, tgt_vocab = vocabs or [Vocab(side, min_freq=min_freq, reserved_tokens=RESERVED_TOKENS)
                                      for side in (source, target)]
    return (Ragged.of([src_vocab[s] for s in source]), Ragged.of([tgt_vocab[t] for t in target]),
            src_vocab, tgt_vocab)


def load_data_split(batch_size, num_steps, num_examples=None, min_freq=3, num_valid=0,
                    num_test=0, num_buckets=0, path=None, *, rank=0, num_workers=1,
                    tokenizer="word", vocab_size=0, split_by="folded", joint_vocab=False,
                    batch_tokens=0, clean=True, valid=None, test=None, vocabs=None):
    """The held-out pipeline: a `SplitData` ``(src_vocab, tgt_vocab, train_iter, valid, test,
    tokenizer, report)``; valid and test are `Pairs` of text (`split.make_parts`).

    ``tokenizer``: "word" (d2l's lower-cased words, vocabularies of the training part with
    `min_freq`), "subword" (sentencepiece models of `vocab_size` pieces trained on the training
    part; the vocabularies are its pieces), or a tokenizer object (one loaded from a model
    directory, to resume or fine-tune, with its word ``vocabs``). The training pairs longer than
    `num_steps` (0: the limit of `lengths.length_limit`) or misaligned (`lengths.keep_pairs`,
    with `clean`) are dropped and counted in ``report["lengths"]``, with the limit and the
    translations' length ratio (`lengths.length_ratio`). ``num_buckets > 0``: `BucketBatches`
    (``batch_tokens``: at most that many padded tokens a batch), whose list of batches is
    sharded between ``num_workers`` workers; else arrays padded to the limit, whose pairs are
    sharded (`shard`). ``joint_vocab``: a new subword tokenizer is one model of both languages."""
    parts, report = make_parts(path, num_examples, num_valid, num_test, split_by, clean=clean,
                               valid=valid, test=test)
    tok = (make_tokenizer(tokenizer, parts.train, vocab_size, joint_vocab)
           if isinstance(tokenizer, str) else tokenizer)
    src_ids, tgt_ids, src_vocab, tgt_vocab = _encode(tok, parts.train, min_freq, vocabs)
    limit, why = length_limit(src_ids.lengths, tgt_ids.lengths, num_steps)
    keep, counts = keep_pairs(src_ids.lengths, tgt_ids.lengths, limit, ratio=clean)
    src_ids, tgt_ids = src_ids.take(keep), tgt_ids.take(keep)
    report["lengths"] = dict(counts, limit=limit, why=why, pairs=len(keep),
                             length_ratio=length_ratio(src_ids.lengths, tgt_ids.lengths))
    if not len(keep):
        raise DataError(f"no training pair is {limit} tokens or shorter ({why}): give a larger "
                        "--set num_steps, or 0 to let the data decide")
    if num_buckets:
        train_iter = load_bucketed(src_ids, tgt_ids, src_vocab, tgt_vocab, batch_size,
                                   num_buckets, batch_tokens=batch_tokens, rank=rank,
                                   num_workers=num_workers)
    else:
        train_iter = load_array(_padded(src_ids, tgt_ids, limit, src_vocab, tgt_vocab, rank,
                                        num_workers), batch_size)
    return SplitData(src_vocab, tgt_vocab, train_iter, parts.valid, parts.test, tok, report)


def trained_part(train, tok, num_steps, clean, vocabs):
    """The pairs of the training part `train` (`split.Pairs`) a run trained on: those within
    the length limit (`num_steps`, 0: the data's, `lengths.length_limit`) and, with `clean`,
    the length ratio (`lengths.keep_pairs`), measured in the model's tokenizer `tok` and
    vocabularies `vocabs` (the rule `load_data_split` drops pairs by)."""
    src_ids, tgt_ids, _, _ = _encode(tok, train, 0, vocabs)
    limit, _ = length_limit(src_ids.lengths, tgt_ids.lengths, num_steps)
    keep, _ = keep_pairs(src_ids.lengths, tgt_ids.lengths, limit, ratio=clean)
    return type(train)([train.source[i] for i in keep], [train.target[i] for i in keep])


def _padded(src_ids, tgt_ids, width, src_vocab, tgt_vocab, rank, num_workers):
    """``(X, X_valid_len, Y, Y_valid_len)`` of this worker's `shard` of the pairs, padded to
    `width`, targets in ``<bos>`` ... ``<eos>`` (`build_array`'s layout, nothing cut)."""
    rows = shard(list(range(len(src_ids))), rank, num_workers)
    src = src_ids.take(rows)
    tgt = tgt_ids.take(rows).wrap(tgt_vocab["<bos>"], tgt_vocab["<eos>"])
    arrays = []
    for seqs, pad in ((src, src_vocab["<pad>"]), (tgt, tgt_vocab["<pad>"])):
        array = onp.full((len(seqs), width), pad, dtype=onp.float32)  # (n, width)
        for i in range(len(seqs)):
            array[i, :seqs.lengths[i]] = seqs[i]
        arrays += [np.array(array), np.array(seqs.lengths, dtype="float32")]
    return arrays
