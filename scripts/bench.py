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
    CTranslate2's default threads) against CTranslate2's own ``translate_batch`` on that engine's
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
    the threads per workload (d2l_transformer/_threads.py); and PyTorch eager on the same slice
    (scripts/baselines.py), as many threads as the package's rows use for it.
Then the ratios. ``--only GROUP`` runs one group of rows (``--only full``: (h) alone).
``--quick``: TINY sizes and fewer sentences (CI, under a minute).
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
]
GROUPS = {"training": "(a)", "decoding": "(b)", "batched": "(c)", "scale": "(e)",
          "translation": "(f)", "serving": "(g)",
          "full": "(h)", "ctranslate2": "(i)", "engine": "(k)"}  # --only GROUP: the rows whose
# label starts with this
DECODE_TOKENS = 50
REPEATED = ("train_book", "train_faithful", "train_fast", "train_fast_nokernels",
            "train_fast_native", "train_torch", "train_gluonnlp", "train_full_imperative",
            "train_full_imperative_mxnet", "train_full_fast", "train_full_fast_native",
            "train_full_torch")
REPEATS_ENV = "D2L_TRANSFORMER_BENCH_REPEATS"  # --repeats, for the (i) rows' process
THREADS_ENV = "D2L_TRANSFORMER_BENCH_THREADS"  # --threads, likewise
ROW_ENV = {"train_full_imperative_mxnet": {"D2L_TRANSFORMER_THREADS": "mxnet"},  # its process's
           "train_fast_native": {"D2L_TRANSFORMER_CPU": "native"},  # d2l_transformer/_cpu_math.py
           "train_full_fast_native": {"D2L_TRANSFORMER_CPU": "native"},
           **{key: {"D2L_TRANSFORMER_MAX_THREADS": "2"} for key, _ in ROWS  # (i): --threads
              if key.startswith(("ct2_", "step_"))}}


def sizes(quick):
    import d2l_transformer as d2t
    if quick:  # (f), (h): the `full` model on 100 test sentences of a 3,000-pair split
        return dict(cfg=d2t.TINY, epochs=3, n_greedy=3, n_batch=256, n_batch_1=20,
                    translate_length=10,
                    full_cfg=d2t.FULL.replace(num_examples=3000, vocab_size=600, batch_size=32,
                                              num_valid=100, num_test=100),
                    full_batches=4, full_epochs=2)
    return dict(cfg=d2t.CHAPTER, epochs=6, n_greedy=20, n_batch=1000, n_batch_1=100,
                translate_length=30,
                full_cfg=d2t.FULL, full_batches=24, full_epochs=3)


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
    from d2l_transformer.distributed.kvstore import GlobalSum
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
            if n > 1:  # not an empty one (the translator refuses those, `inference.limits`)
                sentences.append(" ".join(src_vocab.to_tokens([int(t) for t in row[:int(n) - 1]])))
    return model, src_vocab, tgt_vocab, sentences


def greedy_row(s, params_path):
    """(b) ms/sentence, one sentence at a time, always DECODE_TOKENS steps: the translator's
    key/value cache."""
    import mxnet as mx

    from d2l_transformer.inference.translator import Translator
    model, src_vocab, tgt_vocab, sentences = _trained_model(s, params_path)
    translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=s["cfg"].num_steps,
                            max_length=DECODE_TOKENS)

    def decode(tokens):
        return translator.translate([tokens], early_stop=False)
    run = [sentences[i % len(sentences)].split() for i in range(s["n_greedy"] + 1)]
    decode(run[0])  # warm-up
    tic = time.time()
    for tokens in run[1:]:
        decode(tokens)
    return (time.time() - tic) / s["n_greedy"] * 1000, {"sentences": s["n_greedy"]}


