#!/usr/bin/env python
"""OpenNMT-py 3.5 as a peer: the `hour` preset's Transformer trained, averaged, translated with
beam 4 and scored with sacreBLEU, on the same files, CPU and minutes as the package.

    python scripts/peer_opennmt.py --venv /work/peers/onmt \\
        --train train.en train.de --dev dev.en dev.de --test test.en test.de \\
        --src-lang en --tgt-lang de --work runs/onmt_ende --steps N
    ... --work runs/onmt_calib --calibrate 120      # N: steps/s on this machine, then stop

The script itself needs only the standard library: every step runs in the venv given by
``--venv`` (``pip install OpenNMT-py==3.5.1 'torch==2.2.*' 'numpy<2' sentencepiece sacrebleu``),
as a command recorded in ``WORK/results.json`` (helper scripts are written to ``WORK/bin``), so
each step can be rerun by hand. Other direction: swap the files of each pair and the languages.

1. Subwords: one sentencepiece unigram model per language, ``--vocab-size`` (4,000) pieces,
   trained on the training files only, with the package's settings (``character_coverage=1.0``,
   ``byte_fallback``): separate vocabularies like the `hour` preset (``tie_embeddings`` none),
   so both models spend the same embedding and softmax sizes; a joint model pays only with
   tied embeddings (OpenNMT-py's WMT recipe: ``share_vocab`` + ``share_embeddings``), which is
   ``--joint`` here (one model of ``--vocab-size`` pieces on both languages' training text).
   All files are encoded once, before training (OpenNMT-py's on-the-fly ``sentencepiece``
   transform would re-encode every epoch, on the same two cores); no length filter is applied
   (no ``filtertoolong``), so no verse is dropped: the pieces per line are reported.
2. ``onmt_build_vocab`` on the encoded training files (every line).
3. ``onmt_train``: 2+2 layers, d_model 256, FFN 1024, 4 heads, dropout 0.1 (also attention),
   label smoothing 0.1, sinusoidal positions (interleaved sin/cos, the chapter's), biases in
   attention and FFN (OpenNMT-py 3's defaults drop them; the paper's model has them), Adam
   beta2 0.98, the noam schedule with the `hour` preset's peak 0.002 after 400 warmup steps
   (``learning_rate = peak * sqrt(d_model * warmup)``), Glorot initialisation, loss normalised
   per token, no gradient clipping (OpenNMT-py's Transformer recipe); batches of ``--batch-tokens``
   (4,096) padded tokens (OpenNMT-py counts sentences times the longer side's length: ~7,000
   real source+target tokens a batch here), about half the package's ~7,680 a side, because the
   two cores take a few seconds a batch, so that an hour is ~1,000+ updates (a CPU's cost per
   token hardly depends on the batch at these sizes); no data loader workers (they would take
   the cores from training), one bucket per epoch (``bucket_size`` = the training lines, sorted
   by length, its batches shuffled: OpenNMT-py's default of 262,144 examples would fill its
   first bucket with nine passes over this corpus), ``--threads`` (2) OMP/MKL threads, no GPU
   (``CUDA_VISIBLE_DEVICES=``). Differences that are the toolkit's own: pre-norm layers with a
   final layer norm (the package is post-norm), Adam epsilon 1e-8 (fixed in OpenNMT-py; the
   package 1e-9), duplicate sources within one batch dropped (OpenNMT-py's batcher).
   A checkpoint every ``--save-every`` steps (a tenth of the run), dev validation (loss,
   accuracy) every ``--valid-every`` (a fifth).
4. The last ``--average`` (3) checkpoints averaged (``onmt_average_models``), as the package's
   hour recipe averages its last epochs; ``--average 1`` translates the last checkpoint.
5. ``onmt_translate`` of the test source: beam ``--beam`` (4), OpenNMT-py's default length
   penalty (``avg``), ``--translate-batch`` (32) sentences a batch, at most
   ``min(512, 2 x the batch's longest source + 5)`` pieces; pieces decoded with the target
   model; sacreBLEU BLEU and chrF (defaults: 13a, cased) against the raw reference lines.
   ``--test-lines K`` keeps the first K (smoke tests).

``--calibrate S`` prepares as above, trains for about S seconds (no validation, no checkpoint),
stops, and prints steps/s and real (unpadded) source+target tokens/s between the first and the
last report (the first report's interval holds the start-up), the start-up seconds and the
steps that fit a 60-minute training (``--minutes``): ``--steps`` for the comparison.
Writes ``WORK/results.json``: scores and signatures, ``train_seconds`` (wall clock of
``onmt_train`` only), steps, tokens/s, the peak RSS of the training process, versions, the
pieces per line, the config and the commands with their seconds.
"""

