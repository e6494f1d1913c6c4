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
from d2l_transformer._runtime import environ as _environ
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
             "MKLDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE", _cpu_math.ENV, _environ.MARK,
             _threads.ENV, _threads.MAX_ENV)

pinnable = _cpu_math.unpinnable(flags=_cpu_math.cpu_flags())
needs_pins = pytest.mark.skipif(pinnable is not None, reason=f"not pinned here: {pinnable}")
needs_data = pytest.mark.skipif(not os.path.exists(d2t.data.default_data_path()),
                                reason="fra-eng.zip is not there")


def _env(**extra):
    """This process's environment without any variable of `MATH_VARS`, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k not in MATH_VARS}, **extra}


def _train(out, epochs, *args, stderr=None, **env):
    r = subprocess.run([sys.executable, TRAIN, "--epochs", str(epochs), "--seed", "0",
                        "--ctx", "cpu", "--skip-toys", "--quiet", "--out", str(out), *args],
                       capture_output=True, text=True, cwd=ROOT, env=_env(**env), timeout=900)
    assert r.returncode == 0, r.stderr
    if stderr is not None:
        stderr.append(r.stderr)
    return json.loads((out / "summary.json").read_text())


@needs_pins
@needs_data
def test_exact_run_gives_the_readmes_losses_bit_for_bit(tmp_path):
    s = _train(tmp_path, 20, "--exact-chapter")
    assert [e for e, _ in s["epoch_history"]] == list(range(1, 21))
    assert [loss for _, loss in s["epoch_history"]] == EXACT
    assert s["cpu_math"]["pinned"] and s["cpu_math"]["why"] is None
    assert (s["cpu_math"]["isa_cap"], s["cpu_math"]["openblas"]) == ("AVX2", "Haswell")
    assert s["cpu_math"]["threads"] == [1]


@needs_pins
@needs_data
def test_corrected_run_gives_the_readmes_losses_bit_for_bit(tmp_path):
    s = _train(tmp_path, 20)
    assert s["fast"] and [loss for _, loss in s["epoch_history"]] == CORRECTED


@needs_pins
@needs_data
def test_the_pins_alone_decide(tmp_path):
    """Set by hand in native mode, the two variables give the same numbers: they are the whole
    difference."""
    env = {_cpu_math.ENV: "native", "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}
    s = _train(tmp_path, 3, "--exact-chapter", **env)
    assert [loss for _, loss in s["epoch_history"]] == EXACT[:3]


@pytest.mark.slow
@needs_pins
@needs_data
def test_the_users_own_values_are_kept_and_recorded(tmp_path):
    """Another machine's variables are the user's: kept, said in one line at import, and the
    run's record says what ran (not pinned, and why)."""
    err = []
    s = _train(tmp_path, 1, "--exact-chapter", stderr=err, DNNL_MAX_CPU_ISA="AVX512_CORE",
               OPENBLAS_CORETYPE="Sandybridge", OMP_NUM_THREADS="2")
    math = s["cpu_math"]
    assert (math["isa_cap"], math["openblas"], math["threads"]) == ("AVX512_CORE", "Sandybridge", [2])
    assert not math["pinned"] and math["why"] == (
        "oneDNN capped at AVX512_CORE (DNNL_MAX_CPU_ISA is yours), not AVX2; OpenBLAS ran its "
        "Sandybridge kernels (OPENBLAS_CORETYPE is yours); 2 OpenMP threads (OMP_NUM_THREADS=2), "
        "not one")
    notices = [line for line in err[0].splitlines() if line.startswith("d2l_transformer: ")]
    assert notices == [
        "d2l_transformer: OMP_NUM_THREADS=2: MXNet's thread count is yours, so a seed's numbers "
        "may differ from the README's (unset it for the package's)",
        "d2l_transformer: DNNL_MAX_CPU_ISA=AVX512_CORE, OPENBLAS_CORETYPE=Sandybridge are yours and "
        "are kept: a seed's numbers may differ from the README's (unset them for the pinned kernels)"]


PROBE = ("import json, os, warnings; warnings.simplefilter('always'); {pre}import d2l_transformer; "
         "from d2l_transformer._runtime import cpu_math as _cpu_math; "
         "print(json.dumps([os.environ.get(n) for n in ('DNNL_MAX_CPU_ISA', 'OPENBLAS_CORETYPE')]"
         " + [_cpu_math.openblas_core()]))")


