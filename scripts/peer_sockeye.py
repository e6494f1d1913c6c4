#!/usr/bin/env python
"""Sockeye 3.1 as a peer: the `hour` preset's Transformer trained, averaged, translated with
beam 4 and scored with sacreBLEU, on the same files, CPU and minutes as the package and
scripts/peer_opennmt.py.

    python scripts/peer_sockeye.py --venv /work/peers/sockeye \\
        --train train.en train.de --dev dev.en dev.de --test test.en test.de \\
        --src-lang en --tgt-lang de --work runs/sockeye_ende --steps N
    ... --work runs/sockeye_calib --calibrate 120    # N: steps/s on this machine, then stop

The script needs only the standard library and scripts/peer_common.py beside it; every step
runs in the venv given by ``--venv``: Sockeye 3.1.34 needs PyTorch below 1.14, so Python 3.10
(``python3.10 -m venv VENV && VENV/bin/pip install torch==1.13.1 sockeye==3.1.34 sentencepiece
sacrebleu``: PyPI's torch 1.13.1 wheel is the CUDA one, which runs on the CPU). Each command is
recorded in ``WORK/results.json``; other direction: swap the files of each pair and the
languages.

1. Subwords as scripts/peer_opennmt.py (peer_common.py): one sentencepiece unigram model per
   language of ``--vocab-size`` (4,000) pieces on the training files, every file encoded once,
   no length filter (``--max-seq-len`` is the longest encoded line: no verse dropped).
   Sockeye builds its vocabularies from the encoded training files (``--joint``: one joint
   sentencepiece model, ``--shared-vocab``, all embeddings tied).
2. ``sockeye-train`` (on the text files: no ``sockeye-prepare-data`` step): 2+2 layers,
   d_model 256 (``--transformer-model-size``, ``--num-embed``), FFN 1024, 4 heads, fixed
   sinusoidal positions, dropout 0.1 on the embeddings with positions, attention and every
   sublayer's output (``--transformer-dropout-prepost``), none inside the FFN (the package's
   FFN has none), label smoothing 0.1, separate embeddings and softmax (``--weight-tying-type
   none``, the `hour` preset's), Adam beta2 0.98 epsilon 1e-9 (the package's), the inverse
   square root schedule (``inv-sqrt-decay``: ``lr x min(1, t / warmup) / sqrt(max(t,
   warmup))``, so ``--initial-learning-rate`` = peak x sqrt(warmup): the peak 0.002 after 400
   updates), no gradient clipping, batches of about ``--batch-tokens`` (4,096) target tokens
   (``--batch-type word``), ``--threads`` (2) OMP/MKL threads, ``--use-cpu``. The toolkit's
   own: pre-norm layers with a final layer norm (Sockeye's default, as OpenNMT-py; the package
   is post-norm). ``--max-updates`` = ``--steps``, no early stopping, a checkpoint (with dev
   perplexity, no dev decoding) every ``--save-every`` updates (a tenth; ``--checkpoint-minutes
   M``: ``--steps`` x M / ``--minutes``), every one kept (``--keep-last-params -1``).
3. ``sockeye-average --strategy last -n K`` of the last ``--average`` (3) checkpoints, written
   as a model directory of its own (WORK/average: the model's files linked, ``params.best`` the
   average); ``--average 1``: the last checkpoint.
4. ``sockeye-translate --beam-size`` ``--beam`` (4), Sockeye's default length penalty (alpha
   1.0), ``--translate-batch`` (32) sentences a batch; pieces decoded, sacreBLEU BLEU and chrF
   against the raw references. ``--test-lines K``: the first K (smoke tests).
5. ``--score-checkpoints`` (a curve): each checkpoint translated and scored as in 4, one row
   each in ``WORK/curve.json`` (peer_common.py), the average's last.

``--calibrate S`` trains about S seconds (no checkpoint) and prints steps/s, real source+target
tokens/s (the training data's tokens over its batches an epoch, times the updates/s) and the
steps that fit ``--minutes``: ``--steps`` for the comparison.
"""

import os
import re
import time

import peer_common as pc

VERSIONS = '''import json, platform
import sacrebleu, sentencepiece, sockeye, torch
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "sockeye": sockeye.__version__, "sentencepiece": sentencepiece.__version__,
                  "sacrebleu": sacrebleu.__version__, "torch_threads": torch.get_num_threads()}))
'''
# the training log (MODEL/log): time, epoch, batches, samples/s, padded source tokens/s, updates/s
REPORT = re.compile(r"^\[(\d{4}-\d\d-\d\d:\d\d:\d\d:\d\d):INFO:sockeye\.training:\w+\] "
                    r"E=(\d+) B=(\d+)\s+s/sec=([\d.]+) tok/sec=([\d.]+) u/sec=([\d.]+)", re.M)