def batch_row(s, params_path, batch_size):
    """(c) sentences/s of batched greedy translation (the translator, stops at <eos>)."""
    import mxnet as mx

    from d2l_transformer.inference.translator import Translator
    model, src_vocab, tgt_vocab, sentences = _trained_model(s, params_path)
    n = s["n_batch_1"] if batch_size == 1 else s["n_batch"]
    sentences = [sentences[i % len(sentences)].split() for i in range(n)]
    num_steps = s["cfg"].num_steps
    translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=num_steps,
                            max_length=num_steps, batch_size=batch_size)
    translator.translate(sentences[:batch_size])  # warm-up
    tic = time.time()
    translator.translate(sentences)
    return n / (time.time() - tic), {"sentences": n}

def _translation_setup(s):
    """(f): a model of the `full` preset (d=128, FFN 512, 4 heads, 2+2 layers) with random
    weights (seed 0), its own vocabularies (sentencepiece, 4,000 pieces a side) and the source
    sentences of its held-out test split, tokenized by its tokenizer (with random weights only
    their lengths matter); with ``--model DIR``, that trained model, its vocabularies, its
    tokenizer and its test split instead."""
    import mxnet as mx
    from mxnet import init

    import d2l_transformer as d2t
    from d2l_transformer import checkpoint
    from d2l_transformer.data.split import split_corpus
    from d2l_transformer.training.run import load_data
    model_dir = os.environ.get(MODEL_ENV)
    _translation_setup.model_dir = model_dir
    if model_dir:  # --model DIR: a trained model, its own split and tokenizer
        model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(model_dir, mx.cpu())
        tokenizer = checkpoint.load_tokenizer(model_dir, cfg)
    else:
        cfg = s["full_cfg"]
        d2t.set_seed(0)
        src_vocab, tgt_vocab, _, tokenizer, _ = load_data(cfg, cfg.batch_size)
        d2t.set_seed(0)
        model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
        model.initialize(init.Xavier(), ctx=mx.cpu())
    _, _, test = split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test, by=cfg.split_by)
    _translation_setup.tokenizer = tokenizer  # (i) saves the model directory with it
    return model, src_vocab, tgt_vocab, cfg, [tokenizer.encode(t) for t in test.source]


def translate_row(s, key):
    """(f) sentences/s of the Translator translating the test sources 64 at a time, at most
    `translate_length` tokens each (random weights: almost every sentence runs to that length),
    greedy or beam 4. Start-up (data, model, the first batch: graphs, memory plans) is
    excluded."""
    import mxnet as mx

    from d2l_transformer.inference.translator import Translator
    beam = 4 if key.endswith("beam4") else 1
    model, src_vocab, tgt_vocab, cfg, sentences = _translation_setup(s)
    length, batch = s["translate_length"], 64
    translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=cfg.num_steps,
                            max_length=length, batch_size=batch)
    translator.translate(sentences[:batch], beam_size=beam)  # warm-up
    seconds, tokens = 0.0, []
    for i in range(0, len(sentences), batch):
        tic = time.time()
        tokens += [h.tokens for h in translator.translate(sentences[i:i + batch], beam_size=beam)]
        seconds += time.time() - tic
    return len(sentences) / seconds, {
        "seconds": seconds, "sentences": len(sentences), "beam": beam, "max_length": length,
        "mean_tokens": statistics.mean(len(t) for t in tokens),
        "vocab": [len(src_vocab), len(tgt_vocab)]}


ENGINE_MARK = "@engine "  # (i): the prefix of an engine process's answers on its stdout


