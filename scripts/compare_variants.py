"""Train each variant on the chapter's data (same seeds, same epochs) and print one table.

    .venv/bin/python scripts/compare_variants.py --epochs 100 --seeds 0 1 2 --out out/variants

Columns: final loss as the book prints it and per target token, corpus BLEU (sacrebleu, greedy,
batched) on held-out pairs (fra.txt lines after the chapter's 1001 whose every token is in the
vocabularies), tokens/s of the last epoch; each as the mean and min–max over the seeds.
Training uses the fast path (`train_s2s_ch8(fast=True)`: the same arithmetic per step as the
faithful path, see docs/benchmarks.md); ``--faithful`` uses the imperative path.
Also writes loss_curves.png (mean over seeds) and, with ``--json``, every number.
``--quick``: a TINY model with 2 layers, 1 epoch, 1 seed, 20 held-out pairs (a smoke test).
"""

import argparse
import functools
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import d2l_transformer as d2t  # noqa: E402
from d2l_transformer.data import heldout_nmt  # noqa: E402
from d2l_transformer.evaluate import corpus_bleu  # noqa: E402
from d2l_transformer.variants import every_other_layers  # noqa: E402

VARIANTS = [  # name, config changes, blocks kept at inference (None: all)
    ("chapter (post-norm)", {}, None),
    ("pre-norm", {"pre_norm": True}, None),
    ("ScaleNorm + FixNorm (pre-norm)", {"pre_norm": True, "norm": "scale", "fixnorm": True}, None),
    ("LayerDrop p=0.2", {"layerdrop": 0.2}, None),
    ("LayerDrop p=0.5, every other block pruned at inference", {"layerdrop": 0.5}, 1),
    ("DropHead p=0.2", {"drophead": 0.2}, None),
    ("fused QKV", {"fused_qkv": True}, None),
]


@functools.lru_cache(maxsize=None)
def data(cfg, fast):
    """(src_vocab, tgt_vocab, data_iter, held-out (source, target)), read once: every epoch
    reshuffles from the seed set just before it, so runs can share the iterator."""
    src_vocab, tgt_vocab, data_iter = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps,
                                                         cfg.num_examples, fast_loader=fast)
    held = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, 2000)["in_vocab"]
    return src_vocab, tgt_vocab, data_iter, held


def run_variant(cfg, changes, keep, seed, heldout, fast, ctx):
    """Train one variant from `seed`; returns its numbers and its loss curve."""
    src_vocab, tgt_vocab, data_iter, (src, ref) = data(cfg, fast)
    d2t.set_seed(seed)
    model = d2t.build_model(cfg.replace(**changes), len(src_vocab), len(tgt_vocab))
    curve = []
    s = d2t.train_s2s_ch8(model, data_iter, cfg.lr, cfg.num_epochs, ctx, fast=fast,
                          on_epoch=lambda e, loss: curve.append(loss))
    if keep is not None:  # LayerDrop's inference pruning: keep r of N blocks
        for stack in (model.encoder, model.decoder):
            stack.prune(every_other_layers(cfg.num_layers, keep))
    src, ref = src[:heldout], ref[:heldout]
    translator = d2t.Translator(model, src_vocab, tgt_vocab, ctx, num_steps=cfg.num_steps,
                                max_length=cfg.num_steps)
    hyps = [" ".join(h.tokens) for h in translator.translate(src)]
    bleu = corpus_bleu(hyps, [" ".join(r) for r in ref]).score if src else float("nan")
    return {"loss": s["loss"], "loss_per_token": s["loss_per_token"], "bleu": bleu,
            "tokens_per_sec": s["tokens_per_sec"], "heldout_pairs": len(src)}, curve


def cell(values, fmt):
    """'mean (min–max)' over seeds, or the value for one seed."""
    if len(values) == 1:
        return fmt % values[0]
    return f"{fmt % statistics.mean(values)} ({fmt % min(values)}–{fmt % max(values)})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--heldout", type=int, default=200, help="held-out pairs for BLEU")
    ap.add_argument("--out", default="out/variants")
    ap.add_argument("--json", default=None, help="also write every number to this file")
    ap.add_argument("--faithful", action="store_true", help="the imperative training path")
    ap.add_argument("--quick", action="store_true", help="TINY, 1 epoch, 1 seed (smoke test)")
    args = ap.parse_args(argv)
    cfg = d2t.CHAPTER.replace(num_epochs=args.epochs)
    if args.quick:
        # the chapter's data (its held-out pairs), a small model with 2 layers to prune
        cfg = d2t.TINY.replace(num_epochs=1, num_layers=2, num_examples=1000, batch_size=64)
        args.seeds, args.heldout = args.seeds[:1], 20
    os.makedirs(args.out, exist_ok=True)
    ctx = d2t.try_gpu()
    results, fig = [], plt.figure(figsize=(6, 4))
    for name, changes, keep in VARIANTS:
        runs, curves = [], []
        for seed in args.seeds:
            run, curve = run_variant(cfg, changes, keep, seed, args.heldout, not args.faithful, ctx)
            runs.append(run)
            curves.append(curve)
            print(f"{name}, seed {seed}: " + ", ".join(f"{k} {v:.4g}" for k, v in run.items()),
                  flush=True)
        mean_curve = [statistics.mean(c[i] for c in curves) for i in range(len(curves[0]))]
        plt.plot(range(1, len(mean_curve) + 1), mean_curve, label=name)
        results.append({"variant": name, "changes": changes, "keep_blocks": keep, "runs": runs,
                        "seeds": args.seeds, "mean_curve": mean_curve})
    plt.xlabel("epoch"), plt.ylabel("loss (book units), mean over seeds"), plt.yscale("log")
    plt.legend(fontsize=7)
    plt.tight_layout()
    png = os.path.join(args.out, "loss_curves.png")
    fig.savefig(png, dpi=100)
    base = statistics.mean(r["tokens_per_sec"] for r in results[0]["runs"])
    print(f"\n{cfg.num_epochs} epochs, seeds {args.seeds}, chapter data, "
          f"{results[0]['runs'][0]['heldout_pairs']} held-out pairs, {ctx}, "
          f"{'faithful' if args.faithful else 'fast'} path; mean (min–max) over seeds")
    print("| variant | loss (book) | loss / token | held-out BLEU | tokens/s | speed vs chapter |")
    print("|---|---|---|---|---|---|")
    for r in results:
        col = {k: [run[k] for run in r["runs"]] for k in r["runs"][0]}
        print(f"| {r['variant']} | {cell(col['loss'], '%.4f')} | "
              f"{cell(col['loss_per_token'], '%.3f')} | {cell(col['bleu'], '%.1f')} | "
              f"{statistics.mean(col['tokens_per_sec']):.0f} | "
              f"{statistics.mean(col['tokens_per_sec']) / base:.2f} |")
    print(f"wrote {png}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"epochs": cfg.num_epochs, "seeds": args.seeds, "ctx": str(ctx),
                       "fast": not args.faithful, "variants": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    main()
