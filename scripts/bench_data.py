#!/usr/bin/env python
"""A user's large corpus, from its file to the first training batch: seconds and peak memory.

    .venv/bin/python scripts/bench_data.py --pairs 2000000 --preset hour --out out/bench_data

Writes OUT/big.en-fr.tsv: fra.txt's pairs, each copy numbered (``Go. 3`` / ``Va ! 3``), cut at
``--pairs``; then, in a child process, what ``d2l-transformer train --data OUT/big.en-fr.tsv
--preset P`` does before its first step: read and check the file, clean it, split it by groups
of sentences, train the tokenizer (sentencepiece on a sample), encode, keep the pairs within the
lengths, bucket, and cut the first batch. Prints
(and writes OUT/bench_data.json) the seconds of each stage and the child's peak RSS
(``getrusage``'s ``ru_maxrss`` of the finished child). docs/data.md has the figures.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=2_000_000)
    p.add_argument("--preset", default="hour")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "bench_data"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the measured process
    return p


def write_corpus(path, pairs):
    """fra.txt's pairs repeated, copy k with `` k`` after each side, `pairs` lines."""
    from d2l_transformer.data import read_corpus
    sources, targets = read_corpus().pairs()
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for k in range(pairs // len(sources) + 1):
            for s, t in zip(sources, targets):
                if written == pairs:
                    return
                f.write(f"{s} {k}\t{t} {k}\n")
                written += 1


def child(path, preset):
    """The stages of a training run before its first step, timed (this process is measured)."""
    tic = time.time()
    from d2l_transformer.config import PRESETS  # the package first: its step before MXNet loads
    from d2l_transformer.data import load_data
    stages = {"import": time.time() - tic}
    import mxnet as mx
    cfg = PRESETS[preset]
    tic = time.time()
    data = load_data(cfg, cfg.batch_size, path)
    src_vocab, tgt_vocab, train_iter = data.src_vocab, data.tgt_vocab, data.train_iter
    stages["data (read, clean, split, tokenizer, encode, lengths, buckets)"] = time.time() - tic
    tic = time.time()
    X, X_len, Y, Y_len = next(iter(train_iter))
    mx.nd.waitall()
    stages["first batch"] = time.time() - tic
    print(json.dumps({"stages": stages, "batches": len(train_iter), "batch": list(X.shape),
                      "vocab": [len(src_vocab), len(tgt_vocab)]}))


def main(args):
    if args.child:
        return child(args.child, args.preset)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "big.en-fr.tsv")
    if not os.path.exists(path) or sum(1 for _ in open(path, encoding="utf-8")) != args.pairs:
        write_corpus(path, args.pairs)
    tic = time.time()
    run = subprocess.run([sys.executable, __file__, "--child", path, "--preset", args.preset],
                         stdout=subprocess.PIPE, text=True, check=True)
    seconds = time.time() - tic
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2  # kB -> GB
    result = {"pairs": args.pairs, "preset": args.preset, "file_bytes": os.path.getsize(path),
              "seconds_to_first_batch": round(seconds, 1), "peak_rss_gb": round(peak, 2),
              **json.loads(run.stdout.strip().splitlines()[-1])}
    print(json.dumps(result, indent=2))
    with open(os.path.join(args.out, "bench_data.json"), "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_parser().parse_args()))
