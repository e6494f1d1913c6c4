"""The main job end to end: scripts/train_chapter.py as a user runs it."""

import json
import os
import subprocess
import sys

import mxnet as mx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "train_chapter.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=1800)


@pytest.mark.slow
def test_toys_summary_and_table_exact_mode(tmp_path):
    r = _run("--exact-chapter", "--epochs", "2", "--out", str(tmp_path), "--ctx", "cpu")
    assert r.returncode == 0, r.stderr
    for expected in ["MultiHeadAttention: (2, 4, 100)", "AddNorm: (2, 3, 4)",
                     "EncoderBlock: (2, 100, 24)", "TransformerEncoder: (2, 100, 24)",
                     "DecoderBlock: (2, 100, 24)", "layer norm:", "batch norm:",
                     "tokens/sec on cpu(0)", "Go . => ", "I won ! => ", "| book", "exact chapter"]:
        assert expected in r.stdout, expected
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["exact_chapter"] is True and s["epochs"] == 2 and s["seed"] == 0 and s["ctx"] == "cpu(0)"
    assert set(s["translations"]) == {"Go .", "Wow !", "I'm OK .", "I won !"}
    assert isinstance(s["loss"], float) and s["loss_per_token"] > s["loss"]
    assert (tmp_path / "positional_encoding.png").stat().st_size > 1000
    assert (tmp_path / "loss.png").stat().st_size > 1000


def test_bad_options_are_one_line(tmp_path):
    r = _run("--ctx", f"gpu:{mx.context.num_gpus()}", "--out", str(tmp_path), "--skip-toys")  # absent
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "GPU" in r.stderr
    r = _run("--data", str(tmp_path / "missing.zip"), "--out", str(tmp_path), "--skip-toys")
    assert r.returncode == 2 and "missing.zip" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_full_chapter_run_reaches_the_books_loss(tmp_path):
    """The whole chapter run (100 epochs, corrected model): loss below 0.06 in book units."""
    r = _run("--skip-toys", "--out", str(tmp_path), "--ctx", "cpu")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["epochs"] == 100 and s["loss"] < 0.06, s["loss"]
    assert len(s["history"]) == 10


def test_model_directory_that_is_not_the_scripts_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    r = _run("--out", str(tmp_path), "--skip-toys", "--ctx", "cpu")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is a directory that is not a model directory" in r.stderr
    assert os.listdir(tmp_path) == ["model"] and os.listdir(tmp_path / "model") == ["notes.txt"]


@pytest.mark.slow
def test_run_again_replaces_its_own_model_directory(tmp_path):
    """`make demo` twice: the second run replaces the model directory the first one wrote."""
    for seed in ("0", "1"):
        r = _run("--skip-toys", "--epochs", "1", "--seed", seed, "--out", str(tmp_path),
                 "--ctx", "cpu", "--quiet")
        assert r.returncode == 0, r.stderr
        s = json.loads((tmp_path / "model" / "summary.json").read_text())
        assert s["seed"] == int(seed)
