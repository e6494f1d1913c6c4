"""Validation during training: valid loss and greedy BLEU per epoch in summary.json, the best
model kept as OUT/best, early stopping, OUT/average (the average of the last epochs)."""

import json
import os
import shutil
import signal
import subprocess
import sys

import mxnet as mx
import pytest

import d2l_transformer as d2t
from d2l_transformer import checkpoint, cli
from d2l_transformer.data import split_corpus
from d2l_transformer.training.validation import EarlyStopping, LastParameters, Validator

# the tiny model on 200 pairs, 20 of them held out as the valid part (word tokenizer; the split
# by groups of sentences fills 19 of the 20 places)
TRAIN = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--max-pairs", "200",
         "--set", "num_valid=20", "--set", "num_test=20", "--set", "valid_sentences=20"]


def _summary(out):
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("valid") / "m")
    assert cli.main(TRAIN + ["--epochs", "5", "--average-last", "2", "--out", out]) == 0
    return out


def test_validation_each_epoch_best_dir_is_the_best(run, capsys):
    summary = _summary(run)
    records = summary["validation"]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["sentences"] == 19 and r["valid_loss"] > 0 for r in records)
    assert records[-1]["valid_loss"] < records[0]["valid_loss"]  # it learns
    bleus = [r["valid_bleu"] for r in records]
    best_epoch = bleus.index(max(bleus)) + 1  # the first of the best
    assert summary["best"] == {"best_bleu": max(bleus), "best_epoch": best_epoch,
                               "validations_without_improvement": 5 - best_epoch}
    # OUT/best: a model directory of its own (its manifest checked by load) that scores the best
    # BLEU again; OUT itself stays a complete model directory beside it
    model, src_vocab, tgt_vocab, cfg, best_summary = checkpoint.load(os.path.join(run, "best"))
    assert best_summary["best_epoch"] == best_epoch
    assert best_summary["epochs_done"] == best_epoch
    valid = split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test).valid
    tok = checkpoint.load_tokenizer(os.path.join(run, "best"), cfg)
    again = Validator(model, valid, tok, src_vocab, tgt_vocab, cfg, mx.cpu())()
    assert again["valid_bleu"] == pytest.approx(max(bleus), abs=1e-9)
    assert checkpoint.load(run)[4]["epochs_done"] == 5
    assert sorted(json.load(open(os.path.join(run, "manifest.json")))) == sorted(
        n for n in os.listdir(run) if os.path.isfile(os.path.join(run, n))
        and n != "manifest.json" and n[0] != ".")
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet", "--model", os.path.join(run, "best"), "Go."]) == 0
    assert capsys.readouterr().out.strip()


def test_average_dir_holds_the_average_and_evaluates(run, capsys):
    summary = _summary(run)
    assert summary["average"]["averaged_epochs"] == [4, 5]
    avg = os.path.join(run, "average")
    model, *_ = checkpoint.load(avg)
    last, *_ = checkpoint.load(run)
    a, b = model._collect_params_with_prefix(), last._collect_params_with_prefix()
    assert any((a[k].data() != b[k].data()).asnumpy().any() for k in a)  # not the last epoch
    capsys.readouterr()
    assert cli.main(["evaluate", "--engine", "mxnet",
                     "--model", avg, "--max-sentences", "5", "--beam", "2"]) == 0
    assert "valid (5 of 19): greedy: BLEU" in capsys.readouterr().out


def test_a_run_of_one_epoch_keeps_its_model_and_its_average(tmp_path, capsys):
    """One epoch saves OUT only at its end: OUT/average is written after it (before, its
    directory made OUT a folder the run refused to replace), and a replaced model's new average
    is kept, not dropped with the old one's."""
    out = str(tmp_path / "m")
    for again in ([], ["--overwrite"]):
        assert cli.main(TRAIN + ["--epochs", "1", "--average-last", "2", "--out", out] + again) == 0
        assert "averaging the last 1 epochs, not 2" in capsys.readouterr().err
        summary = _summary(out)
        assert summary["epochs_done"] == 1 and summary["average"]["averaged_epochs"] == [1]
        model, *_ = checkpoint.load(os.path.join(out, "average"))
        last, *_ = checkpoint.load(out)
        a, b = model._collect_params_with_prefix(), last._collect_params_with_prefix()
        assert all((a[k].data() == b[k].data()).asnumpy().all() for k in a)  # one epoch's mean


