"""OpenMP threads per workload (d2l_transformer/_runtime/threads.py, `threads.size_for`, switched by the
kernel library's operator): one thread for the chapter's sizes, every core for the `full`
preset's, never against the user's own setting."""

import json
import os
import subprocess
import sys

import mxnet as mx
import pytest
from test_kernels import (
    loaded,  # noqa: F401
    needs_kernels,  # noqa: F401 - the fixture it marks with
)

from d2l_transformer._runtime import compat as _compat
from d2l_transformer._runtime import environ as _environ
from d2l_transformer._runtime import threads as _threads
from d2l_transformer.distributed.launch import job_env

PROBE = ("import json, os, sys; {pre}import d2l_transformer; "
         "from d2l_transformer._runtime import threads as _threads; "
         "print(json.dumps([os.environ.get('OMP_NUM_THREADS'), _threads._state['managed']]))")


def _probe(env, pre=""):
    """(OMP_NUM_THREADS, managed) in a fresh interpreter with `env` over a clean environment."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS", _threads.ENV, _threads.MAX_ENV,
                         _environ.MARK)}
    out = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre)], env={**base, **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _notices(err):
    return [line for line in err.splitlines() if line.startswith("d2l_transformer: ")]


def test_configure_at_import():
    assert _probe({}) == (["1", True], "")  # one thread until big work asks for more
    assert _probe({_threads.ENV: "3"})[0] == ["3", True]
    assert _probe({_threads.ENV: "mxnet"}) == ([None, False], "")  # MXNet's own choice
    # the user's, never overridden; said in one line where it may change the numbers
    result, err = _probe({"OMP_NUM_THREADS": "2"})
    assert result == ["2", False] and _notices(err) == [
        "d2l_transformer: OMP_NUM_THREADS=2: MXNet's thread count is yours, so a seed's numbers "
        "may differ from the README's (unset it for the package's)"]
    assert _probe({"OMP_NUM_THREADS": "1"}) == (["1", False], "")
    assert _probe({"MXNET_OMP_MAX_THREADS": "2"})[0] == [None, False]
    # MXNet read its settings first (after NumPy's aliases, without which it cannot import on
    # the NumPy that Python 3.12+ needs: d2l_transformer/_runtime/compat.py, run on its own)
    pre = f"import runpy; runpy.run_path({_compat.__file__!r})['apply'](); import mxnet; "
    result, err = _probe({}, pre=pre)
    assert result == [None, False] and "MXNet runs its own OpenMP thread count" in err
    # a child of a managed process (dist workers, benchmark rows) is managed too
    mark = {_environ.MARK: '{"OMP_NUM_THREADS": "1"}'}
    assert _probe({"OMP_NUM_THREADS": "1", **mark}) == (["1", True], "")
    assert _probe({"OMP_NUM_THREADS": "1", _threads.ENV: "mxnet", **mark})[0] == [None, False]
    assert _probe({"OMP_NUM_THREADS": "4", **mark})[0] == ["4", False]  # changed since: the user's


@pytest.mark.parametrize("name, value, line", [
    (_threads.ENV, "lots", "D2L_TRANSFORMER_THREADS='lots' is not auto, mxnet or a number of "
                           "threads (1 or more): using auto"),
    (_threads.ENV, "0", "D2L_TRANSFORMER_THREADS='0' is not auto, mxnet or a number of threads "
                        "(1 or more): using auto"),
    (_threads.MAX_ENV, "two", "D2L_TRANSFORMER_MAX_THREADS='two' is not a number of threads (1 "
                              "or more): ignored"),
])
def test_a_malformed_setting_gives_one_line(name, value, line):
    result, err = _probe({name: value})
    assert result == ["1", True] and err == f"d2l_transformer: {line}\n"


def test_one_rule_for_machine_bound_work():
    """`is_big` decides threads, oneDNN's cap (`cpu_math.settle`) and the default precision:
    every edition's run is pinned, the `full` and `hour` presets' training and the
    translator's batched beam search at their sizes are machine-bound."""
    from d2l_transformer.config import EDITIONS, FULL, HOUR, TINY

    vocab = {"0.11": 201, "0.17": 201, "1.0": 214}  # their target vocabularies
    for edition, cfg in EDITIONS.items():
        assert not _threads.is_big(_threads.run_work(cfg, vocab[edition])), edition
    assert _threads.run_work(EDITIONS["1.0"], 214) == 128 * 9 * 256 * 214
    assert not _threads.is_big(_threads.run_work(TINY, 35))
    for cfg in (FULL, HOUR):
        assert _threads.is_big(_threads.run_work(cfg, 4000))
        assert _threads.is_big(64 * 4 * cfg.embedding_size * 4000)  # a translator call, beam 4


