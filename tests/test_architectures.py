"""The 2019 book's earlier models through the package: ``train --architecture seq2seq|attention``
(their sections' settings, exact and corrected), translate and evaluate (the chapter's greedy
loop), the refusals (beam search, export, the server: one line each), `compare`'s table of
their own, and 9.3.7's claim (`claim`, scripts/claim.py)."""

import json
import os
import subprocess
import sys

import pytest

from d2l_transformer.build import build_model
from d2l_transformer.config import CHAPTER, PRESETS, SECTIONS, preset_config
from d2l_transformer.inference.limits import chapter_only
from d2l_transformer.report import claim
from d2l_transformer.seq2seq import Seq2SeqEncoder
from d2l_transformer.seq2seq_attention import Seq2SeqAttentionDecoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "d2l_transformer"]


def _cli(*args, **kwargs):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=900,
                          **kwargs)


def test_presets_are_the_sections_settings():
    assert SECTIONS["attention"] == CHAPTER.replace(architecture="attention", num_epochs=200)
    assert SECTIONS["seq2seq"].num_epochs == 300 and SECTIONS["seq2seq"].rnn_hidden_size == 32
    assert preset_config("chapter", "0.11", "attention") is SECTIONS["attention"]
    full = preset_config("full", "0.11", "seq2seq")
    assert full == PRESETS["full"].replace(architecture="seq2seq", rnn_hidden_size=256)
    assert preset_config("full") is PRESETS["full"]


