#!/usr/bin/env python
"""Fault injection: a model directory survives kills, concurrent readers and failing saves.

Three scenarios, each bounded in time (``--timeout`` seconds), figures printed and written with
``--json PATH`` (docs/safety.md has the figures and the command that produced them):

kill        ``d2l-transformer train --preset tiny`` (a checkpoint every epoch) killed with
            SIGKILL ``--kills`` times: each run first completes a checkpoint of its own, then
            is killed alternately at a random moment of the next epoch's batches and while a
            save is under way (as soon as the save's new version directory appears, plus a
            random 0-30 ms; ``save_under_way`` counts the kills that found the new version
            not yet in place); after each kill the directory must load (`checkpoint.load`), and
            the next run continues it with ``--resume`` from the epoch after the one saved.
concurrent  one process saving the model ``--saves`` times, every parameter set to the version
            number and summary.json holding it, while ``--readers`` processes load it until
            ``--loads`` loads are done (both counts reached): failed loads, and loads whose
            weights and summary disagree (a mixed version).
fail        a save that fails half-way, through the console script (``train --resume`` one
            more epoch): under a file size limit (``RLIMIT_FSIZE`` half the parameters' size,
            SIGXFSZ ignored, as ``ulimit -f`` with the signal trapped), and into a read-only
            directory (mode 0555; as root, where modes do not apply, a read-only tmpfs mount,
            skipped if mounting is not allowed): the exit status, the one-line error, and the
            previous version loading whole, byte for byte.

Run from the source tree: ``python scripts/fault_injection.py [--only kill,concurrent,fail]``.
"""

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import d2l_transformer as d2t  # isort: skip  (first: its NumPy-alias shim must precede mxnet)
import mxnet as mx

from d2l_transformer import checkpoint
from d2l_transformer.io import atomic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ("kill", "concurrent", "fail")
TRAIN = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--seed", "0"]


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SCENARIOS),
                   help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    p.add_argument("--kills", type=int, default=30)
    p.add_argument("--saves", type=int, default=500)
    p.add_argument("--loads", type=int, default=500)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900, help="seconds per scenario")
    p.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    return p


def _cli(*args):
    return [sys.executable, "-m", "d2l_transformer.cli", *args]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def _versions(path):
    """The version directories inside the model directory `path`."""
    return {n for n in os.listdir(path) if re.fullmatch(r"v-[0-9a-f]{16}", n)} \
        if os.path.isdir(path) else set()


def _files(path):
    """The model directory's files and their bytes, as a reader resolves it."""
    real = atomic.resolve_dir(path)
    return {n: open(os.path.join(real, n), "rb").read() for n in sorted(os.listdir(real))}


# ---------------------------------------------------------------------------------- kill -9
def _start_line(proc, lines, deadline):
    """The run's "training ... (from epoch K)" line (None if it did not come in time)."""
    while time.time() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                return None
            continue
        if line is None:
            return None
        if line.startswith("training "):
            return line
    return None


