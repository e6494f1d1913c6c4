"""--exact-chapter is the chapter's own run: the chapter's code (its classes verbatim, trained
by d2l 0.11.4's `train_s2s_ch9`, seeded once; scripts/chapter_oracle.py) and our exact mode
(scripts/train_chapter.py --exact-chapter), each in its own process with the same seed on this
machine, give the same loss at every epoch, to the last bit, and the same four translations."""

import json
import os
import subprocess
import sys

import pytest

import d2l_transformer as d2t
from d2l_transformer.report.book import CHAPTER_CODE, agreement, agreements

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")


def _oracle_installed():
    try:
        import d2l
    except ImportError:
        return False
    return d2l.__version__ == "0.11.4"


needs_oracle = pytest.mark.skipif(not _oracle_installed(),
                                  reason="the chapter's library d2l==0.11.4 is not installed")
needs_data = pytest.mark.skipif(not os.path.exists(d2t.data.default_data_path()),
                                reason="fra-eng.zip is not there")


def _run(script, *args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)


@pytest.mark.slow
@needs_oracle
@needs_data
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_mode_repeats_the_chapters_own_run(tmp_path, seed):
    common = ["--seed", str(seed), "--epochs", "3", "--ctx", "cpu"]
    r = _run("train_chapter.py", "--exact-chapter", "--chapter-code", "--skip-toys", "--quiet",
             "--out", str(tmp_path), *common)
    assert r.returncode == 0, r.stderr
    ours = json.loads((tmp_path / "summary.json").read_text())
    theirs = json.loads((tmp_path / "chapter_code" / "summary.json").read_text())
    assert theirs["oracle"] == "d2l 0.11.4" and theirs["seed"] == ours["seed"] == seed
    assert [e for e, _ in theirs["epoch_history"]] == [1, 2, 3]
    assert ours["epoch_history"] == theirs["epoch_history"]  # every epoch, every bit
    assert ours["translations"] == theirs["translations"]
    assert ours["cpu_math"] == theirs["cpu_math"]  # both on the same kernels (`_runtime.cpu_math`)
    assert 0.15 < ours["loss"] < 0.25  # a real run: 3 epochs from ~0.39 at epoch 1
    # the script prints both beside the book, and says that they agree
    assert "| chapter's code" in r.stdout and "| exact chapter" in r.stdout
    assert "loss identical at all 3 epochs" in r.stdout and "4 of 4 translations" in r.stdout


def test_oracle_refuses_another_d2l_in_one_line(tmp_path):
    fake = tmp_path / "d2l"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '1.0.3'\n")
    (fake / "d2l.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "chapter_oracle.py"), "--epochs", "1"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "0.11.4" in r.stderr, r.stderr


def _summary(seed=0, history=((1, 0.25), (2, 0.125)), go="va !"):
    return {"seed": seed, "exact_chapter": True, "epoch_history": [list(e) for e in history],
            "translations": {"Go .": go, "I won !": "j'ai gagné !"}, "oracle": "d2l 0.11.4"}


def test_agreement_compares_every_epoch_exactly():
    chapter = _summary()
    assert agreement(chapter, _summary()) == (
        "exact chapter vs the chapter's own code (d2l 0.11.4, seed 0): loss identical at all 2 "
        "epochs (last 0.125); 2 of 2 translations identical")
    off_by_one_ulp = 0.25 + 2 ** -54
    line = agreement(chapter, _summary(history=((1, off_by_one_ulp), (2, 0.125)), go="<unk> !"))
    assert f"first differs at epoch 1: 0.25 (chapter) vs {off_by_one_ulp!r} (ours)" in line
    assert line.endswith("1 of 2 translations identical")
    assert "not comparable, ours ran with seed 3" in agreement(chapter, _summary(seed=3))
    assert "not comparable, 2 epochs against 1" in agreement(chapter, _summary(history=((1, 0.25),)))
    runs = [(CHAPTER_CODE, chapter), ("exact chapter", _summary()),
            ("corrected", dict(_summary(), exact_chapter=False))]
    assert len(agreements(runs)) == 1  # the corrected model is not the chapter's run


@pytest.mark.slow
@needs_oracle
@needs_data
@pytest.mark.parametrize("architecture", ["seq2seq", "attention"])
def test_the_seq2seq_models_exact_runs_repeat_their_sections_own_code(tmp_path, architecture):
    """8.14's and 9.2's models: ``train --architecture A --exact-chapter`` and the section's
    code (chapter_oracle.py --architecture A), seed 1, 3 epochs: every epoch's loss to the bit,
    the translations; `compare` says so under a table of their own."""
    common = ["--architecture", architecture, "--seed", "1", "--epochs", "3", "--ctx", "cpu"]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    r = subprocess.run([sys.executable, "-m", "d2l_transformer", "train", "--exact-chapter",
                        "--quiet", "--out", str(ours), *common], capture_output=True, text=True,
                       cwd=ROOT, timeout=1800)
    assert r.returncode == 0, r.stderr
    r = _run("chapter_oracle.py", "--out", str(theirs), *common)
    assert r.returncode == 0, r.stderr
    a, b = (json.loads((d / "summary.json").read_text()) for d in (ours, theirs))
    assert a["architecture"] == b["architecture"] == architecture
    assert a["epoch_history"] == b["epoch_history"] and len(a["epoch_history"]) == 3
    assert a["translations"] == b["translations"]
    r = subprocess.run([sys.executable, "-m", "d2l_transformer", "compare", str(ours), str(theirs)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert "loss identical at all 3 epochs" in r.stdout and "4 of 4 translations" in r.stdout
