"""The precision of a run's products: chosen once per run (training/precision.py), bfloat16
products with float32 master weights, optimizer states and checkpoints."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as onp
import pytest

import d2l_transformer as d2t
from d2l_transformer import checkpoint
from d2l_transformer.config import EDITIONS, preset_config
from d2l_transformer.training import precision
from d2l_transformer.training.optim import config_trainer

ROOT = Path(__file__).resolve().parents[1]
UNITS = {"flags", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
NO_UNITS = {"flags", "avx2", "fma", "avx512f"}
needs_units = pytest.mark.skipif(not precision.units(),
                                 reason="this CPU has no bfloat16 units (avx512_bf16, amx_bf16)")


def _choose(cfg, flags=UNITS, tgt_size=4000, ctx=None, fast=True):
    return precision.choose(cfg, tgt_size, ctx or mx.cpu(), fast=fast, flags=flags)


def test_units_are_read_from_the_flags():
    assert precision.units(UNITS) == ("amx_bf16", "avx512_bf16")
    assert precision.units({"avx512_bf16"}) == ("avx512_bf16",)
    assert precision.units(NO_UNITS) == ()


@pytest.mark.parametrize("name", ["full", "full_word", "hour"])
def test_auto_measures_a_machine_bound_run_on_a_cpu_with_units(name):
    """`choose` names bfloat16 the candidate; `settle` measures it against float32."""
    chosen = _choose(d2t.PRESETS[name])
    assert (chosen.name, chosen.asked) == ("bfloat16", "auto") and chosen.notice() is None
    assert chosen.why.endswith("to be measured")


@pytest.mark.parametrize("float32, bfloat16, best, speed", [
    (1.00, 0.70, "bfloat16", "1.43x"),  # an AMX Xeon's hour step
    (1.00, 0.96, "float32", "1.04x"),  # faster, but within the margin
    (1.00, 1.50, "float32", "0.67x"),  # an AVX512-BF16 Xeon without AMX: slower
    (1.05, 1.00, "float32", "1.05x"),  # exactly the margin: not over it
])
def test_auto_takes_bfloat16_only_when_faster_by_more_than_the_margin(float32, bfloat16, best,
                                                                      speed):
    name, why = precision.decide({"float32": float32, "bfloat16": bfloat16})
    assert name == best and why.startswith("measured on this CPU: ")
    assert f"{speed} as fast in bfloat16" in why and "5% margin" in why
    assert precision.decide({"float32": 1.0, "bfloat16": 0.8}, margin=0.3)[0] == "float32"


def test_measuring_leaves_the_random_streams_as_the_run_expects(monkeypatch, tmp_path):
    """The probe draws from every stream (here a stand-in that does only that); afterwards
    NumPy's and Python's are as before and MXNet's as seeded, and a second run of the same
    sizes recalls the figures from the cache (no probe), with the same choice."""
    import random

    from d2l_transformer.io import measured
    from d2l_transformer.training import probe
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(tmp_path))
    monkeypatch.setattr(measured, "busy", lambda: None)  # kept whatever the machine runs
    probes = []

    def time_steps(cfg, src_size, tgt_size, shape, precisions):
        probes.append(shape)
        onp.random.rand(5), random.random(), mx.nd.random.uniform(shape=(5,)).asnumpy()
        return {"float32": [1.0, 0.9, 1.1], "bfloat16": [0.5, 0.6, 0.5]}
    monkeypatch.setattr(probe, "time_steps", time_steps)
    cfg, log = d2t.FULL, io.StringIO()
    for run in range(2):
        d2t.set_seed(7)
        onp.random.rand(3)  # the data's draws before `settle`
        before = onp.random.get_state()[1].copy(), random.getstate()
        chosen = precision.measure(cfg, 4000, 4000, 1 << 30, (256, 30, 30), seed=7, log=log)
        assert (onp.random.get_state()[1] == before[0]).all() and random.getstate() == before[1]
        drawn = mx.nd.random.uniform(shape=(4,)).asnumpy()
        mx.random.seed(7)
        assert (drawn == mx.nd.random.uniform(shape=(4,)).asnumpy()).all()
        assert chosen.record() == {"precision": "bfloat16", "asked": "auto", "why": chosen.why,
                                   "measured": {"float32": 1.0, "bfloat16": 0.5,
                                                "cached": run == 1}}
    assert probes == [(256, 30, 30)]  # once: then from the cache
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith(
        "precision auto: a training step of this run's model, batch 256x30x30: float32 1.000 s, "
        "bfloat16 0.500 s: bfloat16 runs (") for line in lines)
    assert lines[0].endswith(f"s; cached for this CPU in {tmp_path / 'measured.json'})")
    assert lines[1].endswith(f"(measured before, cached in {tmp_path / 'measured.json'})")


@pytest.mark.parametrize("cfg", [d2t.CHAPTER, d2t.TINY, *EDITIONS.values(),
                                 d2t.CHAPTER.replace(exact_chapter=True),
                                 EDITIONS["1.0"].replace(exact_chapter=True)])
def test_auto_keeps_every_chapter_run_float32(cfg):
    """The chapter's, tiny, every edition and the exact runs, with the vocabularies of their
    own data: pinned runs (small work, the one rule), their numbers must not move."""
    from d2l_transformer.data import load_data
    tgt_size = len(load_data(cfg, cfg.batch_size)[1])
    chosen = _choose(cfg, tgt_size=tgt_size)
    assert chosen.name == "float32" and chosen.notice() is None
    assert ("imperative path" if cfg.exact_chapter else "pinned run") in chosen.why


def test_auto_needs_big_work_and_the_graph_path():
    small = d2t.FULL.replace(batch_size=8, num_steps=4, batch_tokens=0, embedding_size=16,
                             num_heads=2)
    assert "pinned run" in _choose(small).why
    assert _choose(d2t.FULL, fast=False).name == "float32"
    seq2seq = preset_config("full", architecture="seq2seq")
    assert _choose(seq2seq).name == "float32"


def test_asked_bfloat16_runs_float32_where_it_cannot_and_says_so_in_one_line(monkeypatch):
    asked = d2t.FULL.replace(precision="bfloat16")
    monkeypatch.setattr(precision.cpu_math, "cpu_flags", lambda: None)  # not Linux
    for chosen, cause in [(_choose(asked, flags=NO_UNITS), "no bfloat16 units"),
                          (_choose(asked, flags=None), "no bfloat16 units"),
                          (_choose(asked, ctx=[mx.gpu(0)]), "on the CPU only"),
                          (_choose(asked, fast=False), "imperative path")]:
        assert chosen.name == "float32" and cause in chosen.why
        assert chosen.notice().startswith("precision: bfloat16 asked, float32 runs: ")
        assert "\n" not in chosen.notice()
    monkeypatch.undo()
    assert _choose(asked).name == "bfloat16"  # asked: on a slice of the corpus too
    assert _choose(d2t.CHAPTER.replace(precision="bfloat16")).name == "bfloat16"
    assert _choose(d2t.FULL.replace(precision="float32")).name == "float32"
    assert _choose(d2t.FULL, flags=NO_UNITS).notice() is None  # auto falls back silently


def test_precision_is_a_config_field_a_resumed_run_may_change():
    cfg = d2t.FULL.with_overrides({"precision": "bfloat16"})
    assert cfg.precision == "bfloat16" and d2t.TransformerConfig().precision == "auto"
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16"):
        d2t.FULL.with_overrides({"precision": "float16"})
    assert d2t.config.resume_overrides(d2t.FULL, {"precision": "float32"}).precision == "float32"
    saved = json.loads(d2t.FULL.to_json())
    del saved["precision"]  # a config.json written before the field existed
    assert d2t.TransformerConfig.from_json(json.dumps(saved)).precision == "auto"


STEP = """
import json, d2l_transformer as d2t, mxnet as mx, numpy as onp
from mxnet import gluon, init
from d2l_transformer.training import precision, steps
cfg = d2t.TINY.replace(precision="bfloat16", dropout=0.0)
d2t.set_seed(0)  # the batch order
src_vocab, tgt_vocab, it = d2t.load_data_nmt(16, 10, 200)
chosen, _ = precision.settle(cfg, len(tgt_vocab), mx.cpu())  # before the first kernel
X, X_vlen, Y, Y_vlen = next(iter(it))
out = {"chosen": chosen.name}
for name in ("float32", "bfloat16"):
    d2t.set_seed(0)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.initialize(init.Xavier(), ctx=mx.cpu())
    trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.005})
    step = steps._fast_step(model, trainer, d2t.MaskedSoftmaxCELoss(), precision=name)
    losses = [float(step(X, X_vlen, Y[:, :-1], Y[:, 1:], Y_vlen - 1)[0]) for _ in range(3)]
    params = model.collect_params().values()
    states = [s for st in trainer._updaters[0].states.values() for s in st]
    dtypes = {p.data().dtype for p in params} | {s.dtype for s in states}
    out[name] = {"losses": losses, "dtypes": sorted({onp.dtype(d).name for d in dtypes}),
                 "weight": model.decoder.dense.weight.data().asnumpy().ravel()[:50].tolist()}