import argparse
import json
import os
import re
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
    "versions.py": '''import json, platform
import ctranslate2, onmt, sacrebleu, sentencepiece, torch
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "opennmt_py": onmt.__version__, "sentencepiece": sentencepiece.__version__,
                  "sacrebleu": sacrebleu.__version__, "torch_threads": torch.get_num_threads(),
                  "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}))
''',
}
REPORT = re.compile(r"\[([\d-]+ [\d:]+),\d+ INFO\] Step\s+(\d+)(?:/\s*\d+)?; acc:.*?"
                    r"bsz:\s*(\d+)/\s*(\d+)/\s*(\d+);")  # time, step, src/tgt/sentences a batch
VALID = re.compile(r"Validation (perplexity|accuracy|xent): ([\d.]+)")


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
        if time_limit is not None:  # SIGINT at the limit, SIGKILL 30 s later if still running
            stops = iter([signal.SIGINT, signal.SIGKILL])

            def stop(*_):
                proc.send_signal(next(stops, signal.SIGKILL))
                signal.setitimer(signal.ITIMER_REAL, 30)
            signal.signal(signal.SIGALRM, stop)
            signal.setitimer(signal.ITIMER_REAL, time_limit)
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


def yaml_value(v):
    return json.dumps(v)  # JSON scalars and lists are YAML


def write_config(path, options):
    """A flat YAML file; ``data`` is the one nested mapping OpenNMT-py expects."""
    lines = []
    for key, value in options.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            for name, corpus in value.items():
                lines.append(f"    {name}:")
                lines.extend(f"        {k}: {yaml_value(v)}" for k, v in corpus.items())
        else:
            lines.append(f"{key}: {yaml_value(value)}")
    write_lines(path, lines)


def config(args, paths, steps, calibrate, bucket):
    d, warmup = 256, args.warmup
    shared = {"share_vocab": True, "share_embeddings": True, "share_decoder_embeddings": True} \
        if args.joint else {}
    return {
        "data": {"corpus_1": {"path_src": paths["train.src"], "path_tgt": paths["train.tgt"]},
                 "valid": {"path_src": paths["dev.src"], "path_tgt": paths["dev.tgt"]}},
        "src_vocab": paths["vocab.src"], "tgt_vocab": paths["vocab.tgt"], **shared,
        "save_data": os.path.join(args.work, "onmt"), "overwrite": True,
        "save_model": os.path.join(args.work, "checkpoints", "model"),
        "save_checkpoint_steps": 0 if calibrate else args.save_every,
        "keep_checkpoint": max(args.average, 1),
        "train_steps": steps, "valid_steps": 10 ** 9 if calibrate else args.valid_every,
        "report_every": 5 if calibrate else 50, "seed": args.seed, "num_workers": 0,
        "bucket_size": bucket,
        "encoder_type": "transformer", "decoder_type": "transformer",
        "enc_layers": 2, "dec_layers": 2, "hidden_size": d, "word_vec_size": d,
        "transformer_ff": 1024, "heads": 4, "dropout": [0.1], "attention_dropout": [0.1],
        "position_encoding": True, "position_encoding_type": "SinusoidalInterleaved",
        "add_qkvbias": True, "add_ffnbias": True,
        "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.98, "decay_method": "noam",
        "learning_rate": round(args.peak_lr * (d * warmup) ** 0.5, 6), "warmup_steps": warmup,
        "label_smoothing": 0.1, "max_grad_norm": 0, "param_init": 0, "param_init_glorot": True,
        "normalization": "tokens", "accum_count": [1], "batch_type": "tokens",
        "batch_size": args.batch_tokens, "valid_batch_size": args.batch_tokens,
        "model_dtype": "fp32",
    }


