"""Hyperparameters on top of a preset: `TransformerConfig.with_overrides`, ``train --set`` and
``--config`` (recorded in the model directory's config.json), their one-line errors, what a
resumed run may change, and the warning for a warmup longer than the run."""

import json
import os
import subprocess
import sys

import pytest

import d2l_transformer as d2t
from d2l_transformer.cli import commands as cli
from d2l_transformer.config import load_overrides, parse_overrides, resume_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--max-pairs", "200"]


def _fresh_process(argv):
    """``d2l-transformer ARGV`` in a new process. The training and its resumption each run in
    a fresh one: gluon.Trainer orders the parameters by their names, which carry per-process
    counters (``dense12_weight``), so trainer.states saved by a process that had built other
    models before lines up with the parameters of a resuming process only by chance."""
    run = subprocess.run([sys.executable, "-m", "d2l_transformer.cli"] + argv,
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr


def test_parse_overrides_reads_json_literals_else_strings():
    assert parse_overrides(["lr=0.001", "num_layers=3", "pre_norm=true", "num_examples=null",
                            "tokenizer=word", 'norm="scale"', "fixnorm=False", "x = 2",
                            "lr=1e-4"]) == {
        "lr": 1e-4, "num_layers": 3, "pre_norm": True, "num_examples": None,
        "tokenizer": "word", "norm": "scale", "fixnorm": False, "x": 2}
    for bad in ("lr", "=3", ""):
        with pytest.raises(ValueError, match="field=value"):
            parse_overrides([bad])


def test_with_overrides_checks_types_and_values():
    cfg = d2t.TINY.with_overrides({"lr": 1, "num_layers": 3, "num_examples": None,
                                   "beta2": 0.98, "clip_per_token": True})
    assert cfg == d2t.TINY.replace(lr=1.0, num_layers=3, num_examples=None, beta2=0.98,
                                   clip_per_token=True)
    assert isinstance(cfg.lr, float)
    for overrides, message in (
            ({"num_layer": 3}, "unknown config field num_layer"),
            ({"num_layers": 2.5}, "num_layers must be an integer, not 2.5"),
            ({"num_layers": True}, "num_layers must be an integer, not true"),
            ({"lr": "fast"}, 'lr must be a number, not "fast"'),
            ({"lr": None}, "lr cannot be null"),
            ({"pre_norm": 1}, "pre_norm must be true or false, not 1"),
            ({"num_examples": "all"}, "num_examples must be null or an integer"),
            ({"num_heads": 3}, "embedding_size 16 must be a multiple of num_heads 3"),
            ({"dropout": 1.5}, "dropout must be in [0, 1)"),
            ({"norm": "group"}, "norm must be one of layer, scale, batch, masked_batch"),
            ({"pos_encoding": "rope"}, "pos_encoding must be one of sincos, none, learned, alibi"),
            ({"lr": -1}, "lr and epsilon must be positive"),
            ({"num_layers": 0}, "num_layers must be at least 1")):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                           .replace(")", r"\)")):
            d2t.TINY.with_overrides(overrides)
    with pytest.raises(ValueError, match="JSON object"):
        d2t.TINY.with_overrides([1, 2])
    for preset in d2t.PRESETS.values():  # every preset passes its own checks
        assert preset.check() is preset


def test_full_presets_values():
    """The `full` sizes and schedule, and the one-hour recipe's (`hour`: twice as wide, 11
    epochs; docs/evaluation.md); the word preset differs only in its tokenizer."""
    assert d2t.FULL == d2t.TransformerConfig(
        embedding_size=128, ffn_hidden_size=512, num_heads=4, num_layers=2, dropout=0.1,
        batch_size=256, num_steps=0, batch_tokens=7680, lr=0.002, num_epochs=15,
        num_examples=None, min_freq=0,
        label_smoothing=0.1, warmup_steps=400, num_valid=2000, num_test=2000, num_buckets=10,
        tokenizer="subword", vocab_size=4000, loss_reduction="token", beta2=0.98,
        epsilon=1e-9, clip_per_token=True)
    assert d2t.PRESETS["full_word"] == d2t.FULL.replace(tokenizer="word", vocab_size=0,
                                                        min_freq=10)
    assert d2t.PRESETS["hour"] == d2t.FULL.replace(embedding_size=256, ffn_hidden_size=1024,
                                                   num_epochs=11)
    assert sorted(d2t.PRESETS) == ["chapter", "full", "full_gpu", "full_word", "full_word_gpu",
                                   "hour", "tiny"]


