#!/usr/bin/env python
"""Benchmark: the faithful vs the fast training path, greedy decoding, batched greedy
translation, measured side by side in ONE run on this machine.

Rows (each measured in its own subprocess, so that its peak resident memory is its own):
(a) training tokens/s at the chapter's hyperparameters: the chapter's own code (its classes on
    the d2l 0.11.4 oracle, d2l's loop), our faithful imperative path, the fast path, and the
    fast path without the fused CPU kernels (``D2L_TRANSFORMER_KERNELS=0``: MXNet's own
    operators), and two baselines of the same model (scripts/baselines.py: PyTorch eager on the
    row's threads, GluonNLP 0.10's Transformer hybridized; a baseline whose package is missing
    is skipped with its reason) — same data, same seed, same number of epochs; the first epoch
    is excluded as warm-up. These rows run ``--repeats`` rounds (default 3), interleaved (book,
    faithful, fast, fast without kernels, PyTorch, GluonNLP, book, ...), because this
    machine's speed drifts by 2x within minutes: a row's value is its median over the rounds,
    and a training ratio is the median of the per-round ratios (rows measured within seconds
    of each other);
(b) greedy decoding ms/sentence at 50 target tokens (no early stop), one sentence at a time:
    the translator's key/value cache;
(c) batched greedy translation (the translator) sentences/s of training sentences at batch
    sizes 1, 64, 256;
(e) scale-out: the fast path on 2 CPU contexts and on 2 dist_sync worker processes;
(f) translation sentences/s of a `full` model (random weights, its 4,000-piece vocabularies, the
    2,000 sources of its test split, 30 tokens each, batches of 64, start-up excluded), greedy
    and beam 4, the translator;
(i) CTranslate2: the model of (f) (random weights, the `full` preset's vocabularies) exported
    with `export --format ctranslate2` in float32 and int8, translating the distinct sources of
    the test split, batches of 64, at most `translate_length` tokens, greedy and beam 4
    (α = 0 / length_penalty 0, the scoring both searches share), ``--threads`` each (default
    2: the translator's OpenMP threads capped at 2, CTranslate2's ``intra_threads=2``); each
    engine in a process of its own, one engine at a time, each translating all the sentences
    in one call per round, ``--repeats`` rounds (default 3), a row's value is its median over
    the rounds, start-up (loading, each engine's first batch) excluded. ``--model DIR``: (f),
    and (i) translate with that trained model directory instead (its own test split and
    tokenizer): sentences then end where the model ends them, as in use;
(k) ``--engine ctranslate2``: the engine object ``d2l-transformer translate --engine ctranslate2``
    uses (`inference.engines.open_engine`: the export kept beside a copy of the model directory,
    the default `--engine-threads`) against CTranslate2's own ``translate_batch`` on that engine's
    translator (the same export, threads and sentences: the distinct test sources of (f) or
    ``--model``), all the sentences in one call each, batches of 64, greedy and beam 4, start-up
    (export, loading, a first batch) excluded; ``--repeats`` interleaved rounds in one process,
    medians, and the ratio engine/translate_batch. Both run the same search and return the
    same things (one hypothesis and its score, length_penalty = the engine's default alpha);
    ``translate_batch`` with one length limit for all (the longest source's), the engine with
    each sentence's own;
(d) the peak resident memory (ru_maxrss) of each row's process (``--quick`` runs every row in
    one process, so there the column is the running peak).
(g) serving: ``d2l-transformer serve`` on loopback under concurrent clients (requests/s, p50/p99
    latency, errors) and a bad-request storm (docs/serving.md); ``--serve-model DIR`` serves
    that model directory instead of training the chapter preset first.
(h) the `full` preset's training (d=128, dropout 0.1, label smoothing, warmup, bucketed
    batches) in target tokens/s on a slice of its real batches (``full_batches`` of the first
    epoch, seed 0): the imperative path vs the fast path, interleaved rounds as in (a); the
    first pass over the slice is warm-up (deferred init, graph building), the next ones timed.
    One more imperative row runs with MXNet's own OpenMP threads (``D2L_TRANSFORMER_THREADS=
    mxnet``: half the CPUs, one on this machine), as every path ran before the package chose
    the threads per workload (d2l_transformer/_runtime/threads.py); and PyTorch eager on the same slice
    (scripts/baselines.py), as many threads as the package's rows use for it.
    ``--full-preset hour``: the same rows for the `hour` preset's model (d=256, FFN 1024).
    The fast path once more with its products in bfloat16 (``precision=bfloat16``:
    d2l_transformer/training/precision.py; skipped on a CPU without bfloat16 units), and
    PyTorch once more under ``torch.autocast("cpu", dtype=torch.bfloat16)``; each fast row
    gives its products' GFLOP a pass and what they ran at. Four rows bound them: one 2048^3
    product at its best, MXNet's FullyConnected and PyTorch's matmul, float32 and bfloat16
    (scripts/bench_gemm.py, each once, not interleaved).
Then the ratios. ``--only GROUP`` runs one group of rows (``--only full``: (h) alone).
``--quick``: TINY sizes and fewer sentences (CI, under a minute).
``--json PATH`` writes every figure. The decoding rows use the model the fast row trained.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from unittest import mock

from bench_common import (
    FULL_PRESET_ENV,
    MODEL_ENV,
    REPEATS_ENV,
    SERVE_MODEL_ENV,
    THREADS_ENV,
    peak_rss_mb,
    sizes,
)
from bench_decoding import batch_row, greedy_row, translate_row
from bench_engines import ct2_row, engine_row, engine_worker
from bench_gemm import gemm_row
from bench_scale import scale_row
from bench_serving import serving_row
from bench_training import baseline_row, book_row, full_train_row, train_row

# The rows' code, by what it measures: bench_training.py (a) and (h), bench_decoding.py (b), (c)
# and (f), bench_scale.py (e), bench_serving.py (g), bench_engines.py (i) and (k). Here: the
# command line, the table of rows and ratios, a process per row, interleaved rounds, medians.

ROWS = [  # key, label
    ("train_book", "(a) train, the chapter's own code tokens/s"),
    ("train_faithful", "(a) train faithful tokens/s"),
    ("train_fast", "(a) train fast tokens/s"),
    ("train_fast_nokernels", "(a) train fast, no fused kernels tokens/s"),
    ("train_fast_native", "(a) train fast, the CPU's native kernels tokens/s"),
    ("train_torch", "(a) train, PyTorch eager tokens/s"),
    ("train_gluonnlp", "(a) train, GluonNLP 0.10 hybridized tokens/s"),
    ("greedy_kv", "(b) greedy ms/sentence, key/value cache"),
    ("batch_1", "(c) batched greedy sentences/s batch=1 "),
    ("batch_64", "(c) batched greedy sentences/s batch=64"),
    ("batch_256", "(c) batched greedy sentences/s batch=256"),
    ("train_2ctx", "(e) train fast, 2 contexts cpu:0,cpu:1 tokens/s"),
    ("train_dist2", "(e) train fast, 2 dist_sync workers tokens/s"),
    ("translate_greedy", "(f) translate full-size, Translator, greedy sentences/s"),
    ("translate_beam4", "(f) translate full-size, Translator, beam 4 sentences/s"),
    ("serving", "(g) serve, concurrent clients on loopback requests/s"),
    ("ct2_ours_greedy", "(i) Translator, greedy sentences/s"),
    ("ct2_float32_greedy", "(i) CTranslate2 float32, greedy sentences/s"),
    ("ct2_int8_greedy", "(i) CTranslate2 int8, greedy sentences/s"),
    ("ct2_ours_beam4", "(i) Translator, beam 4 sentences/s"),
    ("ct2_float32_beam4", "(i) CTranslate2 float32, beam 4 sentences/s"),
    ("ct2_int8_beam4", "(i) CTranslate2 int8, beam 4 sentences/s"),
    ("engine_ct2_greedy", "(k) translate --engine ctranslate2, greedy sentences/s"),
    ("engine_raw_greedy", "(k) CTranslate2 translate_batch, greedy sentences/s"),
    ("engine_ct2_beam4", "(k) translate --engine ctranslate2, beam 4 sentences/s"),
    ("engine_raw_beam4", "(k) CTranslate2 translate_batch, beam 4 sentences/s"),
    ("train_full_imperative", "(h) full preset train, imperative target tokens/s"),
    ("train_full_imperative_mxnet", "(h) full preset train, imperative, MXNet's threads tok/s"),
    ("train_full_fast", "(h) full preset train, fast target tokens/s"),
    ("train_full_fast_native", "(h) full preset train, fast, native kernels tok/s"),
    ("train_full_torch", "(h) full preset train, PyTorch eager target tokens/s"),
    ("train_full_fast_bf16", "(h) full preset train, fast, bfloat16 products tok/s"),
    ("train_full_torch_bf16", "(h) full preset train, PyTorch autocast bfloat16 tok/s"),
    ("gemm_mxnet_float32", "(h) one 2048^3 product, MXNet float32 GFLOP/s"),
    ("gemm_mxnet_bfloat16", "(h) one 2048^3 product, MXNet bfloat16 GFLOP/s"),
    ("gemm_torch_float32", "(h) one 2048^3 product, PyTorch float32 GFLOP/s"),
    ("gemm_torch_bfloat16", "(h) one 2048^3 product, PyTorch bfloat16 GFLOP/s"),
]
RATIOS = [  # label, numerator, denominator
    ("(a) train ratio fast/faithful", "train_fast", "train_faithful"),
    ("(a) train ratio fast/the chapter's own code", "train_fast", "train_book"),
    ("(a) train ratio faithful/the chapter's own code", "train_faithful", "train_book"),
    ("(a) train ratio fast/fast without kernels", "train_fast", "train_fast_nokernels"),
    ("(a) train ratio fast/fast on the CPU's native kernels", "train_fast", "train_fast_native"),
    ("(a) train ratio fast/PyTorch eager", "train_fast", "train_torch"),
    ("(a) train ratio fast/GluonNLP hybridized", "train_fast", "train_gluonnlp"),
    ("(c) batched ratio batch=256/batch=1", "batch_256", "batch_1"),
    ("(e) scale ratio 2 contexts/1 device", "train_2ctx", "train_fast"),
    ("(e) scale ratio 2 dist_sync workers/1 device", "train_dist2", "train_fast"),
    ("(i) ratio greedy Translator/CTranslate2 float32", "ct2_ours_greedy", "ct2_float32_greedy"),
    ("(i) ratio greedy Translator/CTranslate2 int8", "ct2_ours_greedy", "ct2_int8_greedy"),
    ("(i) ratio beam 4 Translator/CTranslate2 float32", "ct2_ours_beam4", "ct2_float32_beam4"),
    ("(i) ratio beam 4 Translator/CTranslate2 int8", "ct2_ours_beam4", "ct2_int8_beam4"),
    ("(k) ratio greedy --engine ctranslate2/translate_batch", "engine_ct2_greedy",
     "engine_raw_greedy"),
    ("(k) ratio beam 4 --engine ctranslate2/translate_batch", "engine_ct2_beam4",
     "engine_raw_beam4"),
    ("(h) full preset train ratio fast/imperative", "train_full_fast", "train_full_imperative"),
    ("(h) full preset train ratio fast/imperative, MXNet's threads", "train_full_fast",
     "train_full_imperative_mxnet"),
    ("(h) full preset train ratio fast/PyTorch eager", "train_full_fast", "train_full_torch"),
    ("(h) full preset train ratio fast/fast on native kernels", "train_full_fast",
     "train_full_fast_native"),
    ("(h) full preset train ratio fast bfloat16/fast float32", "train_full_fast_bf16",
     "train_full_fast"),
    ("(h) full preset train ratio fast bfloat16/PyTorch autocast", "train_full_fast_bf16",
     "train_full_torch_bf16"),
    ("(h) full preset train ratio PyTorch autocast/PyTorch float32", "train_full_torch_bf16",
     "train_full_torch"),
]
GROUPS = {"training": "(a)", "decoding": "(b)", "batched": "(c)", "scale": "(e)",
          "translation": "(f)", "serving": "(g)",
          "full": "(h)", "ctranslate2": "(i)", "engine": "(k)"}  # --only GROUP: the rows whose
# label starts with this
REPEATED = ("train_book", "train_faithful", "train_fast", "train_fast_nokernels",
            "train_fast_native", "train_torch", "train_gluonnlp", "train_full_imperative",
            "train_full_imperative_mxnet", "train_full_fast", "train_full_fast_native",
            "train_full_torch", "train_full_fast_bf16", "train_full_torch_bf16")
ROW_ENV = {"train_full_imperative_mxnet": {"D2L_TRANSFORMER_THREADS": "mxnet"},  # its process's
           "train_fast_native": {"D2L_TRANSFORMER_CPU": "native"},  # d2l_transformer/_runtime/cpu_math.py
           "train_full_fast_native": {"D2L_TRANSFORMER_CPU": "native"},
           **{key: {"D2L_TRANSFORMER_MAX_THREADS": "2"} for key, _ in ROWS  # (i): --threads
              if key.startswith(("ct2_", "step_"))}}


def run_row(key, quick, params_path):
    s = sizes(quick)
    if key == "train_book":
        return book_row(s)
    if key in ("train_2ctx", "train_dist2", "train_dist2_worker"):  # (e)
        return scale_row(s, key, quick, params_path)
    if key == "train_fast_nokernels":  # the same fast path on MXNet's own operators
        with mock.patch.dict(os.environ, {"D2L_TRANSFORMER_KERNELS": "0"}):
            return train_row(s, True, None)
    if key == "train_fast_native":  # the fast path, its process on the CPU's own kernels
        return train_row(s, True, None)
    if key in ("train_torch", "train_gluonnlp", "train_full_torch", "train_full_torch_bf16"):
        return baseline_row(s, key, os.path.dirname(params_path))
    if key.startswith("train_full_"):
        return full_train_row(s, key.startswith("train_full_fast"), os.path.dirname(params_path),
                              "bfloat16" if key.endswith("_bf16") else "float32")
    if key.startswith("gemm_"):
        return gemm_row(key, quick)
    if key.startswith("train_"):
        return train_row(s, key == "train_fast", params_path)
    if key.startswith("translate_"):
        return translate_row(s, key)
    if key.startswith("engine_"):
        return engine_row(s, key, params_path, 1 if quick else int(os.environ.get(REPEATS_ENV, 3)))
    if key.startswith("ct2_"):
        return ct2_row(s, key, params_path, 1 if quick else int(os.environ.get(REPEATS_ENV, 3)),
                       int(os.environ.get(THREADS_ENV, 2)))
    if key == "serving":
        return serving_row(quick)
    if key == "greedy_kv":
        return greedy_row(s, params_path)
    return batch_row(s, params_path, int(key.split("_")[1]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="TINY sizes, under a minute (CI)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved rounds of the (a) training rows (default 3; --quick: 1)")
    p.add_argument("--threads", type=int, default=2,
                   help="(i): threads of each engine (default 2)")
    p.add_argument("--only", choices=sorted(GROUPS), default=None,
                   help="run only this group of rows (and its ratios)")
    p.add_argument("--serve-model", default=None, metavar="DIR",
                   help="(g): serve this model directory (default: train the chapter preset)")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="(f), (i): translate with this trained model directory (its test split "
                        "and tokenizer) instead of a random-weight `full` model")
    p.add_argument("--full-preset", default="full", choices=("full", "hour"),
                   help="(h): the preset whose model and trainer the rows train (default full; "
                        "both share the data slice)")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: one row
    p.add_argument("--engine-worker", default=None, help=argparse.SUPPRESS)  # internal: (i)
    p.add_argument("--params", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        p.error("--repeats and --threads must be at least 1")
    if not args.row:  # (i): the rounds and threads, for the row's process (its environment)
        os.environ[FULL_PRESET_ENV] = args.full_preset  # and (h)'s preset
        os.environ[REPEATS_ENV] = str(args.repeats)
        os.environ[THREADS_ENV] = str(args.threads)
        for key in ROW_ENV:  # the translator's OpenMP threads, at most --threads
            if key.startswith(("ct2_", "step_")):
                ROW_ENV[key] = {"D2L_TRANSFORMER_MAX_THREADS": str(args.threads)}
    if args.serve_model:  # the row's process reads it from its environment
        os.environ[SERVE_MODEL_ENV] = os.path.abspath(args.serve_model)
    if args.model:
        os.environ[MODEL_ENV] = os.path.abspath(args.model)
    if args.engine_worker:  # child of a (i) row: one engine
        return engine_worker(args.engine_worker)
    if args.row:  # child: measure one row, print its JSON
        # first: its NumPy-alias shim must precede every import of mxnet (Python 3.12+); its
        # import of mxnet runs the role and exits in a dist_sync scheduler or server
        import d2l_transformer  # noqa: F401
        value, extra = run_row(args.row, args.quick, args.params)
        print(json.dumps({"value": value, "peak_rss_mb": peak_rss_mb(), **extra}))
        return 0
    results, rounds = {}, []
    header = "peak RSS MB" if not args.quick else "RSS MB (cum.)"
    print(f"{'row':52s} {'value':>10s} {header:>14s}", flush=True)
    repeats = 1 if args.quick else args.repeats
    rows = [(k, label) for k, label in ROWS if not args.only or label.startswith(GROUPS[args.only])]
    repeated = [k for k in REPEATED if k in dict(rows)]
    with tempfile.TemporaryDirectory() as tmp:
        params = os.path.join(tmp, "model.params")

        def measure(key):
            if args.quick:  # one process, data read once; the RSS column is cumulative
                value, extra = run_row(key, True, params)
                return {"value": value, "peak_rss_mb": peak_rss_mb(), **extra}
            # a process per row: each row's own peak RSS
            cmd = [sys.executable, os.path.abspath(__file__), "--row", key, "--params", params]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, **ROW_ENV.get(key, {})})
            if proc.returncode:
                raise RuntimeError(f"row {key} failed:\n{proc.stderr[-2000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])

        try:
            for r in range(repeats if repeated else 0):  # the training rows, interleaved
                rounds.append({key: measure(key) for key in repeated})
                if repeats > 1:
                    print(f"  round {r + 1}: " + ", ".join(
                        f"{key} {rounds[-1][key]['value']:.0f}" for key in repeated), flush=True)
            for key, label in rows:
                if key in REPEATED:
                    values = [rnd[key]["value"] for rnd in rounds]
                    results[key] = {**rounds[-1][key], "value": statistics.median(values), "rounds": values,
                                    "peak_rss_mb": max(rnd[key]["peak_rss_mb"] for rnd in rounds)}
                else:
                    results[key] = measure(key)
                results[key]["label"] = label
                print(f"{label:52s} {results[key]['value']:10.1f} "
                      f"{results[key]['peak_rss_mb']:14.1f}", flush=True)
                if "detail" in results[key]:
                    print(f"    {results[key]['detail']}", flush=True)
                if "skipped" in results[key]:
                    print(f"    skipped: {results[key]['skipped']}", flush=True)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for label, num, den in RATIOS:
        if num not in results or den not in results:  # --only: another group's ratio
            continue
        if "skipped" in results[num] or "skipped" in results[den]:
            print(f"{label:52s} {'skipped':>10s}", flush=True)
            continue
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
        results["full_preset"] = args.full_preset  # the (h) rows' model
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
