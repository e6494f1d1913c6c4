#!/usr/bin/env python
"""Issue 4 benchmark: the faithful vs the fast training path, cached vs uncached greedy decoding,
batched greedy translation, measured side by side in ONE run on this machine.

Rows (each measured in its own subprocess, so that its peak resident memory is its own):
(a) training tokens/s at the chapter's hyperparameters: the chapter's own code (its classes on
    the d2l 0.11.4 oracle, d2l's loop), our faithful imperative path, the fast path, and the
    fast path without the fused CPU kernels (``D2L_TRANSFORMER_KERNELS=0``: MXNet's own
    operators) — same data, same seed, same number of epochs; the first epoch is excluded as
    warm-up. These rows run ``--repeats`` rounds (default 3), interleaved (book, faithful,
    fast, fast without kernels, book, ...), because this machine's speed drifts by 2x within
    minutes: a row's value is its median over the rounds, and a training ratio is the median
    of the per-round ratios (rows measured within seconds of each other);
(b) greedy decoding ms/sentence at 50 target tokens (no early stop): the key/value cache, the
    chapter's state (caches block inputs, re-projects them every step), and no cache (the whole
    prefix recomputed every step; imperative, and as a hybridized graph);
(c) batched greedy translation sentences/s of training sentences at batch sizes 1, 64, 256;
(e) issue 6: the fast path on 2 CPU contexts and on 2 dist_sync worker processes;
(d) the peak resident memory (ru_maxrss) of each row's process (``--quick`` runs every row in
    one process, so there the column is the running peak).
Then the ratios. ``--quick``: TINY sizes and fewer sentences (CI, under a minute).
``--json PATH`` writes every figure. The decoding rows use the model the fast row trained.
"""

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from unittest import mock

ROWS = [  # key, label
    ("train_book", "(a) train, the chapter's own code tokens/s"),
    ("train_faithful", "(a) train faithful tokens/s"),
    ("train_fast", "(a) train fast tokens/s"),
    ("train_fast_nokernels", "(a) train fast, no fused kernels tokens/s"),
    ("greedy_kv", "(b) greedy ms/sentence, key/value cache"),
    ("greedy_inputs", "(b) greedy ms/sentence, chapter state (inputs)"),
    ("greedy_uncached", "(b) greedy ms/sentence, no cache"),
    ("greedy_uncached_graph", "(b) greedy ms/sentence, no cache, hybridized"),
    ("batch_1", "(c) batched greedy sentences/s batch=1 "),
    ("batch_64", "(c) batched greedy sentences/s batch=64"),
    ("batch_256", "(c) batched greedy sentences/s batch=256"),
    ("train_2ctx", "(e) train fast, 2 contexts cpu:0,cpu:1 tokens/s"),
    ("train_dist2", "(e) train fast, 2 dist_sync workers tokens/s"),
]
RATIOS = [  # label, numerator, denominator
    ("(a) train ratio fast/faithful", "train_fast", "train_faithful"),
    ("(a) train ratio fast/the chapter's own code", "train_fast", "train_book"),
    ("(a) train ratio faithful/the chapter's own code", "train_faithful", "train_book"),
    ("(a) train ratio fast/fast without kernels", "train_fast", "train_fast_nokernels"),
    ("(b) greedy ratio uncached/cached", "greedy_uncached", "greedy_kv"),
    ("(b) greedy ratio chapter state/cached", "greedy_inputs", "greedy_kv"),
    ("(c) batched ratio batch=256/batch=1", "batch_256", "batch_1"),
    ("(e) scale ratio 2 contexts/1 device", "train_2ctx", "train_fast"),
    ("(e) scale ratio 2 dist_sync workers/1 device", "train_dist2", "train_fast"),
]
DECODE_TOKENS = 50
REPEATED = ("train_book", "train_faithful", "train_fast", "train_fast_nokernels")


def sizes(quick):
    import d2l_transformer as d2t
    if quick:
        return dict(cfg=d2t.TINY, epochs=3, n_greedy=3, n_batch=256, n_batch_1=20)
    return dict(cfg=d2t.CHAPTER, epochs=6, n_greedy=20, n_batch=1000, n_batch_1=100)


@functools.lru_cache(maxsize=None)
def _data(cfg, fast_loader=False):
    """(src_vocab, tgt_vocab, data_iter), read once per process (reading takes seconds)."""
    import d2l_transformer as d2t
    return d2t.load_data_nmt(cfg.batch_size, cfg.num_steps, cfg.num_examples,
                             fast_loader=fast_loader)