def _probe(pre="", **env):
    """([DNNL_MAX_CPU_ISA, OPENBLAS_CORETYPE, OpenBLAS's kernels], the package's lines on
    stderr) after importing the package in a fresh interpreter with `env` over a clean
    environment; no Python warning of the package's."""
    r = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre)], env=_env(**env),
                       capture_output=True, text=True, check=True)
    assert "UserWarning" not in r.stderr
    said = [line + "\n" for line in r.stderr.splitlines() if line.startswith("d2l_transformer: ")]
    return json.loads(r.stdout.strip().splitlines()[-1]), "".join(said)


@needs_pins
def test_configure_at_import():
    assert _probe() == (["AVX2", "Haswell", "Haswell"], "")
    # the user's value is kept, and said in one line
    result, err = _probe(DNNL_MAX_CPU_ISA="AVX512_CORE")
    assert result == ["AVX512_CORE", "Haswell", "Haswell"]
    assert err == ("d2l_transformer: DNNL_MAX_CPU_ISA=AVX512_CORE is yours and is kept: a seed's "
                   "numbers may differ from the README's (unset it for the pinned kernels)\n")
    assert _probe(DNNL_MAX_CPU_ISA="AVX2") == (["AVX2", "Haswell", "Haswell"], "")  # the pin itself
    native, err = _probe(**{_cpu_math.ENV: "native", "OPENBLAS_CORETYPE": "Sandybridge"})
    assert native == [None, "Sandybridge", "Sandybridge"] and err == ""
    result, err = _probe(**{_cpu_math.ENV: "fastest"})  # one line, no warning's source line
    assert result[0] == "AVX2" and err == (
        "d2l_transformer: D2L_TRANSFORMER_CPU='fastest' is not pinned or native: using pinned\n")


