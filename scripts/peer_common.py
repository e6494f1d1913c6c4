"""What the peer scripts share (scripts/peer_opennmt.py, scripts/peer_sockeye.py,
scripts/peer_package.py): their common options, the command `Runner` that records each command
in ``WORK/results.json``, sentencepiece subwords, sacreBLEU scores, throughput from a log's
reports, and the curve: one JSON row per kept checkpoint.

Only the standard library: a peer script's process only drives; every toolkit step runs in the
toolkit's own virtual environment (``--venv``), through the helper scripts written to
``WORK/bin`` (`HELPERS`), so each step can be rerun by hand.

A curve row (`curve_row`), the same for every toolkit, the package too::

    {"checkpoint": ..., "updates": ..., "minutes": ..., "wall_minutes": ..., "bleu": ...,
     "chrf": ..., "tokens_per_sec": ..., "peak_rss_gb": ..., "settings": {...}}

``minutes``: training minutes before the checkpoint was written, the start-up (reading the data,
building the model: before the first update) left out, as the package's ``train_seconds`` leaves
out its own; ``wall_minutes``: from the training command's start. ``tokens_per_sec``: real
(unpadded) source+target tokens a second of training up to that checkpoint.
"""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

HELPERS = {
    "spm_train.py": '''import sys
import sentencepiece as spm
prefix, vocab_size, threads, *inputs = sys.argv[1:]
spm.SentencePieceTrainer.train(
    input=",".join(inputs), model_prefix=prefix, vocab_size=int(vocab_size), model_type="unigram",
    character_coverage=1.0, byte_fallback=True, num_threads=int(threads), minloglevel=1)
''',
    "spm_encode.py": '''import sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f, open(sys.argv[3], "w", encoding="utf-8") as out:
    for line in f:
        out.write(" ".join(sp.encode(line.rstrip("\\n"), out_type=str)) + "\\n")
''',
    "spm_decode.py": '''import sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f, open(sys.argv[3], "w", encoding="utf-8") as out:
    for line in f:
        out.write(sp.decode(line.split()) + "\\n")
''',
    "score.py": '''import json, sys
from sacrebleu.metrics import BLEU, CHRF
hyp_path, ref_path, out_path = sys.argv[1:]
read = lambda p: open(p, encoding="utf-8").read().split("\\n")[:-1]
hyps, refs = read(hyp_path), read(ref_path)
assert len(hyps) == len(refs), (len(hyps), len(refs))
bleu, chrf = BLEU(), CHRF()
b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
result = {"bleu": b.score, "bleu_signature": str(bleu.get_signature()), "chrf": c.score,
          "chrf_signature": str(chrf.get_signature()), "sentences": len(hyps),
          "precisions": list(b.precisions), "bp": b.bp, "sys_len": b.sys_len, "ref_len": b.ref_len}
json.dump(result, open(out_path, "w"), indent=1)
print(f"BLEU {b.score:5.2f}  chrF {c.score:5.2f}  ({bleu.get_signature()}; {chrf.get_signature()})")
''',
}
SUBDIRS = ("bin", "data", "spm", "checkpoints", "curve")


