"""Rows (e) of scripts/bench.py: scale-out, the fast path of (a) (bench_training.py) on 2 CPU
contexts in one process and on 2 dist_sync workers started by `d2l_transformer.launch`."""

import json
import sys

from bench_common import BENCH
from bench_training import train_row


def scale_row(s, key, quick, params_path):
    """``train_2ctx``, ``train_dist2`` and ``train_dist2_worker`` (the row inside the launched
    job: each worker's part of ``train_dist2``)."""
    if key == "train_2ctx":
        import mxnet as mx
        return train_row(s, True, params_path, ctx=[mx.cpu(0), mx.cpu(1)])
    if key == "train_dist2":
        return dist_row(quick)
    # inside the launched job (scheduler/server: mxnet import)
    import d2l_transformer as d2t
    from d2l_transformer.distributed.kvstore import announce_rank
    kvstore = d2t.create_kvstore("dist_sync")
    announce_rank(kvstore)
    return train_row(s, True, params_path, kvstore=kvstore)


def dist_row(quick):
    """(e): 2 dist_sync workers (1 scheduler, 1 server) on this machine, started by
    `d2l_transformer.launch`; rank 0 prints its row as JSON."""
    from d2l_transformer.distributed.launch import launch

    class Lines(list):
        def write(self, text):
            self.append(text)

        def flush(self):
            pass

    out = Lines()
    cmd = [sys.executable, BENCH, "--row", "train_dist2_worker"]
    code = launch(cmd + (["--quick"] if quick else []), num_workers=2, num_servers=1,
                  timeout=900, stream=out)
    rows = [line.split(" ", 2)[2] for line in out if line.startswith("[rank 0] {")]
    if code or not rows:
        raise RuntimeError("the dist_sync row failed:\n" + "".join(out)[-3000:])
    row = json.loads(rows[-1])
    return row.pop("value"), row
