#!/usr/bin/env python
"""OpenNMT-py 3.5 as a peer: the `hour` preset's Transformer trained, averaged, translated with
beam 4 and scored with sacreBLEU, on the same files, CPU and minutes as the package.

    python scripts/peer_opennmt.py --venv /work/peers/onmt \\
        --train train.en train.de --dev dev.en dev.de --test test.en test.de \\
        --src-lang en --tgt-lang de --work runs/onmt_ende --steps N
    ... --work runs/onmt_calib --calibrate 120      # N: steps/s on this machine, then stop

The script itself needs only the standard library and scripts/peer_common.py beside it (the
options, subwords, scores and curves every peer script shares): every step runs in the venv
given by ``--venv`` (``pip install OpenNMT-py==3.5.1 'torch==2.2.*' 'numpy<2' sentencepiece
sacrebleu``), as a command recorded in ``WORK/results.json`` (helper scripts are written to
``WORK/bin``), so each step can be rerun by hand. Other direction: swap the files of each pair
and the languages.

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
   A checkpoint every ``--save-every`` steps (a tenth of the run; ``--checkpoint-minutes M``:
   ``--steps`` x M / ``--minutes``), dev validation (loss, accuracy) every ``--valid-every``
   (a fifth).
4. The last ``--average`` (3) checkpoints averaged (``onmt_average_models``), as the package's
   hour recipe averages its last epochs; ``--average 1`` translates the last checkpoint.
5. ``onmt_translate`` of the test source: beam ``--beam`` (4), OpenNMT-py's default length
   penalty (``avg``), ``--translate-batch`` (32) sentences a batch, at most
   ``min(512, 2 x the batch's longest source + 5)`` pieces; pieces decoded with the target
   model; sacreBLEU BLEU and chrF (defaults: 13a, cased) against the raw reference lines.
   ``--test-lines K`` keeps the first K (smoke tests).
6. ``--score-checkpoints`` (a curve): every checkpoint is kept, and each is translated and
   scored as in 5, one row each in ``WORK/curve.json`` (peer_common.py: minutes, updates,
   BLEU, chrF, tokens/s, peak RSS, settings), the average's row last.

``--calibrate S`` prepares as above, trains for about S seconds (no validation, no checkpoint),
stops, and prints steps/s and real (unpadded) source+target tokens/s between the first and the
last report (the first report's interval holds the start-up), the start-up seconds and the
steps that fit a 60-minute training (``--minutes``): ``--steps`` for the comparison.
Writes ``WORK/results.json``: scores and signatures, ``train_seconds`` (wall clock of
``onmt_train`` only), steps, tokens/s, the peak RSS of the training process, versions, the
pieces per line, the config and the commands with their seconds.
"""

import json
import os
import re
import time

import peer_common as pc

VERSIONS = '''import json, platform
import ctranslate2, onmt, sacrebleu, sentencepiece, torch
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "opennmt_py": onmt.__version__, "sentencepiece": sentencepiece.__version__,
                  "sacrebleu": sacrebleu.__version__, "torch_threads": torch.get_num_threads(),
                  "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}))
'''
REPORT = re.compile(r"\[([\d-]+ [\d:]+),\d+ INFO\] Step\s+(\d+)(?:/\s*\d+)?; acc:.*?"
                    r"bsz:\s*(\d+)/\s*(\d+)/\s*(\d+);")  # time, step, src/tgt/sentences a batch
VALID = re.compile(r"Validation (perplexity|accuracy|xent): ([\d.]+)")
CHECKPOINT = re.compile(r"model_step_(\d+)\.pt")


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
    pc.write_lines(path, lines)


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
        "keep_checkpoint": -1 if args.score_checkpoints else max(args.average, 1),
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


def parse_reports(log_text, report_every):
    """(step, src tokens, tgt tokens, time) of each training report: the tokens of the
    ``report_every`` updates before it (OpenNMT-py reports a batch's mean)."""
    return [(int(m[2]), int(m[3]) * report_every, int(m[4]) * report_every,
             time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")))
            for m in REPORT.finditer(log_text)]


def get_parser():
    p = pc.base_parser(__doc__, "OpenNMT-py")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="padded tokens a batch (sentences x longer side)")
    p.add_argument("--valid-every", type=int, help="dev validation interval (steps // 5)")
    return p


