"""``d2l-transformer launch``: start a ``dist_sync`` job with the launcher MXNet ships.

MXNet's wheel ships ``mxnet/tools/launch.py`` and the ``dmlc_tracker`` package: it starts the
ps-lite scheduler, the servers and the workers (``--launcher local`` on this machine, ``ssh``
or ``mpi`` on the hosts of a host file) with the ``DMLC_*`` variables each role needs. We
run it as it is and add only what it lacks:

- Python 3.9 removed ``Thread.isAlive``, which its tracker calls: the bootstrap below aliases
  it to ``Thread.is_alive`` before running ``launch.py`` (without this, ``--launcher local``
  crashes on Python 3.11 and leaves a worker running);
- every output line is prefixed with its process's role and kvstore rank
  (``_launch_child.py`` wraps the command);
- the whole job runs in its own process group: when one process exits with an error, on
  Ctrl-C, or after ``--timeout`` seconds, every process the job started is stopped
  (SIGTERM, then SIGKILL after a grace period), and the exit status is non-zero.

With ``ssh``/``mpi`` the processes on other hosts are started by ssh/mpirun; stopping them on
failure is then up to those tools (an ssh session that dies does not always kill its remote
command).
"""

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from .._runtime import threads as _threads
from ._launch_child import FAILED_MARKER

LAUNCHERS = ("local", "ssh", "mpi")
GRACE_SECONDS = 5
_BOOTSTRAP = """\
import runpy, sys, threading
threading.Thread.isAlive = threading.Thread.is_alive  # removed in Python 3.9; dmlc_tracker calls it
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class LaunchError(Exception):
    """A problem with the launch arguments: printed as one line."""


def mxnet_launch_py():
    """The path of MXNet's ``tools/launch.py`` (found without importing MXNet)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError("MXNet is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tools", "launch.py")
    if not os.path.exists(path):
        raise LaunchError(f"MXNet's launcher is missing: {path}")
    return path


def launch_command(command, num_workers, num_servers=1, launcher="local", hostfile=None):
    """The argv that runs `command` as a job of `num_workers` workers and `num_servers` servers."""
    if not command:
        raise LaunchError("no command to launch (put it after --)")
    if num_workers < 1 or num_servers < 1:
        raise LaunchError("need at least 1 worker and 1 server")
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if launcher != "local" and not hostfile:
        raise LaunchError(f"--launcher {launcher} needs a host file (-H)")
    if hostfile and not os.path.exists(hostfile):
        raise LaunchError(f"host file not found: {hostfile}")
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launch_child.py")
    job = shlex.join([sys.executable, "-u", child, *command])  # launch.py runs it with bash
    argv = [sys.executable, "-u", "-c", _BOOTSTRAP, mxnet_launch_py(), "-n", str(num_workers),
            "-s", str(num_servers), "--launcher", launcher]
    if hostfile:
        argv += ["-H", hostfile]
    return argv + [job]


def _stop_group(proc):
    """SIGTERM to the job's process group, SIGKILL to what is left after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + GRACE_SECONDS
        while time.time() < deadline:
            proc.poll()  # reap the group's leader (our child): a zombie still counts as alive
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _interruptible():
    """Make Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt in the waiting launcher, even
    when it was started with SIGINT ignored (as a shell's background job is); returns a function
    that restores the previous handlers. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


def job_env(environ, launcher, num_workers):
    """The job's environment: this one, unbuffered, without this process's DMLC role; a local
    job's workers share this machine's cores, so each may use cores / workers OpenMP threads
    (`_runtime.threads.MAX_ENV`, unless set)."""
    env = dict(environ, PYTHONUNBUFFERED="1")
    env.pop("DMLC_ROLE", None)  # this process's role must not leak into the job's
    if launcher == "local":
        env.setdefault(_threads.MAX_ENV, str(max(1, _threads.physical_cores() // num_workers)))
    return env


def launch(command, num_workers, num_servers=1, launcher="local", hostfile=None, timeout=None,
           stream=None):
    """Run `command` as a ``dist_sync`` job through MXNet's launcher; returns the exit status:
    0 when every process succeeded, non-zero when one failed, the job timed out (124) or was
    interrupted (130). Every process it started is stopped before it returns."""
    stream = sys.stdout if stream is None else stream
    argv = launch_command(command, num_workers, num_servers, launcher, hostfile)
    env = job_env(os.environ, launcher, num_workers)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1, start_new_session=True,
                            env=dict(env, D2L_TRANSFORMER_LAUNCH_GROUP="1"))
    # the flag tells `_launch_child` that its process group is this job's alone (a new session)
    failed, timed_out = [], threading.Event()

    def pump():
        for line in proc.stdout:
            if FAILED_MARKER in line:
                failed.append(line.strip())
            stream.write(line if line.startswith("[") else f"[launcher] {line}")
            stream.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    restore = _interruptible()
    timer = threading.Timer(timeout, lambda: (timed_out.set(), _stop_group(proc))) \
        if timeout else None
    try:
        if timer:
            timer.start()
        while True:  # short waits: a signal may wake another thread, not this blocked one
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
        reader.join(timeout=GRACE_SECONDS)
    except KeyboardInterrupt:
        stream.write("[launcher] interrupted: stopping every process of the job\n")
        _stop_group(proc)
        return 130
    finally:
        if timer:
            timer.cancel()
        _stop_group(proc)  # whatever is left: the launcher's orphans
        restore()
    if timed_out.is_set():
        stream.write(f"[launcher] timed out after {timeout} s: stopped every process of the job\n")
        return 124
    if failed:
        stream.write(f"[launcher] a process failed ({failed[0]}): stopped the others\n")
        status = int(failed[0].rsplit(" ", 1)[-1])  # the failed process's own, or 128 + signal
        return status if status > 0 else 128 - status
    return code if code >= 0 else 128 - code
