"""The CPU math pinned (d2l_transformer/_runtime/cpu_math.py): one seed gives the README's numbers on any
x86-64 CPU with AVX2, not only on the machine that made them.

The golden values are the README's run (seed 0): its first 20 epochs, made on an AMD CPU with
AVX2 and repeated bit for bit on an Intel Xeon with AVX-512 and AMX under the pins (there,
without them, epoch 2 already differs in the 9th digit). A test here that fails on a new CPU
means the pins are not complete for it: docs/chapter.md, "The same numbers on every CPU"."""

import json
import os
import subprocess
import sys

import pytest

import d2l_transformer as d2t
from d2l_transformer._runtime import cpu_math as _cpu_math
from d2l_transformer._runtime import threads as _threads
from d2l_transformer.report.book import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "scripts", "train_chapter.py")
# scripts/train_chapter.py --exact-chapter --epochs 20 --seed 0: every epoch's loss
EXACT = [0.39101697927341283, 0.24451114069053334, 0.20744966735220827, 0.18211597651545464,
         0.16137290371681404, 0.1426827119281761, 0.12685359940218285, 0.11350376755905925,
         0.1020864078744403, 0.09293031896694787, 0.08573487225700827, 0.07722404601204791,
         0.07280828094654371, 0.06967479730743209, 0.06450489831717669, 0.061226883691147635,
         0.05716809072230135, 0.055471351938202546, 0.05142384916644712, 0.05289853615940275]
# scripts/train_chapter.py --epochs 20 --seed 0 (the corrected default: graph path, kernels)
CORRECTED = [0.38313271103610264, 0.23706871791011663, 0.1980801011249507, 0.1684184870742478,
             0.14814255864657286, 0.13379826523146973, 0.11952862536447768, 0.10657037473192402,
             0.0969830062278144, 0.08804702328915583, 0.07996644730876366, 0.07287914730929189,
             0.06716591553669779, 0.06590287847134184, 0.05944176313440247, 0.056700329267954486,
             0.05316456486734421, 0.05227208562012269, 0.049583608727479855, 0.048908566364652004]
# every variable that changes MXNet's CPU arithmetic, or this package's choice of it
MATH_VARS = ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA",
             "MKLDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE", _cpu_math.ENV, _cpu_math._MARK,
             _threads.ENV, _threads._MARK)

pinnable = _cpu_math.unpinnable(flags=_cpu_math.cpu_flags())
needs_pins = pytest.mark.skipif(pinnable is not None, reason=f"not pinned here: {pinnable}")
needs_data = pytest.mark.skipif(not os.path.exists(d2t.data.default_data_path()),
                                reason="fra-eng.zip is not there")