def test_config_of_a_former_preset_still_loads():
    """A model directory's config.json holds the fields, not the preset's name: one trained
    with the former ``full_v1`` preset (MXNet's Adam, the chapter's clip) still loads."""
    former = d2t.FULL.replace(beta2=0.999, epsilon=1e-8, clip_per_token=False, num_epochs=3)
    assert d2t.TransformerConfig.from_json(former.to_json()) == former


def test_resume_may_change_the_schedule_not_the_model():
    saved = d2t.TINY
    assert resume_overrides(saved, {"lr": 0.001, "num_epochs": 9}).lr == 0.001
    with pytest.raises(ValueError, match="cannot change num_layers, vocab_size"):
        resume_overrides(saved, {"num_layers": 3, "vocab_size": 5, "lr": 0.1})
    assert resume_overrides(saved, {"num_layers": saved.num_layers}) == saved  # unchanged: fine


def test_load_overrides_errors(tmp_path):
    path = tmp_path / "c.json"
    with pytest.raises(ValueError, match="config file not found"):
        load_overrides(str(path))
    path.write_text("{lr: 1}")
    with pytest.raises(ValueError, match="is not JSON"):
        load_overrides(str(path))
    path.write_text("[1]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        load_overrides(str(path))


def test_set_and_config_round_trip_into_config_json(tmp_path, capsys):
    """preset < --config < --set < the dedicated options; config.json records what ran."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"lr": 0.01, "num_layers": 2, "dropout": 0.1, "num_epochs": 7}))
    out = str(tmp_path / "m")
    _fresh_process(TRAIN + ["--out", out, "--config", str(config), "--set", "dropout=0.2",
                            "--set", "beta2=0.98", "--set", "num_epochs=5", "--epochs", "1"])
    saved = d2t.TransformerConfig.from_json(open(os.path.join(out, "config.json")).read())
    assert saved == d2t.TINY.replace(lr=0.01, num_layers=2, dropout=0.2, beta2=0.98,
                                     num_epochs=1, num_examples=199, source_lang="en",
                                     target_lang="fr",  # the languages: from the data
                                     length_ratio=0.0)  # the chapter's pipeline sets none
    capsys.readouterr()
    # resuming: the schedule may change, the model may not (one line, exit 2)
    assert cli.main(TRAIN + ["--out", out, "--resume", "--set", "num_heads=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume keeps the model") and err.count("\n") == 1
    _fresh_process(TRAIN + ["--out", out, "--resume", "--set", "lr=0.02", "--epochs", "2"])
    saved = d2t.TransformerConfig.from_json(open(os.path.join(out, "config.json")).read())
    assert saved.lr == 0.02 and saved.num_epochs == 2 and saved.num_layers == 2


@pytest.mark.parametrize("argv,message", [
    (["--set", "nope=1"], "error: unknown config field nope"),
    (["--set", "lr=abc"], 'error: lr must be a number, not "abc"'),
    (["--set", "lr"], "error: --set takes field=value, not 'lr'"),
    (["--config", "/nonexistent/c.json"], "error: config file not found: /nonexistent/c.json"),
    (["--patience", "0"], "error: --patience must be at least 1"),
    (["--valid-every", "1"], "error: --valid-every needs a valid part"),
])
def test_bad_overrides_are_one_line_exit_2(tmp_path, capsys, argv, message):
    assert cli.main(TRAIN + ["--out", str(tmp_path / "m")] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not os.path.exists(tmp_path / "m")


def test_warmup_longer_than_the_run_warns_and_runs(tmp_path, capsys):
    out = str(tmp_path / "m")
    assert cli.main(TRAIN + ["--out", out, "--epochs", "2", "--set", "warmup_steps=400"]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("warning: warmup_steps")]
    # 200 pairs in batches of 16: 13 batches an epoch, 26 updates
    assert warning == ["warning: warmup_steps 400 is longer than the whole run (13 batches x 2 "
                       "epochs = 26 updates): the learning rate never reaches lr 0.005; give "
                       "e.g. --set warmup_steps=6, or more --epochs or data"]
    assert os.path.exists(os.path.join(out, "params.params"))
    assert cli.main(TRAIN + ["--out", str(tmp_path / "n"), "--epochs", "2",
                             "--set", "warmup_steps=26"]) == 0
    assert "warning" not in capsys.readouterr().err

