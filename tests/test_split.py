"""Held-out sets that are held out: splits by source sentence, and the count of test sources
that training has seen."""

import zipfile

import numpy as onp
import pytest

import d2l_transformer as d2t
from d2l_transformer.data import (
    clean_text,
    heldout_nmt,
    load_data_split,
    normalize_source,
    read_pairs,
    source_overlap,
    split_corpus,
    split_pairs,
)


def _zip(tmp_path, lines):
    path = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("fra-eng/fra.txt", "\n".join(lines) + "\n")
    return str(path)


def test_normalize_source_is_d2ls_preprocessing():
    assert normalize_source("Go.") == normalize_source("go .") == normalize_source(" GO  .") == "go ."
    assert normalize_source(["go", "."]) == "go ."  # d2l's tokens
    assert normalize_source("Wait!") != normalize_source("Wait.")
    assert clean_text(" Cours\u202f!  Vite\xa0! ") == "Cours ! Vite !"


def test_split_keeps_each_source_in_one_part():
    """50 sentences, each with 1-4 translations in various spellings of its case and spacing."""
    rng = onp.random.RandomState(0)
    source, target = [], []
    for i in range(50):
        for j in range(rng.randint(1, 5)):
            source.append(f"Sentence {i}." if j % 2 else f"sentence {i} .")
            target.append(f"Phrase {i}-{j}.")
    train, valid, test = split_pairs(source, target, 10, 15, seed=3)
    assert (len(valid.source), len(test.source)) == (10, 15)
    assert len(train.source) + 25 == len(source)
    keys = [{normalize_source(s) for s in part.source} for part in (train, valid, test)]
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]
    assert source_overlap(test.source, train.source) == source_overlap(valid.source, train.source) == 0
    assert sorted(train.target + valid.target + test.target) == sorted(target)
    assert all(t.startswith("Phrase " + normalize_source(s).split()[1] + "-")
               for part in (train, valid, test) for s, t in zip(*part))
    assert split_pairs(source, target, 10, 15, seed=3) == (train, valid, test)
    assert split_pairs(source, target, 10, 15, seed=4) != (train, valid, test)


def test_source_overlap_counts_pairs():
    assert source_overlap(["Go.", "go .", "Run!", "Hi."], ["GO.", "Hi there."]) == 2


def test_split_of_fra_txt_holds_out_sentences():
    """The full presets' split of all 167,130 pairs: 2,000 valid and 2,000 test pairs, none of
    whose source sentences is in the training part. A split of PAIRS with the same seed (how
    the full preset was split before) shares 1,009 of its 2,000 test sources with training."""
    train, valid, test = split_corpus(None, 2000, 2000)
    assert (len(train.source), len(valid.source), len(test.source)) == (163130, 2000, 2000)
    assert source_overlap(test.source, train.source) == 0
    assert source_overlap(valid.source, train.source) == 0
    assert source_overlap(test.source, valid.source) == 0
    old = split_corpus(None, 2000, 2000, by="pair")  # model directories trained before
    assert source_overlap(old.test.source, old.train.source) == 1009
    with pytest.raises(ValueError, match="unknown split 'line'"):
        split_corpus(None, 2000, 2000, by="line")


def test_heldout_leaves_out_sources_the_chapter_trains_on(tmp_path, nmt):
    """Lines after the training pairs whose source is a training source are left out."""
    path = _zip(tmp_path, ["Go.\tVa !", "Hi.\tSalut !", "Run!\tCours !", "Go.\tBouge !",
                           "Hi!\tSalut !", "GO .\tEn route !", "Who?\tQui ?"])
    src_vocab, tgt_vocab, _ = d2t.load_data_nmt(2, 5, 2, path)  # lines 0..2
    held = heldout_nmt(src_vocab, tgt_vocab, 2, path=path)
    assert held["excluded"] == 2  # "Go." and "GO ." again
    assert held["unfiltered"] == ([["hi", "!"], ["who?"]], [["salut", "!"], ["qui", "?"]])
    assert held["unfiltered_text"] == (["Hi!", "Who?"], ["Salut !", "Qui ?"])
    assert heldout_nmt(src_vocab, tgt_vocab, 2, 1, path=path)["unfiltered_text"] == (["Hi!"], ["Salut !"])


def test_read_pairs_numbers_lines_as_tokenize_nmt(tmp_path):
    path = _zip(tmp_path, ["Go.\tVa\u202f!", "Hi.\tSalut !"])
    assert read_pairs(path) == (["Go.", "Hi."], ["Va !", "Salut !"])
    assert read_pairs(path, 0) == (["Go."], ["Va !"])  # num_examples 0: line 0 alone
    text = d2t.preprocess_nmt(d2t.read_data_nmt(path))
    assert d2t.tokenize_nmt(text, 0) == ([["go", "."]], [["va", "!"]])


@pytest.mark.parametrize("tokenizer", ["word", "subword"])
def test_load_data_split(tokenizer):
    data = load_data_split(16, 12, 599, 2, 60, 60, 4, tokenizer=tokenizer, vocab_size=500)
    assert (len(data.valid.source), len(data.test.source)) == (60, 60)
    assert data.tokenizer.kind == tokenizer
    X, X_vlen, Y, Y_vlen = next(iter(data.train_iter))
    assert (X.shape[1], Y.shape[1]) in data.train_iter.widths
    assert int(Y[0, 0]) == data.tgt_vocab["<bos>"]
    if tokenizer == "subword":
        assert data.src_vocab.idx_to_token == data.tokenizer.src_vocab().idx_to_token
        assert any(t[:1].isupper() for t in data.src_vocab.idx_to_token[4:])  # cased
    else:
        assert all(t == t.lower() for t in data.src_vocab.idx_to_token)


def test_max_pairs_means_n_pairs(tmp_path, capsys):
    from d2l_transformer import checkpoint, cli
    base = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--epochs", "1"]
    for bad in ("0", "-3"):
        assert cli.main(base + ["--max-pairs", bad, "--out", str(tmp_path / "m")]) == 2
        assert capsys.readouterr().err == "error: --max-pairs must be at least 1\n"
    assert cli.main(base + ["--max-pairs", "1", "--out", str(tmp_path / "one")]) == 0
    assert "1 batches per epoch" in capsys.readouterr().err
    assert checkpoint.load_config(str(tmp_path / "one")).num_examples == 0