print(json.dumps(out))
"""


@needs_units
def test_a_bfloat16_step_is_close_to_the_float32_step_and_keeps_float32_state():
    """Three fast steps on one batch from the same weights: the losses within 0.2% (bfloat16
    keeps 8 bits of mantissa), the output layer's weights within a fifth of an Adam step, the
    weights and Adam's states all float32."""
    r = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["chosen"] == "bfloat16"
    f32, bf16 = out["float32"], out["bfloat16"]
    assert f32["dtypes"] == bf16["dtypes"] == ["float32"]
    assert f32["losses"] != bf16["losses"]  # the products did compute in bfloat16
    for a, b in zip(f32["losses"], bf16["losses"]):
        assert abs(a - b) <= 2e-3 * abs(a)
    # Adam moves a weight by up to lr = 0.005 a step, whatever the gradient's size
    assert max(abs(a - b) for a, b in zip(f32["weight"], bf16["weight"])) < 1e-3


@pytest.mark.parametrize("step_seconds, rounds", [(1.0, 5), (0.3, 7), (0.01, 15)])
def test_the_probe_times_short_steps_more_often(monkeypatch, step_seconds, rounds):
    """Five timed rounds, more while a precision's steps add up to less than 2 s (at most
    15), after three untimed steps each, the precisions alternated."""
    from d2l_transformer.training import probe
    order = []
    monkeypatch.setattr(probe, "training_step", lambda cfg, src, tgt, name: name)
    monkeypatch.setattr(probe, "timed", lambda step, batch: order.append(step) or step_seconds)
    seconds = probe.time_steps(d2t.TINY, 40, 40, (4, 5, 6))
    assert {k: len(v) for k, v in seconds.items()} == {"float32": rounds, "bfloat16": rounds}
    assert order[:10] == ["float32", "bfloat16"] * 4 + ["bfloat16", "float32"]
    assert len(order) == 2 * (3 + rounds)