@needs_pins
def test_a_child_decides_again_over_its_parents_pins():
    """A pinned parent's values (marked) are not the user's: a child in native mode drops them,
    a pinned one keeps them without a word; a value changed since the mark is the user's."""
    mark = json.dumps({"DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"})
    inherited = {_environ.MARK: mark, "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}
    assert _probe(**inherited, **{_cpu_math.ENV: "native"}) == ([None, None, _probe(
        **{_cpu_math.ENV: "native"})[0][2]], "")
    assert _probe(**inherited) == (["AVX2", "Haswell", "Haswell"], "")
    result, err = _probe(**dict(inherited, OPENBLAS_CORETYPE="Sandybridge"))
    assert result == ["AVX2", "Sandybridge", "Sandybridge"]
    assert "OPENBLAS_CORETYPE=Sandybridge is yours" in err


CHILD = ("import json, os, subprocess, sys; import d2l_transformer; "
         "from d2l_transformer._runtime import environ; "
         "show = [sys.executable, '-c', 'import json, os; print(json.dumps(dict(os.environ)))']; "
         "seen = [json.loads(subprocess.run(show, env=environ.user_environ(), capture_output=True, "
         "text=True).stdout)]; environ.restore_user_environ(); "
         "seen.append(json.loads(subprocess.run(show, capture_output=True, text=True).stdout)); "
         "print(json.dumps(seen))")


def test_children_that_are_not_ours_get_the_users_environment():
    """A process that imported the package hands a child that does not import it (PyTorch's
    benchmark row, CTranslate2's) the environment the user had: `user_environ`, or its own
    environment given back (`restore_user_environ`)."""
    user = _env(OMP_NUM_THREADS="3", D2L_TRANSFORMER_TEST_VALUE="kept")
    r = subprocess.run([sys.executable, "-c", CHILD], env=user, capture_output=True, text=True,
                       check=True)
    for seen in json.loads(r.stdout.strip().splitlines()[-1]):
        assert {k: seen.get(k) for k in MATH_VARS} == {k: user.get(k) for k in MATH_VARS}
        assert seen["D2L_TRANSFORMER_TEST_VALUE"] == "kept"


def test_the_pytorch_row_runs_in_the_users_environment(tmp_path):
    """scripts/bench_training.py's PyTorch row: PyTorch is not the package's, so it loads
    (here: the moment it would) in the environment the user had, not the pinned one."""
    code = ("import json, os, sys; sys.path.insert(0, {scripts!r}); import d2l_transformer; "
            "import baselines, bench_training; seen = []; "
            "baselines.missing = lambda p: seen.append(dict(os.environ)) or 'not here'; "
            "bench_training.baseline_row({{}}, 'train_torch', {tmp!r}); "
            "print(json.dumps([seen[0].get(k) for k in ('OMP_NUM_THREADS', 'DNNL_MAX_CPU_ISA', "
            "'OPENBLAS_CORETYPE')]))").format(scripts=os.path.join(ROOT, "scripts"), tmp=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=_env(OPENBLAS_CORETYPE="Zen"),
                       capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [None, None, "Zen"]


@needs_pins
def test_mxnet_imported_first_says_what_came_too_late_in_one_line():
    pre = (f"import runpy; runpy.run_path({d2t._runtime.compat.__file__!r})['apply'](); import mxnet; ")
    result, err = _probe(pre=pre)
    lines = [line for line in err.splitlines() if "imported before d2l_transformer" in line]
    assert len(lines) == 1 and lines[0].endswith("(import d2l_transformer first)")
    assert "MXNet runs its own OpenMP thread count, not the package's" in lines[0]
    assert "oneDNN's AVX2 cap holds only if no MXNet operator has run yet" in lines[0]
    assert (f"OpenBLAS runs its {result[2]} kernels" in lines[0]) == (result[2] != "Haswell")


def test_where_pinning_cannot_hold():
    assert "aarch64" in _cpu_math.unpinnable("aarch64", {"asimd"})
    assert "not Linux" in _cpu_math.unpinnable("x86_64", None)
    assert _cpu_math.unpinnable("x86_64", {"avx", "sse2"}) == "the CPU lacks AVX2 and FMA"
    assert _cpu_math.unpinnable("x86_64", {"avx2"}) == "the CPU lacks FMA"
    assert _cpu_math.unpinnable("AMD64", {"avx2", "fma"}) is None


def _record(**changes):
    return {"pinned": True, "mode": "pinned", "cpu": "Some CPU", "isa_cap": "AVX2",
            "openblas": "Haswell", "threads": [1], "why": None, **changes}


def test_the_line_says_why_a_table_may_differ():
    assert _cpu_math.line(_record()) == (
        "CPU math: oneDNN capped at AVX2, OpenBLAS Haswell kernels, 1 OpenMP thread on Some "
        "CPU (pinned: the README's numbers on any x86-64 CPU with AVX2 and FMA)")
    native = _cpu_math.line(_record(pinned=False, mode="native", isa_cap=None,
                                    openblas="SkylakeX", why="D2L_TRANSFORMER_CPU=native: x"))
    assert "oneDNN uncapped, OpenBLAS SkylakeX" in native
    assert native.endswith("this table may differ from the README's: D2L_TRANSFORMER_CPU=native: x")
    assert ", 1 and 2 OpenMP threads on" in _cpu_math.line(_record(threads=[1, 2], why="y"))
    assert ", MXNet's own OpenMP threads on" in _cpu_math.line(_record(threads=None, why="y"))
    assert ", 1 OpenMP thread on" in _cpu_math.line(_record(threads=1))  # an older record
    assert "not recorded" in _cpu_math.line(None)


SETTLE = ("import os, d2l_transformer as d2t; from d2l_transformer._runtime import cpu_math as _cpu_math; "
          "[_cpu_math.settle(getattr(d2t, n), v) for n, v in {runs}]; "
          "print(os.environ.get('DNNL_MAX_CPU_ISA'), _cpu_math.describe('cpu(0)')['why'])")


@needs_pins
def test_the_first_run_of_a_process_settles_the_onednn_cap():
    def settle(*runs):
        return subprocess.run([sys.executable, "-c", SETTLE.format(runs=list(runs))],
                              env=_env(), capture_output=True, text=True,
                              check=True).stdout.strip().splitlines()[-1]

    assert settle(("CHAPTER", 201), ("FULL", 4000)) == "AVX2 None"  # pinned work: the pins hold
    assert settle(("FULL", 4000), ("CHAPTER", 201)) == (  # machine-bound: every instruction set
        "None a machine-bound run: oneDNN on every instruction set of this CPU")
    # the rule is the work's, not the data's: the whole corpus at the chapter's sizes is pinned
    assert settle(("FULL", 16)) == "AVX2 None"


@needs_pins
def test_a_small_bfloat16_run_is_recorded_as_one_not_as_a_machine_bound_run():
    """``tiny --set precision=bfloat16`` lifts oneDNN's cap for its bfloat16 kernels, not for
    its size: the record says so (and `mode` says the math ran unpinned)."""
    code = ("import json, d2l_transformer as d2t; from d2l_transformer._runtime import cpu_math; "
            "cpu_math.settle(d2t.TINY, 35, bfloat16=True); print(json.dumps(cpu_math.describe()))")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                       check=True)
    record = json.loads(r.stdout.strip().splitlines()[-1])
    assert (record["pinned"], record["mode"]) == (False, "unpinned")
    assert record["why"].startswith("bfloat16 asked (oneDNN has no bfloat16 kernels below "
                                    "AVX-512): oneDNN on every instruction set of this CPU")
    assert "machine-bound" not in record["why"]


class _Libc:
    """`ctypes.CDLL(None)` whose ``syscall`` answers `granted` and counts its calls."""

    calls = []

    def __init__(self, name, use_errno=False):
        pass

    def syscall(self, *args):
        _Libc.calls.append(args)
        return 0 if _Libc.granted else -1


@pytest.mark.parametrize("users_cap, granted, allowed, cap, refused", [
    (None, True, True, _cpu_math.AMX, False),  # ours: AMX named
    ("AVX512_CORE_AMX", True, True, "AVX512_CORE_AMX", False),  # yours: the tiles asked for
    ("AVX512_CORE_BF16", True, False, "AVX512_CORE_BF16", False),  # yours, without AMX: kept
    ("AVX512_CORE_AMX", False, False, "AVX512_CORE_AMX", True),  # refused: said, not fatal
    (None, False, False, None, False),  # refused, no cap: oneDNN never reaches AMX
])
def test_amx_tiles_are_asked_for_whenever_the_cpu_has_them(monkeypatch, users_cap, granted,
                                                           allowed, cap, refused):
    monkeypatch.setattr(_cpu_math.ctypes, "CDLL", _Libc)
    monkeypatch.setattr(_Libc, "calls", [])
    monkeypatch.setattr(_Libc, "granted", granted, raising=False)
    monkeypatch.setitem(_cpu_math._state, "amx", None)
    monkeypatch.delenv(_environ.MARK, raising=False)
    if users_cap is None:
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("DNNL_MAX_CPU_ISA", users_cap)
    assert not _cpu_math.allow_amx({"avx512_bf16"}) and _Libc.calls == []  # no tiles: not asked
    assert _cpu_math.allow_amx({"amx_bf16", "amx_tile", "avx512_bf16"}) == allowed
    assert len(_Libc.calls) == 1 and os.environ.get("DNNL_MAX_CPU_ISA") == cap
    why = _cpu_math.amx_refused()
    assert (why is not None) == refused
    if refused:
        assert why.startswith("DNNL_MAX_CPU_ISA=AVX512_CORE_AMX is yours and names AMX, but "
                              "Linux lends this process no AMX tiles")
    _cpu_math.allow_amx({"amx_bf16", "amx_tile"})
    assert len(_Libc.calls) == 1  # asked once per process


def _cli(*args, **env):
    r = subprocess.run([sys.executable, "-m", "d2l_transformer", *args], capture_output=True,
                       text=True, cwd=ROOT, env=_env(DNNL_VERBOSE="1", **env), timeout=600)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.startswith("dnnl_verbose,info,cpu,isa:")]


