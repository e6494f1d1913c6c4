"""A real corpus end to end: compressed and several files read once, cleaned with counts,
lengths from the training part (nothing cut), batches by tokens, the user's own dev and test
sets, fine-tuning, other data refused on --resume, and one line for every bad corpus."""

import json
import os

import numpy as onp
import pytest

import d2l_transformer as d2t
from d2l_transformer import checkpoint
from d2l_transformer.cli import commands as cli
from d2l_transformer.data import (
    MAX_CHARS,
    BucketBatches,
    DataError,
    Pairs,
    clean_pairs,
    format_counts,
    keep_pairs,
    length_limit,
    length_ratio,
    make_parts,
    read_corpus,
    read_heldout,
    strict_sentence,
)
from d2l_transformer.data.sources import COMPRESSED

WORDS = ("the king went up to the city and all the people of the land came with him "
         "saying peace be to this house for ever").split()


def write(path, lines):
    """`lines`, a line each, into `path`, compressed as its suffix says."""
    opener = COMPRESSED.get(os.path.splitext(str(path))[1], open)
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def long_pairs(n, seed=0, low=4, high=60):
    """`n` (source, target) pairs of `low`..`high` words, the target the source upper-cased:
    sentences as long as a Bible verse's, a task a tiny model learns, with an end to learn."""
    rng = onp.random.RandomState(seed)
    pairs = []
    for i in range(n):
        words = [WORDS[j] for j in rng.randint(0, len(WORDS), rng.randint(low, high + 1))]
        pairs.append((" ".join(words) + f" {i}.", " ".join(words).upper() + f" {i}."))
    return pairs


def corpus_files(tmp_path, pairs, name="train", suffix=""):
    return [write(tmp_path / f"{name}.{lang}{suffix}", [p[k] for p in pairs])
            for k, lang in ((0, "en"), (1, "de"))]


# ------------------------------------------------------------------------------ reading
@pytest.mark.parametrize("suffix", [".gz", ".xz", ".bz2"])
def test_compressed_files_read_as_the_plain_ones(tmp_path, suffix):
    pairs = long_pairs(50)
    plain = read_corpus(corpus_files(tmp_path, pairs))
    packed = read_corpus(corpus_files(tmp_path, pairs, suffix=suffix))
    assert packed.pairs() == plain.pairs() == ([p[0] for p in pairs], [p[1] for p in pairs])
    assert packed.columns == ("en", "de")
    tsv = write(tmp_path / f"pairs.en-de.tsv{suffix}", [f"{s}\t{t}" for s, t in pairs])
    assert read_corpus(tsv).pairs() == plain.pairs()
    broken = tmp_path / f"broken.en-de.tsv{suffix}"
    broken.write_bytes(b"not compressed at all")
    with pytest.raises(DataError, match="broken.en-de.tsv.* is damaged or unreadable"):
        read_corpus(str(broken))


def test_several_corpora_read_in_order_in_one_direction(tmp_path):
    a, b = long_pairs(10, 1), long_pairs(7, 2)
    first = write(tmp_path / "a.en-de.tsv", [f"{s}\t{t}" for s, t in a])
    second = write(tmp_path / "b.de-en.tsv", [f"{t}\t{s}" for s, t in b])  # the other way round
    corpus = read_corpus([[first], [second]])
    assert corpus.pairs() == ([p[0] for p in a + b], [p[1] for p in a + b])
    assert [r["pairs"] for r in corpus.records] == [10, 7]
    assert [r["columns"] for r in corpus.records] == [["en", "de"], ["de", "en"]]
    reversed_ = read_corpus([[first], [second]], "de")
    assert reversed_.pairs() == ([p[1] for p in a + b], [p[0] for p in a + b])
    other = write(tmp_path / "c.en-fr.tsv", ["Hi.\tSalut."])
    with pytest.raises(DataError, match="c.en-fr.tsv holds en and fr, not en and de"):
        read_corpus([[first], [other]])


