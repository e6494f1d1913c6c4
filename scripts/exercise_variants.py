"""Exercises 9.3.9.2 (other positional encodings) and 9.3.9.3 (batch vs layer normalization):
train every option of one exercise with ``d2l-transformer train``, score it, print one table
and write every number to OUT/exercise_<name>.json.

    .venv/bin/python scripts/exercise_variants.py --exercise position --seeds 0 1 2 --out out/ex2
    .venv/bin/python scripts/exercise_variants.py --exercise norm --seeds 0 --out out/ex3
    .venv/bin/python scripts/exercise_variants.py --exercise norm --quick --out /tmp/ex3

The options: ``pos_encoding`` sincos (the chapter's), none, learned, alibi; ``norm`` layer (the
chapter's), scale, batch, masked_batch (docs/variants.md). The settings (``--settings``; all of
the exercise's by default), each run once per seed:

* chapter: ``train --preset chapter --set FIELD=OPTION`` (the corrected chapter), 100 epochs:
  the loss at epochs 10, 50 and 100, the chapter's 4 translations, and greedy corpus BLEU on the
  held-out lines after the chapter's pairs whose tokens are all in its vocabularies: by source
  length (position; the chapter trains on sources of at most 4 tokens), or translated in
  batches of 64 and one sentence at a time (norm: running statistics at inference);
* medium: ``--preset full_word`` on the first 20,000 pairs of fra.txt, a model of width 64, 5
  epochs (a few minutes on 2 cores): valid BLEU (greedy, 500 valid sentences); position: BLEU
  by source-length bucket on the lines after them. fra.txt is ordered by length, so the first
  pairs ARE the short ones (at most N = 6 source tokens): the length test without a filter;
* padding (norm): the chapter's run with every batch padded to 20 positions, not 10;
* small_batch (norm): the chapter's run with batches of 8 sentences (20 epochs);
* full (only when asked for: about 2.5 minutes an epoch on 2 cores): ``--preset full``, the whole
  corpus, ``--full-epochs`` epochs (1 by default): valid BLEU (greedy, 500 valid sentences)
  and the minutes of training before it, to compare the options at equal minutes.

The chapter's own option (sincos, layer) is the same model in both exercises: its runs live in
OUT/SETTING/default/ and one ``--out`` shared by both exercises trains it once.

``--quick``: every setting tiny (200 or 2,000 pairs, 1-2 epochs), a smoke test. A run whose
summary.json is complete is read again, not retrained (delete OUT to start over).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from d2l_transformer.data import heldout_nmt, preprocess_fast, read_data_nmt, tokenize_nmt
from d2l_transformer.evaluate import translate_and_score
from d2l_transformer.inference.engines import MXNetEngine

OPTIONS = {"position": ("pos_encoding", ["sincos", "none", "learned", "alibi"]),
           "norm": ("norm", ["layer", "scale", "batch", "masked_batch"])}
SETTINGS = {"position": ["chapter", "medium", "full"],
            "norm": ["chapter", "medium", "padding", "small_batch", "full"]}
MEDIUM = ["num_examples=20000", "num_valid=1000", "num_test=0", "embedding_size=64",
          "ffn_hidden_size=256", "warmup_steps=200", "valid_sentences=500"]
# (preset, --set items, epochs, --valid-every) per setting; --quick: (its --set items, epochs)
RUNS = {"chapter": ("chapter", [], 100, None),
        "medium": ("full_word", MEDIUM, 5, 5),
        "padding": ("chapter", ["num_steps=20"], 100, None),
        "small_batch": ("chapter", ["batch_size=8"], 20, None),
        "full": ("full", [], 1, 1)}
QUICK = {"chapter": (["num_examples=499"], 2), "padding": (["num_examples=499", "num_steps=20"], 1),
         "small_batch": (["num_examples=199", "batch_size=8"], 1),
         "medium": (["num_examples=2000", "num_valid=100", "num_test=0", "embedding_size=32",
                     "ffn_hidden_size=64", "warmup_steps=10", "valid_sentences=50"], 1),
         "full": (["num_examples=2000", "num_valid=100", "num_test=100", "embedding_size=32",
                   "ffn_hidden_size=64", "warmup_steps=10", "valid_sentences=50",
                   "vocab_size=500"], 1)}
LOSS_EPOCHS = (10, 50, 100)


def cli():
    """The ``d2l-transformer`` command of this Python's environment."""
    beside = os.path.join(os.path.dirname(sys.executable), "d2l-transformer")
    return beside if os.path.exists(beside) else shutil.which("d2l-transformer")


