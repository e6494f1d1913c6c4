"""Runs one process of a distributed job and prefixes its output lines with its role and rank.

Started by MXNet's ``tools/launch.py`` in place of the user's command (see `launch.py`); it is
run by path, not as ``-m d2l_transformer...``, because importing the package imports MXNet, and
an MXNet imported with ``DMLC_ROLE=server`` turns the importing process into a server.

    python _launch_child.py COMMAND...

The prefix is ``[scheduler]``, ``[server N]`` or ``[worker N]`` (N: the launcher's task id)
until the worker prints ``RANK_MARKER rank R of W`` (`d2l-transformer train` does, once its
kvstore exists); from then on it is ``[rank R]``, the kvstore rank that picks the data shard.
When the command exits non-zero, this prints ``FAILED_MARKER`` with the exit code and stops
every process of the job (they share one process group, made by `launch.launch`): the others
would otherwise wait forever for the failed one in the kvstore's barrier.
"""

import os
import re
import signal
import subprocess
import sys

RANK_MARKER = "d2l-transformer-kvstore:"
FAILED_MARKER = "d2l-transformer-launch: FAILED"


def prefix_from_env(env):
    role = env.get("DMLC_ROLE", "worker")
    if role == "scheduler":
        return "[scheduler]"
    task = int(env.get("DMLC_TASK_ID", "0"))
    if role == "server":  # the local launcher numbers servers after the workers
        task -= int(env.get("DMLC_NUM_WORKER", "0"))
    return f"[{role} {task}]"


def main(argv):
    if not argv:
        print("usage: _launch_child.py COMMAND...", file=sys.stderr)
        return 2
    prefix = prefix_from_env(os.environ)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", bufsize=1)
    for line in proc.stdout:
        match = re.match(re.escape(RANK_MARKER) + r" rank (\d+) of (\d+)", line)
        if match:
            prefix = f"[rank {match.group(1)}]"
        sys.stdout.write(f"{prefix} {line}")
        sys.stdout.flush()
    code = proc.wait()
    if code != 0:
        sys.stdout.write(f"{prefix} {FAILED_MARKER} with exit code {code}\n")
        sys.stdout.flush()
        if os.environ.get("D2L_TRANSFORMER_LAUNCH_GROUP") == "1":  # a group of its own
            os.killpg(os.getpgrp(), signal.SIGTERM)  # stop the whole job, ourselves included
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
