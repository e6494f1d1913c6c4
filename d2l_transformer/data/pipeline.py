"""The data a config trains on, through the pipeline its fields choose: the chapter's (each
edition's, d2l 9.5), d2l 1.0's with its validation pairs, or a held-out split with a tokenizer
and buckets; any corpus, in the config's direction (`sources`)."""

from .sources import DataError, open_data
from .split import load_data_split
from .text import load_data_mt_fra_eng, load_data_nmt
from .tokenize import WordTokenizer, words_problem


def load_data(cfg, batch_size, data_path=None, *, rank=0, num_workers=1, fast=False,
              tokenizer=None):
    """``(src_vocab, tgt_vocab, train_iter, tokenizer, valid_iter)`` for `cfg`: the chapter's
    pairs (`load_data_nmt`, as `cfg.edition`'s d2l prepares them; d2l 1.0's
    `load_data_mt_fra_eng`, whose ``valid_iter`` holds its validation pairs, else None), or
    the preset's own split, tokenizer and buckets (`load_data_split`) when it has them.
    ``data_path``: a path, two aligned files or a `data.DataSource` (`data.open_data`, in
    `cfg`'s direction). ``tokenizer``: the one a resumed run was trained with (else `cfg`'s, a
    subword one trained on the training part)."""
    data_path = open_data(data_path, cfg.source_lang, cfg.target_lang)
    if cfg.tokenizer == "word":  # the chapter's words are what lies between spaces: DataError
        problem = words_problem(data_path)
        if problem:
            raise DataError(problem)
    if cfg.edition == "1.0":
        if num_workers > 1:
            raise DataError("edition 1.0 trains in one process (its validation is d2l's)")
        src_vocab, tgt_vocab, train_iter, valid_iter = load_data_mt_fra_eng(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.num_valid, data_path,
            fast_loader=fast)
        return src_vocab, tgt_vocab, train_iter, WordTokenizer("1.0"), valid_iter
    if cfg.num_valid or cfg.num_test or cfg.num_buckets:
        data = load_data_split(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.min_freq, cfg.num_valid,
            cfg.num_test, cfg.num_buckets, data_path, rank=rank, num_workers=num_workers,
            tokenizer=tokenizer or cfg.tokenizer, vocab_size=cfg.vocab_size, split_by=cfg.split_by,
            joint_vocab=cfg.tie_embeddings == "all")
        return data.src_vocab, data.tgt_vocab, data.train_iter, data.tokenizer, None
    return load_data_nmt(batch_size, cfg.num_steps, cfg.num_examples, data_path, rank=rank,
                         num_workers=num_workers, fast_loader=fast, min_freq=cfg.min_freq,
                         edition=cfg.edition) + (WordTokenizer(cfg.edition), None)
