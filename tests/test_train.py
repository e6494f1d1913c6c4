"""Training semantics (d2l's train_s2s_ch8), configs, contexts."""

import math

import d2l
import mxnet as mx
import pytest
from conftest import assert_close
from mxnet import autograd, np

import d2l_transformer as d2t


def _tiny_run(nmt, epochs, seed=0, exact=False):
    src_vocab, tgt_vocab, data_iter = nmt
    d2t.set_seed(seed)
    cfg = d2t.CHAPTER.replace(exact_chapter=exact)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    return d2t.train_s2s_ch8(model, data_iter, cfg.lr, epochs, mx.cpu()), model


@pytest.mark.slow
def test_short_run_loss_falls_and_summary_fields(nmt):
    summary, _ = _tiny_run(nmt, 10, exact=False)
    assert summary["history"] == [(10, summary["loss"])]
    summary_1, _ = _tiny_run(nmt, 1)
    losses = [summary_1["loss"], summary["loss"]]
    assert losses[1] < 0.6 * losses[0], losses
    # the book's loss is each sequence's mean over its 9 label positions: x9 gives per token
    assert summary["loss_per_token"] == pytest.approx(9 * summary["loss"], rel=1e-6)
    assert summary["tokens_per_sec"] > 0 and summary["ctx"] == "cpu(0)"
    assert d2t.book_line(summary).startswith("loss %.3f, " % summary["loss"])


def test_same_seed_same_loss(nmt):
    a, _ = _tiny_run(nmt, 2, seed=3)
    b, _ = _tiny_run(nmt, 2, seed=3)
    c, _ = _tiny_run(nmt, 2, seed=4)
    assert a["loss"] == b["loss"] and a["loss"] != c["loss"]


def test_grad_clipping_equals_d2l():
    net = d2t.PositionWiseFFN(8, 4)
    net.initialize()
    X = np.random.normal(size=(2, 3, 5)) * 10
    with autograd.record():
        loss = (net(X) ** 2).sum()
    loss.backward()
    grads = [p.grad().copy() for p in net.collect_params().values()]
    d2t.grad_clipping(net, 1)
    ours = [p.grad().copy() for p in net.collect_params().values()]
    for p, g in zip(net.collect_params().values(), grads):
        p.grad()[:] = g
    d2l.grad_clipping(net, 1)
    for a, p in zip(ours, net.collect_params().values()):
        assert_close(a, p.grad(), tol=1e-6)
    assert math.sqrt(sum(float((g ** 2).sum()) for g in ours)) == pytest.approx(1, rel=1e-5)


def test_masked_loss_ignores_padding():
    loss = d2t.MaskedSoftmaxCELoss()
    pred = np.random.normal(size=(1, 4, 5))
    label = np.array([[1, 2, 3, 4]])
    full = loss(pred, label, np.array([4]))
    pred2 = pred.copy()
    pred2[0, 2:] = 100  # beyond the valid length: must not matter
    assert_close(loss(pred, label, np.array([2])), loss(pred2, label, np.array([2])), tol=0)
    assert float(loss(pred, label, np.array([2]))) < float(full)


def test_config_round_trip_and_presets():
    for name, cfg in d2t.PRESETS.items():
        assert d2t.TransformerConfig.from_json(cfg.to_json()) == cfg
        model = d2t.build_model(cfg, 30, 20)
        model.initialize()
        out, _ = model(np.ones((2, 5)), np.ones((2, 4)), np.array([5, 3]))
        assert out.shape == (2, 4, 20), name
    c = d2t.CHAPTER
    assert (c.embedding_size, c.num_layers, c.dropout, c.batch_size, c.num_steps, c.lr,
            c.num_epochs, c.ffn_hidden_size, c.num_heads) == (32, 2, 0.0, 64, 10, 0.005, 100, 64, 4)
    with pytest.raises(ValueError, match="unknown fields: colour"):
        d2t.TransformerConfig.from_json('{"colour": 1}')


def test_parse_ctx():
    assert d2t.parse_ctx("cpu") == mx.cpu() and d2t.parse_ctx("cpu:1") == mx.cpu(1)
    gpus = mx.context.num_gpus()
    assert d2t.parse_ctx("auto") == d2t.try_gpu() == (mx.gpu(0) if gpus else mx.cpu())
    with pytest.raises(ValueError, match=f"MXNet sees {gpus} GPU"):
        d2t.parse_ctx(f"gpu:{gpus}")  # one past the last GPU (gpu:0 without any)
    with pytest.raises(ValueError, match="unknown context"):
        d2t.parse_ctx("tpu")