def parse_reports(log_text):
    """(step, src tokens/batch, tgt tokens/batch, epoch time) of each training report."""
    return [(int(m[2]), int(m[3]), int(m[4]), time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")))
            for m in REPORT.finditer(log_text)]


def throughput(reports, report_every, started):
    """Steady rates between the first and the last report, and the start-up seconds (from
    ``started``, the process's start, to step 0 at the steady rate)."""
    if len(reports) < 2:
        return None
    (s0, _, _, t0), (s1, _, _, t1) = reports[0], reports[-1]
    steps, secs = s1 - s0, max(t1 - t0, 1e-9)
    src = sum(r[1] * report_every for r in reports[1:])
    tgt = sum(r[2] * report_every for r in reports[1:])
    rate = steps / secs
    return {"steps_per_second": round(rate, 4), "src_tokens_per_second": round(src / secs, 1),
            "tgt_tokens_per_second": round(tgt / secs, 1),
            "src_tgt_tokens_per_second": round((src + tgt) / secs, 1),
            "src_tgt_tokens_per_step": round((src + tgt) / steps, 1),
            "startup_seconds": round(t0 - started - s0 / rate, 1),
            "measured_steps": [s0, s1], "measured_seconds": round(secs)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", required=True, help="the virtual environment with OpenNMT-py")
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
    p.add_argument("--minutes", type=float, default=60, help="the budget --calibrate sizes")
    p.add_argument("--vocab-size", type=int, default=4000)
    p.add_argument("--joint", action="store_true",
                   help="one sentencepiece model and vocabulary, all embeddings tied")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="padded tokens a batch (sentences x longer side)")
    p.add_argument("--peak-lr", type=float, default=0.002)
    p.add_argument("--warmup", type=int, default=400)
    p.add_argument("--save-every", type=int, help="checkpoint interval (steps // 10)")
    p.add_argument("--valid-every", type=int, help="dev validation interval (steps // 5)")
    p.add_argument("--average", type=int, default=3, help="average the last K checkpoints")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--translate-batch", type=int, default=32, help="sentences a batch")
    p.add_argument("--test-lines", type=int, help="score the first K test lines only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.steps is not None:
        args.save_every = args.save_every or max(1, args.steps // 10)
        args.valid_every = args.valid_every or max(1, args.steps // 5)
    args.venv, args.work = os.path.abspath(args.venv), os.path.abspath(args.work)
    if not os.path.exists(os.path.join(args.venv, "bin", "onmt_train")):
        p.error(f"no onmt_train in {args.venv}/bin: install OpenNMT-py there")
    if os.path.isdir(args.work) and os.listdir(args.work):
        p.error(f"--work {args.work} is not empty")
    for sub in ("bin", "data", "spm", "checkpoints"):
        os.makedirs(os.path.join(args.work, sub), exist_ok=True)
    for name, text in HELPERS.items():
        with open(os.path.join(args.work, "bin", name), "w") as f:
            f.write(text)
    r = Runner(args.venv, args.work, args.threads)
    W = lambda *parts: os.path.join(args.work, *parts)
    results = {"toolkit": "OpenNMT-py", "direction": f"{args.src_lang}-{args.tgt_lang}",
               "args": dict(vars(args)), "env": r.env_note}
    results["versions"] = json.loads(r.run(r.helper("versions.py"), capture=True)[0])

    # 1. sentencepiece, trained on the training files only; every file encoded once
    test_src, test_ref = (read_lines(f, args.test_lines) for f in args.test)
    if len(test_src) != len(test_ref):
        sys.exit(f"--test: {len(test_src)} source lines, {len(test_ref)} reference lines")
    if any(not s.strip() for s in test_src):
        sys.exit("--test: empty source lines (onmt_translate would skip them)")
    write_lines(W("data", "test.raw.src"), test_src)
    write_lines(W("data", "test.ref"), test_ref)
    spm = {"src": W("spm", f"{args.src_lang}.model"), "tgt": W("spm", f"{args.tgt_lang}.model")}
    if args.joint:
        spm = dict.fromkeys(spm, W("spm", f"{args.src_lang}{args.tgt_lang}.model"))
        r.run(r.helper("spm_train.py", spm["src"][:-6], args.vocab_size, args.threads, *args.train))
    else:
        for side, path in zip(("src", "tgt"), args.train):
            r.run(r.helper("spm_train.py", spm[side][:-6], args.vocab_size, args.threads, path))
    paths = {"vocab.src": W("vocab.src"), "vocab.tgt": W("vocab.src" if args.joint else "vocab.tgt")}
    plan = [("train", "src", args.train[0]), ("train", "tgt", args.train[1]),
            ("dev", "src", args.dev[0]), ("dev", "tgt", args.dev[1]),
            ("test", "src", W("data", "test.raw.src"))]
    for split, side, path in plan:
        paths[f"{split}.{side}"] = W("data", f"{split}.sp.{side}")
        r.run(r.helper("spm_encode.py", spm[side], path, paths[f"{split}.{side}"]))
    results["pieces_per_line"] = {f"{s}.{d}": piece_stats(paths[f"{s}.{d}"]) for s, d, _ in plan}
    long_pairs = sum(max(len(a.split()), len(b.split())) > 150 for a, b in
                     zip(read_lines(paths["train.src"]), read_lines(paths["train.tgt"])))
    print(f"pieces per line: {json.dumps(results['pieces_per_line'])}; training pairs over 150 "
          f"pieces on either side: {long_pairs} (none filtered)", flush=True)

    # 2-3. vocabulary, config, training
    steps = 10 ** 7 if args.calibrate else args.steps
    bucket = results["pieces_per_line"]["train.src"]["lines"]
    options = config(args, paths, steps, args.calibrate is not None, bucket)
    cfg_path = W("config.yaml")
    write_config(cfg_path, options)
    results["config"] = options
    r.run([r.tool("onmt_build_vocab"), "-config", cfg_path, "-n_sample", -1,
           "-num_threads", args.threads], log=W("build_vocab.log"), echo=lambda line: False)
    report_every = options["report_every"]
    echo = lambda line: ("Step " in line or "Validation" in line or "Saving" in line
                         or "Error" in line or "parameters" in line
                         or ("Traceback" in line and not args.calibrate))  # calibrate: SIGINT
    log_text, train_seconds, rss = r.run([r.tool("onmt_train"), "-config", cfg_path],
                                         log=W("train.log"), capture=True, echo=echo,
                                         time_limit=args.calibrate)
    reports = parse_reports(log_text)
    rates = throughput(reports, report_every, r.started)
    results.update(train_seconds=round(train_seconds, 1), peak_rss_train_mib=round(rss, 1),
                   steps=args.steps or (reports[-1][0] if reports else 0), throughput=rates)
    if reports:
        per_step = sum(src + tgt for _, src, tgt, _ in reports) / len(reports)
        results["src_tgt_tokens_per_second_wall"] = round(per_step * results["steps"] / train_seconds, 1)
    valid = VALID.findall(log_text)
    results["last_validation"] = {k: float(v) for k, v in valid[-3:]} if valid else None
    results["commands"] = r.commands
    if args.calibrate:
        if not rates:
            sys.exit(f"too few training reports in {args.calibrate:.0f} s to measure: see {W('train.log')}")
        budget = args.minutes * 60
        rates["steps_for_budget"] = int(rates["steps_per_second"] * (budget - rates["startup_seconds"]))
        results["calibration"] = rates
        dump(results, W("results.json"))
        print(f"calibration: {rates['steps_per_second']:.3f} steps/s, "
              f"{rates['src_tgt_tokens_per_second']:.0f} source+target tokens/s "
              f"({rates['src_tokens_per_second']:.0f} + {rates['tgt_tokens_per_second']:.0f}, "
              f"{rates['src_tgt_tokens_per_step']:.0f} a step), start-up {rates['startup_seconds']:.0f} s, "
              f"peak RSS {rss:.0f} MiB; {args.minutes:g} minutes: --steps {rates['steps_for_budget']}")
        return results

    # 4. average the last checkpoints
    found = sorted((int(m[1]), f) for f in os.listdir(W("checkpoints"))
                   if (m := re.fullmatch(r"model_step_(\d+)\.pt", f)))
    last = [W("checkpoints", f) for _, f in found[-max(args.average, 1):]]
    model = last[-1]
    if len(last) > 1:
        model = W("checkpoints", "averaged.pt")
        r.run([r.tool("onmt_average_models"), "-models", *last, "-output", model])
    results["checkpoints_averaged"] = [os.path.basename(f) for f in last]

    # 5. translate, decode, score
    hyp_sp, hyp = W("test.hyp.sp"), W(f"test.hyp.{args.tgt_lang}")
    _, results["translate_seconds"], _ = r.run(
        [r.tool("onmt_translate"), "-model", model, "-src", paths["test.src"], "-output", hyp_sp,
         "-beam_size", args.beam, "-batch_type", "sents", "-batch_size", args.translate_batch,
         "-max_length", 512, "-max_length_ratio", 2, "-gpu", -1, "-seed", args.seed],
        log=W("translate.log"), echo=lambda line: "PRED" in line or "Error" in line)
    r.run(r.helper("spm_decode.py", spm["tgt"], hyp_sp, hyp))
    r.run(r.helper("score.py", hyp, W("data", "test.ref"), W("score.json")))
    with open(W("score.json")) as f:
        results.update(json.load(f))
    results["commands"] = r.commands
    dump(results, W("results.json"))
    print(f"{results['direction']}: BLEU {results['bleu']:.2f} chrF {results['chrf']:.2f} after "
          f"{results['steps']} steps, {results['train_seconds']:.0f} s of training; {W('results.json')}")
    return results


def dump(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
