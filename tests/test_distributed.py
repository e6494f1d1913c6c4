"""Data parallelism over a device list, dist_sync over MXNet's kvstore, the launcher."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mxnet as mx
import numpy as onp
import pytest
from conftest import trainable

import d2l_transformer as d2t
from d2l_transformer.data import shard
from d2l_transformer.distributed.launch import LaunchError, launch, launch_command

ROOT = Path(__file__).resolve().parents[1]
TWO = [mx.cpu(0), mx.cpu(1)]  # two devices of one process, as two GPUs would be


@pytest.fixture(scope="module")
def data():
    d2t.set_seed(0)
    src_vocab, tgt_vocab, it = d2t.load_data_nmt(16, 10, 200)
    return src_vocab, tgt_vocab, [b for _, b in zip(range(3), it)]


def _train(data, ctx, fast, epochs=2, batches=None):
    src_vocab, tgt_vocab, default = data
    d2t.set_seed(4)
    model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
    summary = d2t.train_s2s_ch8(model, batches or default, 0.005, epochs, ctx, fast=fast)
    return model, summary


def _max_diff(a, b, ctx_a=TWO[0], ctx_b=TWO[0]):
    return max(float(abs(p.data(ctx_a).asnumpy() - q.data(ctx_b).asnumpy()).max())
               for p, q in zip(trainable(a), trainable(b)))


def test_parse_ctx_list():
    assert d2t.parse_ctx_list("cpu:0, cpu:1") == TWO
    assert d2t.parse_ctx_list("cpu") == [mx.cpu(0)]
    absent = f"gpu:{mx.context.num_gpus()}"  # one past the last GPU (gpu:0 without any)
    for bad in ("cpu:0,cpu", "cpu,", "cpu:0;cpu:1", f"cpu:0,{absent}"):
        with pytest.raises(ValueError):
            d2t.parse_ctx_list(bad)


def test_shards_are_disjoint_and_equal():
    items = list(range(1001))
    parts = [shard(items, r, 3) for r in range(3)]
    assert [len(p) for p in parts] == [333] * 3  # same number of steps on every worker
    assert not set(parts[0]) & set(parts[1]) and not set(parts[1]) & set(parts[2])
    with pytest.raises(ValueError):
        shard(items, 3, 3)


@pytest.mark.parametrize("fast", [False, True])
def test_two_devices_equal_one_device(data, fast):
    """cpu:0,cpu:1 trains to the same parameters as one device on the same batches (1e-5):
    the gradients are summed over devices, clipped as a whole, divided by all the tokens."""
    one, s1 = _train(data, mx.cpu(), fast)
    two, s2 = _train(data, TWO, fast)
    assert _max_diff(one, two) < 1e-5
    assert _max_diff(two, two, mx.cpu(0), mx.cpu(1)) == 0  # the copies stay identical
    assert s2["ctx"] == "cpu(0),cpu(1)" and abs(s1["loss"] - s2["loss"]) < 1e-6


def test_batch_smaller_than_device_count(data):
    """A last batch of 1 sentence on 2 devices: the idle device adds nothing, both update."""
    X, X_vlen, Y, Y_vlen = data[2][0]
    tiny = [(X[:1], X_vlen[:1], Y[:1], Y_vlen[:1])]
    one, _ = _train(data, mx.cpu(), False, epochs=1, batches=data[2][:1] + tiny)
    two, _ = _train(data, TWO, False, epochs=1, batches=data[2][:1] + tiny)
    assert _max_diff(one, two) < 1e-5 and _max_diff(two, two, mx.cpu(0), mx.cpu(1)) == 0


@pytest.mark.parametrize("fast", [False, True])
def test_first_step_runs_on_the_broadcast_weights(data, fast):
    """The first device's weights reach the others BEFORE the first forward pass (Gluon's
    Trainer broadcasts them after the first backward, which on a dist kvstore races with the
    gradients' pushpull): a second device that starts with other weights computes its first
    gradient on the first device's, so the run equals the one-device run."""
    src_vocab, tgt_vocab, batches = data
    models = []
    for ctx in (mx.cpu(), TWO):
        d2t.set_seed(4)
        model = d2t.build_model(d2t.TINY, len(src_vocab), len(tgt_vocab))
        model.initialize(mx.init.Xavier(), ctx=ctx)
        X, X_vlen, Y, Y_vlen = batches[0]
        model(X, Y[:, :-1], X_vlen, Y_vlen - 1)  # the deferred initialisation, on every device
        models.append(model)
    for p in trainable(models[1]):
        p.data(TWO[1])[:] += 1  # the second device's copy differs
    for model, ctx in zip(models, (mx.cpu(), TWO)):
        d2t.train_s2s_ch8(model, batches, 0.005, 1, ctx, trainer=d2t.make_trainer(model, 0.005),
                          fast=fast)
    assert _max_diff(*models) < 1e-5 and _max_diff(models[1], models[1], *TWO) == 0


