"""scripts/peer_*.py's pure parts: the checkpoint interval, the logs' reports, the toolkits'
configs and command lines, the curve rows. No toolkit is needed (they run in their own venvs)."""

import argparse
import importlib
import os
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def peers():
    """The peer scripts as modules (they import peer_common from their own directory)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield argparse.Namespace(**{name: importlib.import_module(name) for name in
                                    ("peer_common", "peer_opennmt", "peer_sockeye", "peer_package",
                                     "peer_plot")})
    finally:
        sys.path.remove(str(SCRIPTS))


def _args(peers, module, *extra):
    return getattr(peers, module).get_parser().parse_args(
        ["--venv", "V", "--train", "a.en", "a.de", "--dev", "d.en", "d.de", "--test", "t.en", "t.de",
         "--src-lang", "en", "--tgt-lang", "de", "--work", "W", *extra])


def test_save_interval(peers):
    """30 minutes of 2,400 steps, a checkpoint every 10: every 800 steps."""
    assert peers.peer_common.save_interval(2400, 30, 10) == 800
    assert peers.peer_common.save_interval(5, 30, 1) == 1


def test_throughput_and_rows(peers):
    pc = peers.peer_common
    reports = [(10, 100, 100, 1010.0), (20, 500, 500, 1020.0), (30, 500, 500, 1030.0)]
    rates = pc.throughput(reports, 1000.0)
    assert rates["steps_per_second"] == 1.0 and rates["src_tgt_tokens_per_second"] == 100.0
    assert rates["startup_seconds"] == 0.0  # step 10 at 10 s: no start-up at 1 step/s
    assert pc.tokens_per_sec_until(reports, 20, 1000.0) == 100.0
    assert pc.tokens_per_sec_until(reports, 15, 1000.0) is None
    row = pc.curve_row("c", 600, 630.0, 30.0, {"bleu": 12.345, "chrf": 40.0}, 100.0, 2048, {})
    assert (row["minutes"], row["wall_minutes"], row["bleu"], row["peak_rss_gb"]) == (10.0, 10.5, 12.35, 2.0)


def test_opennmt(peers, tmp_path):
    onmt = peers.peer_opennmt
    log = ("[2024-01-01 10:00:00,123 INFO] Step 50/ 1628; acc: 1.2; ppl: 9.0; xent: 2.2; "
           "lr: 0.001; sents:  100; bsz: 3000/ 3500/ 90; 100/120 tok/s;   30 sec\n"
           "[2024-01-01 10:00:40,123 INFO] Step 100/ 1628; acc: 1.2; ppl: 9.0; xent: 2.2; "
           "lr: 0.001; sents:  100; bsz: 3000/ 3500/ 90; 100/120 tok/s;   70 sec\n")
    reports = onmt.parse_reports(log, 50)
    assert [r[:3] for r in reports] == [(50, 150000, 175000), (100, 150000, 175000)]
    assert reports[1][3] - reports[0][3] == 40
    args = _args(peers, "peer_opennmt", "--steps", "3000", "--minutes", "30",
                 "--checkpoint-minutes", "10", "--score-checkpoints")
    args.save_every = peers.peer_common.save_interval(args.steps, args.minutes, args.checkpoint_minutes)
    args.valid_every = 600
    paths = {k: k for k in ("train.src", "train.tgt", "dev.src", "dev.tgt", "vocab.src", "vocab.tgt")}
    options = onmt.config(args, paths, args.steps, False, 100)
    assert (options["save_checkpoint_steps"], options["keep_checkpoint"]) == (1000, -1)
    assert options["learning_rate"] == round(0.002 * (256 * 400) ** 0.5, 6)
    onmt.write_config(tmp_path / "c.yaml", options)
    assert '    corpus_1:\n        path_src: "train.src"' in (tmp_path / "c.yaml").read_text()


def test_sockeye(peers):
    sk = peers.peer_sockeye
    log = ("[2024-01-01:10:00:00:INFO:sockeye.data_io:get_training_data_iters] "
           "Creating training data iterator\n"
           "[2024-01-01:10:00:00:INFO:sockeye.data_io:log] Tokens: source 1000 target 1200\n"
           "[2024-01-01:10:00:00:INFO:sockeye.data_io:log] Bucket (8, 8): 10 samples in 3 batches "
           "of 4, ~8.0 target tokens/batch, trg/src length ratio: 1.0 (+-0.0)\n"
           "[2024-01-01:10:00:00:INFO:sockeye.data_io:log] Bucket (16, 16): 10 samples in 7 "
           "batches of 4, ~8.0 target tokens/batch, trg/src length ratio: 1.0 (+-0.0)\n"
           "[2024-01-01:10:01:00:INFO:sockeye.training:__call__] E=0 B=50\ts/sec=10.00 "
           "tok/sec=900.00 u/sec=0.80\tppl=100.0 \n"
           "[2024-01-01:10:02:00:INFO:sockeye.training:__call__] E=0 B=100\ts/sec=10.00 "
           "tok/sec=900.00 u/sec=0.80\tppl=90.0 \n")
    reports = sk.parse_reports(log)
    assert [r[:3] for r in reports] == [(50, 5000, 6000), (100, 5000, 6000)]  # 100 + 120 an update
    assert reports[1][3] - reports[0][3] == 60
    args = _args(peers, "peer_sockeye", "--steps", "900", "--minutes", "30", "--checkpoint-minutes", "10")
    args.save_every = peers.peer_common.save_interval(args.steps, args.minutes, args.checkpoint_minutes)
    r = peers.peer_common.Runner("V", "W", 2)
    argv = [str(a) for a in sk.train_argv(args, r, {k: k for k in ("train.src", "train.tgt", "dev.src",
                                                                  "dev.tgt")}, 200, args.steps)]
    option = lambda name: argv[argv.index(name) + 1]
    assert argv[0] == os.path.join("V", "bin", "sockeye-train")
    assert (option("--checkpoint-interval"), option("--max-updates")) == ("300", "900")
    assert option("--initial-learning-rate") == "0.04"  # 0.002 x sqrt(400): the peak at 400
    assert (option("--keep-last-params"), option("--max-seq-len")) == ("-1", "200:200")


def test_package_rows(peers):
    pkg = peers.peer_package
    report = {"sets": [{"decoders": {"greedy": {"bleu": 1.0, "chrf": 2.0},
                                     "beam 4": {"bleu": 3.0, "chrf": 4.0}}}]}
    assert pkg.beam_scores(report, 4)["bleu"] == 3.0 and pkg.beam_scores(report, 1)["bleu"] == 1.0
    summary = {"epochs_done": 6, "train_seconds": 600.0, "tokens_per_sec": 1234.56}
    row = pkg.summary_row("epoch_6", summary, 170, {"bleu": 10.0, "chrf": 30.0}, 4096, {"x": 1})
    assert (row["updates"], row["minutes"], row["tokens_per_sec"], row["epochs"]) == (1020, 10.0, 1234.6, 6)
    summary["average"] = {"averaged_epochs": [5, 6]}  # a stage's OUT records its average too
    assert pkg.summary_row("epoch_6", summary, 170, {"bleu": 1, "chrf": 2}, 1, {})["checkpoint"] == "epoch_6"
    assert pkg.summary_row("average", summary, 170, {"bleu": 1, "chrf": 2}, 1, {})["checkpoint"] == \
        "average (average of epochs [5, 6])"
    args = pkg.get_parser().parse_args(["--venv", "V", "--train", "a", "b", "--test", "t", "r",
                                        "--src-lang", "en", "--tgt-lang", "de", "--work", "W",
                                        "--epochs-at", "6", "12"])
    argv = pkg.train_argv(args, peers.peer_common.Runner("V", "W", 2), 12, True)
    assert argv[-1] == "--resume" and argv[argv.index("--epochs") + 1] == 12
    assert argv[argv.index("--average-last") + 1] == 4
    args.average = 0  # no average: no flag
    assert "--average-last" not in pkg.train_argv(args, peers.peer_common.Runner("V", "W", 2), 12, True)


def test_the_curves_plot_and_table(peers, tmp_path, capsys):
    """Two runs' curve.json drawn in one PNG; the table has a line per row, averages named."""
    import json
    for name, toolkit, direction, bleus in (("a", "d2l_transformer", "en-de", (10.0, 15.0)),
                                            ("b", "OpenNMT-py", "en-de", (8.0, 12.5)),
                                            ("d", "OpenNMT-py", "de-en", (9.0, 13.0))):
        rows = [{"checkpoint": f"step_{i}", "minutes": 10.0 * (i + 1), "updates": 100 * (i + 1),
                 "bleu": b, "chrf": 2 * b, "tokens_per_sec": 1000.0, "peak_rss_gb": 1.5,
                 "settings": {"toolkit": toolkit, "direction": direction}} for i, b in enumerate(bleus)]
        rows.append(dict(rows[-1], checkpoint="average", bleu=bleus[-1] + 1))
        (tmp_path / name).mkdir()
        (tmp_path / name / "curve.json").write_text(json.dumps(rows))
    e = json.loads((tmp_path / "a" / "curve.json").read_text())  # other settings: a run of its own
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "curve.json").write_text(json.dumps(
        [dict(r, settings=dict(r["settings"], set=["batch_tokens=4096"])) for r in e[:1]]))
    (tmp_path / "c").mkdir()  # the first run continued in a WORK of its own: one line with it
    (tmp_path / "c" / "curve.json").write_text(json.dumps([dict(
        json.loads((tmp_path / "a" / "curve.json").read_text())[0], checkpoint="epoch_4",
        minutes=40.0, bleu=16.0)]))
    png, out = tmp_path / "c.png", tmp_path / "c.json"
    curves = peers.peer_plot.main([str(tmp_path / d) for d in "abcde"]
                                  + ["--png", str(png), "--json", str(out)])
    assert [label for label, _ in curves] == ["d2l_transformer en-de", "OpenNMT-py en-de",
                                              "OpenNMT-py de-en",
                                              "d2l_transformer batch_tokens=4096 en-de"]
    assert [r["checkpoint"] for r in curves[0][1]] == ["step_0", "step_1", "average", "epoch_4"]
    head = png.read_bytes()
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and len(json.loads(out.read_text())) == 4
    assert int.from_bytes(head[16:20], "big") == 1100  # two directions: two panels side by side
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 11 and "| OpenNMT-py en-de | average | 20.0 | 200 | 13.50 |" in lines[-5]
