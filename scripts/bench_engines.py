"""Rows (i) and (k) of scripts/bench.py: the package's translator against CTranslate2 on the
model and sentences of (f) (bench_decoding.py). (i) each engine in a process of its own
(``bench.py --engine-worker SPEC``), one engine at a time; (k) the ``--engine ctranslate2``
engine against CTranslate2's own ``translate_batch``, in one process. Each measures all its
rows at once and keeps them in a JSON file beside the params, which the rows after it read."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import BENCH, own_peak_rss_mb
from bench_decoding import translation_setup

ENGINE_MARK = "@engine "  # (i): the prefix of an engine process's answers on its stdout


def engine_worker(spec_path):
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
        print(ENGINE_MARK + json.dumps([time.perf_counter() - tic, out, own_peak_rss_mb()]),
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
    turn, each in a process of its own (`engine_worker`), the others idle; medians over the
    rounds. One process for all three, alternating batch by batch, measured the engines' idle
    thread pools instead: there CTranslate2 float32 beam 4 ran at ~290 sentences/s beside an
    idle int8 translator and at ~750-950 alone (docs/benchmarks.md)."""
    import mxnet as mx

    from d2l_transformer import checkpoint
    from d2l_transformer._runtime import environ
    from d2l_transformer.inference.engines import translator_options
    from d2l_transformer.inference.export import export
    from d2l_transformer.inference.export.ctranslate2 import decoding_options
    model, src_vocab, tgt_vocab, cfg, sentences = translation_setup(s)
    sentences = list({tuple(t): list(t) for t in sentences}.values())  # distinct sources
    length, batch = s["translate_length"], 64
    X = mx.np.ones((1, 2))  # (batch, seq_len): the deferred shapes, before saving
    model(X, X, mx.np.array([2]))
    engines = ("ours", "float32", "int8")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = translation_setup.model_dir or checkpoint.save(
            os.path.join(tmp, "model"), model, src_vocab, tgt_vocab, cfg,
            tokenizer=translation_setup.tokenizer)
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
                workers[name] = subprocess.Popen(  # the user's environment: CTranslate2's
                    [sys.executable, BENCH, "--engine-worker", spec], env=environ.user_environ(),
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


def _model_copy(tmp, setup):
    """A model directory in `tmp` (the export is kept beside it): a copy of (f)'s ``--model``,
    else (f)'s random-weight model `setup` (`translation_setup`'s) saved."""
    import shutil

    import mxnet as mx

    from d2l_transformer import checkpoint
    model, src_vocab, tgt_vocab, cfg, _ = setup
    model_dir = os.path.join(tmp, "model")
    if translation_setup.model_dir:
        shutil.copytree(os.path.realpath(translation_setup.model_dir), model_dir)
    else:
        X = mx.np.ones((1, 2))  # (batch, seq_len): the deferred shapes, before saving
        model(X, X, mx.np.array([2]))
        checkpoint.save(model_dir, model, src_vocab, tgt_vocab, cfg,
                        tokenizer=translation_setup.tokenizer)
    return model_dir


def _raw_options(engine, sentences, beam):
    """``translate_batch``'s options for the search and the outputs `engine` asks for (one
    hypothesis and its score), with one length limit for all (the longest source's)."""
    from d2l_transformer.inference.limits import BANNED, decode_limit
    from d2l_transformer.inference.translator import ALPHA
    limit = max(decode_limit(engine.cfg.num_steps, len(t), engine.max_positions) for t in sentences)
    return {"beam_size": beam, "max_batch_size": 64, "max_decoding_length": limit,
            "min_decoding_length": 0, "max_input_length": 0, "length_penalty": ALPHA,
            "return_scores": True, "disable_unk": engine.no_unk,
            "suppress_sequences": [[t] for t in BANNED]}


def _pair_rounds(engine, sentences, beam, repeats, rounds=None, order=0):
    """One round of the engine ("ct2") and ``translate_batch`` on its translator ("raw") per
    repeat, which goes first alternating with `order`; appends ``{name: sentences/s}`` to
    `rounds` and returns it with the last round's tokens."""
    options = _raw_options(engine, sentences, beam)
    runs = {"ct2": lambda: [h.tokens for h in engine.translate(sentences, beam)],
            "raw": lambda: [r.hypotheses[0] for r in
                            engine.translator.translate_batch(sentences, **options)]}
    rounds, tokens = [] if rounds is None else rounds, {}
    for r in range(repeats):
        seconds = {}
        for name in (("ct2", "raw") if (r + order) % 2 == 0 else ("raw", "ct2")):
            tic = time.perf_counter()
            tokens[name] = runs[name]()
            seconds[name] = time.perf_counter() - tic
        rounds.append({name: len(sentences) / sec for name, sec in seconds.items()})
    return rounds, tokens


def engine_rounds(s, beam, repeats):
    """(k) sentences/s of the ctranslate2 engine (`inference.engines`) and of ``translate_batch``
    on its own CTranslate2 translator, `repeats` interleaved rounds (which goes first
    alternates), medians."""
    from d2l_transformer.inference.engines import open_engine
    setup = translation_setup(s)
    sentences = list({tuple(t): list(t) for t in setup[4]}.values())  # distinct sources
    with tempfile.TemporaryDirectory() as tmp:
        engine = open_engine(_model_copy(tmp, setup), "ctranslate2")  # the CLI's: exports there
        _pair_rounds(engine, sentences, beam, 1)  # warm-up
        rounds, tokens = _pair_rounds(engine, sentences, beam, repeats)
    return {"values": {k: statistics.median(r[k] for r in rounds) for k in ("ct2", "raw")},
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


PAUSE = 0.2  # seconds before each timed call: the translator before has gone idle


def grid_threads(cores):
    """The grid's thread counts on `cores` physical cores: 1 up to 4, and the counts the
    engine's own measurement tries (`ct2_threads.candidates`: 8 from 8 cores on)."""
    from d2l_transformer.inference import ct2_threads
    return sorted(set(range(1, min(cores, 4) + 1)) | set(ct2_threads.candidates(cores)))


def _fresh_defaults(model_dir, types):
    """Each compute type's default threads (``--engine-threads 0``), measured now: an empty
    cache directory of its own (`inference.ct2_threads`)."""
    from d2l_transformer.inference.engines import CTranslate2Engine
    from d2l_transformer.io.cache import ENV
    before = os.environ.get(ENV)
    with tempfile.TemporaryDirectory() as cache:
        os.environ[ENV] = cache
        try:
            return {t: CTranslate2Engine(model_dir, compute_type=t).intra_threads for t in types}
        finally:
            os.environ.pop(ENV) if before is None else os.environ.__setitem__(ENV, before)


def engine_grid(model_dir, sentences, beams, repeats, types, counts):
    """Sentences/s of the engine and of ``translate_batch`` on its translator (`_pair_rounds`)
    for every compute type in `types` and thread count in `counts`, each beam of `beams`:
    one engine per cell, loaded first; `repeats` rounds, each over every cell in turn (the
    order reversed every other round), medians; a ratio is the median of its rounds' ratios.
    Then, per type and beam, the engine at its default threads (`_fresh_defaults`) against
    ``translate_batch`` at its fastest count in the same round."""
    from d2l_transformer.inference.engines import CTranslate2Engine
    defaults = _fresh_defaults(model_dir, types)
    engines = {(t, n): CTranslate2Engine(model_dir, intra_threads=n, compute_type=t)
               for t in types for n in counts}
    rows, summary = [], []
    for beam in beams:
        rounds, tokens = {cell: [] for cell in engines}, {}
        for engine in engines.values():
            _pair_rounds(engine, sentences, beam, 1)  # warm-up
        for r in range(repeats):
            for i, cell in enumerate(list(engines) if r % 2 == 0 else list(engines)[::-1]):
                time.sleep(PAUSE)
                tokens[cell] = _pair_rounds(engines[cell], sentences, beam, 1, rounds[cell],
                                            order=r + i)[1]
        for (t, n), cell_rounds in rounds.items():
            medians = {k: statistics.median(x[k] for x in cell_rounds) for k in ("ct2", "raw")}
            rows.append({"compute_type": engines[t, n].compute_type, "asked": t, "threads": n,
                         "beam": beam, "engine": medians["ct2"], "translate_batch": medians["raw"],
                         "ratio": statistics.median(x["ct2"] / x["raw"] for x in cell_rounds),
                         "rounds": cell_rounds,
                         "same_tokens": sum(a == b for a, b in zip(*tokens[t, n].values()))})
        for t in types:
            cells = [row for row in rows if row["asked"] == t and row["beam"] == beam]
            best = max(cells, key=lambda row: row["translate_batch"])
            ours = next((row for row in cells if row["threads"] == defaults[t]), None)
            ratio = ours and statistics.median(  # round by round: the machine drifts
                mine["ct2"] / max(row["rounds"][r]["raw"] for row in cells)
                for r, mine in enumerate(ours["rounds"]))
            summary.append({"compute_type": t, "beam": beam, "default_threads": defaults[t],
                            "translate_batch_best_threads": best["threads"],
                            "translate_batch_best": best["translate_batch"],
                            "engine_at_default": ours and ours["engine"], "ratio": ratio})
    return rows, summary


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a trained model directory (its test split); default: bench.py (f)'s "
                        "random-weight `full` model")
    p.add_argument("--sentences", type=int, default=None, metavar="N",
                   help="the first N distinct test sources (default: all)")
    p.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--beams", default="1,4", help="beam sizes (default 1,4)")
    p.add_argument("--compute-types", default=None, metavar="T,T",
                   help="default: every type CTranslate2 supports on this CPU")
    p.add_argument("--threads", default=None, metavar="N,N",
                   help="default: 1 up to the physical cores, at most 4 (and 8 from 8 cores)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the figures to FILE")
    args = p.parse_args(argv)
    import ctranslate2
    from bench_common import MODEL_ENV, sizes

    import d2l_transformer  # noqa: F401  (before mxnet: its NumPy-alias shim)
    from d2l_transformer._runtime import threads as _threads
    from d2l_transformer._runtime.cpu_math import cpu_name
    if args.model:
        os.environ[MODEL_ENV] = os.path.abspath(args.model)
    setup = translation_setup(sizes(False))
    sentences = list({tuple(t): list(t) for t in setup[4]}.values())[:args.sentences]
    types = (args.compute_types.split(",") if args.compute_types
             else sorted(ctranslate2.get_supported_compute_types("cpu")))
    cores = _threads.physical_cores()
    counts = ([int(n) for n in args.threads.split(",")] if args.threads else grid_threads(cores))
    beams = [int(b) for b in args.beams.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        rows, summary = engine_grid(_model_copy(tmp, setup), sentences, beams, args.repeats,
                                    types, counts)
    print(f"{'beam':>4} {'compute type':26} {'threads':>7} {'engine':>9} {'translate_batch':>15} "
          "ratio   (sentences/s, medians)")
    for row in rows:  # the type asked for (CTranslate2's name for it where another)
        name = row["asked"] + ("" if row["asked"] == row["compute_type"] else
                               f" ({row['compute_type']})")
        print(f"{row['beam']:4d} {name:26} {row['threads']:7d} {row['engine']:9.1f} "
              f"{row['translate_batch']:15.1f} {row['ratio']:5.2f}x")
    for s in summary:
        at = "not in the grid" if s["ratio"] is None else f"{s['ratio']:.2f}x"
        print(f"beam {s['beam']} {s['compute_type']}: the engine at its default "
              f"{s['default_threads']} threads / translate_batch at its fastest "
              f"({s['translate_batch_best_threads']} threads): {at}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "sentences": len(sentences), "repeats": args.repeats,
                       "cpu": cpu_name(), "physical_cores": cores,
                       "ctranslate2": ctranslate2.__version__, "rows": rows,
                       "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