TOKENS = re.compile(r"Tokens: source (\d+) target (\d+)")
BUCKET = re.compile(r"Bucket \([^)]*\): \d+ samples in (\d+) batches of")
TRAINING_DATA, VALIDATION_DATA = "Creating training data iterator", "Creating validation data iterator"
CHECKPOINT = re.compile(r"params\.(\d{5})")
UPDATES = re.compile(r"Checkpoint \[(\d+)\]\s+Updates=(\d+)")
VALID = re.compile(r"Checkpoint \[(\d+)\]\s+Validation-(\S+)=([\d.]+)")


def read_log(args):
    """Sockeye's log file (WORK/model/log): the console's lines with their times."""
    with open(os.path.join(args.work, "model", "log"), encoding="utf-8") as f:
        return f.read()


def get_parser():
    p = pc.base_parser(__doc__, "Sockeye 3.1")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="about this many target tokens a batch (--batch-type word)")
    return p


def train_argv(args, r, paths, max_len, steps):
    """``sockeye-train``'s command line (every option of Sockeye 3.1.34's)."""
    d, every = 256, 10 ** 7 if args.calibrate else args.save_every
    tying = ["--shared-vocab", "--weight-tying-type", "src_trg_softmax"] if args.joint \
        else ["--weight-tying-type", "none"]
    return [
        r.tool("sockeye-train"), "--source", paths["train.src"], "--target", paths["train.tgt"],
        "--validation-source", paths["dev.src"], "--validation-target", paths["dev.tgt"],
        "--output", os.path.join(args.work, "model"), "--overwrite-output",
        "--max-seq-len", f"{max_len}:{max_len}", *tying,
        "--encoder", "transformer", "--decoder", "transformer", "--num-layers", "2:2",
        "--transformer-model-size", d, "--num-embed", f"{d}:{d}",
        "--transformer-attention-heads", 4, "--transformer-feed-forward-num-hidden", 1024,
        "--transformer-positional-embedding-type", "fixed",
        "--transformer-dropout-attention", 0.1, "--transformer-dropout-prepost", 0.1,
        "--transformer-dropout-act", 0.0, "--embed-dropout", "0.0:0.0",
        "--label-smoothing", 0.1, "--optimizer", "adam", "--optimizer-betas", "0.9:0.98",
        "--optimizer-eps", 1e-9, "--initial-learning-rate", round(args.peak_lr * args.warmup ** 0.5, 6),
        "--learning-rate-scheduler-type", "inv-sqrt-decay", "--learning-rate-warmup", args.warmup,
        "--gradient-clipping-type", "none",
        "--batch-type", "word", "--batch-size", args.batch_tokens,
        "--batch-sentences-multiple-of", 1,
        "--checkpoint-interval", every, "--max-updates", steps, "--keep-last-params", -1,
        "--max-num-checkpoint-not-improved", -1, "--decode-and-evaluate", 0,
        "--seed", args.seed, "--use-cpu", "--dtype", "float32",
    ]


def parse_reports(log_text, report_every=50):
    """``(update, real source tokens, real target tokens, time)`` of each speed report: the
    tokens of the ``report_every`` updates before it, at the training data's mean real tokens
    an update (its tokens over its batches an epoch; Sockeye's own tok/sec counts padded source
    tokens only)."""
    start = log_text.find(TRAINING_DATA)
    end = log_text.find(VALIDATION_DATA, start)
    train_part = log_text[start:end if end >= 0 else None]
    tokens, batches = TOKENS.search(train_part), sum(map(int, BUCKET.findall(train_part)))
    src, tgt = (int(tokens[1]) / batches, int(tokens[2]) / batches) if tokens and batches else (0, 0)
    return [(int(m[3]), round(src * report_every), round(tgt * report_every),
             time.mktime(time.strptime(m[1], "%Y-%m-%d:%H:%M:%S")))
            for m in REPORT.finditer(log_text)]


