"""Scale-out on MXNet's own KVStore: which kvstore, which shard, global sums.

Several devices in one process use the ``device`` kvstore that `gluon.Trainer` creates
itself; several processes (or machines) use ``dist_sync`` over ps-lite, started by
`launch` (MXNet's ``tools/launch.py``). In both cases the Trainer is built with
``update_on_kvstore=False``: the kvstore only SUMS gradients (``trainer.allreduce_grads()``)
and every worker runs the optimizer itself. That is what lets the step clip the summed
gradient by its global norm before the update, keeps ``trainer.set_learning_rate`` and a
warmup schedule effective (with updates on the servers they would be ignored), and leaves
every worker with the same parameters as the others.
"""

import os

import mxnet as mx

KVSTORES = ("device", "local", "dist_sync", "dist_device_sync")
_SUM_KEY = 999_983  # a kvstore key for global sums, far from the Trainer's parameter keys


def create_kvstore(name):
    """The kvstore for ``--kvstore``: a dist kvstore is created here (workers need its rank
    to pick their data shard before the Trainer exists); ``device``/``local`` stay names for
    the Trainer to create. ``None`` means ``device``."""
    name = name or "device"
    if name not in KVSTORES:
        raise ValueError(f"unknown kvstore {name!r}: use one of {', '.join(KVSTORES)}")
    if not name.startswith("dist"):
        return name
    missing = [v for v in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                           "DMLC_NUM_WORKER") if v not in os.environ]
    if missing:  # ps-lite would abort the process with a C++ check failure
        raise ValueError(f"--kvstore {name} needs the variables a launcher sets ({', '.join(missing)} "
                         "missing): start it with `d2l-transformer launch -n N -- ...`")
    return mx.kv.create(name)


def is_distributed(kvstore):
    """True for a dist kvstore object (several processes)."""
    return isinstance(kvstore, mx.kvstore.KVStore) and kvstore.type.startswith("dist")


def worker_info(kvstore):
    """``(rank, num_workers)``: ``(0, 1)`` in a single process."""
    if is_distributed(kvstore):
        return kvstore.rank, kvstore.num_workers
    return 0, 1


def announce_rank(kvstore):
    """Print this worker's kvstore rank in the line `launch` looks for: from then on it
    prefixes the worker's output with ``[rank R]`` (the launcher only knows task ids)."""
    from ._launch_child import RANK_MARKER
    rank, num_workers = worker_info(kvstore)
    print(f"{RANK_MARKER} rank {rank} of {num_workers}", flush=True)


class GlobalSum:
    """Sums a few host floats over all workers through the kvstore (push, then pull).

    Used for the number of target tokens of each step (the update divides by the GLOBAL
    count, as a single device would on the whole batch) and for the epoch's loss. Every
    worker must make the same calls in the same order, as with any collective operation.
    """

    def __init__(self, kvstore, size):
        self.kv, self.size = kvstore, size
        self.key = _SUM_KEY + size  # one key per vector length
        self.buffer = mx.nd.zeros((size,))
        if is_distributed(kvstore):
            done = kvstore.__dict__.setdefault("_d2l_global_sum_keys", set())
            if self.key not in done:  # a key is initialised once per kvstore (a collective)
                kvstore.init(self.key, self.buffer)
                done.add(self.key)

    def __call__(self, *values):
        if not is_distributed(self.kv):
            return list(values)
        self.kv.push(self.key, mx.nd.array(values, dtype="float32"))
        self.kv.pull(self.key, out=self.buffer)
        return [float(v) for v in self.buffer.asnumpy()]
