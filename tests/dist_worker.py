"""A worker of the dist_sync test (tests/test_distributed.py), started by `d2l_transformer.launch`.

    dist_worker.py OUT_DIR EPOCHS

Trains the chapter preset on this worker's shard for EPOCHS epochs, then one more epoch with
the learning rate set to 0, and writes OUT_DIR/rank{R}.json (losses, learning rates) and
OUT_DIR/rank{R}.params (the final parameters). As scheduler or server, the first line's
``import mxnet`` runs that role and exits.
"""
import json
import os
import sys

import mxnet as mx  # noqa: F401  (scheduler/server: runs the role here and exits)
from mxnet import init

import d2l_transformer as d2t
from d2l_transformer.dist.kvstore import announce_rank, create_kvstore, worker_info


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


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
