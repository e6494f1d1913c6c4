"""Held-out sets that are held out: splits by groups of sentences (and the splits model
directories were trained on before: by source sentence, by pair), and the counts of test
sources and references that training has seen."""

import zipfile

import numpy as onp
import pytest

import d2l_transformer as d2t
from d2l_transformer.data import (
    Pairs,
    clean_text,
    fold_sentence,
    heldout_nmt,
    load_data_split,
    normalize_sentence,
    overlap,
    overlaps,
    read_pairs,
    split_by_group,
    split_by_source,
    split_corpus,
    strict_sentence,
)


def _zip(tmp_path, lines):
    path = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("fra-eng/fra.txt", "\n".join(lines) + "\n")
    return str(path)


def test_normalize_sentence_is_d2ls_preprocessing():
    assert normalize_sentence("Go.") == normalize_sentence("go .") == normalize_sentence(" GO  .") == "go ."
    assert normalize_sentence(["go", "."]) == "go ."  # d2l's tokens
    assert normalize_sentence("Wait!") != normalize_sentence("Wait.")
    assert clean_text(" Cours\u202f!  Vite\xa0! ") == "Cours ! Vite !"


def test_split_keeps_each_source_in_one_part():
    """50 sentences, each with 1-4 translations in various spellings of its case and spacing."""
    rng = onp.random.RandomState(0)
    source, target = [], []
    for i in range(50):
        for j in range(rng.randint(1, 5)):
            source.append(f"Sentence {i}." if j % 2 else f"sentence {i} .")
            target.append(f"Phrase {i}-{j}.")
    for split in (split_by_source, split_by_group):
        train, valid, test = split(source, target, 10, 15, seed=3)
        assert (len(valid.source), len(test.source)) == (10, 15)
        assert len(train.source) + 25 == len(source)
        keys = [{normalize_sentence(s) for s in part.source} for part in (train, valid, test)]
        assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]
        assert overlap(test.source, train.source) == overlap(valid.source, train.source) == 0
        assert sorted(train.target + valid.target + test.target) == sorted(target)
        assert all(t.startswith("Phrase " + normalize_sentence(s).split()[1] + "-")
                   for part in (train, valid, test) for s, t in zip(*part))
        assert split(source, target, 10, 15, seed=3) == (train, valid, test)
        assert split(source, target, 10, 15, seed=4) != (train, valid, test)


def test_groups_join_pairs_that_share_a_source_or_a_target():
    """A chain: s1-t1, s2-t1 (t1 shared), s2-t2 (s2 shared), s3-t2 (t2 shared) is one group;
    s4-t4 and s5-t5 stand alone (with 40 more, so that the chain is under a tenth of the pairs).
    Split by source only, a test reference can be a training target; by groups, never."""
    source = ["You are.", "You're.", "you're .", "Thou art.", "Run!", "Hi."]
    target = ["Tu es.", "Tu es.", "Vous êtes.", "Vous êtes.", "Cours !", "Salut !"]
    source += [f"Sentence {i}." for i in range(40)]
    target += [f"Phrase {i}." for i in range(40)]
    for seed in range(20):
        train, valid, test = split_by_group(source, target, 1, 4, seed=seed)
        for part in (train, valid, test):  # the chain's four pairs are in one part
            assert len([s for s in part.source if s in source[:4]]) in (0, 4)
        assert overlaps(test, train) == (0, 0, list(range(len(test.source))))
        assert overlaps(valid, train).references == 0
    leaks = [overlaps(test, train).references for seed in range(20)
             for train, _, test in [split_by_source(source, target, 1, 2, seed=seed)]]
    assert max(leaks) >= 1  # "Tu es." or "Vous êtes." both sides of the split


def test_overlap_counts_pairs():
    assert overlap(["Go.", "go .", "Run!", "Hi."], ["GO.", "Hi there."]) == 2
    part = Pairs(["Go.", "Hi.", "Run!"], ["Va !", ["Salut !", "Coucou !"], "Cours !"])
    train = Pairs(["GO.", "Walk."], ["Marche.", "coucou !"])
    assert overlaps(part, train) == (1, 1, [2])  # a list of references: seen when any is