def test_the_average_of_identical_checkpoints_is_each_of_them():
    cfg = d2t.TINY
    model = d2t.build_model(cfg, 30, 20)
    model.initialize(mx.init.Xavier(), ctx=mx.cpu())
    X = mx.np.ones((2, 3))
    model(X, X, mx.np.array([3, 2]))  # deferred shapes
    kept = LastParameters(model, 3)
    for epoch in range(1, 5):
        kept.add(epoch)
    assert kept.epochs == [2, 3, 4]
    average = kept.average()
    params = model._collect_params_with_prefix()
    assert sorted(average) == sorted(params)
    for name, p in params.items():
        assert (average[name].asnumpy() == p.data().asnumpy()).all(), name
    with kept.swapped_in({k: v * 0 for k, v in average.items()}):
        assert all((p.data() == 0).asnumpy().all() for p in params.values())
    assert all((average[k].asnumpy() == p.data().asnumpy()).all() for k, p in params.items())


def test_early_stopping_counts_validations_without_improvement():
    stop = EarlyStopping(patience=2)
    assert [stop.update(e, b) for e, b in enumerate([1.0, 2.0, 2.0, 1.5], 1)] == [
        True, True, False, False]
    assert stop.should_stop and stop.best_epoch == 2
    resumed = EarlyStopping.from_state(3, stop.state())
    assert not resumed.should_stop and resumed.stale == 2 and not EarlyStopping().should_stop


def test_patience_stops_after_k_flat_validations(tmp_path, capsys):
    """A learning rate of 1e-9 leaves the translations as they are: the valid BLEU is flat, so
    the first validation stays the best and the run stops K validations later."""
    out = str(tmp_path / "m")
    assert cli.main(TRAIN + ["--epochs", "10", "--patience", "2", "--set", "lr=1e-9",
                             "--out", out]) == 0
    err = capsys.readouterr().err
    assert "stopping after epoch 3: no better valid BLEU in 2 validations (best" in err
    summary = _summary(out)
    assert summary["stopped_early"] == 3 and summary["epochs_done"] == 3
    assert [r["epoch"] for r in summary["validation"]] == [1, 2, 3]
    assert len({r["valid_bleu"] for r in summary["validation"]}) == 1
    assert summary["best"]["best_epoch"] == 1
    assert checkpoint.load(os.path.join(out, "best"))[4]["epochs_done"] == 1


def test_valid_every_and_the_chapter_preset(tmp_path, capsys):
    """--valid-every 2 validates every other epoch; 0 never; the chapter's preset (no valid
    part) trains as before, without validation."""
    out = str(tmp_path / "m")
    assert cli.main(TRAIN + ["--epochs", "3", "--valid-every", "2", "--out", out]) == 0
    assert [r["epoch"] for r in _summary(out)["validation"]] == [2]
    assert cli.main(TRAIN + ["--epochs", "1", "--valid-every", "0", "--out", str(tmp_path / "n")]) == 0
    assert "validation" not in _summary(str(tmp_path / "n"))
    assert not os.path.exists(tmp_path / "n" / "best")
    assert cli.main(["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--epochs", "1",
                     "--max-pairs", "100", "--out", str(tmp_path / "c")]) == 0
    assert "validation" not in _summary(str(tmp_path / "c"))


