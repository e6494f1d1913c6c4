"""The cache of measured decisions (d2l_transformer/io/measured.py): its key names the machine
(the cgroup's CPU quota too), a value outside the measured choices is refused when read back,
and processes writing at once lose no entry."""

import json
import multiprocessing
import os

import pytest

from d2l_transformer._runtime import threads as _threads
from d2l_transformer.io import measured


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """This test's own cache directory (`io.cache`), on a machine taken for quiet (what the
    tests measure is theirs: `measured.busy` is tested on its own)."""
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured, "busy", lambda: None)
    return tmp_path / "cache" / measured.FILE


def _cgroup(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2
    ({"cpu.max": "max 100000\n"}, None),  # v2, no quota
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),  # v1
    ({"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
     0.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, none
    ({}, None),  # no control group files at all
])
def test_the_key_holds_the_cgroup_cpu_quota(tmp_path, monkeypatch, files, quota):
    _cgroup(tmp_path, files)
    monkeypatch.setattr(_threads, "CGROUP", str(tmp_path))
    monkeypatch.setattr(_threads, "PROC_CGROUP", str(tmp_path / "none"))  # at the root
    assert _threads.cpu_quota() == quota
    name = measured.key("a decision", {"version": "1.2", "model": "2/256"})
    assert name.startswith("a decision; ") and name.endswith("; version 1.2; model 2/256")
    assert f"quota {'none' if quota is None else f'{quota:g} CPUs'}" in name
    assert f"{_threads.physical_cores()} cores, {_threads.usable_cpus()} CPUs" in name


def test_a_value_outside_the_measured_choices_is_refused(cache):
    assert measured.keep("k", 2, {"1": 2.0, "2": 1.0}, "the threads") == (str(cache), None)
    assert measured.recall("k", [1, 2])["value"] == 2
    assert measured.recall("k", [1]) is None  # 2 was not measured here
    data = json.loads(cache.read_text())
    for bad in (100000, "2", 2.0, None, True):
        data["entries"]["k"]["value"] = bad
        cache.write_text(json.dumps(data))
        assert measured.recall("k", [1, 2, 4]) is None, bad
    assert measured.recall("other", [1, 2]) is None


def _keep_many(first, count):
    measured.busy = lambda: None  # this child's figures are a test's, kept whatever the load
    for i in range(first, first + count):
        measured.keep(f"entry {i}", i % 2, {"0": 1.0, "1": 2.0}, "a test's figures")


def test_processes_writing_at_once_lose_no_entry(cache):
    """Four processes keep 25 entries each, at the same time: all 100 are in the file."""
    context = multiprocessing.get_context("spawn")  # the child reads D2L_TRANSFORMER_CACHE
    workers = [context.Process(target=_keep_many, args=(k * 25, 25)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    entries = json.loads(cache.read_text())["entries"]
    assert sorted(entries) == sorted(f"entry {i}" for i in range(100))
    assert not [n for n in os.listdir(cache.parent) if n != measured.FILE]  # no lock, no temp


def test_a_damaged_file_is_ignored_and_written_anew(cache, caplog):
    cache.parent.mkdir()
    cache.write_text("{not json")
    assert measured.recall("k", [1]) is None
    assert any("ignoring the damaged cache file" in r.getMessage() for r in caplog.records)
    measured.keep("k", 1, {"1": 1.0}, "the threads")
    assert measured.recall("k", [1])["figures"] == {"1": 1.0}


def test_a_busy_machine_keeps_nothing(cache, monkeypatch):
    """Figures measured under another job's load decide for their process alone: a load
    average over the usable CPUs (2.9 on 2 CPUs) keeps nothing, and says so."""
    monkeypatch.undo()
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(cache.parent))
    cpus = _threads.usable_cpus()
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus + 0.9, 0.0, 0.0))
    assert measured.busy() == f"the machine was busy (load average {cpus + 0.9:.1f} on {cpus} CPUs)"
    assert measured.keep("k", 1, {"1": 1.0}, "the threads") == (None, measured.busy())
    assert not cache.exists()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0 * cpus, 0.0, 0.0))
    assert measured.busy() is None
    assert measured.keep("k", 1, {"1": 1.0}, "the threads") == (str(cache), None)