def _env(**extra):
    """This process's environment without any variable of `MATH_VARS`, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k not in MATH_VARS}, **extra}


def _train(out, epochs, *args, **env):
    r = subprocess.run([sys.executable, TRAIN, "--epochs", str(epochs), "--seed", "0",
                        "--ctx", "cpu", "--skip-toys", "--quiet", "--out", str(out), *args],
                       capture_output=True, text=True, cwd=ROOT, env=_env(**env), timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "summary.json").read_text())


@needs_pins
@needs_data
def test_exact_run_gives_the_readmes_losses_bit_for_bit(tmp_path):
    s = _train(tmp_path, 20, "--exact-chapter")
    assert [e for e, _ in s["epoch_history"]] == list(range(1, 21))
    assert [loss for _, loss in s["epoch_history"]] == EXACT
    assert s["cpu_math"]["pinned"] and s["cpu_math"]["why"] is None
    assert (s["cpu_math"]["isa_cap"], s["cpu_math"]["openblas"]) == ("AVX2", "Haswell")


@needs_pins
@needs_data
def test_corrected_run_gives_the_readmes_losses_bit_for_bit(tmp_path):
    s = _train(tmp_path, 20)
    assert s["fast"] and [loss for _, loss in s["epoch_history"]] == CORRECTED


@needs_pins
@needs_data
@pytest.mark.parametrize("env", [
    # another machine's environment: the pins replace it
    {"DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX", "OPENBLAS_CORETYPE": "Sandybridge"},
    # the pins are the whole difference: set by hand in native mode, the same numbers
    {_cpu_math.ENV: "native", "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"},
], ids=["over-another-environment", "native-with-the-pins-by-hand"])
def test_the_pins_alone_decide(tmp_path, env):
    s = _train(tmp_path, 3, "--exact-chapter", **env)
    assert [loss for _, loss in s["epoch_history"]] == EXACT[:3]


PROBE = ("import json, os, warnings; warnings.simplefilter('always'); {pre}import d2l_transformer; "
         "from d2l_transformer._runtime import cpu_math as _cpu_math; "
         "print(json.dumps([os.environ.get(n) for n in ('DNNL_MAX_CPU_ISA', 'OPENBLAS_CORETYPE')]"
         " + [_cpu_math.openblas_core()]))")


def _probe(pre="", **env):
    """([DNNL_MAX_CPU_ISA, OPENBLAS_CORETYPE, OpenBLAS's kernels], stderr) after importing the
    package in a fresh interpreter with `env` over a clean environment."""
    r = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre)], env=_env(**env),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@needs_pins
def test_configure_at_import():
    assert _probe()[0] == ["AVX2", "Haswell", "Haswell"]
    assert _probe(DNNL_MAX_CPU_ISA="AVX512_CORE")[0] == ["AVX2", "Haswell", "Haswell"]
    native, err = _probe(**{_cpu_math.ENV: "native", "OPENBLAS_CORETYPE": "Sandybridge"})
    assert native == [None, "Sandybridge", "Sandybridge"] and "d2l_transformer" not in err
    result, err = _probe(**{_cpu_math.ENV: "fastest"})
    assert result[0] == "AVX2" and "is not pinned or native: using pinned" in err


@needs_pins
def test_a_child_in_native_mode_gets_back_what_the_pins_replaced():
    mark = json.dumps({"DNNL_MAX_CPU_ISA": None, "OPENBLAS_CORETYPE": "Sandybridge"})
    inherited = {_cpu_math._MARK: mark, "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}
    assert _probe(**inherited, **{_cpu_math.ENV: "native"})[0] == [None, "Sandybridge",
                                                                  "Sandybridge"]
    assert _probe(**inherited)[0] == ["AVX2", "Haswell", "Haswell"]


@needs_pins
def test_mxnet_imported_first_warns_in_one_line():
    pre = (f"import runpy; runpy.run_path({d2t._runtime.compat.__file__!r})['apply'](); import mxnet; ")
    result, err = _probe(pre=pre, OPENBLAS_CORETYPE="Sandybridge")
    assert result[2] == "Sandybridge"
    lines = [line for line in err.splitlines() if "imported before d2l_transformer" in line]
    assert len(lines) == 1 and "Sandybridge kernels" in lines[0]
    assert "import d2l_transformer first" in lines[0]


def test_where_pinning_cannot_hold():
    assert "aarch64" in _cpu_math.unpinnable("aarch64", {"asimd"})
    assert "not Linux" in _cpu_math.unpinnable("x86_64", None)
    assert _cpu_math.unpinnable("x86_64", {"avx", "sse2"}) == "the CPU lacks AVX2 and FMA"
    assert _cpu_math.unpinnable("x86_64", {"avx2"}) == "the CPU lacks FMA"
    assert _cpu_math.unpinnable("AMD64", {"avx2", "fma"}) is None


def _record(**changes):
    return {"pinned": True, "mode": "pinned", "cpu": "Some CPU", "isa_cap": "AVX2",
            "openblas": "Haswell", "threads": 1, "why": None, **changes}


def test_the_line_says_why_a_table_may_differ():
    assert _cpu_math.line(_record()) == (
        "CPU math: oneDNN capped at AVX2, OpenBLAS Haswell kernels, OMP_NUM_THREADS=1 on Some "
        "CPU (pinned: the README's numbers on any x86-64 CPU with AVX2)")
    native = _cpu_math.line(_record(pinned=False, mode="native", isa_cap=None,
                                    openblas="SkylakeX", why="D2L_TRANSFORMER_CPU=native: x"))
    assert "oneDNN uncapped, OpenBLAS SkylakeX" in native
    assert native.endswith("this table may differ from the README's: D2L_TRANSFORMER_CPU=native: x")
    assert "not recorded" in _cpu_math.line(None)


SETTLE = ("import os, d2l_transformer as d2t; from d2l_transformer._runtime import cpu_math as _cpu_math; "
          "[_cpu_math.settle(getattr(d2t, n)) for n in {names}]; "
          "print(os.environ.get('DNNL_MAX_CPU_ISA'), _cpu_math.describe('cpu(0)')['why'])")


@needs_pins
def test_the_first_run_of_a_process_settles_the_onednn_cap():
    def settle(*names):
        return subprocess.run([sys.executable, "-c", SETTLE.format(names=list(names))],
                              env=_env(), capture_output=True, text=True,
                              check=True).stdout.strip().splitlines()[-1]

    assert settle("CHAPTER", "FULL") == "AVX2 None"  # a slice of the data: the pins hold
    assert settle("FULL", "CHAPTER") == (  # the whole corpus: every instruction set
        "None a run on the whole corpus: oneDNN on every instruction set of this CPU")


def test_describe_names_the_gpu_and_the_threads(monkeypatch):
    assert "gpu(0)" in _cpu_math.describe("gpu(0)")["why"]
    if pinnable is None:
        monkeypatch.setitem(_cpu_math._state, "settled", "capped")  # whichever test ran first
        monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
        assert _cpu_math.describe("cpu(0)")["why"] is None  # this test process: pinned, 1 thread
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert _cpu_math.describe("cpu(0)")["why"] == "2 OpenMP threads (OMP_NUM_THREADS), not one"


def test_compare_prints_the_cpu_math_once_or_per_group():
    run = {"loss": 0.032, "loss_per_token": 0.29, "tokens_per_sec": 1.0, "ctx": "cpu(0)",
           "translations": {}, "cpu_math": _record()}
    text = compare([("a", run), ("b", dict(run))])
    assert text.splitlines()[-1] == _cpu_math.line(_record())
    other = dict(run, cpu_math=_record(threads=2, why="2 OpenMP threads (OMP_NUM_THREADS), not one"))
    last = compare([("a", run), ("b", other)]).splitlines()[-2:]
    assert last[0].startswith("CPU math of a: ") and last[1].startswith("CPU math of b: ")
    assert "this table may differ from the README's: 2 OpenMP threads" in last[1]