def test_trainer_updates_locally_so_the_learning_rate_applies(data):
    """update_on_kvstore=False: set_learning_rate(0) really stops the updates on 2 devices."""
    src_vocab, tgt_vocab, batches = data
    model, _ = _train(data, TWO, False, epochs=1)
    trainer = d2t.make_trainer(model, 0.005)
    before = [p.data(c).asnumpy() for p in trainable(model) for c in TWO]
    trainer.set_learning_rate(0.0)
    d2t.train_s2s_ch8(model, batches, 0.0, 1, TWO, trainer=trainer)
    assert trainer._update_on_kvstore is False
    after = [p.data(c).asnumpy() for p in trainable(model) for c in TWO]
    assert all((a == b).all() for a, b in zip(before, after))
    trainer.set_learning_rate(0.005)
    d2t.train_s2s_ch8(model, batches, 0.005, 1, TWO, trainer=trainer)
    assert any((a != b).any() for a, b in zip(after, [p.data(c).asnumpy()
                                                     for p in trainable(model) for c in TWO]))


# ------------------------------------------------------------------------- dist_sync, launcher
def _processes_with(marker):
    # -ww: whole lines (ps cuts them at $COLUMNS otherwise, and the marker is at the end)
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line]


def _no_process_with(marker):
    return not _processes_with(marker)


class _Lines:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def flush(self):
        pass

    def __str__(self):
        return "".join(self.lines)


@pytest.mark.slow
def test_dist_sync_loopback(tmp_path):
    """1 scheduler, 1 server, 2 workers on loopback, started by the launcher: the chapter
    preset on two shards; the loss falls, both workers end with identical parameters, and
    ``set_learning_rate(0)`` stops the updates (they run on the workers, not the server)."""
    out = _Lines()
    code = launch([sys.executable, str(ROOT / "tests" / "dist_worker.py"), str(tmp_path), "3"],
                  num_workers=2, num_servers=1, timeout=300, stream=out)
    assert code == 0, str(out)[-3000:]
    assert "[rank 0]" in str(out) and "[rank 1]" in str(out)  # rank-prefixed lines
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in runs] == [0, 1] and runs[0]["batches"] == 16  # 500 pairs / 32
    losses = runs[0]["losses"]
    assert losses == runs[1]["losses"] and losses[-1] < 0.7 * losses[0]  # global, falling
    assert runs[0]["update_on_kvstore"] is False
    mx.npx.set_np()
    params = [{k: v.asnumpy() for k, v in mx.npx.load(str(tmp_path / name)).items()}
              for name in ("rank0.params", "rank1.params", "rank0.before_lr0.params")]
    assert params[0].keys() == params[1].keys()
    for k in params[0]:
        onp.testing.assert_array_equal(params[0][k], params[1][k])  # identical workers
        onp.testing.assert_array_equal(params[0][k], params[2][k])  # lr 0: no update


@pytest.mark.slow
def test_dist_sync_bucketed_cannot_hang(tmp_path):
    """2 workers on `BucketBatches`: the list of batches of all pairs is dealt out, so both run
    the same number of steps although their batches have different lengths at the same step;
    the job ends (bounded by the launcher's timeout) with identical parameters."""
    out = _Lines()
    code = launch([sys.executable, str(ROOT / "tests" / "dist_worker.py"), str(tmp_path), "2",
                   "bucketed"], num_workers=2, num_servers=1, timeout=300, stream=out)
    assert code == 0, str(out)[-3000:]  # 124 if a worker had waited for a missing step
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert runs[0]["batches"] == runs[1]["batches"] == runs[0]["all_batches"] // 2
    assert len(runs[0]["shapes"]) == len(runs[1]["shapes"]) == 2 * runs[0]["batches"]
    widths = [[tuple(s[1:]) for s in r["shapes"]] for r in runs]
    assert widths[0] != widths[1] and len(set(widths[0])) > 1  # different lengths, step by step
    assert runs[0]["losses"] == runs[1]["losses"] and runs[0]["losses"][1] < runs[0]["losses"][0]
    mx.npx.set_np()
    params = [{k: v.asnumpy() for k, v in mx.npx.load(str(tmp_path / f"rank{r}.params")).items()}
              for r in range(2)]
    assert params[0].keys() == params[1].keys()
    for k in params[0]:
        onp.testing.assert_array_equal(params[0][k], params[1][k])