def test_auto_measures_one_process_on_one_device_only(monkeypatch):
    """Several workers or devices would each measure, and might choose apart: float32, said
    in the record (nothing measured)."""
    from d2l_transformer.training import probe
    monkeypatch.setattr(precision, "units", lambda flags=None: ("avx512_bf16",))
    monkeypatch.setattr(precision, "_bfloat16_runs", lambda: True)
    monkeypatch.setattr(probe, "time_steps", lambda *args: pytest.fail("measured"))
    for kwargs in ({"workers": 2}, {"ctxs": [mx.cpu(0), mx.cpu(1)]}):
        ctxs = kwargs.pop("ctxs", mx.cpu())
        chosen, _ = precision.settle(d2t.FULL, 4000, ctxs, **kwargs)
        assert chosen.record() == {"precision": "float32", "asked": "auto", "why": (
            "auto measures a run of one process on one device (each worker would measure, and "
            "might choose, apart): give --set precision=bfloat16 to compute in bfloat16")}


def test_a_measurement_that_fails_leaves_float32_and_says_why(monkeypatch, tmp_path):
    """The probe's step raising (MXNet's error, memory): the run computes float32, the record
    and the one line say why, and nothing is cached."""
    from d2l_transformer.training import probe
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(tmp_path))

    def time_steps(*args):
        raise mx.base.MXNetError("bfloat16 FullyConnected: out of memory\nStack trace: ...")
    monkeypatch.setattr(probe, "time_steps", time_steps)
    log = io.StringIO()
    chosen = precision.measure(d2t.FULL, 4000, 4000, 1 << 30, (256, 30, 30), seed=0, log=log)
    why = "auto could not time bfloat16 against float32 here (bfloat16 FullyConnected: out of memory)"
    assert chosen.record() == {"precision": "float32", "asked": "auto", "why": why}
    assert log.getvalue() == f"precision auto: float32 runs: {why}\n"
    assert not (tmp_path / "measured.json").exists()