def train(out_dir, setting, field, option, seed, args):
    """``d2l-transformer train`` of one option in one setting (skipped when `out_dir` holds a
    complete run); returns its summary.json."""
    preset, items, epochs, valid_every = RUNS[setting]
    if setting == "full":
        epochs = args.full_epochs
    if args.quick:
        items, epochs = QUICK[setting]
        valid_every = 1 if setting in ("medium", "full") else None
    path = os.path.join(out_dir, "summary.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        if summary.get("epochs_done") == epochs and "translations" in summary:
            return summary
    cmd = [cli(), "train", "--preset", preset, "--seed", str(seed), "--epochs", str(epochs),
           "--out", out_dir, "--overwrite", "--quiet", "--set", f"{field}={option}"]
    for item in items:
        cmd += ["--set", item]
    if valid_every:
        cmd += ["--valid-every", str(valid_every)]
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def losses(summary):
    """``{epoch: loss}`` at `LOSS_EPOCHS` (and the last epoch) from the run's history."""
    history = {int(e): loss for e, loss, *_ in summary["epoch_history"]}
    last = max(history)
    return {e: history[e] for e in sorted(set(LOSS_EPOCHS) | {last}) if e in history}


def max_source_tokens(num_examples):
    """N: the longest source (d2l's tokens) among the first num_examples + 1 pairs of fra.txt."""
    source, _ = tokenize_nmt(preprocess_fast(read_data_nmt()), num_examples)
    return max(len(s) for s in source)


def buckets(engine, num_examples, per_bucket):
    """The held-out lines after the run's pairs with every token in its vocabularies, by
    source length: ``{label: (sources, references)}``, at most `per_bucket` each (the first
    ones: fra.txt's order), labels relative to N (`max_source_tokens`)."""
    n = max_source_tokens(num_examples)
    held = heldout_nmt(engine.src_vocab, engine.tgt_vocab, num_examples)
    (tokens, _), (sources, refs) = held["in_vocab"], held["in_vocab_text"]
    out = {}
    for src_tokens, src, ref in zip(tokens, sources, refs):
        extra = len(src_tokens) - n
        label = f"<=N={n}" if extra <= 0 else f"N+{extra}" if extra < 4 else "N+4.."
        part = out.setdefault(label, ([], []))
        if len(part[0]) < per_bucket:
            part[0].append(src)
            part[1].append(ref)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != f"<=N={n}", kv[0])))


def bleu_by_length(model_dir, num_examples, per_bucket):
    """``{bucket: {"bleu", "sentences"}}``: greedy corpus BLEU (sacreBLEU, case-insensitive)."""
    engine = MXNetEngine.load(model_dir)
    scores = {}
    for label, (sources, refs) in buckets(engine, num_examples, per_bucket).items():
        result, _ = translate_and_score(engine, sources, refs, 1, lowercase=True)
        scores[label] = {"bleu": result["bleu"], "sentences": len(sources)}
    return scores


def batched_vs_single(model_dir, num_examples, limit):
    """Held-out BLEU translated in batches of 64 and one sentence at a time, and how many of
    the translations differ (batch statistics would make them differ; running ones do not)."""
    out, engine = {}, MXNetEngine.load(model_dir, batch_size=64)
    held = heldout_nmt(engine.src_vocab, engine.tgt_vocab, num_examples)
    sources, refs = (part[:limit] for part in held["in_vocab_text"])
    if not sources:
        return {"sentences": 0}
    for batch in (64, 1):
        engine = engine if batch == 64 else MXNetEngine.load(model_dir, batch_size=1)
        result, hyps = translate_and_score(engine, sources, refs, 1, lowercase=True)
        out[f"batch {batch}"] = {"bleu": result["bleu"], "translations": hyps}
    a, b = (out[k].pop("translations") for k in ("batch 64", "batch 1"))
    out["differing translations"] = sum(x != y for x, y in zip(a, b))
    out["sentences"] = len(sources)
    return out


def run_setting(args, setting, field, option, seed):
    """One option, one seed, one setting: its numbers."""
    name = "default" if option == OPTIONS[args.exercise][1][0] else option  # the chapter's
    out_dir = os.path.join(args.out, setting, name, f"seed{seed}")
    summary = train(out_dir, setting, field, option, seed, args)
    config = _config(out_dir)
    row = {"setting": setting, "option": option, "seed": seed, "losses": losses(summary),
           "loss": summary["loss"], "loss_per_token": summary.get("loss_per_token")}
    if setting == "chapter":
        row["translations"] = summary.get("translations")
    if summary.get("validation"):
        row["valid_bleu"] = summary["validation"][-1]["valid_bleu"]
        row["minutes"] = summary["validation"][-1]["train_seconds"] / 60
    per_bucket = 30 if args.quick else 300
    if args.exercise == "position" and setting in ("chapter", "medium"):
        row["bleu_by_length"] = bleu_by_length(out_dir, config["num_examples"], per_bucket)
    elif args.exercise == "norm" and setting in ("chapter", "padding", "small_batch"):
        row["heldout"] = batched_vs_single(out_dir, config["num_examples"], per_bucket)
    return row