@pytest.mark.slow
@needs_pins
@needs_data
def test_a_run_settles_before_its_first_kernel(tmp_path):
    """oneDNN reads its cap at its first kernel (its verbose mode names the instruction set
    then): `train` and `translate` settle before it, so a pinned run computes with AVX2 and a
    machine-bound one (`threads.is_big`: tiny's 201 pairs in one batch, 1,024 wide) with this
    CPU's own, and a bfloat16 one with AMX where the CPU has its tiles."""
    small, big = tmp_path / "small", tmp_path / "big"
    assert _cli("train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet",
                "--out", str(small)) == ["dnnl_verbose,info,cpu,isa:Intel AVX2"]
    assert json.loads((small / "summary.json").read_text())["cpu_math"]["pinned"]
    own = _cli("train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet", "--out",
               str(tmp_path / "native"), **{_cpu_math.ENV: "native"})
    args = ("--set", "batch_size=256", "--set", "embedding_size=1024")
    assert _cli("train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet", *args,
                "--set", "precision=float32", "--out", str(big)) == own
    math = json.loads((big / "summary.json").read_text())["cpu_math"]
    assert not math["pinned"] and math["isa_cap"] is None
    assert math["why"].startswith("a machine-bound run: oneDNN on every instruction set")
    assert _cli("translate", "--engine", "mxnet", "--model", str(big), "go .") == own
    assert _cli("translate", "--engine", "mxnet",
                "--model", str(small), "go .") == ["dnnl_verbose,info,cpu,isa:Intel AVX2"]
    # the same run in bfloat16 where the CPU has the units: AMX asked for where it has tiles
    flags = _cpu_math.cpu_flags() or set()
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return
    amx = {"amx_bf16", "amx_tile"} <= flags
    isa = _cli("train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet", *args,
               "--set", "precision=bfloat16", "--out", str(tmp_path / "bf16"))
    assert len(isa) == 1 and ("Intel AMX with bfloat16" in isa[0]) == amx, isa
    math = json.loads((tmp_path / "bf16" / "summary.json").read_text())["cpu_math"]
    assert math["isa_cap"] == (_cpu_math.AMX if amx else None)