def test_names_that_lie_and_flags_that_win(tmp_path, capsys, caplog):
    pairs = long_pairs(40)
    dev = write(tmp_path / "dev.tsv", [f"{s}\t{t}" for s, t in pairs])  # dev: Domung's code
    with pytest.raises(DataError, match="cannot tell the languages of dev.tsv"):
        read_corpus(dev)
    assert read_corpus(dev, "en", "de").columns == ("en", "de")
    same = corpus_files(tmp_path, pairs[:5])
    os.rename(same[1], str(tmp_path / "other.en"))
    with pytest.raises(DataError, match="both columns of train.en and other.en are en"):
        read_corpus([same[0], str(tmp_path / "other.en")])
    named = write(tmp_path / "pairs.en-fr.tsv", [f"{s}\t{t}" for s, t in pairs])
    out = str(tmp_path / "m")
    assert cli.main(["train", "--preset", "tiny", "--data", named, "--source-lang", "en",
                     "--target-lang", "de", "--epochs", "1", "--ctx", "cpu", "--quiet",
                     "--out", out]) == 0
    said = "pairs.en-fr.tsv: its name says en and fr; read as en to de"
    assert said in caplog.text  # a plain line on stderr (tests/test_cli.py: the log's lines)
    assert "WARNING" not in capsys.readouterr().err
    assert checkpoint.load_config(out).pair == ("en", "de")


# ------------------------------------------------------------------------------ cleaning
def test_cleaning_counts_duplicates_and_overlong_sides():
    src = ["Go.", "Go. ", "Hi.", "x" * (MAX_CHARS + 1), "Run!"]
    tgt = ["Va !", "Va  !", "Salut.", "y", "Cours\u202f!"]
    kept = clean_pairs(src, tgt)
    assert kept == (["Go.", "Hi.", "Run!"], ["Va !", "Salut.", "Cours !"],
                    {"duplicates": 1, "too_long": 1})
    assert clean_pairs(src, tgt, clean=False)[2] == {"duplicates": 0, "too_long": 0}
    assert len(clean_pairs(src, tgt, clean=False)[0]) == 5


def test_lengths_from_the_training_part():
    """Twice the 99th percentile of the pairs' longer rows (the target with <bos> and <eos>);
    a pair over it is dropped and counted, never cut; a misaligned pair too."""
    src = onp.array([10] * 98 + [30, 200])
    tgt = onp.array([12] * 98 + [28, 9])
    limit, why = length_limit(src, tgt)
    expected = int(onp.ceil(2 * onp.quantile(onp.maximum(src, tgt + 2), 0.99)))
    assert limit == expected and "99th percentile" in why and "the longest has 200" in why
    assert length_limit(src, tgt, num_steps=30) == (30, "num_steps")
    keep, counts = keep_pairs(src, tgt, 30)
    assert counts == {"over_limit": 1, "bad_ratio": 0} and len(keep) == 99
    keep, counts = keep_pairs([10, 3, 9, 28], [12, 10, 58, 9], 100)  # (l + 5) / (s + 5) > 3
    assert list(keep) == [0, 1, 3] and counts == {"over_limit": 0, "bad_ratio": 1}
    assert length_ratio([4, 10, 20, 30], [20, 11, 30, 33]) == 1.5  # sources of 10 or more
    assert length_ratio([4], [40]) == 1.0


def test_batches_by_tokens_hold_every_pair_once():
    rng = onp.random.RandomState(0)
    src = [list(range(n)) for n in rng.randint(3, 120, 400)]
    tgt = [list(range(n + 2)) for n in rng.randint(3, 120, 400)]
    batches = BucketBatches(src, tgt, 64, 6, 0, 0, batch_tokens=1024)
    seen = 0
    for X, _, Y, _ in batches:
        assert X.shape[0] * max(X.shape[1], Y.shape[1]) <= 1024 or X.shape[0] == 1
        assert X.shape[0] <= 64 and (X.shape[0], X.shape[1], Y.shape[1]) in batches.shapes
        seen += X.shape[0]
    assert seen == 400 and len(batches) == len(list(batches))
    assert len(BucketBatches(src, tgt, 64, 6, 0, 0)) < len(batches)  # long pairs: fewer a batch


