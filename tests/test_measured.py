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
    average over 1.5 times the usable CPUs keeps nothing, and says so."""
    monkeypatch.undo()
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(cache.parent))
    cpus = _threads.usable_cpus()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5 * cpus + 0.1, 0.0, 0.0))
    assert measured.busy() == f"the machine was busy (load average {1.5 * cpus + 0.1:.1f} on {cpus} CPUs)"
    assert measured.keep("k", 1, {"1": 1.0}, "the threads") == (None, measured.busy())
    assert not cache.exists()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5 * cpus, 0.0, 0.0))
    assert measured.busy() is None
    assert measured.keep("k", 1, {"1": 1.0}, "the threads") == (str(cache), None)
