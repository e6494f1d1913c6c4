"""``--engine ctranslate2``'s two machine-dependent options.

* threads (`inference.ct2_threads`): the counts measured on a machine's topology, the choice
  from given timings (no timed asserts), the cache (written once per machine and model, reused,
  a damaged file ignored in one line, an unwritable one leaving the measured count), a real
  measurement on a tiny export, and ``--engine-threads N`` winning over all of it;
* compute types (``--compute-type``): every type CTranslate2 supports on this CPU translates,
  float32 gives the MXNet engine's greedy tokens, the type is what evaluate's report and the
  server's ``/health`` say, and a type the CPU lacks, or the option with ``--engine mxnet``, is
  one line.
"""

import io
import json
import logging

import mxnet as mx
import pytest

import d2l_transformer as d2t
from d2l_transformer import checkpoint, cli
from d2l_transformer._runtime import threads as _threads
from d2l_transformer.data import heldout_nmt
from d2l_transformer.evaluate import evaluate_model
from d2l_transformer.inference import ct2_threads
from d2l_transformer.inference.engines import (
    COMPUTE_TYPE,
    CTranslate2Engine,
    EngineError,
    open_engine,
)
from d2l_transformer.io import measured
from d2l_transformer.training.run import train_model

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="the ctranslate2 extra is not installed (pip install '.[ctranslate2]')")
SUPPORTED = sorted(ctranslate2.get_supported_compute_types("cpu"))
KNOWN = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
         "float32")  # CTranslate2's compute types (its Translator's documentation)