def test_threads_for(monkeypatch):
    monkeypatch.setitem(_threads._state, "managed", True)
    monkeypatch.delenv(_threads.ENV, raising=False)
    monkeypatch.delenv(_threads.MAX_ENV, raising=False)
    chapter = 64 * 10 * 32 * 201  # the chapter's output layer per training step
    full = 256 * 15 * 128 * 4000  # the `full` preset's
    assert _threads.threads_for(chapter) == 1
    assert _threads.threads_for(full) == _threads.physical_cores()
    monkeypatch.setenv(_threads.MAX_ENV, "1")
    assert _threads.threads_for(full) == 1
    monkeypatch.setenv(_threads.ENV, "3")
    assert _threads.threads_for(chapter) == 3
    monkeypatch.setitem(_threads._state, "managed", False)
    assert _threads.threads_for(full) is None


def test_local_job_shares_the_cores():
    cores = _threads.physical_cores()
    assert job_env({}, "local", 2)[_threads.MAX_ENV] == str(max(1, cores // 2))
    assert job_env({_threads.MAX_ENV: "5"}, "local", 2)[_threads.MAX_ENV] == "5"
    assert _threads.MAX_ENV not in job_env({}, "ssh", 2)  # other machines' cores


@needs_kernels
def test_size_for_switches_the_engine_thread(monkeypatch):
    if not _threads._state["managed"]:
        pytest.skip("the thread count is the user's here (OMP_NUM_THREADS or MXNet imported first)")
    monkeypatch.delenv(_threads.ENV, raising=False)
    monkeypatch.delenv(_threads.MAX_ENV, raising=False)

    def now():  # the count in force on the engine's CPU worker, read by the operator itself
        return int(mx.nd.d2t_omp_threads(mx.nd.zeros((1,))).asnumpy()[0])

    x = mx.np.random.uniform(size=(512, 128))
    w = mx.np.random.uniform(size=(1000, 128))
    try:
        assert _threads.size_for(_threads.BIG_WORK) == _threads.physical_cores() == now()
        big = mx.npx.fully_connected(x, w, no_bias=True, num_hidden=1000).asnumpy()
        assert _threads.size_for(10) == 1 == now()
        small = mx.npx.fully_connected(x, w, no_bias=True, num_hidden=1000).asnumpy()
        assert abs(big - small).max() <= 1e-4 * abs(small).max()  # the same product
    finally:
        _threads.size_for(0)


def test_size_for_without_a_switch_leaves_the_threads_alone(monkeypatch):
    """Where nothing can switch the engine's thread (the kernel library did not load), the
    count stays what it is and `size_for` says it is not ours: None."""
    monkeypatch.setitem(_threads._state, "managed", True)
    monkeypatch.setitem(_threads._state, "threads", 1)
    monkeypatch.delenv(_threads.ENV, raising=False)
    asked = []

    def cannot(n):  # a switch that fails, as the kernels' does when they do not load
        asked.append(n)
        return False

    monkeypatch.setitem(_threads._state, "switch", cannot)
    assert _threads.size_for(10) == 1 and asked == []  # already in force: nothing to run
    monkeypatch.setenv(_threads.ENV, "3")
    assert _threads.size_for(10) is None and asked == [3]
    assert _threads._state["threads"] == 1
