"""A worker of the dist_sync test (tests/test_distributed.py), started by `d2l_transformer.launch`.

    dist_worker.py OUT_DIR EPOCHS [bucketed]

Trains the chapter preset on this worker's shard for EPOCHS epochs, then one more epoch with
the learning rate set to 0, and writes OUT_DIR/rank{R}.json (losses, learning rates) and
OUT_DIR/rank{R}.params (the final parameters). ``bucketed``: the chapter's model on 2,000 pairs
in `BucketBatches` (each worker deals itself every other batch of one list), EPOCHS epochs,
and the json also lists the batch shapes this worker trained on. As scheduler or server, the
first import of mxnet (by ``import d2l_transformer``) runs that role and exits.
"""
import json
import os
import sys

import d2l_transformer as d2t  # isort: skip  (first: its NumPy-alias shim must precede mxnet)
import mxnet as mx  # noqa: F401  (scheduler/server: the package's import of it ran the role and exited)
from mxnet import init

from d2l_transformer.distributed.kvstore import announce_rank, create_kvstore, worker_info


def main(out, epochs):
    kv = create_kvstore("dist_sync")
    rank, num_workers = worker_info(kv)
    announce_rank(kv)
    cfg = d2t.CHAPTER
    d2t.set_seed(100 + rank)  # different on purpose: kvstore.init gives every worker rank 0's weights
    src_vocab, tgt_vocab, it = d2t.load_data_nmt(cfg.batch_size // num_workers, cfg.num_steps,
                                                 cfg.num_examples, rank=rank, num_workers=num_workers)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.initialize(init.Xavier(), ctx=mx.cpu())
    trainer = d2t.make_trainer(model, cfg.lr, kvstore=kv)
    losses = []
    summary = d2t.train_s2s_ch8(model, it, cfg.lr, epochs, mx.cpu(), trainer=trainer, kvstore=kv,
                                on_epoch=lambda epoch, loss: losses.append(loss))
    model.save_parameters(os.path.join(out, f"rank{rank}.before_lr0.params"))
    trainer.set_learning_rate(0.0)  # ignored if the update ran on the servers
    d2t.train_s2s_ch8(model, it, cfg.lr, epochs + 1, mx.cpu(), trainer=trainer, kvstore=kv,
                      start_epoch=epochs + 1)
    model.save_parameters(os.path.join(out, f"rank{rank}.params"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "num_workers": num_workers, "losses": losses,
                   "batches": len(it), "tokens_per_sec": summary["tokens_per_sec"],
                   "update_on_kvstore": trainer._update_on_kvstore}, f)
    print(f"rank {rank} done: losses {losses}", flush=True)


def bucketed(out, epochs):
    import numpy as onp

    from d2l_transformer.data import load_data_split
    kv = create_kvstore("dist_sync")
    rank, num_workers = worker_info(kv)
    announce_rank(kv)
    cfg = d2t.CHAPTER
    d2t.set_seed(100 + rank)  # different weights: kvstore.init gives every worker rank 0's
    data = load_data_split(cfg.batch_size // num_workers, cfg.num_steps, 1999, cfg.min_freq,
                           num_buckets=5, rank=rank, num_workers=num_workers)
    model = d2t.build_model(cfg, len(data.src_vocab), len(data.tgt_vocab))
    model.initialize(init.Xavier(), ctx=mx.cpu())
    trainer = d2t.make_trainer(model, cfg.lr, kvstore=kv)
    shapes = []

    class Recorded:  # the loader, noting the padded shapes this worker trains on
        def __len__(self):
            return len(data.train_iter)

        def __iter__(self):
            for batch in data.train_iter:
                shapes.append([batch[0].shape[0], batch[0].shape[1], batch[2].shape[1]])
                yield batch
    losses = []
    onp.random.seed(7)  # the batches' shuffles: alike on all workers, as the CLI's --seed makes them
    d2t.train_s2s_ch8(model, Recorded(), cfg.lr, epochs, mx.cpu(), trainer=trainer, kvstore=kv,
                      on_epoch=lambda epoch, loss: losses.append(loss))
    model.save_parameters(os.path.join(out, f"rank{rank}.params"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "losses": losses, "batches": len(data.train_iter),
                   "all_batches": data.train_iter.num_batches, "shapes": shapes}, f)
    print(f"rank {rank} done: {len(shapes)} steps", flush=True)


if __name__ == "__main__":
    if sys.argv[3:] == ["bucketed"]:
        bucketed(sys.argv[1], int(sys.argv[2]))
    else:
        main(sys.argv[1], int(sys.argv[2]))
