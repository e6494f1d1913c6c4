"""Scores: d2l's per-sentence BLEU, sacreBLEU's corpus BLEU and chrF with their signatures, files
scored from the command line; the chapter's held-out set."""

import collections
import json
import math

import pytest
import sacrebleu

import d2l_transformer as d2t
from d2l_transformer import evaluate
from d2l_transformer.data import heldout_nmt, overlap, split_by_group, split_by_source


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


def test_corpus_scores_are_sacrebleus_defaults():
    """13a tokenization of detokenized text, the signature beside the score, chrF beside BLEU."""
    hyps, refs = ["Il est calme.", "Va !"], ["Il est calme.", "Va !"]
    result = evaluate.score(hyps, refs)
    assert result["bleu"] == pytest.approx(100.0) and result["chrf"] == pytest.approx(100.0)
    assert result["bleu_signature"] == \
        f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert result["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
    # 13a splits the punctuation off: p1..p4 = 4/5, 3/4, 2/3, 1/2 and BP 1
    one = evaluate.score(["Il est très calme."], ["Il est très calme!"])
    assert one["bleu"] == pytest.approx(100 * 0.2 ** 0.25, abs=1e-9)
    assert (one["sys_len"], one["ref_len"]) == (5, 5)
    assert evaluate.corpus_bleu(["Il est très calme."], ["Il est très calme!"]).score == one["bleu"]
    # detokenized and d2l-tokenized output score alike under 13a: the spaces do not count
    assert evaluate.score(["il est calme ."], ["Il est calme."], lowercase=True)["bleu"] == pytest.approx(100)
    with pytest.raises(ValueError, match="1 hypotheses but 2 references"):
        evaluate.score(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="nothing to score"):
        evaluate.score([], [])


def test_lowercase_is_in_the_signature():
    cased = evaluate.score(["il est calme."], ["Il est calme."])
    lower = evaluate.score(["il est calme."], ["Il est calme."], lowercase=True)
    assert "|case:mixed|" in cased["bleu_signature"] and "|case:lc|" in lower["bleu_signature"]
    assert "|case:lc|" in lower["chrf_signature"]
    assert lower["bleu"] == pytest.approx(100) and cased["bleu"] < 100 and lower["chrf"] > cased["chrf"]


def test_score_files_and_the_cli(tmp_path, capsys):
    """`d2l-transformer evaluate --hyp FILE --ref FILE`: the same numbers, no model needed."""
    from d2l_transformer.cli import commands as cli
    hyp, ref, out = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "scores.json"
    hyp.write_text("Il est calme.\nVa !\nJe suis chez moi.\n", encoding="utf-8")
    ref.write_text("Il est très calme.\nVa !\nJe suis à la maison.\n", encoding="utf-8")
    expected = evaluate.score(["Il est calme.", "Va !", "Je suis chez moi."],
                              ["Il est très calme.", "Va !", "Je suis à la maison."])
    assert evaluate.score_files(str(hyp), str(ref)) == expected
    assert cli.main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{evaluate.format_score(expected)}  (3 sentences)"
    assert lines[1] == f"BLEU signature: {expected['bleu_signature']}"
    assert lines[2] == f"chrF signature: {expected['chrf_signature']}"
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["bleu"] == expected["bleu"] and saved["chrf_signature"] == expected["chrf_signature"]
    assert cli.main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lowercase"]) == 0
    assert "case:lc" in capsys.readouterr().out
    ref2 = tmp_path / "ref2.txt"  # a second reference for lines 1 and 3, none for line 2
    ref2.write_text("Il est calme.\n\nJe suis chez moi.\n", encoding="utf-8")
    both = evaluate.score(["Il est calme.", "Va !", "Je suis chez moi."],
                          [["Il est très calme.", "Il est calme."], ["Va !"],
                           ["Je suis à la maison.", "Je suis chez moi."]])
    assert both["bleu"] == pytest.approx(100) and both["bleu_signature"].startswith("nrefs:var|")
    assert evaluate.score_files(str(hyp), [str(ref), str(ref2)]) == both
    assert cli.main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), str(ref2)]) == 0
    assert capsys.readouterr().out.startswith(f"{evaluate.format_score(both)}  (3 sentences)")
    with pytest.raises(ValueError, match="line 2 has no reference in any"):
        evaluate.score_files(str(hyp), [str(ref2), str(ref2)])
    short = tmp_path / "short.txt"
    short.write_text("Va !\n", encoding="utf-8")
    for argv, message in ((["--hyp", str(short), "--ref", str(ref)], "has 1 lines but"),
                          (["--hyp", str(tmp_path / "nope"), "--ref", str(ref)], "nope not found"),
                          (["--hyp", str(hyp)], "--hyp and --ref go together"),
                          ([], "evaluate needs --model DIR, or --hyp FILE --ref FILE")):
        assert cli.main(["evaluate"] + argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_heldout_split_counts(nmt):
    src_vocab, tgt_vocab, _ = nmt
    held = heldout_nmt(src_vocab, tgt_vocab, 1000)
    src, tgt = held["unfiltered"]
    assert len(src) == len(tgt) == 166129  # 167130 pairs - the chapter's 1001
    assert held["excluded"] == 0  # fra.txt keeps a sentence's translations together
    assert overlap(src, d2t.data.read_pairs(num_examples=1000).source) == 0
    assert (held["unfiltered_text"][0][0], held["unfiltered_text"][1][0]) == ("Who knows?", "Qui sait ?")
    assert (src[0], tgt[0]) == (["who", "knows?"], ["qui", "sait", "?"])  # line 1001
    fsrc, ftgt = held["in_vocab"]
    assert len(fsrc) == 146
    assert all(src_vocab.unk not in src_vocab[s] for s in fsrc)
    assert all(tgt_vocab.unk not in tgt_vocab[t] for t in ftgt)
    assert len(heldout_nmt(src_vocab, tgt_vocab, 1000, num_heldout=1000)["unfiltered"][0]) == 1000


@pytest.mark.parametrize("split", [split_by_group, split_by_source])
def test_splits_are_deterministic_and_disjoint(split):
    src, tgt = [[str(i)] for i in range(100)], [[str(-i)] for i in range(100)]
    train, valid, test = split(src, tgt, 10, 20, seed=3)
    assert (len(train[0]), len(valid[0]), len(test[0])) == (70, 10, 20)
    assert sorted(s[0] for p in (train, valid, test) for s in p[0]) == sorted(s[0] for s in src)
    assert split(src, tgt, 10, 20, seed=3) == (train, valid, test)
    assert all(t == [str(-int(s[0]))] for s, t in zip(*train))


def test_tokenize_nmt_unchanged_by_the_range_helper():
    text = d2t.preprocess_nmt("go.\tva !\nhi.\tsalut !\nrun!\tcours !\n")
    assert d2t.tokenize_nmt(text, 1) == ([["go", "."], ["hi", "."]], [["va", "!"], ["salut", "!"]])
    assert d2t.data.tokenize_nmt_lines(text, 1, 2) == ([["hi", "."]], [["salut", "!"]])


def test_several_references_per_hypothesis():
    """A reference may be a list: each hypothesis's n-grams are clipped by its best reference,
    its length compared with the closest; sacreBLEU's streams padded with None (nrefs:var)."""
    hyps = ["Il est calme.", "Va !"]
    two = evaluate.score(hyps, [["Il est tranquille.", "Il est calme."], ["Va !", "Pars !"]])
    assert two["bleu"] == pytest.approx(100) and two["bleu_signature"].startswith("nrefs:2|")
    var = evaluate.score(hyps, [["Il est tranquille.", "Il est calme."], "Pars !"])
    streams = [["Il est tranquille.", "Pars !"], ["Il est calme.", None]]
    assert var["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, streams).score)
    assert var["bleu_signature"].startswith("nrefs:var|") and var["chrf_signature"].startswith("nrefs:var|")
    assert evaluate.score(["a b"], [["a b"]]) == evaluate.score(["a b"], ["a b"])  # one in a list
    with pytest.raises(ValueError, match="has no reference"):
        evaluate.score(["a"], [[]])


def test_score_all_references_counts_each_source_once():
    go = ["Vas-y, va maintenant !", "Pars, pars tout de suite !", "Bouge de là, vite !"]
    pairs = d2t.data.Pairs(["Go.", "Go.", "Hi.", "Go.", "Run!"],
                           [go[0], go[1], "Salut à toi, mon ami !", go[2], "Cours vite !"])
    # the first three pairs scored; "Go." twice, its first hypothesis counts (not the second)
    hyps, src = [go[2], "Rien à voir avec ça.", "Salut à toi, mon ami !"], ["Go.", "Go.", "Hi."]
    result = evaluate.score_all_references(hyps, src, pairs)
    assert result["sentences"] == 2 and result["most_references"] == 3
    expected = sacrebleu.corpus_bleu([go[2], "Salut à toi, mon ami !"],
                                     [[go[0], "Salut à toi, mon ami !"], [go[1], None], [go[2], None]])
    assert result["bleu"] == pytest.approx(expected.score) == pytest.approx(100)
    # one reference each: go[2] against go[0] is wrong
    assert evaluate.score(hyps, pairs.target[:3])["bleu"] < 100
    assert evaluate.group_references(pairs.source, pairs.target) == {
        "Go.": [go[0], go[1], go[2]], "Hi.": ["Salut à toi, mon ami !"], "Run!": ["Cours vite !"]}
    with pytest.raises(ValueError, match="1 sources are not in the set, e.g. 'Stop.'"):
        evaluate.score_all_references(["Arrête !"], ["Stop."], pairs)
