"""BLEU: d2l's per-sentence definition, corpus BLEU through sacrebleu; the held-out split."""

import collections
import math
from unittest import mock

import pytest

import d2l_transformer as d2t
from d2l_transformer import evaluate
from d2l_transformer.data import heldout_nmt, split_pairs


def d2l_bleu(pred_seq, label_seq, k):  # d2l-en chapter_recurrent-modern/seq2seq.md, verbatim
    pred_tokens, label_tokens = pred_seq.split(' '), label_seq.split(' ')
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    score = math.exp(min(0, 1 - len_label / len_pred))
    for n in range(1, k + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs[''.join(label_tokens[i: i + n])] += 1
        for i in range(len_pred - n + 1):
            if label_subs[''.join(pred_tokens[i: i + n])] > 0:
                num_matches += 1
                label_subs[''.join(pred_tokens[i: i + n])] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


@pytest.mark.parametrize("pred,label,k,expected", [
    ("va !", "va !", 2, 1.0),  # d2l 1.0 prints `go . => va !, bleu 1.000`
    ("je suis chez moi .", "je suis chez moi .", 4, 1.0),
    ("x y z", "va !", 2, 0.0),  # no unigram matches
    # worked: same length (BP 1), p1 = 3/4, p2 = 1/3 (ab of ab bc cd) -> (3/4)^(1/2) (1/3)^(1/4)
    ("a b c d", "a b e d", 2, math.sqrt(0.75) * (1 / 3) ** 0.25),
    # brevity penalty exp(1 - 4/2), p1 = 1, p2 = 1
    ("il est", "il est calme .", 2, math.exp(1 - 4 / 2)),
])
def test_bleu_equals_d2l(pred, label, k, expected):
    assert evaluate.bleu(pred, label, k) == pytest.approx(expected, abs=1e-12)
    assert evaluate.bleu(pred, label, k) == d2l_bleu(pred, label, k)


def test_bleu_short_prediction_is_zero_where_d2l_divides_by_zero():
    with pytest.raises(ZeroDivisionError):
        d2l_bleu("va", "va !", 2)
    assert evaluate.bleu("va", "va !", 2) == 0.0


def test_corpus_bleu_goes_through_sacrebleu():
    hyps, refs = ["il est calme .", "va !"], ["il est calme .", "va !"]
    assert evaluate.corpus_bleu(hyps, refs).score == pytest.approx(100.0)
    with mock.patch("sacrebleu.corpus_bleu", wraps=evaluate.sacrebleu.corpus_bleu) as spy:
        score = evaluate.corpus_bleu(["il est très calme ."], ["il est très calme !"])
    spy.assert_called_once_with(["il est très calme ."], [["il est très calme !"]], tokenize="none",
                                force=True)
    # p1..p4 = 4/5, 3/4, 2/3, 1/2 and BP 1: BLEU = 100 * (1/5) ** (1/4)
    assert score.score == pytest.approx(100 * 0.2 ** 0.25, abs=1e-9)
    # "none" keeps "l'ai" one token; 13a would split it and change the count
    assert evaluate.corpus_bleu(["je l'ai ."], ["je l'ai ."]).sys_len == 3
    with pytest.raises(ValueError, match="1 hypotheses but 2 references"):
        evaluate.corpus_bleu(["a"], ["a", "b"])


def test_heldout_split_counts(nmt):
    src_vocab, tgt_vocab, _ = nmt
    held = heldout_nmt(src_vocab, tgt_vocab, 1000)
    src, tgt = held["unfiltered"]
    assert len(src) == len(tgt) == 166129  # 167130 pairs - the chapter's 1001
    assert (src[0], tgt[0]) == (["who", "knows?"], ["qui", "sait", "?"])  # line 1001
    fsrc, ftgt = held["in_vocab"]
    assert len(fsrc) == 146
    assert all(src_vocab.unk not in src_vocab[s] for s in fsrc)
    assert all(tgt_vocab.unk not in tgt_vocab[t] for t in ftgt)
    assert len(heldout_nmt(src_vocab, tgt_vocab, 1000, num_heldout=1000)["unfiltered"][0]) == 1000


def test_split_pairs_is_deterministic_and_disjoint():
    src, tgt = [[str(i)] for i in range(100)], [[str(-i)] for i in range(100)]
    train, valid, test = split_pairs(src, tgt, 10, 20, seed=3)
    assert (len(train[0]), len(valid[0]), len(test[0])) == (70, 10, 20)
    assert sorted(s[0] for p in (train, valid, test) for s in p[0]) == sorted(s[0] for s in src)
    assert split_pairs(src, tgt, 10, 20, seed=3) == (train, valid, test)
    assert all(t == [str(-int(s[0]))] for s, t in zip(*train))


def test_tokenize_nmt_unchanged_by_the_range_helper():
    text = d2t.preprocess_nmt("go.\tva !\nhi.\tsalut !\nrun!\tcours !\n")
    assert d2t.tokenize_nmt(text, 1) == ([["go", "."], ["hi", "."]], [["va", "!"], ["salut", "!"]])
    assert d2t.data.tokenize_nmt_lines(text, 1, 2) == ([["hi", "."]], [["salut", "!"]])