def test_own_sets_replace_the_parts_and_leave_training(tmp_path):
    pairs = long_pairs(200)
    corpus = read_corpus(corpus_files(tmp_path, pairs))
    dev = read_heldout(corpus_files(tmp_path, pairs[:5] + long_pairs(5, 9), "dev"), "en", "de",
                       "--valid")
    parts, report = make_parts(corpus, None, 20, 20, valid=dev)
    assert parts.valid == Pairs(*dev[:2]) and len(parts.test.source) == 19
    assert report["counts"]["shared_with_heldout"] == 5 and report["valid"]["pairs"] == 10
    held = {strict_sentence(s) for s in parts.valid.source + parts.test.source}
    assert not held & {strict_sentence(s) for s in parts.train.source}
    with pytest.raises(DataError, match="line 2 is empty: nothing to translate"):
        read_heldout([write(tmp_path / "e.en", ["Go.", ""]), write(tmp_path / "e.de", ["a", "b"])],
                     "en", "de", "--test")


# ------------------------------------------------------------------------------ the command line
BAD = {"empty": ([], "is empty: no sentence pairs"),
       "blank": (["", "  ", ""], "has 3 lines, all blank"),
       "sides": (["a\t ", " \tb"], "every pair has an empty side"),
       "three": (["Hi.\tHallo.", "Yes.\tJa.", "No.\tNein."],
                 "3 pairs (after cleaning) are too few for a valid part")}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_corpus_is_one_line_naming_the_file(tmp_path, capsys, name):
    lines, message = BAD[name]
    path = write(tmp_path / f"{name}.en-de.tsv", lines)
    for preset in ("tiny", "hour"):
        out = str(tmp_path / preset)
        code = cli.main(["train", "--preset", preset, "--data", path, "--ctx", "cpu", "--quiet",
                         "--out", out])
        err = capsys.readouterr().err
        if preset == "tiny" and name == "three":
            assert code == 0  # the chapter's pipeline holds nothing out
            continue
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("error: ") and message in err and f"{name}.en-de.tsv" in err
        assert not os.path.exists(out)


