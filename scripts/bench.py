"""Issue 4 benchmark: faithful vs fast training, cached vs uncached and batched greedy decoding.

Prints one table measured side by side in one run: (a) training tokens/s (first epoch excluded
as warm-up) and the ratio; (b) greedy ms/sentence with/without the cache at 50 target tokens;
(c) batched greedy sentences/s at batch sizes 1, 64, 256; (d) peak resident memory (ru_maxrss
of this process after each row, so it is cumulative). ``--quick``: TINY sizes, for CI.
"""

import argparse
import json
import resource
import sys
import time

import mxnet as mx

import d2l_transformer as d2t


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train_rate(cfg, fast, epochs, ctx):
    d2t.set_seed(0)
    src_vocab, tgt_vocab, it = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps, cfg.num_examples)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    rates = []
    summary = d2t.train_s2s_ch8(model, it, cfg.lr, epochs, ctx, fast=fast)
    rates.append(summary["tokens_per_sec"])  # last epoch (earlier epochs are warm-up)
    return rates[-1], model, src_vocab, tgt_vocab, it


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny sizes, < 1 min (CI)")
    p.add_argument("--json", default=None, help="write the figures to this path")
    args = p.parse_args(argv)
    ctx = mx.cpu()
    cfg = d2t.TINY if args.quick else d2t.CHAPTER
    epochs = 2 if args.quick else 4
    n_sent, steps = (64, 10) if args.quick else (1000, 50)
    rows = []
    slow, _, _, _, _ = train_rate(cfg, False, epochs, ctx)
    rows.append(("train faithful tokens/s", slow, rss_mb()))
    fast, model, src_vocab, tgt_vocab, it = train_rate(cfg, True, epochs, ctx)
    rows.append(("train fast tokens/s", fast, rss_mb()))
    rows.append(("train ratio fast/faithful", fast / slow, rss_mb()))
    sentences = []
    for X, X_vlen, _, _ in it:
        for row, n in zip(X.asnumpy().tolist(), X_vlen.asnumpy().tolist()):
            sentences.append(" ".join(src_vocab.to_tokens([int(t) for t in row[:int(n)]])))
    sentences = [s.replace(" <eos>", "") for s in sentences][:n_sent]
    n_dec = 5 if args.quick else 20
    ms = {}
    for cache in (False, True):
        tic = time.time()
        # force 50 target tokens: no early stop because <eos> is never the only row left
        for s in sentences[:n_dec]:
            d2t.predict_greedy_batch(model, [s], src_vocab, tgt_vocab, steps, ctx, cache=cache)
        ms[cache] = (time.time() - tic) / n_dec * 1000
        rows.append((f"greedy ms/sentence cache={cache} (<= {steps} tokens)", ms[cache], rss_mb()))
    rows.append(("greedy ratio uncached/cached", ms[False] / ms[True], rss_mb()))
    for bs in (1, 64, 256):
        subset = sentences if bs > 1 else sentences[:min(50, len(sentences))]
        tic = time.time()
        for i in range(0, len(subset), bs):
            d2t.predict_greedy_batch(model, subset[i:i + bs], src_vocab, tgt_vocab,
                                     cfg.num_steps, ctx)
        rows.append((f"batched greedy sentences/s batch={bs}",
                     len(subset) / (time.time() - tic), rss_mb()))
    print(f"{'row':50s} {'value':>12s} {'peak RSS MB':>12s}")
    for name, value, mem in rows:
        print(f"{name:50s} {value:12.2f} {mem:12.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: {"value": v, "peak_rss_mb": m} for name, v, m in rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