def main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)
    r, results = pc.finish_args(p, args, "sockeye-train", VERSIONS)
    results = {"toolkit": "Sockeye", **results}
    W = lambda *parts: os.path.join(args.work, *parts)
    spm, paths = pc.subwords(args, r, results)
    rss, reports, started = train_model(args, r, paths, results)
    if args.calibrate:
        return pc.calibration(args, results, pc.throughput(reports, started), rss)
    found = sorted((int(m[1]), W("model", f)) for f in os.listdir(W("model"))
                   if (m := CHECKPOINT.fullmatch(f)) and int(m[1]) > 0)  # 0: the initialisation
    model, checkpoint = average(args, r, found, results)
    hyp_sp, results["translate_seconds"] = translate(args, r, paths, model, checkpoint,
                                                     "test.hyp", "translate.log")
    results.update(pc.score(args, r, hyp_sp, spm["tgt"], "test.hyp", "score.json"))
    return pc.report(args, r, results,
                     lambda: curve(args, r, paths, spm, found, reports, started, rss, results))


def train_model(args, r, paths, results):
    """``sockeye-train``: returns its peak RSS (MiB), its speed reports and its start."""
    stats = results["pieces_per_line"]
    max_len = max(stats[k]["max"] for k in ("train.src", "train.tgt", "dev.src", "dev.tgt")) + 1
    argv = train_argv(args, r, paths, max_len, 10 ** 7 if args.calibrate else args.steps)
    results["train_argv"] = [str(a) for a in argv]
    echo = lambda line: ("E=" in line or "Checkpoint [" in line or "Error" in line
                         or "discarded" in line or "parameters" in line.lower()
                         or ("Traceback" in line and not args.calibrate))
    log_text, train_seconds, rss = r.run(argv, log=os.path.join(args.work, "train.log"),
                                         capture=True, echo=echo, time_limit=args.calibrate)
    started = r.started
    reports = parse_reports(read_log(args))
    results.update(train_seconds=round(train_seconds, 1), peak_rss_train_mib=round(rss, 1),
                   steps=args.steps or (reports[-1][0] if reports else 0),
                   throughput=pc.throughput(reports, started))
    valid = VALID.findall(log_text)
    results["last_validation"] = {k: float(v) for _, k, v in valid if _ == valid[-1][0]} \
        if valid else None
    results["commands"] = r.commands
    return rss, reports, started


def average(args, r, found, results):
    """The last ``--average`` checkpoints averaged into WORK/average (a model directory of
    links and the average as ``params.best``): returns the model directory and the checkpoint
    to translate (None: its ``params.best``)."""
    last = found[-max(args.average, 1):]
    results["checkpoints_averaged"] = [os.path.basename(f) for _, f in last]
    model = os.path.join(args.work, "model")
    if len(last) == 1:
        return model, last[0][0]
    avg = os.path.join(args.work, "average")
    os.makedirs(avg)
    for name in os.listdir(model):
        if not name.startswith("params.") and name not in ("log", "training_state"):
            os.symlink(os.path.join(model, name), os.path.join(avg, name))
    r.run([r.tool("sockeye-average"), "--output", os.path.join(avg, "params.best"),
           *[f for _, f in last]])
    return avg, None


def translate(args, r, paths, model, checkpoint, name, log):
    """``sockeye-translate`` of the encoded test source with `model` (its ``params.best``, or
    `checkpoint`) into WORK/NAME.sp: returns the file and the seconds it took."""
    hyp_sp = os.path.join(args.work, f"{name}.sp")
    which = ["--checkpoints", checkpoint] if checkpoint is not None else []
    _, seconds, _ = r.run(
        [r.tool("sockeye-translate"), "--models", model, *which, "--input", paths["test.src"],
         "--output", hyp_sp, "--beam-size", args.beam, "--batch-size", args.translate_batch,
         "--use-cpu", "--seed", args.seed],
        log=os.path.join(args.work, log), echo=lambda line: "Error" in line)
    return hyp_sp, seconds


def curve(args, r, paths, spm, found, reports, started, rss, results):
    """One row per checkpoint (its params file's time is when it was written), then the
    average's (at the last checkpoint's time)."""
    startup = (results["throughput"] or {}).get("startup_seconds")
    settings = pc.curve_settings(args, "Sockeye", batch_tokens=args.batch_tokens)
    rows, model = [], os.path.join(args.work, "model")
    updates = {int(c): int(u) for c, u in UPDATES.findall(read_log(args))}
    for number, path in found:
        name = os.path.join("curve", f"checkpoint_{number}")
        hyp_sp, _ = translate(args, r, paths, model, number, name, name + ".log")
        scores = pc.score(args, r, hyp_sp, spm["tgt"], name)
        step = updates.get(number, number * args.save_every)
        rows.append(pc.curve_row(os.path.basename(path), step, os.path.getmtime(path) - started,
                                 startup, scores, pc.tokens_per_sec_until(reports, step, started),
                                 rss, settings))
        pc.say_row(rows[-1])
    return pc.with_average(rows, found, results)


if __name__ == "__main__":
    main()