def test_a_huge_line_is_dropped_and_said(tmp_path, capsys):
    pairs = long_pairs(60)
    lines = [f"{s}\t{t}" for s, t in pairs] + ["word " * 400_000 + "\tWort"]  # 2 MB
    path = write(tmp_path / "big.en-de.tsv", lines)
    assert cli.main(["train", "--preset", "tiny", "--data", path, "--set", "num_valid=5",
                     "--epochs", "1", "--ctx", "cpu", "--quiet", "--out",
                     str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert "read 61 pairs (61 lines); dropped 1 over 1,000 characters" in err
    assert err.count("read 61 pairs") == 1  # the corpus is read once


# ------------------------------------------------------------------------------ whole runs
TINY_LONG = ["--preset", "tiny", "--set", "tokenizer=subword", "--set", "vocab_size=400",
             "--set", "num_steps=0", "--set", "num_examples=null", "--set", "num_buckets=4",
             "--set", "batch_tokens=1024", "--set", "min_freq=0", "--ctx", "cpu", "--quiet"]


def _summary(out):
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.slow
def test_a_long_corpus_trains_on_gz_with_own_sets_and_its_translations_end(tmp_path, capsys):
    """Verses of up to 60 words (about 80 pieces) in .gz files, the user's dev and test sets:
    nothing is cut (the limit comes from the data), validation and the test set are the
    user's, and the model's translations end where the sentence ends (a model trained on
    targets cut at 30 tokens runs on)."""
    train = corpus_files(tmp_path, long_pairs(1500, 1, 20, 60), suffix=".gz")
    dev = corpus_files(tmp_path, long_pairs(30, 2, 20, 60), "dev")
    test = corpus_files(tmp_path, long_pairs(30, 3, 20, 60), "test")
    out = str(tmp_path / "long")
    assert cli.main(["train", *TINY_LONG, "--data", *train, "--valid", *dev, "--test", *test,
                     "--epochs", "12", "--set", "lr=0.01", "--set", "warmup_steps=100",
                     "--out", out]) == 0
    err = capsys.readouterr().err
    summary = _summary(out)
    lengths = summary["data"]["lengths"]
    assert lengths["over_limit"] == 0 and lengths["limit"] > 80 and "none dropped" in err
    assert summary["data"]["test"]["files"] == [os.path.abspath(f) for f in test]
    assert summary["validation"][-1]["sentences"] == 30
    assert cli.main(["evaluate", "--engine", "mxnet", "--model", out, "--ctx", "cpu", "--beam", "2", "--json",
                     str(tmp_path / "e.json")]) == 0
    report = json.load(open(tmp_path / "e.json"))
    assert [s["name"] for s in report["sets"]] == ["dev.en", "test.en"]
    assert report["sets"][1]["scored"] == 30  # every line
    refs = [p[1] for p in long_pairs(30, 3, 20, 60)]
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet", "--model", out, "--ctx", "cpu",
                     *[p[0] for p in long_pairs(30, 3, 20, 60)][:10]]) == 0
    outputs = capsys.readouterr().out.splitlines()
    ended = sum(o.endswith(".") and abs(len(o.split()) - len(r.split())) <= 3
                for o, r in zip(outputs, refs))
    assert ended >= 8, outputs


@pytest.mark.slow
def test_init_from_fine_tunes_and_resume_refuses_other_data(tmp_path, capsys):
    first = corpus_files(tmp_path, long_pairs(400, 1), "a")
    second = corpus_files(tmp_path, long_pairs(400, 2), "b")
    base, tuned = str(tmp_path / "base"), str(tmp_path / "tuned")
    assert cli.main(["train", *TINY_LONG, "--data", *first, "--epochs", "2", "--out", base]) == 0
    assert cli.main(["train", "--data", *second, "--epochs", "3", "--resume", "--ctx", "cpu",
                     "--out", base]) == 2
    assert "is not the data model directory" in capsys.readouterr().err
    assert cli.main(["train", "--init-from", base, "--data", *second, "--epochs", "2",
                     "--set", "lr=0.001", "--ctx", "cpu", "--quiet", "--out", tuned]) == 0
    summary = _summary(tuned)
    assert summary["init_from"]["model"] == os.path.abspath(base)
    assert [c["files"] for c in summary["init_from"]["data"]["corpora"]] == [first]
    assert [c["files"] for c in summary["data"]["corpora"]] == [second]
    for name in ("src_vocab.json", "tgt_vocab.json", "spm_src.model", "spm_tgt.model"):
        assert open(os.path.join(base, name), "rb").read() == open(os.path.join(tuned, name), "rb").read()
    assert checkpoint.load_config(tuned).lr == 0.001
    assert cli.main(["train", "--init-from", base, "--data", *second, "--set", "vocab_size=50",
                     "--ctx", "cpu", "--out", str(tmp_path / "no")]) == 2
    assert "cannot change vocab_size" in capsys.readouterr().err