def _engine_worker(spec_path):
    """(i) one engine in a process of its own (``bench.py --engine-worker SPEC``): load it,
    translate the first batch (warm-up: graphs, memory plans), then for each ``run`` line on
    stdin time one call over all the sentences, which each engine sorts by length and cuts into
    batches (as `translate` on a file does), and answer ``seconds, translations, peak RSS`` as
    one JSON line. The parent runs one engine at a time, so no other engine's threads are ever
    awake beside the one being timed. SPEC: a JSON file (`ct2_rounds`)."""
    with open(spec_path) as f:
        spec = json.load(f)
    engine, beam, batch, sentences = spec["engine"], spec["beam"], spec["batch"], spec["sentences"]
    if engine == "ours":  # OpenMP threads: the translator's choice, at most --threads (ROW_ENV)
        # the package first: it configures MXNet's threads
        from d2l_transformer.inference.engines import translator_options  # noqa: I001
        from d2l_transformer.inference.translator import Translator
        from d2l_transformer import checkpoint
        import mxnet as mx
        model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(spec["model_dir"], mx.cpu())
        translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), max_length=spec["length"],
                                batch_size=batch, **translator_options(cfg))  # as the CLI

        def decode(part):
            return [h.tokens for h in translator.translate(part, beam_size=beam, alpha=0.0)]
    else:
        import ctranslate2
        translator = ctranslate2.Translator(spec["model_dir"], device="cpu",
                                            intra_threads=spec["threads"], inter_threads=1)

        def decode(part):  # CTranslate2 too sorts by length, then batches
            return [r.hypotheses[0] for r in translator.translate_batch(
                part, max_batch_size=batch, **spec["options"])]
    decode(sentences[:batch])
    print(ENGINE_MARK + json.dumps("ready"), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        tic = time.perf_counter()
        out = decode(sentences)
        print(ENGINE_MARK + json.dumps([time.perf_counter() - tic, out, _own_peak_rss_mb()]),
              flush=True)
    return 0


def _engine_answer(name, proc):
    """The next answer of an engine process (other lines of its stdout are passed over)."""
    for line in proc.stdout:
        if line.startswith(ENGINE_MARK):
            return json.loads(line[len(ENGINE_MARK):])
    raise RuntimeError(f"the {name} engine stopped (exit status {proc.wait()})")


def ct2_rounds(s, beam, repeats, threads):
    """(i) sentences/s of the translator and of CTranslate2 float32 and int8 on the same model
    and sentences, `repeats` rounds; in each round every engine translates all the sentences in
    turn, each in a process of its own (`_engine_worker`), the others idle; medians over the
    rounds. One process for all three, alternating batch by batch, measured the engines' idle
    thread pools instead: there CTranslate2 float32 beam 4 ran at ~290 sentences/s beside an
    idle int8 translator and at ~750-950 alone (docs/benchmarks.md)."""
    import mxnet as mx

    from d2l_transformer import checkpoint
    from d2l_transformer.inference.engines import translator_options
    from d2l_transformer.inference.export import export
    from d2l_transformer.inference.export.ctranslate2 import decoding_options
    model, src_vocab, tgt_vocab, cfg, sentences = _translation_setup(s)
    sentences = list({tuple(t): list(t) for t in sentences}.values())  # distinct sources
    length, batch = s["translate_length"], 64
    X = mx.np.ones((1, 2))  # (batch, seq_len): the deferred shapes, before saving
    model(X, X, mx.np.array([2]))
    engines = ("ours", "float32", "int8")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _translation_setup.model_dir or checkpoint.save(
            os.path.join(tmp, "model"), model, src_vocab, tgt_vocab, cfg,
            tokenizer=_translation_setup.tokenizer)
        options = {**decoding_options(cfg, 0), "beam_size": beam, "max_decoding_length": length,
                   "disable_unk": translator_options(cfg)["no_unk"]}  # <unk> as the translator's
        workers = {}
        try:
            for name in engines:
                if name != "ours":
                    export(model_dir, os.path.join(tmp, name), format="ctranslate2",
                           quantization=None if name == "float32" else name)
                spec = os.path.join(tmp, f"{name}.json")
                with open(spec, "w") as f:
                    json.dump({"engine": name, "beam": beam, "batch": batch, "length": length,
                               "threads": threads, "options": options, "sentences": sentences,
                               "model_dir": model_dir if name == "ours"
                               else os.path.join(tmp, name)}, f)
                workers[name] = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--engine-worker", spec],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                _engine_answer(name, workers[name])  # loaded and warmed up
            rounds, tokens, rss = [], {}, {}
            for _ in range(repeats):
                seconds = {}
                for name, proc in workers.items():
                    time.sleep(0.5)  # the engine before has gone idle
                    proc.stdin.write("run\n")
                    proc.stdin.flush()
                    seconds[name], tokens[name], rss[name] = _engine_answer(name, proc)
                rounds.append({name: len(sentences) / sec for name, sec in seconds.items()})
        finally:
            for proc in workers.values():
                proc.stdin.close()  # its loop ends
                proc.wait(timeout=60)
    return {"values": {name: statistics.median(r[name] for r in rounds) for name in engines},
            "rounds": rounds, "sentences": len(sentences), "beam": beam, "max_length": length,
            "mean_tokens": {k: statistics.mean(len(t) for t in v) for k, v in tokens.items()},
            "same_as_ours": {q: sum(a == b for a, b in zip(tokens["ours"], tokens[q]))
                             for q in engines[1:]},
            "threads": threads, "processes": "one per engine, one engine at a time",
            "engine_peak_rss_mb": rss}  # each engine's process


def ct2_row(s, key, params_path, repeats, threads):
    """(i) one engine of `ct2_rounds`, measured once for the three (kept beside the params)."""
    beam = 4 if key.endswith("beam4") else 1
    path = os.path.join(os.path.dirname(params_path or tempfile.mkdtemp()), f"ct2_beam{beam}.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(ct2_rounds(s, beam, repeats, threads), f)
    with open(path) as f:
        result = json.load(f)
    engine = key.split("_")[1]
    return result["values"][engine], {**{k: v for k, v in result.items() if k != "values"},
                                      "peak_rss_mb": result["engine_peak_rss_mb"][engine]}


def engine_rounds(s, beam, repeats):
    """(k) sentences/s of the ctranslate2 engine (`inference.engines`) and of ``translate_batch``
    on its own CTranslate2 translator, `repeats` interleaved rounds (which goes first
    alternates), medians."""
    import shutil

    import mxnet as mx

    from d2l_transformer import checkpoint
    from d2l_transformer.inference.engines import open_engine
    from d2l_transformer.inference.limits import BANNED, decode_limit
    from d2l_transformer.inference.translator import ALPHA
    model, src_vocab, tgt_vocab, cfg, sentences = _translation_setup(s)
    sentences = list({tuple(t): list(t) for t in sentences}.values())  # distinct sources
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")  # a copy: the export is kept beside it
        if _translation_setup.model_dir:
            shutil.copytree(os.path.realpath(_translation_setup.model_dir), model_dir)
        else:
            X = mx.np.ones((1, 2))  # (batch, seq_len): the deferred shapes, before saving
            model(X, X, mx.np.array([2]))
            checkpoint.save(model_dir, model, src_vocab, tgt_vocab, cfg,
                            tokenizer=_translation_setup.tokenizer)
        engine = open_engine(model_dir, "ctranslate2")  # the CLI's engine: exports here
        limit = max(decode_limit(cfg.num_steps, len(t), engine.max_positions) for t in sentences)
        options = {"beam_size": beam, "max_batch_size": 64, "max_decoding_length": limit,
                   "min_decoding_length": 0, "max_input_length": 0, "length_penalty": ALPHA,
                   "return_scores": True,
                   "disable_unk": engine.no_unk, "suppress_sequences": [[t] for t in BANNED]}
        runs = {"ct2": lambda: [h.tokens for h in engine.translate(sentences, beam)],
                "raw": lambda: [r.hypotheses[0] for r in
                                engine.translator.translate_batch(sentences, **options)]}
        for run in runs.values():
            run()  # warm-up
        rounds, tokens = [], {}
        for r in range(repeats):
            seconds = {}
            for name in (("ct2", "raw") if r % 2 == 0 else ("raw", "ct2")):
                tic = time.perf_counter()
                tokens[name] = runs[name]()
                seconds[name] = time.perf_counter() - tic
            rounds.append({name: len(sentences) / sec for name, sec in seconds.items()})
    return {"values": {k: statistics.median(r[k] for r in rounds) for k in runs},
            "rounds": rounds, "sentences": len(sentences), "beam": beam,
            "ratio_rounds": [r["ct2"] / r["raw"] for r in rounds],
            "mean_tokens": {k: statistics.mean(len(t) for t in v) for k, v in tokens.items()},
            "same_tokens": sum(a == b for a, b in zip(tokens["ct2"], tokens["raw"]))}


def engine_row(s, key, params_path, repeats):
    """(k) one of `engine_rounds`' two figures, measured once for both."""
    beam = 4 if key.endswith("beam4") else 1
    path = os.path.join(os.path.dirname(params_path or tempfile.mkdtemp()),
                        f"engine_beam{beam}.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(engine_rounds(s, beam, repeats), f)
    with open(path) as f:
        result = json.load(f)
    return result["values"][key.split("_")[1]], {k: v for k, v in result.items() if k != "values"}


SERVE_MODEL_ENV = "D2L_TRANSFORMER_BENCH_SERVE_MODEL"  # --serve-model DIR, for the row's process
MODEL_ENV = "D2L_TRANSFORMER_BENCH_MODEL"  # --model DIR, for the row's process


def _serving_sizes(quick):
    import d2l_transformer as d2t
    if quick:
        return dict(cfg=d2t.TINY, clients=4, requests=60, storm=120, after=20)
    return dict(cfg=d2t.CHAPTER, clients=8, requests=2000, storm=400, after=200)


def _serving_bad_requests():
    """``[(method, path, body, expected status)]``: one of each kind of bad request."""
    big = json.dumps({"text": ["go . " * 220000]}).encode()  # over the 1 MB cap
    return [("POST", "/translate", b'{"text": ["go ."', 400),
            ("POST", "/translate", b'\xff\xfe{"text": ["go ."]}', 400),
            ("POST", "/translate", b"[" * 50000, 400),
            ("POST", "/translate", b'["go ."]', 422),
            ("POST", "/translate", b'{"beam": 4}', 422),
            ("POST", "/translate", b'{"text": "go ."}', 422),
            ("POST", "/translate", b'{"text": ["go .", 7]}', 422),
            ("POST", "/translate", b'{"text": []}', 422),
            ("POST", "/translate", b'{"text": ["   "]}', 422),
            ("POST", "/translate", b'{"text": ["go ."], "beam": 99}', 422),
            ("POST", "/translate", b'{"text": ["go ."], "beam": true}', 422),
            ("POST", "/translate", json.dumps({"text": ["go ."] * 1000}).encode(), 413),
            ("POST", "/translate", json.dumps({"text": ["go " * 600]}).encode(), 413),
            ("POST", "/translate", big, 413),
            ("GET", "/translate", None, 405),
            ("POST", "/nowhere", b"{}", 404)]


class _Client:
    """One keep-alive HTTP/1.1 connection (http.client); reconnects after the server closed it."""

    def __init__(self, port):
        self.port, self.conn = port, None

    def send(self, method, path, body=None):
        import http.client
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            try:
                headers = {"Content-Type": "application/json"} if body is not None else {}
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                if response.getheader("connection", "").lower() == "close":
                    self.close()
                return response.status, data
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def serving_row(quick):
    """(g) ``d2l-transformer serve`` in its own process on loopback; `clients` threads, each on
    a keep-alive connection, send `requests` one-sentence requests (beam 4, training sentences).
    Figures: requests/s, p50/p99 latency, errors (a failed request, a non-200, or a translation
    other than the server's answer to that sentence sent alone before the load), the mean
    micro-batch. Then the bad-request storm: `storm` malformed requests of every kind, one good
    request after every 3 bad ones, and `after` good requests: every bad one must get its 4xx,
    every good one its translation."""
    import concurrent.futures
    import io
    import socket
    import threading

    from d2l_transformer import checkpoint
    from d2l_transformer.data import preprocess_nmt, read_data_nmt, tokenize_nmt
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return float("nan"), {"skipped": "the serve extra is not installed"}
    z = _serving_sizes(quick)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.environ.get(SERVE_MODEL_ENV)
        if not model_dir:
            import mxnet as mx

            from d2l_transformer.training.run import train_model
            model_dir = os.path.join(tmp, "model")
            train_model(z["cfg"], model_dir, ctx=mx.cpu(), progress=False, log=io.StringIO())
        cfg = checkpoint.load_config(model_dir)
        source, _ = tokenize_nmt(preprocess_nmt(read_data_nmt()), cfg.num_examples)
        sentences = sorted({" ".join(tokens) for tokens in source})[:200]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        log = open(os.path.join(tmp, "server.log"), "w")
        server = subprocess.Popen([sys.executable, "-m", "d2l_transformer.cli", "serve", "--model",
                                   model_dir, "--port", str(port), "--ctx", "cpu"],
                                  stdout=log, stderr=subprocess.STDOUT)
        local = threading.local()

        def send(method, path, body=None):
            if not hasattr(local, "client"):
                local.client = _Client(port)
            return local.client.send(method, path, body)

        def translate(sentence):
            status, data = send("POST", "/translate",
                                json.dumps({"text": [sentence], "beam": 4}).encode())
            return json.loads(data)["translations"][0]["translation"] if status == 200 else None

        try:
            deadline = time.time() + 300
            while True:
                try:
                    if _Client(port).send("GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the server did not start:\n" + open(log.name).read()[-2000:])
                time.sleep(0.2)
            expected = {s: translate(s) for s in sentences}  # one at a time, before the load
            before = json.loads(send("GET", "/health")[1])

            def good(i):
                sentence = sentences[i % len(sentences)]
                tic = time.perf_counter()
                try:
                    ok = translate(sentence) == expected[sentence]
                except OSError:
                    ok = False
                return ok, time.perf_counter() - tic

            with concurrent.futures.ThreadPoolExecutor(z["clients"]) as pool:
                tic = time.perf_counter()
                load = list(pool.map(good, range(z["requests"])))
                seconds = time.perf_counter() - tic
                after_load = json.loads(send("GET", "/health")[1])
                bad = _serving_bad_requests()

                def storm(i):  # 3 bad, 1 good, ...
                    if i % 4 == 3:
                        return "good", good(i)[0]
                    method, path, body, status = bad[(i - i // 4) % len(bad)]
                    try:
                        got, data = send(method, path, body)
                        return "bad", got == status and "error" in json.loads(data)
                    except OSError:
                        return "bad", False

                stormed = list(pool.map(storm, range(z["storm"] * 4 // 3)))
                afterwards = list(pool.map(good, range(z["after"])))
        finally:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
    latencies = sorted(t for _, t in load)
    batches = after_load["batches"] - before["batches"]
    sentences_done = after_load["sentences"] - before["sentences"]
    bad_ok = [ok for kind, ok in stormed if kind == "bad"]
    good_ok = [ok for kind, ok in stormed if kind == "good"] + [ok for ok, _ in afterwards]
    extra = {"clients": z["clients"], "requests": len(load), "seconds": seconds,
             "p50_ms": 1000 * statistics.median(latencies),
             "p99_ms": 1000 * statistics.quantiles(latencies, n=100, method="inclusive")[98],
             "errors": sum(not ok for ok, _ in load),
             "mean_batch": sentences_done / max(batches, 1),
             "storm_bad": len(bad_ok), "storm_bad_wrong": sum(not ok for ok in bad_ok),
             "storm_good": len(good_ok), "storm_good_wrong": sum(not ok for ok in good_ok),
             "model": os.path.basename(os.path.normpath(model_dir)), "beam": 4}
    extra["detail"] = (f"{extra['clients']} clients, {extra['requests']} requests: p50 "
                       f"{extra['p50_ms']:.0f} ms, p99 {extra['p99_ms']:.0f} ms, errors "
                       f"{extra['errors']}, mean micro-batch {extra['mean_batch']:.1f}; storm: "
                       f"{extra['storm_bad']} bad requests, {extra['storm_bad_wrong']} without "
                       f"their 4xx; {extra['storm_good']} good ones, {extra['storm_good_wrong']} "
                       "wrong")
    if extra["errors"] or extra["storm_bad_wrong"] or extra["storm_good_wrong"]:
        raise RuntimeError("serving: " + extra["detail"])
    return len(load) / seconds, extra


def _full_slice(s, cache_dir):
    """(h): ``(src vocabulary size, tgt vocabulary size, batches)``, the first `full_batches`
    batches of the `full` preset's bucketed loader (seed 0) as NumPy arrays; built once per
    benchmark run (tokenizer training and bucketing take a minute) and kept in `cache_dir`."""
    import pickle

    import d2l_transformer as d2t
    from d2l_transformer.training.run import load_data
    cfg = s["full_cfg"]
    path = os.path.join(cache_dir, f"full_slice_{s['full_batches']}.pkl")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    d2t.set_seed(0)
    src_vocab, tgt_vocab, it, _, _ = load_data(cfg, cfg.batch_size)
    batches = [[a.asnumpy() for a in batch] for _, batch in zip(range(s["full_batches"]), it)]
    out = (len(src_vocab), len(tgt_vocab), batches)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(out, f)
    os.replace(path + ".tmp", path)
    return out


def full_train_row(s, fast, cache_dir):
    """(h) target tokens/s of `train_s2s_ch8` on the `full` preset's slice (`_full_slice`),
    its model, trainer (Adam, warmup) and loss (label smoothing, per-token), imperative
    (``fast=False``) or fast; every pass over the slice after the first is timed."""
    import mxnet as mx
    from mxnet import init

    import d2l_transformer as d2t
    from d2l_transformer import _cpu_math
    from d2l_transformer.training.loss import MaskedSoftmaxCELoss
    from d2l_transformer.training.optim import config_trainer
    cfg = s["full_cfg"]
    _cpu_math.settle(cfg)  # as `train_model` does: the whole corpus lifts oneDNN's cap
    src_size, tgt_size, arrays = _full_slice(s, cache_dir)
    batches = [[mx.np.array(a, dtype="float32") for a in batch] for batch in arrays]
    tokens = sum(float(Y_len.sum() - len(Y_len)) for *_, Y_len in arrays)  # Y_valid_len - 1
    d2t.set_seed(0)  # both paths: the same initial weights
    model = d2t.build_model(cfg, src_size, tgt_size)
    model.initialize(init.Xavier(), ctx=mx.cpu())
    trainer = config_trainer(model, cfg)
    loss = MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=cfg.loss_reduction)
    stamps = []
    summary = d2t.train_s2s_ch8(model, batches, cfg.lr, s["full_epochs"], mx.cpu(),
                                trainer=trainer, loss=loss, fast=fast,
                                on_epoch=lambda epoch, loss: stamps.append(time.time()))
    rate = tokens * (len(stamps) - 1) / (stamps[-1] - stamps[0])
    shapes = sorted({(X.shape[0], X.shape[1], Y.shape[1]) for X, _, Y, _ in arrays})
    return rate, {"loss": summary["loss"], "batches": len(arrays), "tokens_per_pass": tokens,
                  "passes_timed": len(stamps) - 1, "shapes": len(shapes)}


def baseline_row(s, key, cache_dir):
    """(a) ``train_torch`` / ``train_gluonnlp``, (h) ``train_full_torch``: the same model in
    PyTorch eager or GluonNLP 0.10 hybridized (scripts/baselines.py) on the batches of the
    package's rows (NumPy copies), target tokens/s over epochs 2..; PyTorch on the threads the
    package's loop takes for that work (`_threads.threads_for`)."""
    import baselines

    from d2l_transformer._threads import threads_for
    package = "gluonnlp" if key == "train_gluonnlp" else "torch"
    reason = baselines.missing(package)
    if reason:
        return float("nan"), {"skipped": reason}
    if key == "train_full_torch":
        cfg, epochs = s["full_cfg"], s["full_epochs"]
        src_size, tgt_size, batches = _full_slice(s, cache_dir)
    else:
        cfg, epochs = s["cfg"], s["epochs"]
        src_vocab, tgt_vocab, it = _data(cfg)
        src_size, tgt_size = len(src_vocab), len(tgt_vocab)
        batches = [[a.asnumpy() for a in batch] for batch in it]
    if package == "gluonnlp":
        return baselines.train_gluonnlp(batches, src_size, tgt_size, cfg, epochs)
    X, _, Y, _ = batches[0]  # the loop's rule: the first batch's output-layer multiply-adds
    threads = threads_for(X.shape[0] * (Y.shape[1] - 1) * cfg.embedding_size * tgt_size)
    return baselines.train_torch(batches, src_size, tgt_size, cfg, epochs, threads)


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _own_peak_rss_mb():
    """This process's own peak resident memory: Linux's VmHWM, which starts afresh at exec
    (ru_maxrss keeps the parent's peak across fork and exec); elsewhere ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return _peak_rss_mb()


def book_row(s):
    """(a) the chapter's own code: its classes as printed (oracles/chapter_0_11.py, on the
    `d2l` 0.11.4 oracle the chapter imported) trained by d2l's own ``train_s2s_ch9``, on the
    same data; epochs timed from when the loop starts reading each epoch's batches."""
    import contextlib
    import io

    try:
        import d2l
    except ImportError:  # the oracle is a test dependency (make venv installs it)
        return float("nan"), {"skipped": "d2l 0.11.4 is not installed"}
    import mxnet as mx
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracles"))
    import chapter_0_11 as book

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
    from d2l_transformer.distributed.launch import launch

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
        from d2l_transformer.distributed.kvstore import announce_rank
        kvstore = d2t.create_kvstore("dist_sync")
        announce_rank(kvstore)
        return train_row(s, True, params_path, kvstore=kvstore)
    if key == "train_fast_nokernels":  # the same fast path on MXNet's own operators
        with mock.patch.dict(os.environ, {"D2L_TRANSFORMER_KERNELS": "0"}):
            return train_row(s, True, None)
    if key == "train_fast_native":  # the fast path, its process on the CPU's own kernels
        return train_row(s, True, None)
    if key in ("train_torch", "train_gluonnlp", "train_full_torch"):
        return baseline_row(s, key, os.path.dirname(params_path))
    if key.startswith("train_full_"):
        return full_train_row(s, key in ("train_full_fast", "train_full_fast_native"),
                              os.path.dirname(params_path))
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
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: one row
    p.add_argument("--engine-worker", default=None, help=argparse.SUPPRESS)  # internal: (i)
    p.add_argument("--params", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        p.error("--repeats and --threads must be at least 1")
    if not args.row:  # (i): the rounds and threads, for the row's process (its environment)
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
        return _engine_worker(args.engine_worker)
    if args.row:  # child: measure one row, print its JSON
        # first: its NumPy-alias shim must precede every import of mxnet (Python 3.12+); its
        # import of mxnet runs the role and exits in a dist_sync scheduler or server
        import d2l_transformer  # noqa: F401
        value, extra = run_row(args.row, args.quick, args.params)
        print(json.dumps({"value": value, "peak_rss_mb": _peak_rss_mb(), **extra}))
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
                return {"value": value, "peak_rss_mb": _peak_rss_mb(), **extra}
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
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
