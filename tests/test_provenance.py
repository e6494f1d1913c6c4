"""A model directory's record of its data holds, or the package refuses in one line: the
corpora and the user's own dev and test files are checked against their recorded SHA-256
wherever they are read again (--resume, evaluate), and a moved file may be given again."""

import json
import os
import shutil

import pytest

from d2l_transformer import cli

TINY = ["--preset", "tiny", "--set", "num_valid=10", "--set", "num_steps=0", "--set",
        "num_examples=null", "--set", "min_freq=0", "--ctx", "cpu", "--quiet"]


def _lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _pairs(n, start=0):
    return [(f"I see {i} red cats.", f"Je vois {i} chats rouges.") for i in range(start, start + n)]


def _set(tmp, name, pairs):
    return [_lines(tmp / f"{name}.en", [p[0] for p in pairs]),
            _lines(tmp / f"{name}.fr", [p[1] for p in pairs])]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny word model trained 1 epoch on a TSV corpus, with its own dev and test files."""
    tmp = tmp_path_factory.mktemp("prov")
    corpus = _lines(tmp / "train.en-fr.tsv", ["\t".join(p) for p in _pairs(120)])
    dev, test = _set(tmp, "dev", _pairs(8, 500)), _set(tmp, "test", _pairs(8, 600))
    out = str(tmp / "model")
    assert cli.main(["train", *TINY, "--data", corpus, "--valid", *dev, "--test", *test,
                     "--epochs", "1", "--out", out]) == 0
    return tmp, out, corpus, dev, test


def _one_line(capsys, *parts):
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and all(p in line for p in parts), err
    return line


def test_an_edited_dev_or_test_set_is_refused_naming_it(trained, capsys):
    tmp, out, corpus, dev, test = trained
    original = open(dev[1], encoding="utf-8").read()
    try:
        _lines(tmp / "dev.fr", [p[1] for p in _pairs(7, 500)] + ["Autre chose."])
        assert cli.main(["train", "--resume", "--epochs", "2", "--ctx", "cpu", "--quiet",
                         "--out", out]) == 2
        _one_line(capsys, "--valid", dev[1], "changed since", "SHA-256")
        assert cli.main(["evaluate", "--model", out, "--ctx", "cpu"]) == 2
        _one_line(capsys, "--valid", "changed since")
    finally:
        _lines(tmp / "dev.fr", original.splitlines())
    original = open(test[0], encoding="utf-8").read()
    try:
        _lines(tmp / "test.en", [p[0] for p in _pairs(7, 600)] + ["Something else."])
        assert cli.main(["evaluate", "--model", out, "--ctx", "cpu", "--max-sentences", "2"]) == 2
        _one_line(capsys, "--test", test[0], "changed since")
    finally:
        _lines(tmp / "test.en", original.splitlines())
    assert cli.main(["evaluate", "--model", out, "--ctx", "cpu", "--max-sentences", "2",
                     "--beam", "1"]) == 0


def test_other_data_on_resume_is_refused(trained, tmp_path, capsys):
    tmp, out, corpus, dev, test = trained
    other = _lines(tmp_path / "other.en-fr.tsv", ["\t".join(p) for p in _pairs(120, 1000)])
    assert cli.main(["train", "--resume", "--data", other, "--epochs", "2", "--ctx", "cpu",
                     "--quiet", "--out", out]) == 2
    _one_line(capsys, "other.en-fr.tsv is not the data", "SHA-256")


def test_moved_files_are_given_again(trained, tmp_path, capsys):
    """The corpus, the dev and the test files moved: --resume and evaluate say which is not
    there and what to give; given at their new place (same SHA-256) they are accepted."""
    tmp, out, corpus, dev, test = trained
    model, other = str(tmp_path / "model"), str(tmp_path / "other")
    shutil.copytree(out, model)
    shutil.copytree(out, other)
    new = tmp_path / "moved"
    shutil.copytree(tmp, new, ignore=shutil.ignore_patterns("model"))
    gone = tmp.parent / (tmp.name + "-gone")
    os.rename(tmp, gone)
    try:
        assert cli.main(["train", "--resume", "--epochs", "2", "--ctx", "cpu", "--quiet",
                         "--out", model]) == 2
        _one_line(capsys, "which is not there: give --")
        moved = [str(new / os.path.basename(f)) for f in (corpus, *dev, *test)]
        assert cli.main(["train", "--resume", "--data", moved[0], "--epochs", "2", "--ctx",
                         "cpu", "--quiet", "--out", model]) == 2
        _one_line(capsys, "--valid", "which is not there: give --valid")
        assert cli.main(["train", "--resume", "--data", moved[0], "--valid", *moved[1:3],
                         "--test", *moved[3:], "--epochs", "2", "--ctx", "cpu", "--quiet",
                         "--out", model]) == 0
        with open(os.path.join(model, "summary.json"), encoding="utf-8") as f:
            data = json.load(f)["data"]
        assert data["valid"]["files"] == moved[1:3] and data["corpora"][0]["files"] == moved[:1]
        assert cli.main(["evaluate", "--model", other, "--ctx", "cpu", "--max-sentences", "2",
                         "--beam", "1"]) == 2
        _one_line(capsys, "which is not there: give --")
        assert cli.main(["evaluate", "--model", other, "--data", moved[0], "--valid", *moved[1:3],
                         "--test", *moved[3:], "--ctx", "cpu", "--max-sentences", "2",
                         "--beam", "1"]) == 0
    finally:
        os.rename(gone, tmp)


def test_fine_tuning_or_resuming_on_another_pair_is_refused(trained, tmp_path, capsys):
    """An English-to-French model, new data named German-English: refused in one line naming
    both pairs, on --init-from and on --resume; a name that tells nothing takes the model's."""
    tmp, out, corpus, dev, test = trained
    german = _lines(tmp_path / "new.de-en.tsv", [f"Ich sehe {i}.\tI see {i}." for i in range(60)])
    tuned = str(tmp_path / "tuned")
    assert cli.main(["train", "--init-from", out, "--data", german, "--epochs", "1", "--ctx",
                     "cpu", "--quiet", "--out", tuned]) == 2
    _one_line(capsys, "new.de-en.tsv holds de and en (by its name)", "translates en to fr", "--init-from")
    assert not os.path.exists(tuned)
    assert cli.main(["train", "--resume", "--data", german, "--epochs", "2", "--ctx", "cpu",
                     "--quiet", "--out", out]) == 2
    _one_line(capsys, "holds de and en", "translates en to fr", "--resume")
    nameless = _lines(tmp_path / "more.tsv", ["\t".join(p) for p in _pairs(60, 2000)])
    assert cli.main(["train", "--init-from", out, "--data", nameless, "--epochs", "1",
                     "--set", "num_valid=5", "--ctx", "cpu", "--quiet", "--out", tuned]) == 0