def test_subwords_on_a_preset_without_held_out_parts_train_and_load(tmp_path, capsys):
    """``--set tokenizer=subword`` on the chapter's tiny preset goes through the held-out
    pipeline (its sentencepiece models are trained and kept), and the model translates; a
    model directory without them says so once."""
    out = str(tmp_path / "m")
    assert cli.main(["train", "--preset", "tiny", "--set", "tokenizer=subword", "--set",
                     "vocab_size=400", "--set", "min_freq=0", "--set", "num_steps=0",
                     "--epochs", "1", "--ctx", "cpu", "--quiet", "--out", out]) == 0
    assert checkpoint.load_config(out).tokenizer == "subword"
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet", "--model", out, "--ctx", "cpu", "Go."]) == 0
    os.remove(os.path.join(out, "current", "spm_src.model"))
    assert cli.main(["translate", "--engine", "mxnet", "--model", out, "--ctx", "cpu", "Go."]) == 2
    err = capsys.readouterr().err
    assert err == f"error: model directory {out}: spm_src.model is missing\n"  # once


def test_messages_name_what_is_missing(tmp_path, capsys):
    model = str(tmp_path / "m")
    assert cli.main(["train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet",
                     "--out", model]) == 0
    ref = write(tmp_path / "ref.fr", ["Va !"])
    capsys.readouterr()
    assert cli.main(["evaluate", "--engine", "mxnet",
                     "--model", model, "--src", str(tmp_path / "missing.txt"),
                     "--ref", ref]) == 2
    err = capsys.readouterr().err
    assert "missing.txt not found" in err and "D2L_TRANSFORMER_DATA" not in err
    long = write(tmp_path / "long.en", ["Go. " * 600, "Hi."])
    refs = write(tmp_path / "long.fr", ["Va !", "Salut !"])
    assert cli.main(["evaluate", "--engine", "mxnet",
                     "--model", model, "--src", long, "--ref", refs, "--json",
                     str(tmp_path / "e.json")]) == 0  # 1,200 words: over the positions
    out = capsys.readouterr().out
    assert "1 of its sources are longer than the model's positions" in out
    assert json.load(open(tmp_path / "e.json"))["sets"][0]["scored"] == 2


def test_a_word_model_fine_tunes_with_its_own_vocabularies(tmp_path):
    """The chapter's tiny word model, fine-tuned on other pairs of fra.txt: its vocabularies
    (words of the new data it never saw are <unk>), the held-out pipeline's batches."""
    base, tuned = str(tmp_path / "base"), str(tmp_path / "tuned")
    assert cli.main(["train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet",
                     "--out", base]) == 0
    later = write(tmp_path / "later.en-fr.tsv", [
        "\t".join(p) for p in zip(*[side[3000:3400] for side in read_corpus().pairs()])])
    assert cli.main(["train", "--init-from", base, "--data", later, "--epochs", "1", "--ctx",
                     "cpu", "--quiet", "--out", tuned]) == 0
    for name in ("src_vocab.json", "tgt_vocab.json"):
        assert open(os.path.join(base, name)).read() == open(os.path.join(tuned, name)).read()
    assert _summary(tuned)["data"]["pairs"] == 400


def test_an_in_memory_corpus_is_counted_as_one_on_disk():
    """A `Corpus` made in memory, without counts, goes wherever a data source does: its pairs
    with an empty side dropped and counted, its counts formatted."""
    sources = [f"Go {i // 4}." if i % 4 else "" for i in range(120)]
    targets = [f"Va {i // 4} ! {i % 4}" for i in range(120)]
    corpus = d2t.data.Corpus(sources, targets, "en", "fr")
    parts, report = make_parts(corpus, None, 5, 5)
    assert format_counts(report["counts"]) == "read 90 pairs (120 lines); dropped 30 blank or " \
                                              "with an empty side"
    data = d2t.data.load_data(d2t.TINY.replace(num_valid=3, num_steps=0), 4, corpus)
    assert format_counts(data.report["counts"]).startswith("read 90 pairs (120 lines)")
    with pytest.raises(DataError, match="the pairs given has 2 lines but every pair has an empty"):
        read_corpus(d2t.data.Corpus(["", "a"], ["b", ""], "en", "fr"))