def _pump(stream, lines):
    """Every line of `stream` into the queue `lines`, then None."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def kill_scenario(work, kills, rng, timeout):
    out = os.path.join(work, "kill", "m")
    os.makedirs(os.path.dirname(out))
    figures = {"kills": 0, "aimed_at_batches": 0, "aimed_at_saves": 0, "save_under_way": 0,
               "loads_ok": 0, "unreadable": 0, "lost": 0, "resumed_at_next_epoch": 0,
               "resumes": 0, "fresh_starts": 0, "problems": []}
    saved_epochs, deadline = None, time.time() + timeout
    for i in range(kills):
        if time.time() > deadline:
            figures["problems"].append(f"time limit after {i} kills")
            break
        resume = checkpoint.is_model_dir(out)
        proc = subprocess.Popen(_cli(*TRAIN, "--epochs", "100000", "--out", out,
                                     *(["--resume"] if resume else [])),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=_env(), cwd=work)
        lines = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True)
        reader.start()
        start = _start_line(proc, lines, min(deadline, time.time() + 300))
        if start is None:
            proc.kill()
            proc.wait()
            figures["problems"].append(f"round {i}: the run did not start")
            continue
        first = int(re.search(r"from epoch (\d+)", start).group(1))
        if resume:
            figures["resumes"] += 1
            figures["resumed_at_next_epoch"] += first == saved_epochs + 1
        else:
            figures["fresh_starts"] += 1
        # every run first completes one checkpoint of its own (so that the runs progress),
        # then is killed at the moment aimed at
        live = atomic.resolve_dir(out) if os.path.lexists(out) else None
        tic = time.time()
        while proc.poll() is None and time.time() < deadline and (
                not os.path.lexists(out) or atomic.resolve_dir(out) == live):
            time.sleep(0.005)
        epoch_seconds = min(time.time() - tic, 3.0)  # an over-estimate: the first epoch warms up
        if i % 2 == 0:  # a random moment of the next epoch: mostly batches
            figures["aimed_at_batches"] += 1
            time.sleep(rng.uniform(0.0, epoch_seconds))
        else:  # as soon as the next save's new version appears, plus 0-30 ms
            figures["aimed_at_saves"] += 1
            before = _versions(out)
            while proc.poll() is None and time.time() < deadline:
                new = _versions(out) - before
                if new:
                    time.sleep(rng.uniform(0.0, 0.03))
                    live = os.path.basename(atomic.resolve_dir(out))
                    figures["save_under_way"] += any(n != live for n in new & _versions(out))
                    break
                time.sleep(0.001)
        proc.kill()  # SIGKILL
        proc.wait()
        reader.join(5)
        figures["kills"] += 1
        if not checkpoint.is_model_dir(out) and saved_epochs is None:
            continue  # killed before its first checkpoint: nothing to lose yet
        try:
            summary = checkpoint.load(out)[4]
        except checkpoint.CheckpointError as e:
            figures["unreadable"] += 1
            figures["lost"] += saved_epochs is not None
            figures["problems"].append(f"round {i}: {e}")
            continue
        figures["loads_ok"] += 1
        if saved_epochs is not None and summary["epochs_done"] < saved_epochs:
            figures["lost"] += 1
            figures["problems"].append(f"round {i}: epochs went back from {saved_epochs} to "
                                       f"{summary['epochs_done']}")
        saved_epochs = summary["epochs_done"]
    figures["epochs_saved_at_the_end"] = saved_epochs
    return figures


# ---------------------------------------------------------------------------------- concurrent
def _set_version(model, version):
    for p in model.collect_params().values():
        if p.grad_req != "null":
            p.set_data(mx.np.full(p.shape, float(version)))


def _tiny_model():
    cfg = d2t.TINY
    src_vocab, tgt_vocab, _ = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps, cfg.num_examples)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.initialize(mx.init.Xavier())
    X = mx.np.ones((1, 2))  # (batch, seq_len): every shape known
    model(X, X, mx.np.array([2]))
    return model, src_vocab, tgt_vocab, cfg


def _writer(directory, saves, loads, target, done):
    model, src_vocab, tgt_vocab, cfg = _tiny_model()
    version = 0
    while (saves.value < target or loads.value < target) and not done.is_set():
        version += 1
        _set_version(model, version)
        checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"version": version})
        with saves.get_lock():
            saves.value += 1


def _reader(directory, saves, loads, target, done, failures, mixed, messages):
    while (saves.value < target or loads.value < target) and not done.is_set():
        try:
            model, _, _, _, summary = checkpoint.load(directory)
        except Exception as e:  # noqa: BLE001 - every failure is counted, whatever it is
            with failures.get_lock():
                failures.value += 1
            messages.put(f"{type(e).__name__}: {e}")
        else:
            values = {float(v) for p in model.collect_params().values() if p.grad_req != "null"
                      for v in (p.data().min(), p.data().max())}
            if values != {float(summary["version"])}:
                with mixed.get_lock():
                    mixed.value += 1
                messages.put(f"summary version {summary['version']}, weights {sorted(values)}")
        with loads.get_lock():
            loads.value += 1


def concurrent_scenario(work, saves_target, loads_target, readers, timeout):
    directory = os.path.join(work, "concurrent", "m")
    model, src_vocab, tgt_vocab, cfg = _tiny_model()
    _set_version(model, 0)
    checkpoint.save(directory, model, src_vocab, tgt_vocab, cfg, {"version": 0})
    ctx = multiprocessing.get_context("spawn")  # MXNet's engine threads do not survive a fork
    saves, loads, failures, mixed = (ctx.Value("i", 0) for _ in range(4))
    done, messages = ctx.Event(), ctx.Queue()
    target = max(saves_target, loads_target)
    procs = [ctx.Process(target=_writer, args=(directory, saves, loads, target, done))]
    procs += [ctx.Process(target=_reader, args=(directory, saves, loads, target, done, failures,
                                                mixed, messages)) for _ in range(readers)]
    tic = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join(max(1.0, timeout - (time.time() - tic)))
        if p.is_alive():
            done.set()
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    examples = []
    with contextlib.suppress(queue.Empty):
        while len(examples) < 5:
            examples.append(messages.get(timeout=0.1))
    return {"saves": saves.value, "loads": loads.value, "readers": readers,
            "failed_loads": failures.value, "mixed_versions": mixed.value,
            "exit_codes": [p.exitcode for p in procs], "seconds": round(time.time() - tic, 1),
            "timed_out": done.is_set(), "examples": examples}


# ---------------------------------------------------------------------------------- failing saves
def _limit_file_size(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return preexec


def _failing_save(out, work, preexec=None):
    """Train one more epoch on the model in `out` and save: the save must fail in one line
    and leave the previous version whole."""
    before, versions = _files(out), _versions(out)
    epochs = checkpoint.load(out)[4]["epochs_done"]
    proc = subprocess.run(_cli(*TRAIN, "--epochs", str(epochs + 1), "--out", out, "--resume"),
                          capture_output=True, text=True, env=_env(), cwd=work, timeout=600,
                          preexec_fn=preexec)
    lines = proc.stderr.strip().splitlines()
    error = [line for line in lines if line.startswith("error: ")]
    return {"exit_code": proc.returncode, "error": error[-1] if error else None,
            "traceback": "Traceback" in proc.stderr,
            "error_lines": len(lines) - lines.index(error[-1]) if error else None,
            "previous_loads": checkpoint.load(out)[4]["epochs_done"] == epochs,
            "previous_byte_for_byte": _files(out) == before,
            "leftover_versions": len(_versions(out) - versions)}


@contextlib.contextmanager
def _read_only_dir(path, model_dir):
    """The model directory `model_dir` made read-only for the code inside: mode 0555, or as
    root a read-only remount of the tmpfs mounted at `path` above it (yields False when neither
    is possible)."""
    if os.getuid() != 0:
        os.chmod(model_dir, 0o555)
        try:
            yield True
        finally:
            os.chmod(model_dir, 0o755)
        return
    if subprocess.run(["mount", "-o", "remount,ro", path], capture_output=True).returncode:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["mount", "-o", "remount,rw", path], capture_output=True)


def fail_scenario(work, timeout):
    figures = {}
    base = os.path.join(work, "fail")
    os.makedirs(base)
    out = os.path.join(base, "m")
    subprocess.run(_cli(*TRAIN, "--epochs", "1", "--out", out), capture_output=True, env=_env(),
                   cwd=work, timeout=timeout, check=True)
    size = os.path.getsize(os.path.join(out, "params.params"))
    figures["file_size_limit"] = dict(_failing_save(out, work, _limit_file_size(size // 2)),
                                      limit_bytes=size // 2, params_bytes=size)
    ro = os.path.join(base, "ro")  # a directory of its own: as root, a tmpfs mounted there
    os.makedirs(ro)
    mounted = os.getuid() == 0 and not subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", ro], capture_output=True).returncode
    try:
        if os.getuid() == 0 and not mounted:
            figures["read_only_directory"] = {"skipped": "root without the right to mount a "
                                                         "read-only file system"}
            return figures
        out = os.path.join(ro, "m")
        subprocess.run(_cli(*TRAIN, "--epochs", "1", "--out", out), capture_output=True,
                       env=_env(), cwd=work, timeout=timeout, check=True)
        with _read_only_dir(ro, out) as ok:
            figures["read_only_directory"] = dict(
                _failing_save(out, work), how="mode 0555" if os.getuid() else "read-only tmpfs") \
                if ok else {"skipped": "could not make the directory read-only"}
    finally:
        if mounted:
            subprocess.run(["umount", ro], capture_output=True)
    return figures


# ---------------------------------------------------------------------------------- main
def main(argv=None):
    args = get_parser().parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = sorted(set(only) - set(SCENARIOS))
    if unknown:
        print(f"error: unknown scenario {', '.join(unknown)}: use {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    work = args.work or tempfile.mkdtemp(prefix="d2l_faults-")
    os.makedirs(work, exist_ok=True)
    env = _env()
    os.environ.setdefault("PYTHONPATH", env["PYTHONPATH"])  # the spawned processes import it too
    results = {"command": "python scripts/fault_injection.py " + " ".join(argv or sys.argv[1:])}
    try:
        for name in only:
            tic = time.time()
            if name == "kill":
                results[name] = kill_scenario(work, args.kills, rng, args.timeout)
            elif name == "concurrent":
                results[name] = concurrent_scenario(work, args.saves, args.loads, args.readers,
                                                    args.timeout)
            else:
                results[name] = fail_scenario(work, args.timeout)
            results[name]["scenario_seconds"] = round(time.time() - tic, 1)
            print(name + ": " + json.dumps(results[name]), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        atomic.write_text(args.json, json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