RUNS = """
import io, json, random, sys
import d2l_transformer as d2t, mxnet as mx, numpy as onp
from d2l_transformer._runtime import threads
from d2l_transformer.io import measured
from d2l_transformer.training import precision, probe
from d2l_transformer.training.run import train_model
threads.BIG_WORK = 1  # tiny's sizes made machine-bound: every core, auto measures
measured.busy = lambda: None  # the figures kept whatever else the machine runs
if sys.argv[1] == "stand-in":  # a CPU without bfloat16 units: a probe that only draws
    precision.units = lambda flags=None: ("avx512_bf16",)
    precision._bfloat16_runs = lambda: True
    def time_steps(cfg, src_size, tgt_size, shape, precisions):
        onp.random.rand(5), random.random(), mx.nd.random.uniform(shape=(5,)).asnumpy()
        return {"float32": [1.0], "bfloat16": [2.0]}
    probe.time_steps = time_steps
out = []
for _ in range(2):  # the cache cold, then warm
    log = io.StringIO()
    summary = train_model(d2t.TINY.replace(dropout=0.1), ctx=mx.cpu(), progress=False, log=log,
                          seed=5)
    out.append({"history": summary["epoch_history"], "precision": summary["precision"],
                "log": log.getvalue()})
print(json.dumps(out))
"""


@pytest.mark.parametrize("probe", [
    "stand-in", pytest.param("real", marks=needs_units)])