@pytest.mark.parametrize("call, message", [
    (lambda: preset_config("chapter", "0.17", "seq2seq"), "takes no --architecture seq2seq"),
    (lambda: CHAPTER.with_overrides({"architecture": "attention", "edition": "1.0"}),
     "the attention model is the 2019 book's"),
    (lambda: CHAPTER.with_overrides({"architecture": "rnn"}), "architecture must be one of"),
    (lambda: build_model(SECTIONS["seq2seq"].replace(pre_norm=True), 10, 10),
     "need the corrected Transformer, not the seq2seq model"),
])
def test_bad_combinations_are_one_line(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("exact", [False, True])
def test_the_switches_come_from_the_config(exact):
    """Exact runs keep 8.14's and 9.1's flaws (`config.EXACT_BUGS`), the default none; only
    the chapter's loop decodes either model, and only the imperative step trains them (the
    graph cannot trace them: `steps.traceable`, of a config or a model)."""
    from d2l_transformer.training.steps import traceable

    cfg = SECTIONS["attention"].replace(exact_chapter=exact)
    model = build_model(cfg, 12, 14)
    assert type(model.encoder) is Seq2SeqEncoder and type(model.decoder) is Seq2SeqAttentionDecoder
    assert model.encoder.state_after_padding is exact
    assert model.decoder.attention_cell.tanh_before_sum is exact
    assert cfg.bugs == (("state_after_padding", "tanh_before_sum") if exact else ())
    assert chapter_only(cfg) and chapter_only(model) and not traceable(cfg)
    seq2seq = build_model(SECTIONS["seq2seq"].replace(exact_chapter=exact), 12, 14)
    assert seq2seq.decoder.dense.weight.shape[0] == 14  # the target's vocabulary
    assert not any(traceable(x) for x in (cfg, model, SECTIONS["seq2seq"], seq2seq))
    transformer = cfg.replace(architecture="transformer")
    assert traceable(transformer) and traceable(build_model(transformer, 12, 14))


@pytest.mark.parametrize("preset, threads", [("chapter", 1), ("full", "cores")])
def test_seq2seq_threads_follow_the_output_layer(preset, threads, monkeypatch):
    """The corrected seq2seq models size their threads as the Transformer does, by the output
    layer's products (rows x LSTM units x vocabulary): one at the section's size, every core at
    `full`'s 256 units; an exact run keeps the process's threads."""
    import mxnet as mx

    from d2l_transformer._runtime import threads as _threads
    from d2l_transformer.training.loop import train_s2s_ch8

    cfg = preset_config(preset, "0.11", "seq2seq").replace(num_layers=1)
    cfg = cfg.replace(num_steps=cfg.num_steps or 30)  # full's: what its data decides, say 30
    vocab = 201 if preset == "chapter" else 4000
    works = []
    monkeypatch.setattr(_threads, "size_for", works.append)
    model = build_model(cfg, vocab, vocab)
    X = mx.np.ones((cfg.batch_size, cfg.num_steps))
    vlen = mx.np.full((cfg.batch_size,), cfg.num_steps)
    for exact in (False, True):  # the width from the model itself: its LSTM units
        train_s2s_ch8(model, [(X, vlen, X, vlen)], cfg.lr, 1, mx.cpu(), size_threads=not exact)
    assert works == [cfg.batch_size * (cfg.num_steps - 1) * cfg.rnn_hidden_size * vocab]
    monkeypatch.setitem(_threads._state, "managed", True)
    monkeypatch.delenv(_threads.ENV, raising=False)
    monkeypatch.delenv(_threads.MAX_ENV, raising=False)
    expected = _threads.physical_cores() if threads == "cores" else threads
    assert _threads.threads_for(works[0]) == expected


@pytest.mark.parametrize("architecture", ["seq2seq", "attention"])
def test_the_librarys_loop_trains_the_seq2seq_models(architecture):
    """`train_s2s_ch8` trains the book's seq2seq models as built: the loss falls, and
    ``fast=True`` trains them on the imperative step (`steps.traceable`: the graph cannot trace
    an LSTM encoder that reads the lengths on the host), the same losses to the bit."""
    import mxnet as mx

    from d2l_transformer.data import load_data_nmt
    from d2l_transformer.training.loop import set_seed, train_s2s_ch8

    cfg = preset_config("tiny", "0.11", architecture)
    src_vocab, tgt_vocab, data_iter = load_data_nmt(cfg.batch_size, cfg.num_steps, 100)
    runs = []
    for fast in (False, True):
        set_seed(0)
        model = build_model(cfg, len(src_vocab), len(tgt_vocab))
        runs.append([])
        summary = train_s2s_ch8(model, data_iter, cfg.lr, 3, mx.cpu(), fast=fast,
                                on_epoch=lambda epoch, loss: runs[-1].append(loss))
        assert summary["fast"] is False  # the step that ran: the imperative one
    assert all(0 < loss < 10 for loss in runs[0]) and runs[0][2] < runs[0][1] < runs[0][0]
    assert runs[1] == runs[0]


@pytest.fixture(scope="module")
def seq2seq_dir(tmp_path_factory):
    """A corrected 8.14 model, 2 epochs of the chapter's data."""
    out = tmp_path_factory.mktemp("seq2seq") / "model"
    r = _cli("train", "--architecture", "seq2seq", "--epochs", "2", "--ctx", "cpu", "--quiet",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_translate_and_evaluate_a_seq2seq_model(seq2seq_dir):
    summary = json.loads((seq2seq_dir / "summary.json").read_text())
    assert summary["architecture"] == "seq2seq" and summary["fast"] is False
    assert len(summary["epoch_history"]) == 2 and summary["loss"] < summary["epoch_history"][0][1]
    r = _cli("translate", "--engine", "mxnet", "--model", str(seq2seq_dir), "--ctx", "cpu", "Go .", "I won !")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [summary["translations"]["Go ."],
                                     summary["translations"]["I won !"]]
    r = _cli("evaluate", "--engine", "mxnet",
             "--model", str(seq2seq_dir), "--ctx", "cpu", "--max-sentences", "20")
    assert r.returncode == 0 and "greedy: BLEU" in r.stdout and "beam" not in r.stdout, r.stderr


@pytest.mark.parametrize("args", [("translate", "--beam", "4", "Go ."),
                                  ("translate", "--engine", "ctranslate2", "Go ."),
                                  ("translate", "--attention", "maps", "Go ."),
                                  ("export", "--out", "exported")])
def test_what_only_the_transformer_does_is_refused_in_one_line(seq2seq_dir, tmp_path, args):
    args = [a if a not in ("maps", "exported") else str(tmp_path / a) for a in args]
    r = _cli(args[0], "--model", str(seq2seq_dir), *args[1:])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "needs the Transformer; this is the book's seq2seq model" in r.stderr


def test_compare_gives_the_seq2seq_models_a_table_of_their_own(seq2seq_dir):
    r = _cli("compare", str(seq2seq_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("8.14 Sequence to Sequence (d2l 0.11.4):") and "je l'ai" not in r.stdout


def _summary(losses, seconds, tokens_per_sec=1000.0):
    return {"epoch_history": [[e, x] for e, x in enumerate(losses, 1)], "train_seconds": seconds,
            "tokens_per_sec": tokens_per_sec}


def test_the_claims_table_and_verdicts():
    """Medians over the seeds with their range, the first epoch (and second) under a loss, and
    each half of the claim decided from the medians."""
    runs = [("transformer", "package", _summary([0.3, 0.09, 0.04], 3.0)),
            ("transformer", "package", _summary([0.2, 0.12, 0.08], 6.0)),
            ("attention", "package", _summary([0.4, 0.2, 0.1], 1.5))]
    text = claim.table(runs)
    row = next(line for line in text.splitlines() if line.startswith("| Transformer"))
    # s/epoch 1.5 (1-2); losses 0.25 (0.2-0.3) @1; 0.1 reached at epochs 2 and 3: 2.5 (2-3)
    assert "| 2 | 1000 (1000-1000) | 1.50 (1.00-2.00) | 0.250 (0.200-0.300) |" in row
    assert "| 2.5 (2-3) | 4 (2-6) |" in row and "| 1 of 2 seeds |" in row
    assert claim.first_below(runs[0][2], 0.1) == (2, 2.0)
    (speed, faster, why), (early, converges, _) = claim.verdicts(runs, "package")
    assert not faster and "1.50 s against 0.50 s per epoch" in why
    assert converges  # 0.25 < 0.4 at epoch 1, 0.105 < 0.2 at 2 (the early epochs all have)
    assert claim.verdicts(runs, "book's code") == []


@pytest.mark.slow
def test_the_claims_script_quick_form(tmp_path):
    """scripts/claim.py end to end on 1 epoch and one seed: the runs, the table, the verdicts,
    the plot; run again, it reuses them (--report)."""
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "claim.py"), "--out", str(tmp_path),
           "--seeds", "0", "--epochs", "1", "--architectures", "transformer", "attention"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "the Transformer runs faster per epoch" in r.stdout
    assert (tmp_path / "claim.png").stat().st_size > 1000
    assert (tmp_path / "claim.md").read_text().strip() == r.stdout.strip()
    again = subprocess.run(cmd + ["--report"], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
    assert again.returncode == 0 and again.stdout == r.stdout and "..." not in again.stderr