def test_overwrite_drops_the_replaced_runs_best_and_average(run, tmp_path):
    """--overwrite replaces the whole model: the replaced run's OUT/best and OUT/average are not
    carried into the new run's directory (a resumed run keeps them)."""
    out = str(tmp_path / "m")
    shutil.copytree(os.path.realpath(run), out)  # a copy of the validated run, with best/ and average/
    assert os.path.isdir(os.path.join(out, "best")) and os.path.isdir(os.path.join(out, "average"))
    assert cli.main(TRAIN + ["--epochs", "1", "--valid-every", "0", "--out", out,
                             "--overwrite"]) == 0
    assert _summary(out)["epochs_done"] == 1 and "validation" not in _summary(out)
    assert not os.path.exists(os.path.join(out, "best"))
    assert not os.path.exists(os.path.join(out, "average"))


def test_recipe_curves_plots_the_runs_validations(run, tmp_path, capsys):
    """scripts/recipe_curves.py: the run's five validations as (epoch, minutes, BLEU) rows of
    its table and a PNG; a run given without a label is a one-line usage error."""
    import subprocess
    import sys

    from d2l_transformer.viz.png import validation_curve
    records = _summary(run)["validation"]
    assert validation_curve(_summary(run)) == [
        (r["epoch"], r["train_seconds"] / 60, r["valid_bleu"]) for r in records]
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "recipe_curves.py")
    png = str(tmp_path / "c.png")
    done = subprocess.run([sys.executable, script, "--png", png, "--target", "20,40,goal",
                           f"tiny={run}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    assert [int(r.split("|")[2]) for r in rows] == [1, 2, 3, 4, 5]
    assert [float(r.split("|")[4]) for r in rows] == [round(r["valid_bleu"], 2) for r in records]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, script, "--png", png, run], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "label=MODEL_DIR" in bad.stderr.strip().splitlines()[-1]
    # a run kept as a record in a JSON file, cut at a budget of minutes
    kept = tmp_path / "runs.json"
    minutes = [dict(r, train_seconds=60.0 * r["epoch"]) for r in records]  # a minute an epoch
    kept.write_text(json.dumps({"A": {"validation": minutes}}))
    done = subprocess.run([sys.executable, script, "--png", png, "--max-minutes", "3",
                           f"kept={kept}:A"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| kept |")]
    assert [int(r.split("|")[2]) for r in rows] == [1, 2, 3]


def _same_run(summary):
    """What a killed-then-resumed run must record as an uninterrupted one does: all but the
    seconds."""
    drop = ("train_seconds", "seconds", "tokens_per_sec", "rng_state", "cpu_math", "fast",
            "precision", "ctx")
    validation = [{k: v for k, v in r.items() if k not in drop} for r in summary["validation"]]
    return dict({k: v for k, v in summary.items() if k not in drop}, validation=validation)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_record_and_stop(tmp_path):
    """The run of `test_patience_stops_after_k_flat_validations` killed (SIGKILL) as soon as it
    says epoch 2's validation, then resumed: the same summary.json (seconds aside) and the same
    stop, at epoch 3, as the run that was never killed."""
    args = TRAIN + ["--epochs", "10", "--patience", "2", "--set", "lr=1e-9"]
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    assert cli.main(args + ["--out", whole]) == 0
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "d2l_transformer", *args, "--out", killed],
                            stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if line.startswith("epoch 2: valid"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert cli.main(args + ["--resume", "--out", killed]) == 0
    assert _same_run(_summary(killed)) == _same_run(_summary(whole))
    assert _summary(killed)["stopped_early"] == 3
    last = TRAIN + ["--epochs", "2"]  # killed once its last epoch is validated: before its end
    assert cli.main(last + ["--out", whole, "--overwrite"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "d2l_transformer", *last, "--out", killed,
                             "--overwrite"], stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if line.startswith("epoch 2: valid"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=120)
    assert cli.main(last + ["--resume", "--out", killed]) == 0
    assert _same_run(_summary(killed)) == _same_run(_summary(whole))
    assert "translations" in _summary(killed)