def _sleeper(marker, fail_task=None):
    code = ("import os, sys, time\n"
            f"if os.environ.get('DMLC_ROLE') == 'worker' and os.environ.get('DMLC_TASK_ID') == "
            f"{fail_task!r}:\n    print('worker fails'); sys.exit(3)\n"
            f"time.sleep(300)  # {marker}")
    return [sys.executable, "-c", code]


def test_launcher_stops_everything_when_a_worker_fails():
    marker = f"d2l-test-{uuid.uuid4().hex}"
    out = _Lines()
    tic = time.time()
    code = launch(_sleeper(marker, "1"), num_workers=2, timeout=120, stream=out)
    assert code == 3, str(out)  # the failed worker's own exit status
    assert time.time() - tic < 60  # not the timeout: the failure stopped the job
    assert "[worker 1] worker fails" in str(out) and "stopped the others" in str(out)
    assert _no_process_with(marker)


def test_launcher_timeout_stops_everything():
    marker = f"d2l-test-{uuid.uuid4().hex}"
    out = _Lines()
    code = launch(_sleeper(marker), num_workers=2, timeout=8, stream=out)
    assert code == 124 and "timed out" in str(out)
    assert _no_process_with(marker)


def test_launcher_ctrl_c_stops_everything():
    marker = f"d2l-test-{uuid.uuid4().hex}"
    cmd = [sys.executable, "-m", "d2l_transformer.cli", "launch", "-n", "2", "--timeout", "120",
           "--", *_sleeper(marker)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # wait until the job's 4 processes run (the launcher's
            job = [p for p in _processes_with(marker) if "_launch_child.py" in p]  # own argv
            if len(job) >= 4:  # has the marker too): the wrappers of the 4 processes
                break
            time.sleep(0.5)
        assert len(job) >= 4 and proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in output
    assert _no_process_with(marker)


def test_launch_argument_errors():
    with pytest.raises(LaunchError):
        launch_command([], 2)
    with pytest.raises(LaunchError):
        launch_command(["true"], 2, launcher="ssh")  # needs a host file
    argv = launch_command(["echo", "a b"], 2, 1)
    assert argv[-1].endswith("_launch_child.py echo 'a b'") and "-n" in argv
    proc = subprocess.run([sys.executable, "-m", "d2l_transformer.cli", "launch", "-n", "2"],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert proc.returncode == 2 and proc.stderr.startswith("error: no command")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_dist_sync_only_rank_0_writes(tmp_path):
    """`d2l-transformer launch -n 2 -- d2l-transformer train --kvstore dist_sync`: both workers
    train, rank 0 alone writes the model directory and prints the book's line."""
    model_dir = tmp_path / "model"
    cmd = [sys.executable, "-m", "d2l_transformer.cli", "launch", "-n", "2", "--timeout", "300",
           "--", sys.executable, "-m", "d2l_transformer.cli", "train", "--kvstore", "dist_sync",
           "--epochs", "2", "--quiet", "--out", str(model_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[rank 0] loss ") for line in lines)
    assert not any(line.startswith("[rank 1] loss ") or "=>" in line and line.startswith("[rank 1]")
                   for line in lines)
    assert any(line.startswith("[rank 1] training 2 epochs") for line in lines)
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["num_workers"] == 2 and summary["epochs_done"] == 2


def test_dist_kvstore_outside_a_launcher_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    proc = subprocess.run([sys.executable, "-m", "d2l_transformer.cli", "train", "--kvstore",
                           "dist_sync", "--epochs", "1", "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --kvstore dist_sync needs")