@pytest.mark.parametrize("source_lang", ["en", "fr"])
def test_split_of_fra_txt_holds_out_sentences(source_lang):
    """The full presets' split of fra-eng.zip (151 exact duplicate pairs dropped first): 2,000
    valid and 2,000 test pairs, none of whose sources or references is in the training part
    under the overlap counter's strict key (letters and digits only), either way round. The
    split by d2l's key (``group``, before the folded key) left 2 valid sources, 13 valid
    references, 5 test sources and 17 test references (English to French) seen in training
    under that key. Split by source sentence (of the pairs as read), 184 (English to French)
    or 1,040 (French to English) of the 2,000 test references are training targets; split by
    PAIRS with the same seed, 1,009 of the 2,000 English test sources are training sources."""
    data = d2t.data.read_corpus(None, source_lang)
    train, valid, test = split_corpus(None, 2000, 2000, data)
    assert (len(train.source), len(valid.source), len(test.source)) == (167130 - 151 - 4000, 2000, 2000)
    for part in (valid, test):
        assert overlaps(part, train)[:2] == (0, 0)
    assert overlaps(test, valid)[:2] == (0, 0)
    d2l = split_corpus(None, 2000, 2000, data, by="group")
    flip = {"en": lambda a, b: (a, b), "fr": lambda a, b: (b, a)}[source_lang]
    assert overlaps(d2l.valid, d2l.train)[:2] == flip(2, 13)
    assert overlaps(d2l.test, d2l.train)[:2] == flip(5, 17)
    old = split_corpus(None, 2000, 2000, data, by="source", clean=False)
    assert len(old.train.source) == 163130
    assert overlaps(old.test, old.train)[:2][1] >= {"en": 184, "fr": 1040}[source_lang]
    if source_lang == "en":
        old = split_corpus(None, 2000, 2000, data, by="pair", clean=False)
        assert overlap(old.test.source, old.train.source) >= 1009
    with pytest.raises(ValueError, match="unknown split 'line'"):
        split_corpus(None, 2000, 2000, data, by="line")


def test_keys_fold_what_the_split_must_and_count_stricter():
    """The split's key folds punctuation spacing, apostrophes, quotes, Unicode forms and case;
    the overlap counter's key, written apart, is stricter (it also ignores word breaks), so it
    sees every pair the split's key joins."""
    same = [("Puis-je vous parler une minute ?", "Puis-je vous parler une minute?"),
            ("J’ai gagné.", "J'ai gagné."), ("« Oui »", '"oui"'), ("ＧＯ.", "go"),
            ("Tom: yes; no", "tom : yes ; no")]
    for a, b in same:
        assert fold_sentence(a) == fold_sentence(b), (a, b)
        assert normalize_sentence(a) != normalize_sentence(b)  # d2l's key did not join them
        assert strict_sentence(a) == strict_sentence(b)
    assert fold_sentence("Cours\u202f!") == fold_sentence("COURS !")
    assert fold_sentence("Wait!") == fold_sentence("Wait.") != fold_sentence("Go.")
    assert strict_sentence("Au revoir.") == strict_sentence("Aurevoir")
    assert fold_sentence("Au revoir.") != fold_sentence("Aurevoir")
    assert overlap(["Puis-je vous parler une minute ?"], ["puis je vous parler une minute?"]) == 1


def test_a_giant_group_is_said_and_split_again(tmp_path):
    """3,000 pairs that two very common sentences join into two groups: 1,000 clusters of two
    pairs sharing a target, each also a translation of ``Yes.`` or ``Thank you.``. The split
    says so in one line and still draws its held-out parts from those groups."""
    lines = []
    for i in range(1000):
        lines += [f"Source {i}.\tCible {i}.", f"Other {i}.\tCible {i}.",
                  f"{'Yes.' if i % 2 else 'Thank you.'}\tCible {i}."]
    path = tmp_path / "yes.en-fr.tsv"
    path.write_text("\n".join(lines) + "\n")
    parts, report = d2t.data.make_parts(str(path), None, 99, 99)
    assert (len(parts.valid.source), len(parts.test.source)) == (99, 99)  # clusters of 3
    note = report["note"]
    assert note.count("holds 1,500 of the 3,000 pairs") == 2
    assert "'Yes.'" in note and "'Thank you.'" in note
    assert "\n" not in note and "split again" in note
    assert any(s in ("Yes.", "Thank you.") for s in parts.test.source)
    heldout = {t for part in parts[1:] for t in part.target}
    assert not heldout & set(parts.train.target)  # the clusters stay whole
    small = tmp_path / "small.en-fr.tsv"
    small.write_text("".join(f"S {i}.\tC {i}.\n" for i in range(100)))
    assert "note" not in d2t.data.make_parts(str(small), None, 5, 5)[1]


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
    # at most a tenth each: fra.txt's first 600 pairs are 596 without their 4 duplicates
    assert (len(data.valid.source), len(data.test.source)) == (59, 59)
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
