"""Translating like a toolkit, measured on one model directory (docs/benchmarks.md, "The
toolkit's verbs"): JSON on stdout (and in --json FILE).

* ``evaluate``: ``evaluate --beam 4`` with the MXNet engine (the default before ``auto``) and
  with the default (``auto``), alternated `--rounds` times, each in its own process (the
  command line itself): seconds and BLEU of each set, greedy and beam 4;
* ``nbest``: n-best 5 against beam 5, sentences/s, both engines, on the first `--sentences`
  held-out sources;
* ``score``: pairs/s of ``score`` on both engines over the same pairs, and the largest per-token
  difference between them;
* ``stream``: ``translate`` (the default engine, greedy) over `--stream-lines` lines on stdin,
  in a process of its own: sentences/s and its peak RSS.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CLI = [sys.executable, "-m", "d2l_transformer.cli"]


def _run(argv, stdin=None):
    """``(seconds, stdout)`` of the command line `argv` in a process of its own (exit status 0,
    or 1: some input lines skipped)."""
    tic = time.perf_counter()
    r = subprocess.run(CLI + argv, stdin=stdin, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv[:1])} failed: {r.stderr[-2000:]}")
    return time.perf_counter() - tic, r.stdout


def bench_evaluate(model, rounds, max_sentences):
    """Each engine's ``evaluate --beam 4 --json``, alternated: seconds and the report's BLEU."""
    runs = {"mxnet": [], "auto": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for engine in runs:
                out = os.path.join(tmp, f"{engine}.json")
                argv = ["evaluate", "--model", model, "--beam", "4", "--engine", engine,
                        "--json", out] + (["--max-sentences", str(max_sentences)]
                                          if max_sentences is not None else [])
                seconds, _ = _run(argv)
                with open(out) as f:
                    report = json.load(f)
                runs[engine].append({"seconds": round(seconds, 1), "engine": report["engine"],
                                     "decoding_seconds": round(sum(
                                         r["seconds"] for s in report["sets"]
                                         for r in s["decoders"].values()), 1),
                                     "bleu": {s["name"]: {d: round(r["bleu"], 2) for d, r in
                                                          s["decoders"].items()}
                                              for s in report["sets"]},
                                     "scored": {s["name"]: s["scored"] for s in report["sets"]}})
    median = {e: statistics.median(r["seconds"] for r in v) for e, v in runs.items()}
    decoding = {e: statistics.median(r["decoding_seconds"] for r in v) for e, v in runs.items()}
    return {"runs": runs, "median_seconds": median, "median_decoding_seconds": decoding,
            "speedup": round(median["mxnet"] / median["auto"], 2),
            "decoding_speedup": round(decoding["mxnet"] / decoding["auto"], 2)}


def bench_decoding(model, sentences):
    """n-best 5 against beam 5 and score, both engines, in this process."""
    import d2l_transformer  # noqa: F401  (first: it configures MXNet's threads)
    from d2l_transformer.data import heldout_nmt
    from d2l_transformer.inference.engines import ENGINES, open_engine
    engines = {name: open_engine(model, name) for name in ENGINES}
    e = engines["mxnet"]
    src, tgt = heldout_nmt(e.src_vocab, e.tgt_vocab, e.cfg.num_examples, sentences)["unfiltered"]
    out = {"sentences": len(src), "nbest": {}, "score": {}}
    scores = {}
    for name, engine in engines.items():
        engine.translate(src[:64], 5)  # warm-up: graphs, memory plans
        row = {}
        for label, n_best in (("beam 5", None), ("n-best 5", 5)):
            tic = time.perf_counter()
            engine.translate(src, 5, n_best=n_best)
            row[label] = round(len(src) / (time.perf_counter() - tic), 1)
        out["nbest"][name] = row
        engine.score(src[:64], tgt[:64])
        tic = time.perf_counter()
        scores[name] = engine.score(src, tgt)
        out["score"][name] = round(len(src) / (time.perf_counter() - tic), 1)
    out["score"]["largest_per_token_difference"] = max(
        abs(p - q) for a, b in zip(scores["mxnet"], scores["ctranslate2"])
        for p, q in zip(a.log_probs, b.log_probs))
    return out


def bench_stream(model, lines):
    """``translate`` over `lines` held-out lines repeated, in a process of its own."""
    import d2l_transformer  # noqa: F401
    from d2l_transformer.data import heldout_nmt
    from d2l_transformer.inference.engines import open_engine
    e = open_engine(model, "mxnet")
    src = heldout_nmt(e.src_vocab, e.tgt_vocab, e.cfg.num_examples, 5000)["unfiltered"][0]
    with tempfile.TemporaryFile("w+") as f:
        for i in range(lines):
            f.write(" ".join(src[i % len(src)]) + "\n")
        f.seek(0)
        seconds, stdout = _run(["translate", "--model", model], stdin=f)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child's
    return {"lines": lines, "out_lines": stdout.count("\n"), "seconds": round(seconds, 1),
            "sentences_per_s": round(lines / seconds, 1), "peak_rss_mb": round(peak_kb / 1024)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a model directory written by train")
    p.add_argument("--only", choices=("evaluate", "decoding", "stream"), action="append",
                   default=None, help="these parts only (repeatable; default: all)")
    p.add_argument("--rounds", type=int, default=3, help="evaluate: rounds of each engine")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="evaluate: --max-sentences (default: evaluate's own default)")
    p.add_argument("--sentences", type=int, default=1000, help="n-best and score: sentences")
    p.add_argument("--stream-lines", type=int, default=100_000, help="stream: input lines")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the JSON to FILE")
    args = p.parse_args(argv)
    only = args.only or ["stream", "decoding", "evaluate"]
    result = {"model": args.model, "cpus": os.cpu_count()}
    if "stream" in only:  # first: RUSAGE_CHILDREN is the largest child so far
        result["stream"] = bench_stream(args.model, args.stream_lines)
    if "decoding" in only:
        result["decoding"] = bench_decoding(args.model, args.sentences)
    if "evaluate" in only:
        result["evaluate"] = bench_evaluate(args.model, args.rounds, args.max_sentences)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