def test_pinned_and_why_agree(monkeypatch):
    """`pinned` is `why is None`, and `why` names each way the run left the pinned math."""
    assert "gpu(0)" in _cpu_math.describe("gpu(0)")["why"]
    if pinnable is not None:
        assert not _cpu_math.describe("cpu(0)")["pinned"]
        return
    monkeypatch.setitem(_cpu_math._state, "settled", "capped")  # whichever test ran first
    monkeypatch.setitem(_cpu_math._state, "isa_cap", "AVX2")
    monkeypatch.setitem(_threads._state, "managed", True)
    monkeypatch.delenv(_threads.ENV, raising=False)
    monkeypatch.setitem(_threads._state, "used", {1})
    record = _cpu_math.describe("cpu(0)")
    assert record["pinned"] and record["why"] is None and record["threads"] == [1]
    assert record["mode"] == "pinned"
    monkeypatch.setitem(_threads._state, "used", {1, 2})  # `size_for` gave the run two threads
    record = _cpu_math.describe("cpu(0)")
    assert not record["pinned"] and record["threads"] == [1, 2]
    assert record["mode"] == "unpinned"  # what ran, not what D2L_TRANSFORMER_CPU asked
    assert record["why"] == "1 and 2 OpenMP threads (sized to a machine-bound run), not one"
    monkeypatch.setenv(_threads.ENV, "2")
    monkeypatch.setitem(_threads._state, "used", {2})
    monkeypatch.setitem(_cpu_math._state, "settled", "lifted")
    monkeypatch.setitem(_cpu_math._state, "lifted_for", "a machine-bound run")
    monkeypatch.setitem(_cpu_math._state, "isa_cap", None)
    assert _cpu_math.describe("cpu(0)")["why"] == (
        "a machine-bound run: oneDNN on every instruction set of this CPU; "
        "2 OpenMP threads (D2L_TRANSFORMER_THREADS=2), not one")


def test_compare_prints_the_cpu_math_once_or_per_group():
    run = {"loss": 0.032, "loss_per_token": 0.29, "tokens_per_sec": 1.0, "ctx": "cpu(0)",
           "translations": {}, "cpu_math": _record()}
    text = compare([("a", run), ("b", dict(run))])
    assert text.splitlines()[-1] == _cpu_math.line(_record())
    why = "2 OpenMP threads (OMP_NUM_THREADS=2), not one"
    other = dict(run, cpu_math=_record(threads=[2], pinned=False, why=why))
    last = compare([("a", run), ("b", other)]).splitlines()[-2:]
    assert last[0].startswith("CPU math of a: ") and last[1].startswith("CPU math of b: ")
    assert last[1].endswith(f", 2 OpenMP threads on Some CPU; this table may differ from the "
                            f"README's: {why}")