def test_the_quota_is_read_where_the_process_lives(tmp_path, monkeypatch):
    """A v2 process in /user.slice/job (its cpu.max 1.5 CPUs) under a parent of 3: 1.5; the
    root's files alone say nothing of it."""
    _cgroup(tmp_path, {"user.slice/cpu.max": "300000 100000\n",
                       "user.slice/job/cpu.max": "150000 100000\n",
                       "cpu.max": "max 100000\n"})
    (tmp_path / "self").write_text("0::/user.slice/job\n")
    monkeypatch.setattr(_threads, "CGROUP", str(tmp_path))
    monkeypatch.setattr(_threads, "PROC_CGROUP", str(tmp_path / "self"))
    assert _threads.cpu_quota() == 1.5
    (tmp_path / "self").write_text("4:cpu,cpuacct:/docker/abc\n0::/\n")
    _cgroup(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                       "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert _threads.cpu_quota() == 0.5


def test_the_key_holds_what_changes_the_answer(monkeypatch):
    from d2l_transformer._runtime import cpu_math
    from d2l_transformer._version import __version__
    monkeypatch.setattr(cpu_math, "cpu_flags", lambda: {"avx2", "fma", "avx512_bf16", "sse"})
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("D2L_TRANSFORMER_KERNELS", raising=False)
    name = measured.key("a decision", {})
    assert "flags avx2 fma avx512_bf16;" in name and "sse" not in name
    assert "DNNL_MAX_CPU_ISA unset" in name and "kernels on" in name
    assert f"d2l_transformer {__version__}" in name and "AMX " in name
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("D2L_TRANSFORMER_KERNELS", "0")
    other = measured.key("a decision", {})
    assert "DNNL_MAX_CPU_ISA AVX2" in other and "kernels off" in other and other != name


def test_entries_expire_after_a_month_or_a_new_version(cache):
    measured.keep("k", 1, {"1": 1.0}, "the threads")
    assert measured.recall("k", [1])["version"]
    data = json.loads(cache.read_text())
    data["entries"]["k"]["measured"] = "2000-01-01T00:00:00"
    cache.write_text(json.dumps(data))
    assert measured.recall("k", [1]) is None
    data["entries"]["k"].update(measured=data["entries"]["k"]["measured"].replace("2000", "2999"),
                                version="0.0.1")
    cache.write_text(json.dumps(data))
    assert measured.recall("k", [1]) is None
    measured.keep("other", 1, {"1": 1.0}, "the threads")
    assert list(json.loads(cache.read_text())["entries"]) == ["other"]  # the stale one gone


def test_another_process_training_keeps_nothing(cache, monkeypatch):
    """While another process of the package trains (its mark in the cache directory), figures
    measured here are not kept; a mark whose process is gone is removed."""
    monkeypatch.undo()
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(cache.parent))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    marks = cache.parent / measured.TRAINING
    marks.mkdir(parents=True)
    (marks / str(os.getppid())).write_text("")  # alive: pytest's parent
    assert measured.busy() == f"another d2l_transformer process (pid {os.getppid()}) was training"
    assert measured.keep("k", 1, {"1": 1.0}, "the threads")[0] is None
    os.remove(marks / str(os.getppid()))
    dead = multiprocessing.get_context("spawn").Process(target=int)
    dead.start()
    dead.join()
    (marks / str(dead.pid)).write_text("")
    with measured.training():  # this process's own mark does not count
        assert measured.busy() is None
        assert (marks / str(os.getpid())).exists()
    assert not (marks / str(dead.pid)).exists() and not (marks / str(os.getpid())).exists()