def test_a_run_gives_the_same_numbers_whether_it_measured_or_recalled(tmp_path, probe):
    """Two runs of tiny's sizes made machine-bound (so ``auto`` measures): the first measures
    (its probe drawing from the random streams), the second recalls the figures from the
    cache; every epoch's loss is the same, and each run says what it chose in one line."""
    env = dict(os.environ, D2L_TRANSFORMER_CACHE=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", RUNS, probe], capture_output=True, text=True,
                       timeout=900, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    cold, warm = json.loads(r.stdout.strip().splitlines()[-1])
    assert cold["history"] == warm["history"] and len(cold["history"]) == d2t.TINY.num_epochs
    assert cold["precision"]["measured"]["cached"] is False
    assert warm["precision"]["measured"]["cached"] is True
    assert {k: v for k, v in cold["precision"].items() if k != "measured"} == \
        {k: v for k, v in warm["precision"].items() if k != "measured"}
    if probe == "stand-in":
        assert cold["precision"]["precision"] == "float32"
        assert "0.50x as fast in bfloat16, not over the 5% margin" in cold["precision"]["why"]
    for run in (cold, warm):
        measured = [line for line in run["log"].splitlines() if line.startswith("precision")]
        assert len(measured) == 1 and str(tmp_path / "measured.json") in measured[0]


LOGITS = """
import json, d2l_transformer as d2t, mxnet as mx, numpy as onp
from mxnet import init
from d2l_transformer.training import fused, precision
cfg = d2t.TINY.replace(precision="bfloat16")
precision.settle(cfg, 50, mx.cpu())  # before the first kernel
model = d2t.build_model(cfg, 50, 50)
model.initialize(init.Xavier())
X = mx.np.array(onp.random.RandomState(0).randint(4, 50, (4, 6)), dtype="float32")
valid = mx.np.array([6, 5, 4, 3], dtype="float32")
model(X, X, valid)
class Logits(mx.gluon.HybridBlock):  # the training graph up to the loss
    def __init__(self, model):
        super().__init__()
        self.encoder, self.decoder = model.encoder, model.decoder
    def hybrid_forward(self, F, X, valid):
        return self.decoder(X, self.decoder.init_state(self.encoder(X, valid), valid))[0]
graph = Logits(model)
graph.hybridize()
out = {}
for name in ("float32", "bfloat16"):
    with d2t.kernels.fused(mx.cpu()):
        logits = fused.FastGraph(graph, name)(X, valid).asnumpy()
    out[name] = [str(logits.dtype), int(((logits.view(onp.uint32) & 0xFFFF) != 0).sum())]
print(json.dumps(out))
"""


@needs_units
def test_in_bfloat16_the_logits_reach_the_loss_with_8_bit_mantissas():
    """oneDNN accumulates in float32 but hands back bfloat16: the output layer's logits are
    float32 numbers whose low 16 bits are all zero (bfloat16's mantissa), as bfloat16.py says;
    in float32 they are not."""
    r = subprocess.run([sys.executable, "-c", LOGITS], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bfloat16"] == ["float32", 0]  # no logit has a bit below bfloat16's mantissa
    assert out["float32"][0] == "float32" and out["float32"][1] > 100


def _cli(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "d2l_transformer", *args], capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@needs_units
def test_a_model_trained_in_bfloat16_saves_float32_and_translates_in_a_float32_process(tmp_path):
    out = tmp_path / "bf16"
    _cli("train", "--preset", "tiny", "--set", "precision=bfloat16", "--out", str(out),
         "--quiet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"]["precision"] == "bfloat16"
    assert "measured" not in summary["precision"]  # asked for: nothing to measure
    math = summary["cpu_math"]
    assert math["isa_cap"] != "AVX2"  # oneDNN's bfloat16 kernels need AVX-512
    assert (math["pinned"], math["mode"]) == (False, "unpinned")
    assert math["why"].startswith("bfloat16 asked (oneDNN has no bfloat16 kernels below "
                                  "AVX-512): oneDNN on every instruction set of this CPU")
    saved = mx.nd.load(str(out / "params.params")).values()
    assert {onp.dtype(a.dtype) for a in saved} == {onp.dtype("float32")}
    model, _, _, cfg, _ = checkpoint.load(str(out), mx.cpu())
    assert cfg.precision == "bfloat16"  # what it was trained with; loading computes in float32
    assert {onp.dtype(p.data().dtype) for p in model.collect_params().values()} == {onp.dtype("float32")}
    trainer = config_trainer(model, cfg)
    checkpoint.load_trainer_states(str(out), trainer)  # Adam's moments, as saved
    states = trainer._updaters[0].states.values()
    assert {onp.dtype(s.dtype) for st in states for s in st} == {onp.dtype("float32")}
    r = _cli("translate", "--engine", "mxnet", "--model", str(out), "--ctx", "cpu", "go .", "i won !")
    assert len(r.stdout.strip().splitlines()) == 2


def test_a_resumed_auto_run_keeps_its_recorded_precision(monkeypatch):
    """A machine-bound ``auto`` run on a CPU with units would measure again; resumed, it keeps
    what it recorded (not measured), and says so in its reason."""
    monkeypatch.setattr(precision.cpu_math, "cpu_flags", lambda: UNITS)
    monkeypatch.setattr(precision, "measure", lambda *a, **k: pytest.fail("measured again"))
    cfg = preset_config("full").replace(precision="auto")
    chosen, _ = precision.settle(cfg, 8000, mx.cpu(), recorded="float32")
    assert (chosen.name, chosen.asked) == ("float32", "auto") and "as recorded" in chosen.why


def test_the_record_keeps_every_precision_change_with_its_epoch():
    summary = {}
    precision.record_change(summary, {"precision": "float32", "why": "a"}, 1)
    precision.record_change(summary, {"precision": "float32", "why": "b"}, 4)
    precision.record_change(summary, {"precision": "bfloat16", "why": "c"}, 7)
    assert summary["precision_changes"] == [{"epoch": 1, "precision": "float32"},
                                            {"epoch": 7, "precision": "bfloat16"}]
    assert summary["precision"]["why"] == "c"
    old = {"precision": {"precision": "bfloat16"}}  # a summary from before the list
    precision.record_change(old, {"precision": "float32"}, 3)
    assert old["precision_changes"] == [{"epoch": 1, "precision": "bfloat16"},
                                        {"epoch": 3, "precision": "float32"}]