def test_exact_training_equals_the_books_code_trained_by_d2l(nmt):
    """The chapter's classes trained by d2l's own loop vs ours in exact mode: same weights."""
    import contextlib
    import io

    import chapter_0_11 as book
    from conftest import trainable

    src_vocab, tgt_vocab, data_iter = nmt
    d2t.set_seed(5)
    theirs = d2l.EncoderDecoder(book.TransformerEncoder(len(src_vocab), 32, 64, 4, 2, 0.0),
                                book.TransformerDecoder(len(src_vocab), 32, 64, 4, 2, 0.0))
    with contextlib.redirect_stdout(io.StringIO()):  # d2l's animator prints figures
        d2l.train_s2s_ch9(theirs, data_iter, 0.005, 1, mx.cpu())
    summary, ours = _tiny_run(nmt, 1, seed=5, exact=True)
    for a, b in zip(trainable(theirs), trainable(ours)):
        assert_close(a.data(), b.data(), tol=0)  # bit for bit (tests/test_exact_run.py: whole runs)


@pytest.mark.slow
def test_chapter_script_and_cli_train_the_same_way(tmp_path):
    """scripts/train_chapter.py and `d2l-transformer train --preset chapter` are one way to
    train the chapter (`train_model`): the same seed gives the same loss and translations."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    common = ["--epochs", "2", "--seed", "1", "--ctx", "cpu", "--quiet"]
    script = subprocess.run([sys.executable, os.path.join(root, "scripts", "train_chapter.py"),
                             "--skip-toys", "--out", str(tmp_path / "script"), *common],
                            capture_output=True, text=True, cwd=root, timeout=600)
    assert script.returncode == 0, script.stderr
    cli = subprocess.run([sys.executable, "-m", "d2l_transformer.cli", "train", "--preset",
                          "chapter", "--out", str(tmp_path / "cli"), *common],
                         capture_output=True, text=True, cwd=root, timeout=600)
    assert cli.returncode == 0, cli.stderr
    a = json.loads((tmp_path / "script" / "summary.json").read_text())
    b = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert a["fast"] is b["fast"] is True  # the default path of both
    assert a["loss"] == b["loss"] and a["epoch_history"] == b["epoch_history"]
    assert a["translations"] == b["translations"]
    for sentence, translation in a["translations"].items():  # and both print them
        assert f"{sentence} => {translation}" in script.stdout.splitlines()
        assert f"{sentence} => {translation}" in cli.stdout.splitlines()
    assert (tmp_path / "script" / "model" / "params.params").exists()  # a model directory too


def test_a_second_run_into_a_directory_being_trained_is_refused_at_once(tmp_path, capsys):
    """Two real processes: while one trains OUT, `train --out OUT` (even with --overwrite) is
    refused in one line naming the first's pid, and touches nothing; the first, killed, leaves
    no stale lock (the OS releases it), and a finished run leaves no lock file."""
    import os
    import subprocess
    import sys
    import time

    from d2l_transformer.cli import commands as cli

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out, lock = tmp_path / "m", tmp_path / ".m.lock"
    train = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--out", str(out)]
    with open(tmp_path / "first.err", "w") as err:
        first = subprocess.Popen([sys.executable, "-m", "d2l_transformer.cli"] + train
                                 + ["--epochs", "1000"], cwd=root, stdout=subprocess.DEVNULL,
                                 stderr=err, env=dict(os.environ, PYTHONPATH=root))
    try:
        deadline = time.time() + 300
        while not (lock.exists() and "pid" in lock.read_text()):
            assert first.poll() is None, (tmp_path / "first.err").read_text()
            assert time.time() < deadline, "the first run never took the lock"
            time.sleep(0.05)
        held = lock.read_text()
        assert cli.main(train + ["--epochs", "1", "--overwrite"]) == 2
        assert capsys.readouterr().err == \
            f"error: {out} is being trained by another process (pid {first.pid})\n"
        assert lock.read_text() == held and first.poll() is None
    finally:
        first.kill()
        first.wait()
    assert lock.exists()  # killed: its file stays, its lock does not
    assert cli.main(train + ["--epochs", "1", "--overwrite"]) == 0
    assert not lock.exists() and (out / "params.params").exists()


def test_a_lock_file_the_package_did_not_write_is_refused_untouched(tmp_path, capsys):
    from d2l_transformer.cli import commands as cli

    (tmp_path / ".m.lock").write_text("mine\n")
    assert cli.main(["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--out",
                     str(tmp_path / "m")]) == 2
    assert "was not written by d2l_transformer" in capsys.readouterr().err
    assert (tmp_path / ".m.lock").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock"]