def main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)
    if args.steps is not None:
        args.valid_every = args.valid_every or max(1, args.steps // 5)
    r, results = pc.finish_args(p, args, "onmt_train", VERSIONS)
    results = {"toolkit": "OpenNMT-py", **results}
    W = lambda *parts: os.path.join(args.work, *parts)
    # 1. sentencepiece, trained on the training files only; every file encoded once
    spm, paths = pc.subwords(args, r, results)
    paths.update({"vocab.src": W("vocab.src"), "vocab.tgt": W("vocab.src" if args.joint else "vocab.tgt")})
    # 2-3. vocabulary, config, training
    rss, reports, train = train_model(args, r, paths, results)
    if args.calibrate:
        return pc.calibration(args, results, pc.throughput(reports, r.started), rss)
    found = sorted((int(m[1]), W("checkpoints", f)) for f in os.listdir(W("checkpoints"))
                   if (m := CHECKPOINT.fullmatch(f)))
    # 4. average the last checkpoints
    last = [f for _, f in found[-max(args.average, 1):]]
    model = last[-1]
    if len(last) > 1:
        model = W("checkpoints", "averaged.pt")
        r.run([r.tool("onmt_average_models"), "-models", *last, "-output", model])
    results["checkpoints_averaged"] = [os.path.basename(f) for f in last]
    # 5. translate, decode, score
    hyp_sp, results["translate_seconds"] = translate(args, r, paths, model, "test.hyp", "translate.log")
    results.update(pc.score(args, r, hyp_sp, spm["tgt"], "test.hyp", "score.json"))
    # 6. the curve: every kept checkpoint translated and scored
    return pc.report(args, r, results,
                     lambda: curve(args, r, paths, spm, found, reports, train, rss, results))


def train_model(args, r, paths, results):
    """``onmt_build_vocab`` and ``onmt_train``: returns the training's peak RSS (MiB), its
    reports and its start (seconds since the epoch)."""
    W = lambda *parts: os.path.join(args.work, *parts)
    steps = 10 ** 7 if args.calibrate else args.steps
    bucket = results["pieces_per_line"]["train.src"]["lines"]
    options = config(args, paths, steps, args.calibrate is not None, bucket)
    cfg_path = W("config.yaml")
    write_config(cfg_path, options)
    results["config"] = options
    r.run([r.tool("onmt_build_vocab"), "-config", cfg_path, "-n_sample", -1,
           "-num_threads", args.threads], log=W("build_vocab.log"), echo=lambda line: False)
    echo = lambda line: ("Step " in line or "Validation" in line or "Saving" in line
                         or "Error" in line or "parameters" in line
                         or ("Traceback" in line and not args.calibrate))  # calibrate: SIGINT
    log_text, train_seconds, rss = r.run([r.tool("onmt_train"), "-config", cfg_path],
                                         log=W("train.log"), capture=True, echo=echo,
                                         time_limit=args.calibrate)
    started = r.started
    reports = parse_reports(log_text, options["report_every"])
    results.update(train_seconds=round(train_seconds, 1), peak_rss_train_mib=round(rss, 1),
                   steps=args.steps or (reports[-1][0] if reports else 0),
                   throughput=pc.throughput(reports, started))
    if reports:
        per_step = sum(src + tgt for _, src, tgt, _ in reports) / len(reports) / options["report_every"]
        results["src_tgt_tokens_per_second_wall"] = round(per_step * results["steps"] / train_seconds, 1)
    valid = VALID.findall(log_text)
    results["last_validation"] = {k: float(v) for k, v in valid[-3:]} if valid else None
    results["commands"] = r.commands
    return rss, reports, started


def translate(args, r, paths, model, name, log):
    """``onmt_translate`` of the encoded test source with `model` into WORK/NAME.sp, its log in
    WORK/LOG: returns the file and the seconds it took."""
    hyp_sp = os.path.join(args.work, f"{name}.sp")
    _, seconds, _ = r.run(
        [r.tool("onmt_translate"), "-model", model, "-src", paths["test.src"], "-output", hyp_sp,
         "-beam_size", args.beam, "-batch_type", "sents", "-batch_size", args.translate_batch,
         "-max_length", 512, "-max_length_ratio", 2, "-gpu", -1, "-seed", args.seed],
        log=os.path.join(args.work, log), echo=lambda line: "PRED" in line or "Error" in line)
    return hyp_sp, seconds


def curve(args, r, paths, spm, found, reports, started, rss, results):
    """One row per kept checkpoint (its file's time is when it was written), then the
    average's (at the last checkpoint's time)."""
    startup = (results["throughput"] or {}).get("startup_seconds")
    settings = pc.curve_settings(args, "OpenNMT-py", batch_tokens=args.batch_tokens)
    rows = []
    for step, path in found:
        name = os.path.join("curve", f"step_{step}")
        hyp_sp, _ = translate(args, r, paths, path, name, name + ".log")
        scores = pc.score(args, r, hyp_sp, spm["tgt"], name)
        rows.append(pc.curve_row(os.path.basename(path), step, os.path.getmtime(path) - started,
                                 startup, scores, pc.tokens_per_sec_until(reports, step, started),
                                 rss, settings))
        pc.say_row(rows[-1])
    return pc.with_average(rows, found, results)


if __name__ == "__main__":
    main()