def train_row(s, fast, params_path, ctx=None, kvstore=None):
    """Tokens/s over epochs 2.. (epoch 1 is warm-up: graph building, deferred init).

    ``ctx`` a list: data parallel over those devices; ``kvstore`` dist: this worker's shard of
    the data (half the batch each for 2 workers: the same global batch), global tokens/s."""
    import mxnet as mx

    import d2l_transformer as d2t
    from d2l_transformer.dist.kvstore import GlobalSum
    cfg = s["cfg"]
    rank, num_workers = d2t.worker_info(kvstore)
    if num_workers > 1:
        src_vocab, tgt_vocab, it = d2t.load_data_nmt(cfg.batch_size // num_workers, cfg.num_steps,
                                                     cfg.num_examples, rank=rank,
                                                     num_workers=num_workers, fast_loader=fast)
    else:
        src_vocab, tgt_vocab, it = _data(cfg, fast)  # the same batches either way
    tokens_per_epoch = sum(float((batch[3] - 1).sum()) for batch in it)  # Y_valid_len - 1
    tokens_per_epoch = GlobalSum(kvstore, 1)(tokens_per_epoch)[0]  # all workers' shards
    d2t.set_seed(0)  # both paths: the same initial weights and batches
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    stamps = []
    summary = d2t.train_s2s_ch8(model, it, cfg.lr, s["epochs"], ctx or mx.cpu(), fast=fast,
                                kvstore=kvstore,
                                on_epoch=lambda epoch, loss: stamps.append(time.time()))
    if fast and ctx is None and kvstore is None and params_path:
        model.save_parameters(params_path)
    rate = tokens_per_epoch * (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return rate, {"loss": summary["loss"], "epochs_timed": len(stamps) - 1}


def _trained_model(s, params_path):
    import mxnet as mx

    import d2l_transformer as d2t
    cfg = s["cfg"]
    src_vocab, tgt_vocab, it = _data(cfg)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.load_parameters(params_path, ctx=mx.cpu())
    sentences = []
    for X, X_vlen, _, _ in it:  # the training sentences, without their <eos>
        for row, n in zip(X.asnumpy().tolist(), X_vlen.asnumpy().tolist()):
            sentences.append(" ".join(src_vocab.to_tokens([int(t) for t in row[:int(n) - 1]])))
    return model, src_vocab, tgt_vocab, sentences


def greedy_row(s, params_path, cache, hybridize=False):
    """ms/sentence, one sentence at a time, always DECODE_TOKENS steps."""
    import mxnet as mx

    import d2l_transformer as d2t
    model, src_vocab, tgt_vocab, sentences = _trained_model(s, params_path)
    if hybridize:
        model.hybridize()
    run = [sentences[i % len(sentences)] for i in range(s["n_greedy"] + 1)]
    d2t.predict_greedy_batch(model, run[:1], src_vocab, tgt_vocab, DECODE_TOKENS, mx.cpu(),
                             cache=cache, until_eos=False)  # warm-up
    tic = time.time()
    for sentence in run[1:]:
        d2t.predict_greedy_batch(model, [sentence], src_vocab, tgt_vocab, DECODE_TOKENS,
                                 mx.cpu(), cache=cache, until_eos=False)
    return (time.time() - tic) / s["n_greedy"] * 1000, {"sentences": s["n_greedy"]}


def batch_row(s, params_path, batch_size):
    """sentences/s of batched greedy translation (key/value cache, stops at <eos>)."""
    import mxnet as mx

    import d2l_transformer as d2t
    model, src_vocab, tgt_vocab, sentences = _trained_model(s, params_path)
    n = s["n_batch_1"] if batch_size == 1 else s["n_batch"]
    sentences = [sentences[i % len(sentences)] for i in range(n)]
    num_steps = s["cfg"].num_steps
    d2t.predict_greedy_batch(model, sentences[:batch_size], src_vocab, tgt_vocab, num_steps,
                             mx.cpu())  # warm-up
    tic = time.time()
    for i in range(0, n, batch_size):
        d2t.predict_greedy_batch(model, sentences[i:i + batch_size], src_vocab, tgt_vocab,
                                 num_steps, mx.cpu())
    return n / (time.time() - tic), {"sentences": n}


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def book_row(s):
    """(a) the chapter's own code: its classes as printed (tests/chapter_reference.py, on the
    `d2l` 0.11.4 oracle the chapter imported) trained by d2l's own ``train_s2s_ch9``, on the
    same data; epochs timed from when the loop starts reading each epoch's batches."""
    import contextlib
    import io

    try:
        import d2l
    except ImportError:  # the oracle is a test dependency (make venv installs it)
        return float("nan"), {"skipped": "d2l 0.11.4 is not installed"}
    import mxnet as mx
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import chapter_reference as book

    import d2l_transformer as d2t
    cfg = s["cfg"]
    src_vocab, tgt_vocab, it = _data(cfg)
    tokens_per_epoch = sum(float((batch[3] - 1).sum()) for batch in it)
    stamps = []

    class Timed:  # the DataLoader, stamping the start of every epoch
        def __iter__(self):
            stamps.append(time.time())
            return iter(it)

    d2t.set_seed(0)
    args = (cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_heads, cfg.num_layers, cfg.dropout)
    model = d2l.EncoderDecoder(book.TransformerEncoder(len(src_vocab), *args),
                               book.TransformerDecoder(len(src_vocab), *args))  # as printed
    with contextlib.redirect_stdout(io.StringIO()):  # d2l's animator and book line
        d2l.train_s2s_ch9(model, Timed(), cfg.lr, s["epochs"], mx.cpu())
    stamps.append(time.time())
    rate = tokens_per_epoch * (len(stamps) - 2) / (stamps[-1] - stamps[1])  # epochs 2..
    return rate, {"epochs_timed": len(stamps) - 2}


def dist_row(quick):
    """(e): 2 dist_sync workers (1 scheduler, 1 server) on this machine, started by
    `d2l_transformer.launch`; rank 0 prints its row as JSON."""
    from d2l_transformer.dist.launch import launch

    class Lines(list):
        def write(self, text):
            self.append(text)

        def flush(self):
            pass

    out = Lines()
    cmd = [sys.executable, os.path.abspath(__file__), "--row", "train_dist2_worker"]
    code = launch(cmd + (["--quick"] if quick else []), num_workers=2, num_servers=1,
                  timeout=900, stream=out)
    rows = [line.split(" ", 2)[2] for line in out if line.startswith("[rank 0] {")]
    if code or not rows:
        raise RuntimeError("the dist_sync row failed:\n" + "".join(out)[-3000:])
    row = json.loads(rows[-1])
    return row.pop("value"), row


def run_row(key, quick, params_path):
    s = sizes(quick)
    if key == "train_book":
        return book_row(s)
    if key == "train_2ctx":
        import mxnet as mx
        return train_row(s, True, params_path, ctx=[mx.cpu(0), mx.cpu(1)])
    if key == "train_dist2":
        return dist_row(quick)
    if key == "train_dist2_worker":  # inside the launched job (scheduler/server: mxnet import)
        import d2l_transformer as d2t
        from d2l_transformer.dist.kvstore import announce_rank
        kvstore = d2t.create_kvstore("dist_sync")
        announce_rank(kvstore)
        return train_row(s, True, params_path, kvstore=kvstore)
    if key == "train_fast_nokernels":  # the same fast path on MXNet's own operators
        with mock.patch.dict(os.environ, {"D2L_TRANSFORMER_KERNELS": "0"}):
            return train_row(s, True, None)
    if key.startswith("train_"):
        return train_row(s, key == "train_fast", params_path)
    if key.startswith("greedy_"):
        cache = {"greedy_kv": True, "greedy_inputs": "inputs"}.get(key, False)
        return greedy_row(s, params_path, cache, hybridize=key.endswith("_graph"))
    return batch_row(s, params_path, int(key.split("_")[1]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="TINY sizes, under a minute (CI)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved rounds of the (a) training rows (default 3; --quick: 1)")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: one row
    p.add_argument("--params", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.row:  # child: measure one row, print its JSON
        if args.row == "train_dist2_worker":
            import mxnet  # noqa: F401  (as scheduler or server, this import runs the role and exits)
        value, extra = run_row(args.row, args.quick, args.params)
        print(json.dumps({"value": value, "peak_rss_mb": _peak_rss_mb(), **extra}))
        return 0
    results, rounds = {}, []
    header = "peak RSS MB" if not args.quick else "RSS MB (cum.)"
    print(f"{'row':52s} {'value':>10s} {header:>14s}", flush=True)
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        params = os.path.join(tmp, "model.params")

        def measure(key):
            if args.quick:  # one process, data read once; the RSS column is cumulative
                value, extra = run_row(key, True, params)
                return {"value": value, "peak_rss_mb": _peak_rss_mb(), **extra}
            # a process per row: each row's own peak RSS
            cmd = [sys.executable, os.path.abspath(__file__), "--row", key, "--params", params]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"row {key} failed:\n{proc.stderr[-2000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])

        try:
            for r in range(repeats):  # the training rows, interleaved
                rounds.append({key: measure(key) for key in REPEATED})
                if repeats > 1:
                    print(f"  round {r + 1}: " + ", ".join(
                        f"{key} {rounds[-1][key]['value']:.0f}" for key in REPEATED), flush=True)
            for key, label in ROWS:
                if key in REPEATED:
                    values = [rnd[key]["value"] for rnd in rounds]
                    results[key] = {**rounds[-1][key], "value": statistics.median(values), "rounds": values,
                                    "peak_rss_mb": max(rnd[key]["peak_rss_mb"] for rnd in rounds)}
                else:
                    results[key] = measure(key)
                results[key]["label"] = label
                print(f"{label:52s} {results[key]['value']:10.1f} "
                      f"{results[key]['peak_rss_mb']:14.1f}", flush=True)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for label, num, den in RATIOS:
        if num in REPEATED and den in REPEATED:  # the median of same-round ratios
            per_round = [rnd[num]["value"] / rnd[den]["value"] for rnd in rounds]
            ratio = statistics.median(per_round)
            results[label] = ratio
            results[label + " (rounds)"] = per_round
            spread = f"   rounds: {', '.join(f'{x:.2f}' for x in per_round)}" if repeats > 1 else ""
        else:
            ratio = results[num]["value"] / results[den]["value"]
            results[label] = ratio
            spread = ""
        print(f"{label:52s} {ratio:9.2f}x{spread}", flush=True)
    if args.json:
        results["quick"] = args.quick
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