LACKING = [t for t in KNOWN if t not in SUPPORTED]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The package's cache directory, this test's own (`io.cache`)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(path))
    monkeypatch.setattr(measured, "busy", lambda: None)  # kept whatever else the machine runs
    return path / measured.FILE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A chapter-sized model trained 10 epochs (seconds), and 200 held-out sources."""
    model_dir = str(tmp_path_factory.mktemp("options") / "model")
    train_model(d2t.CHAPTER.replace(num_epochs=10), model_dir, ctx=mx.cpu(), progress=False,
                preset="chapter", log=io.StringIO())
    src_vocab, tgt_vocab = (checkpoint.load(model_dir)[i] for i in (1, 2))
    sentences = heldout_nmt(src_vocab, tgt_vocab, d2t.CHAPTER.num_examples, 200)["unfiltered"][0]
    return model_dir, sentences


# ------------------------------------------------------------------ threads: the logic
@pytest.mark.parametrize("cores, counts", [(0, [1]), (1, [1]), (2, [1, 2]), (3, [1, 2, 3]),
                                           (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (16, [1, 2, 4, 8]),
                                           (64, [1, 2, 4, 8])])
def test_the_counts_measured_follow_the_physical_cores(cores, counts):
    assert ct2_threads.candidates(cores) == counts


@pytest.mark.parametrize("seconds, best", [
    ({1: [1.66, 1.77, 1.70], 2: [1.07, 1.10, 1.05]}, 2),  # 2 cores, no SMT: two threads pay
    ({1: [2.25, 2.0, 2.5], 2: [4.97, 4.7, 8.7]}, 1),  # two vCPUs that do not: one
    ({1: [3.74] * 3, 2: [2.5] * 3, 4: [1.83] * 3, 8: [3.52] * 3}, 4),  # 16 cores: four
    ({1: [1.00, 1.2, 0.9], 2: [0.97, 0.96, 0.98]}, 1),  # within MARGIN: the fewer threads
    ({1: [1.0, 9.0, 1.0], 2: [0.8, 0.8, 0.8]}, 2),  # medians: one slow round changes nothing
])
def test_the_fewest_threads_within_the_margin_of_the_fastest_median_are_chosen(seconds, best):
    assert ct2_threads.choose(seconds) == best


def _fake_measure(monkeypatch, timings):
    """`measure` replaced by one that returns `timings` and counts its calls."""
    calls = []

    def measure(open_translator, counts, sources):
        calls.append(list(counts))
        assert len(sources) == ct2_threads.PROBE_SENTENCES
        return {n: timings[n] for n in counts}
    monkeypatch.setattr(ct2_threads, "measure", measure)
    return calls


MODEL = {"encoder_layers": 2, "decoder_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64,
         "num_heads": 4, "source_vocab_size": 100, "target_vocab_size": 120}
TOKENS = ["<unk>", "<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(96)]


def _best(compute_type="float32", model=MODEL):
    return ct2_threads.best_threads(None, TOKENS, model, compute_type, "4.8.5")


def test_the_measurement_is_cached_once_per_machine_and_model(monkeypatch, cache):
    monkeypatch.setattr(_threads, "physical_cores", lambda: 4)
    calls = _fake_measure(monkeypatch, {1: [3.0] * 3, 2: [1.0] * 3, 4: [2.0] * 3})
    assert _best() == 2 and calls == [[1, 2, 4]]
    entries = json.loads(cache.read_text())["entries"]
    (name, entry), = entries.items()
    assert name == ct2_threads.key(MODEL, "float32", "4.8.5") and entry["value"] == 2
    assert "4 cores" in name and "ctranslate2 4.8.5" in name and "float32" in name
    assert entry["figures"] == {"1": 3.0, "2": 1.0, "4": 2.0}
    assert _best() == 2 and len(calls) == 1  # reused, not measured again
    # another compute type, or another model size, is measured (and kept beside the first)
    calls_before = len(calls)
    assert _best("int8") == 2 and _best(model={**MODEL, "hidden_size": 64}) == 2
    assert len(calls) == calls_before + 2 and len(json.loads(cache.read_text())["entries"]) == 3
    monkeypatch.setattr(_threads, "physical_cores", lambda: 1)  # one core: nothing to measure
    assert _best("int16") == 1 and len(calls) == calls_before + 2


def test_a_busy_machine_measures_nothing_and_takes_one_thread(monkeypatch, cache):
    """What it would measure under another job's load is not kept (`measured.keep`): measuring
    it on every run would cost each its seconds for nothing."""
    monkeypatch.setattr(_threads, "physical_cores", lambda: 4)
    calls = _fake_measure(monkeypatch, {1: [3.0] * 3, 2: [1.0] * 3, 4: [2.0] * 3})
    monkeypatch.setattr(measured, "busy", lambda: "the machine was busy (load average 9.0)")
    assert _best() == 1 and calls == [] and not cache.exists()
    monkeypatch.setattr(measured, "busy", lambda: None)
    assert _best() == 2 and calls == [[1, 2, 4]]  # quiet again: measured and kept
    monkeypatch.setattr(measured, "busy", lambda: "the machine was busy (load average 9.0)")
    assert _best() == 2 and len(calls) == 1  # what was kept is used, busy or not


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"format": "other", "entries": {}}',
                                    "\xff\xfe", "two", 100000, 3])
def test_a_damaged_cache_is_ignored_in_one_line_and_written_anew(monkeypatch, cache, caplog,
                                                                  damage):
    monkeypatch.setattr(_threads, "physical_cores", lambda: 2)
    calls = _fake_measure(monkeypatch, {1: [1.0] * 3, 2: [2.0] * 3})
    cache.parent.mkdir()
    if not isinstance(damage, str) or damage == "two":  # our format, a count not measured
        damage = json.dumps({"format": measured.FORMAT, "entries": {  # here: that entry ignored
            ct2_threads.key(MODEL, "float32", "4.8.5"): {"value": damage}}})
    cache.write_bytes(damage.encode("latin-1"))
    with caplog.at_level(logging.WARNING):
        assert _best() == 1 and len(calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert all("\n" not in w for w in warnings)
    data = json.loads(cache.read_text())
    assert data["format"] == measured.FORMAT and len(data["entries"]) == 1
    assert _best() == 1 and len(calls) == 1  # the new file is read


def test_an_unwritable_cache_leaves_the_measured_count(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(_threads, "physical_cores", lambda: 2)
    calls = _fake_measure(monkeypatch, {1: [2.0] * 3, 2: [1.0] * 3})
    with caplog.at_level(logging.WARNING):
        assert _best() == 2
    assert len(calls) == 1 and blocker.read_text() == "not a directory"
    assert any("cannot keep CTranslate2's measured threads" in r.getMessage()
               for r in caplog.records)


def test_the_translators_are_measured_one_at_a_time(monkeypatch):
    """`measure` loads one translator at a time (each round opens each count's in turn, in
    alternating order) and times every count `ROUNDS` times."""
    alive, opened = [0], []  # translators not yet freed; the counts opened

    class Translator:
        def __init__(self, n):
            assert alive[0] == 0, "a translator was still loaded"
            alive[0] += 1
            opened.append(n)

        def translate_batch(self, sources, **options):
            assert options["max_decoding_length"] == ct2_threads.PROBE_STEPS

        def __del__(self):
            alive[0] -= 1

    seconds = ct2_threads.measure(Translator, [1, 2, 4], ct2_threads.probe(TOKENS))
    assert sorted(seconds) == [1, 2, 4]
    assert all(len(s) == ct2_threads.ROUNDS for s in seconds.values())
    assert opened[:6] == [1, 2, 4, 4, 2, 1] and len(opened) == 3 * ct2_threads.ROUNDS
    assert alive == [0]


# ------------------------------------------------------------------ threads: the engine
def test_the_engine_measures_once_and_engine_threads_wins(tiny, monkeypatch, cache, capsys):
    model_dir, sentences = tiny
    monkeypatch.setattr(_threads, "physical_cores", lambda: 2)
    measured, real = [], ct2_threads.measure

    def measure(*args):
        measured.append(real(*args))  # the real measurement, on the tiny export
        return measured[-1]
    monkeypatch.setattr(ct2_threads, "measure", measure)
    engine = CTranslate2Engine(model_dir)
    (seconds,) = measured
    assert sorted(seconds) == [1, 2] and all(len(s) == ct2_threads.ROUNDS for s in seconds.values())
    assert engine.intra_threads == ct2_threads.choose(seconds)
    (entry,) = json.loads(cache.read_text())["entries"].values()
    assert entry["value"] == engine.intra_threads
    assert len(engine.translate(sentences[:10])) == 10
    assert open_engine(model_dir, "ctranslate2").intra_threads == engine.intra_threads
    assert len(measured) == 1  # cached
    # --engine-threads N: no measurement, N threads, whatever the cache says
    other = 3 - engine.intra_threads
    passed, translator = [], ctranslate2.Translator

    def recording(*args, **kwargs):
        passed.append(kwargs["intra_threads"])
        return translator(*args, **kwargs)
    monkeypatch.setattr(ctranslate2, "Translator", recording)
    cache.unlink()
    assert open_engine(model_dir, "ctranslate2", engine_threads=other).intra_threads == other
    assert cli.main(["translate", "--model", model_dir, "--engine", "ctranslate2",
                     "--engine-threads", str(other), "go ."]) == 0
    assert passed == [other, other] and len(measured) == 1 and not cache.exists()
    capsys.readouterr()


# ------------------------------------------------------------------ compute types
def test_every_supported_compute_type_translates(tiny):
    model_dir, sentences = tiny
    mxnet = open_engine(model_dir, "mxnet").translate(sentences)
    assert len({tuple(h.tokens) for h in mxnet}) > 20  # a model that translates
    default = CTranslate2Engine(model_dir, intra_threads=1)
    assert default.compute_type == COMPUTE_TYPE == "float32"
    assert [h.tokens for h in default.translate(sentences)] == [h.tokens for h in mxnet]
    assert "float32" in SUPPORTED and "int8" in SUPPORTED  # CTranslate2's x86 and ARM builds
    for compute_type in SUPPORTED:
        engine = open_engine(model_dir, "ctranslate2", engine_threads=1, compute_type=compute_type)
        expected = ctranslate2.Translator(engine.directory, compute_type=compute_type).compute_type
        assert engine.compute_type == expected and expected.startswith(compute_type.split("_")[0])
        greedy, beam = engine.translate(sentences), engine.translate(sentences, 4)
        assert all(len(h) == len(sentences) for h in (greedy, beam))
        assert all(h.score is not None and h.score <= 0 for h in greedy + beam)
        same = sum(a.tokens == b.tokens for a, b in zip(greedy, mxnet))
        # the same model, converted: int8 of this 32-wide model moves its near-ties (99 of the
        # 200 greedy translations equal float32's on an AMD EPYC, over half on an Intel Xeon)
        assert same >= 0.4 * len(sentences), (compute_type, same)
        if compute_type == "float32":
            assert [h.tokens for h in greedy] == [h.tokens for h in mxnet]


def test_the_compute_type_reaches_ctranslate2_and_is_reported(tiny, monkeypatch, capsys):
    model_dir, _ = tiny
    passed, real = [], ctranslate2.Translator

    def recording(*args, **kwargs):
        passed.append(kwargs["compute_type"])
        return real(*args, **kwargs)
    monkeypatch.setattr(ctranslate2, "Translator", recording)
    argv = ["--model", model_dir, "--engine", "ctranslate2", "--engine-threads", "1"]
    assert cli.main(["translate", *argv, "--compute-type", "int8", "go ."]) == 0
    assert passed[-1] == "int8"
    assert cli.main(["translate", *argv, "go ."]) == 0 and passed[-1] == "float32"
    report = evaluate_model(model_dir, engine="ctranslate2", beam=2, max_sentences=5,
                            engine_threads=1, compute_type="int8")
    assert (report["compute_type"], report["engine_threads"]) == ("int8_float32", 1)
    assert passed[-1] == "int8"
    report = evaluate_model(model_dir, engine="mxnet", beam=2, max_sentences=5)
    assert (report["engine"], report["compute_type"], report["engine_threads"]) == (
        "mxnet", None, None)
    capsys.readouterr()
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from d2l_transformer.serve.app import create_app
    from d2l_transformer.serve.engine import Engine

    engine = Engine(model_dir, "cpu", engine="ctranslate2", engine_threads=1, compute_type="int8")
    try:
        with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
            model = client.get("/health").json()["model"]
        assert (model["engine"], model["compute_type"], model["engine_threads"]) == (
            "ctranslate2", "int8_float32", 1)
        assert passed[-1] == "int8"
    finally:
        engine.close()


def test_a_compute_type_the_cpu_lacks_or_for_mxnet_is_one_line(tiny, capsys, monkeypatch):
    model_dir, _ = tiny
    names = ", ".join(SUPPORTED)
    lacking = (LACKING or ["float16"])[0]  # no CPU build runs float16
    capsys.readouterr()
    for bad in (lacking, "float64"):
        expected = (f"error: --compute-type {bad}: CTranslate2 {ctranslate2.__version__} supports "
                    f"{names} on this CPU\n")
        for command in ("translate", "evaluate"):
            argv = [command, "--model", model_dir, "--engine", "ctranslate2", "--compute-type", bad]
            assert cli.main(argv + (["go ."] if command == "translate" else [])) == 2, argv
            assert capsys.readouterr().err == expected
    with pytest.raises(EngineError, match=f"^--compute-type {lacking}: "):
        CTranslate2Engine(model_dir, compute_type=lacking)
    mxnet = "error: --compute-type is an option of --engine ctranslate2, not of --engine mxnet\n"
    for argv in (["translate", "--engine", "mxnet", "--model", model_dir, "--compute-type",
                  "int8", "go ."],
                 ["evaluate", "--engine", "mxnet", "--model", model_dir, "--compute-type",
                  "float32"]):
        assert cli.main(argv) == 2, argv
        assert capsys.readouterr().err == mxnet
    with pytest.raises(EngineError):
        open_engine(model_dir, "mxnet", compute_type="int8")
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    assert cli.main(["serve", "--engine", "mxnet", "--model", model_dir, "--port", "0",
                     "--compute-type", "int8"]) == 2
    assert capsys.readouterr().err == mxnet
    assert cli.main(["serve", "--model", model_dir, "--port", "0", "--engine", "ctranslate2",
                     "--compute-type", lacking]) == 2
    assert capsys.readouterr().err.startswith(f"error: --compute-type {lacking}: CTranslate2 ")