def _config(out_dir):
    with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def cell(values, fmt="%.4f"):
    """'mean (min-max)' over seeds, or the value for one seed; '-' when there is none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt % values[0]
    return f"{fmt % statistics.mean(values)} ({fmt % min(values)}-{fmt % max(values)})"


def table(rows, setting):
    """The markdown table of one setting: a row per option, the mean (min-max) over seeds."""
    mine = [r for r in rows if r["setting"] == setting]
    if not mine:
        return []
    epochs = sorted({e for r in mine for e in r["losses"]})
    extra = sorted({k for r in mine for k in r.get("bleu_by_length", {})},
                   key=lambda k: (not k.startswith("<="), k))
    held = [k for k in ("batch 64", "batch 1") if any(k in r.get("heldout", {}) for r in mine)]
    heads = [f"loss@{e}" for e in epochs] + ["loss/token"] + \
        (["valid BLEU", "minutes"] if any("valid_bleu" in r for r in mine) else []) + \
        [f"BLEU {k}" for k in extra] + [f"held-out BLEU, {k}" for k in held] + \
        (["differing"] if held else [])
    lines = [f"### {setting}", "", "| option | " + " | ".join(heads) + " |",
             "|---" * (len(heads) + 1) + "|"]
    for option in dict.fromkeys(r["option"] for r in mine):
        runs = [r for r in mine if r["option"] == option]
        cells = [cell([r["losses"].get(e) for r in runs]) for e in epochs]
        cells.append(cell([r["loss_per_token"] for r in runs], "%.3f"))
        if "valid BLEU" in heads:
            cells.append(cell([r.get("valid_bleu") for r in runs], "%.1f"))
            cells.append(cell([r.get("minutes") for r in runs], "%.1f"))
        cells += [cell([r.get("bleu_by_length", {}).get(k, {}).get("bleu") for r in runs], "%.1f")
                  for k in extra]
        cells += [cell([r["heldout"].get(k, {}).get("bleu") for r in runs], "%.1f") for k in held]
        if held:
            cells.append(cell([r["heldout"].get("differing translations") for r in runs], "%d"))
        lines.append(f"| {option} | " + " | ".join(cells) + " |")
    sizes = {k: v["sentences"] for r in mine for k, v in r.get("bleu_by_length", {}).items()}
    if sizes:
        lines.append("\nsentences per bucket: " + ", ".join(f"{k}: {v}" for k, v in
                                                             sorted(sizes.items())))
    return lines + [""]


def translations(rows):
    """The chapter's 4 translations of each option and seed."""
    lines = ["### the chapter's sentences", ""]
    for r in rows:
        if r["setting"] == "chapter" and r.get("translations"):
            pairs = "; ".join(f"{s} => {t}" for s, t in r["translations"].items())
            lines.append(f"* {r['option']} (seed {r['seed']}): {pairs}")
    return lines + [""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exercise", choices=sorted(OPTIONS), required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--quick", action="store_true", help="tiny runs (a smoke test)")
    ap.add_argument("--out", required=True, help="the runs' model directories and the JSON")
    ap.add_argument("--settings", nargs="+",
                    help="some of the exercise's settings (default: all but full)")
    ap.add_argument("--full-epochs", type=int, default=1, metavar="E",
                    help="the full setting's epochs (default 1)")
    ap.add_argument("--options", nargs="+", help="a subset of the exercise's options")
    args = ap.parse_args(argv)
    field, options = OPTIONS[args.exercise]
    settings = args.settings or [s for s in SETTINGS[args.exercise] if s != "full"]
    unknown = sorted(set(settings) - set(SETTINGS[args.exercise])) + \
        sorted(set(args.options or ()) - set(options))
    if unknown:
        ap.error(f"not a setting or option of --exercise {args.exercise}: {', '.join(unknown)}")
    rows = [run_setting(args, setting, field, option, seed)
            for setting in settings for option in args.options or options
            for seed in args.seeds]
    lines = [f"## exercise {args.exercise}: {field}, seeds {' '.join(map(str, args.seeds))}"
             + (" (quick)" if args.quick else ""), ""]
    for setting in settings:
        lines += table(rows, setting)
    lines += translations(rows)
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"exercise_{args.exercise}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"exercise": args.exercise, "field": field, "seeds": args.seeds,
                   "quick": args.quick, "runs": rows}, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