def base_parser(doc, toolkit):
    """The options every peer script takes; `toolkit` names the venv's contents in the help."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", required=True, help=f"the virtual environment with {toolkit}")
    p.add_argument("--train", nargs=2, required=True, metavar=("SRC", "TGT"))
    p.add_argument("--dev", nargs=2, required=True, metavar=("SRC", "TGT"))
    p.add_argument("--test", nargs=2, required=True, metavar=("SRC", "REF"))
    p.add_argument("--src-lang", required=True)
    p.add_argument("--tgt-lang", required=True)
    p.add_argument("--work", required=True, help="a new (or empty) directory for everything")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--steps", type=int, help="training steps")
    mode.add_argument("--calibrate", type=float, metavar="SECONDS",
                      help="train about this long, print steps/s and tokens/s, stop")
    p.add_argument("--minutes", type=float, default=60,
                   help="the budget --calibrate sizes, and that --steps was sized for")
    p.add_argument("--vocab-size", type=int, default=4000)
    p.add_argument("--joint", action="store_true",
                   help="one sentencepiece model and vocabulary, all embeddings tied")
    p.add_argument("--peak-lr", type=float, default=0.002)
    p.add_argument("--warmup", type=int, default=400)
    p.add_argument("--save-every", type=int, help="checkpoint interval (steps // 10)")
    p.add_argument("--checkpoint-minutes", type=float, metavar="M",
                   help="a checkpoint about every M minutes: --steps x M / --minutes steps "
                        "(--steps being what --calibrate found for --minutes); all are kept")
    p.add_argument("--score-checkpoints", action="store_true",
                   help="translate the test set with every kept checkpoint and score it: "
                        "one row each in WORK/curve.json")
    p.add_argument("--average", type=int, default=3, help="average the last K checkpoints")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--translate-batch", type=int, default=32, help="sentences a batch")
    p.add_argument("--test-lines", type=int, help="score the first K test lines only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    return p


def finish_args(p, args, required_tool, versions_code):
    """Absolute paths, the checkpoint interval, a new WORK with its helper scripts; returns the
    `Runner` and the results so far (versions from `versions_code`, run in the venv)."""
    if args.steps is not None:
        if args.checkpoint_minutes:
            args.save_every = args.save_every or save_interval(args.steps, args.minutes,
                                                               args.checkpoint_minutes)
        args.save_every = args.save_every or max(1, args.steps // 10)
    args.venv, args.work = os.path.abspath(args.venv), os.path.abspath(args.work)
    if not os.path.exists(os.path.join(args.venv, "bin", required_tool)):
        p.error(f"no {required_tool} in {args.venv}/bin: install the toolkit there")
    if os.path.isdir(args.work) and os.listdir(args.work):
        p.error(f"--work {args.work} is not empty")
    for sub in SUBDIRS:
        os.makedirs(os.path.join(args.work, sub), exist_ok=True)
    helpers = dict(HELPERS, **{"versions.py": versions_code})
    for name, text in helpers.items():
        with open(os.path.join(args.work, "bin", name), "w") as f:
            f.write(text)
    r = Runner(args.venv, args.work, args.threads)
    results = {"direction": f"{args.src_lang}-{args.tgt_lang}", "args": dict(vars(args)),
               "env": r.env_note}
    results["versions"] = json.loads(r.run(r.helper("versions.py"), capture=True)[0])
    return r, results


def save_interval(steps, minutes, checkpoint_minutes):
    """Steps between checkpoints about `checkpoint_minutes` apart, `steps` filling `minutes`."""
    return max(1, round(steps * checkpoint_minutes / minutes))


class Runner:
    """Runs and records the commands; every child sees the thread count and no GPU."""

    def __init__(self, venv, work, threads):
        self.venv, self.work, self.commands, self.started = venv, work, [], None
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                        CUDA_VISIBLE_DEVICES="")
        self.env.pop("PYTHONPATH", None)  # the venv's tools never see this repository
        self.env_note = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                         "CUDA_VISIBLE_DEVICES": ""}

    def tool(self, name):
        return os.path.join(self.venv, "bin", name)

    def helper(self, name, *args):
        return [self.tool("python"), os.path.join(self.work, "bin", name), *map(str, args)]

    def run(self, argv, log=None, capture=False, time_limit=None, echo=None):
        """Run argv to its end (or to ``time_limit`` seconds, then SIGINT): returns
        (stdout text when captured, seconds, peak RSS in MiB of the process and its children)."""
        argv = [str(a) for a in argv]
        print("+ " + shlex.join(argv), flush=True)
        start = self.started = time.time()
        out_file = open(log, "w", encoding="utf-8") if log else None
        proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        if time_limit is not None:
            _stop_at(proc, time_limit)
        captured = []
        try:
            for line in proc.stdout:
                if out_file:
                    out_file.write(line)
                    out_file.flush()
                if capture:
                    captured.append(line)
                if echo is None or echo(line):
                    sys.stdout.write("  " + line)
                    sys.stdout.flush()
        finally:
            if time_limit is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if out_file:
                out_file.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") \
            else (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
        seconds = time.time() - start
        self.commands.append({"argv": shlex.join(argv), "seconds": round(seconds, 1),
                              "exit": proc.returncode})
        if proc.returncode != 0 and time_limit is None:
            tail = "".join(captured[-20:]) if capture else f"(see {log})" if log else ""
            sys.exit(f"command failed ({proc.returncode}): {shlex.join(argv)}\n{tail}")
        return "".join(captured), seconds, usage.ru_maxrss / 1024


def _stop_at(proc, time_limit):
    """SIGINT to `proc` after `time_limit` seconds, SIGKILL 30 s later if still running."""
    stops = iter([signal.SIGINT, signal.SIGKILL])

    def stop(*_):
        proc.send_signal(next(stops, signal.SIGKILL))
        signal.setitimer(signal.ITIMER_REAL, 30)
    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, time_limit)


def read_lines(path, limit=None):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[:limit] if limit else lines


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def piece_stats(path):
    """Pieces per line of an encoded file: max, mean, and lines over 150/200/250 pieces."""
    lengths = [len(line.split()) for line in read_lines(path)]
    return {"lines": len(lengths), "max": max(lengths), "mean": round(sum(lengths) / len(lengths), 1),
            **{f"over_{n}": sum(x > n for x in lengths) for n in (150, 200, 250)}}


def subwords(args, r, results):
    """Sentencepiece trained on the training files only (one model per language, or one joint
    model with ``--joint``); every file encoded once. Returns ``(spm, paths)``: the models by
    side and the encoded files (``train.src``, ..., ``test.src``); the raw test source and
    references in WORK/data; the pieces per line in `results`."""
    W = lambda *parts: os.path.join(args.work, *parts)
    test_src, test_ref = (read_lines(f, args.test_lines) for f in args.test)
    if len(test_src) != len(test_ref):
        sys.exit(f"--test: {len(test_src)} source lines, {len(test_ref)} reference lines")
    if any(not s.strip() for s in test_src):
        sys.exit("--test: empty source lines (a translator would skip them)")
    write_lines(W("data", "test.raw.src"), test_src)
    write_lines(W("data", "test.ref"), test_ref)
    spm = {"src": W("spm", f"{args.src_lang}.model"), "tgt": W("spm", f"{args.tgt_lang}.model")}
    if args.joint:
        spm = dict.fromkeys(spm, W("spm", f"{args.src_lang}{args.tgt_lang}.model"))
        r.run(r.helper("spm_train.py", spm["src"][:-6], args.vocab_size, args.threads, *args.train))
    else:
        for side, path in zip(("src", "tgt"), args.train):
            r.run(r.helper("spm_train.py", spm[side][:-6], args.vocab_size, args.threads, path))
    plan = [("train", "src", args.train[0]), ("train", "tgt", args.train[1]),
            ("dev", "src", args.dev[0]), ("dev", "tgt", args.dev[1]),
            ("test", "src", W("data", "test.raw.src"))]
    paths = {}
    for split, side, path in plan:
        paths[f"{split}.{side}"] = W("data", f"{split}.sp.{side}")
        r.run(r.helper("spm_encode.py", spm[side], path, paths[f"{split}.{side}"]))
    results["pieces_per_line"] = {f"{s}.{d}": piece_stats(paths[f"{s}.{d}"]) for s, d, _ in plan}
    long_pairs = sum(max(len(a.split()), len(b.split())) > 150 for a, b in
                     zip(read_lines(paths["train.src"]), read_lines(paths["train.tgt"])))
    print(f"pieces per line: {json.dumps(results['pieces_per_line'])}; training pairs over 150 "
          f"pieces on either side: {long_pairs} (none filtered)", flush=True)
    return spm, paths


def score(args, r, hyp_pieces, spm_tgt, name, out=None):
    """Decode `hyp_pieces` with the target model into WORK/NAME.LANG and score it against the
    test references (sacreBLEU's defaults: 13a, cased) into WORK/OUT (NAME.score.json): the
    scores with their signatures."""
    W = lambda *parts: os.path.join(args.work, *parts)
    hyp, out = W(f"{name}.{args.tgt_lang}"), W(out or f"{name}.score.json")
    r.run(r.helper("spm_decode.py", spm_tgt, hyp_pieces, hyp))
    r.run(r.helper("score.py", hyp, W("data", "test.ref"), out))
    with open(out) as f:
        return json.load(f)


def throughput(reports, started):
    """Steady rates between the first and the last report, and the start-up seconds (from
    ``started``, the process's start, to step 0 at the steady rate). `reports`: ``(step, real
    source tokens, real target tokens, time)`` tuples, the tokens of the updates since the
    report before (the first report's are not counted: its interval holds the start-up)."""
    if len(reports) < 2:
        return None
    (s0, _, _, t0), (s1, _, _, t1) = reports[0], reports[-1]
    steps, secs = s1 - s0, max(t1 - t0, 1e-9)
    src, tgt = sum(r[1] for r in reports[1:]), sum(r[2] for r in reports[1:])
    rate = steps / secs
    return {"steps_per_second": round(rate, 4), "src_tokens_per_second": round(src / secs, 1),
            "tgt_tokens_per_second": round(tgt / secs, 1),
            "src_tgt_tokens_per_second": round((src + tgt) / secs, 1),
            "src_tgt_tokens_per_step": round((src + tgt) / steps, 1),
            "startup_seconds": round(t0 - started - s0 / rate, 1),
            "measured_steps": [s0, s1], "measured_seconds": round(secs)}


def calibration(args, results, rates, rss):
    """--calibrate's end: the steps that fit ``--minutes``, printed and written."""
    if not rates:
        sys.exit(f"too few training reports in {args.calibrate:.0f} s to measure (two are needed): "
                 f"give a longer --calibrate; see {os.path.join(args.work, 'train.log')}")
    budget = args.minutes * 60
    rates["steps_for_budget"] = int(rates["steps_per_second"] * (budget - rates["startup_seconds"]))
    results["calibration"] = rates
    dump(results, os.path.join(args.work, "results.json"))
    print(f"calibration: {rates['steps_per_second']:.3f} steps/s, "
          f"{rates['src_tgt_tokens_per_second']:.0f} source+target tokens/s "
          f"({rates['src_tokens_per_second']:.0f} + {rates['tgt_tokens_per_second']:.0f}, "
          f"{rates['src_tgt_tokens_per_step']:.0f} a step), start-up {rates['startup_seconds']:.0f} s, "
          f"peak RSS {rss:.0f} MiB; {args.minutes:g} minutes: --steps {rates['steps_for_budget']}")
    return results


def curve_row(name, updates, seconds, startup, scores, tokens_per_sec, peak_rss_mib, settings):
    """One checkpoint's row: `seconds` from the training command's start to the checkpoint,
    `startup` the seconds before its first update."""
    return {"checkpoint": name, "updates": updates,
            "minutes": round(max(seconds - (startup or 0), 0) / 60, 2),
            "wall_minutes": round(seconds / 60, 2), "bleu": round(scores["bleu"], 2),
            "chrf": round(scores["chrf"], 2), "tokens_per_sec": tokens_per_sec,
            "peak_rss_gb": round(peak_rss_mib / 1024, 2) if peak_rss_mib else None,
            "settings": settings}


def say_row(row):
    """A curve row's one line, as it lands."""
    print(f"  {row['checkpoint']}: {row['minutes']:.1f} min, BLEU {row['bleu']:.2f} "
          f"chrF {row['chrf']:.2f}", flush=True)


def report(args, r, results, curve):
    """A peer run's end: ``curve()``'s rows into WORK/curve.json (with ``--score-checkpoints``),
    the commands and everything into WORK/results.json, and one line."""
    if args.score_checkpoints:
        results["curve"] = curve()
        dump(results["curve"], os.path.join(args.work, "curve.json"))
    results["commands"] = r.commands
    dump(results, os.path.join(args.work, "results.json"))
    print(f"{results['direction']}: BLEU {results['bleu']:.2f} chrF {results['chrf']:.2f} after "
          f"{results['steps']} updates, {results['train_seconds']:.0f} s of training; "
          f"{os.path.join(args.work, 'results.json')}")
    return results


def tokens_per_sec_until(reports, step, started):
    """Real source+target tokens a second between the first report and the last one at or
    before `step` (None with fewer than two)."""
    rates = throughput([rep for rep in reports if rep[0] <= step], started)
    return rates and rates["src_tgt_tokens_per_second"]


def curve_settings(args, toolkit, **extra):
    """The settings each curve row carries: what makes two rows comparable."""
    return {"toolkit": toolkit, "direction": f"{args.src_lang}-{args.tgt_lang}",
            "beam": args.beam, "threads": args.threads, "vocab_size": args.vocab_size,
            "joint": args.joint, "steps": args.steps, "minutes_budget": args.minutes,
            "save_every": args.save_every, "test_lines": args.test_lines,
            "tokens_per_sec_counts": "real source+target tokens a second of training", **extra}


def dump(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def with_average(rows, found, results):
    """The curve's `rows`, and a last row for the average of the last checkpoints where more
    than one was averaged (its BLEU and chrF the run's own)."""
    if found and len(results["checkpoints_averaged"]) > 1:
        rows.append(dict(rows[-1], checkpoint="average of " + ", ".join(
            results["checkpoints_averaged"]), bleu=round(results["bleu"], 2),
            chrf=round(results["chrf"], 2)))
    return rows