def test_several_corpora_of_two_pairs_are_refused_with_the_flags(tmp_path, capsys):
    a = _lines(tmp_path / "a.en-fr.tsv", ["\t".join(p) for p in _pairs(30)])
    b = _lines(tmp_path / "b.de-en.tsv", [f"Ich sehe {i}.\tI see {i}." for i in range(30)])
    assert cli.main(["train", *TINY, "--data", a, "--data", b, "--source-lang", "en",
                     "--target-lang", "fr", "--epochs", "1", "--out", str(tmp_path / "m")]) == 2
    _one_line(capsys, "b.de-en.tsv holds de and en by its name", "one pair of languages")


def test_fine_tuning_computes_and_records_the_new_datas_lengths(trained, tmp_path):
    """The parent's limit and ratio came from its data: the child's come from its own (longer
    sentences, a longer limit, recorded), unless it sets them; length_ratio may be set."""
    tmp, out, corpus, dev, test = trained
    longer = _lines(tmp_path / "long.en-fr.tsv", [
        f"I see {i} red cats and {i} big dogs in the old town.\t"
        f"Je vois {i} chats rouges et {i} gros chiens dans la vieille ville ce soir." for i in range(60)])
    parent = json.load(open(os.path.join(out, "summary.json")))["data"]["lengths"]
    runs = {}
    for name, extra in (("computed", []), ("set", ["--set", "num_steps=40", "--set",
                                                    "length_ratio=2.5"])):
        runs[name] = str(tmp_path / name)
        assert cli.main(["train", "--init-from", out, "--data", longer, "--epochs", "1",
                         "--set", "num_valid=5", *extra, "--ctx", "cpu", "--quiet",
                         "--out", runs[name]]) == 0
    cfg = json.load(open(os.path.join(runs["computed"], "config.json")))
    lengths = json.load(open(os.path.join(runs["computed"], "summary.json")))["data"]["lengths"]
    assert lengths["limit"] > parent["limit"] and cfg["num_steps"] == lengths["limit"]
    assert cfg["length_ratio"] == lengths["length_ratio"] > 1.0 and "percentile" in lengths["why"]
    cfg = json.load(open(os.path.join(runs["set"], "config.json")))
    assert (cfg["num_steps"], cfg["length_ratio"]) == (40, 2.5)


def test_overlaps_count_the_pairs_trained_on_and_the_pairs_scored(tmp_path, capsys):
    """A training pair over the length limit was never trained on: a test source equal to it
    is not "seen"; with --max-sentences, the counts cover the pairs scored."""
    long = ("I see a very long line of many red cats and many big dogs walking in the old "
            "town tonight.", "Je vois une très longue file de chats rouges et de gros chiens "
                             "marchant dans la vieille ville ce soir.")
    corpus = _lines(tmp_path / "c.en-fr.tsv", ["\t".join(p) for p in _pairs(120) + [long]])
    dev = _set(tmp_path, "dev", _pairs(6, 500))
    model = str(tmp_path / "m")
    assert cli.main(["train", *TINY, "--set", "num_steps=12", "--data", corpus, "--valid", *dev,
                     "--epochs", "1", "--out", model]) == 0
    lengths = json.load(open(os.path.join(model, "summary.json")))["data"]["lengths"]
    assert lengths["over_limit"] == 1
    src = _lines(tmp_path / "t.en", [long[0], "I see 5 red cats.", "Hello there."])
    ref = _lines(tmp_path / "t.fr", [long[1], "Je vois 5 chats rouges.", "Bonjour."])
    seen = {}
    for most in (None, 1):
        report = str(tmp_path / f"{most}.json")
        assert cli.main(["evaluate", "--model", model, "--src", src, "--ref", ref, "--beam", "1",
                         "--ctx", "cpu", "--json", report]
                        + (["--max-sentences", str(most)] if most else [])) == 0
        entry = json.load(open(report))["sets"][0]
        seen[most] = (entry["sources_seen_in_training"], entry["references_seen_in_training"])
    assert seen == {None: (1, 1), 1: (0, 0)}


def test_edition_1_0_refuses_own_dev_and_test_sets(tmp_path, capsys):
    dev = _set(tmp_path, "dev", _pairs(4))
    for part in ("--valid", "--test"):
        assert cli.main(["train", "--edition", "1.0", "--epochs", "1", part, *dev, "--ctx",
                         "cpu", "--quiet", "--out", str(tmp_path / "m")]) == 2
        _one_line(capsys, "edition 1.0", "--valid and --test are not for it")
        assert not os.path.exists(tmp_path / "m")
