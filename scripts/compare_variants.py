"""Issue 7: train each variant on the chapter's data (same seed, same epochs) and print one table.

    .venv/bin/python scripts/compare_variants.py --epochs 30 --out out/variants

Columns: final loss as the book prints it and per target token, corpus BLEU (sacrebleu, greedy)
on held-out pairs (fra.txt lines after the chapter's 1001, in-vocabulary ones), tokens/s of the
last epoch. Also writes loss_curves.png.
"""

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import d2l_transformer as d2t  # noqa: E402
from d2l_transformer.data import heldout_nmt  # noqa: E402
from d2l_transformer.evaluate import corpus_bleu  # noqa: E402

VARIANTS = [
    ("chapter (post-norm)", {}),
    ("pre-norm", {"pre_norm": True}),
    ("ScaleNorm + FixNorm (pre-norm)", {"pre_norm": True, "norm": "scale", "fixnorm": True}),
    ("LayerDrop p=0.2", {"layerdrop": 0.2}),
    ("DropHead p=0.2", {"drophead": 0.2}),
    ("fused QKV", {"fused_qkv": True}),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--heldout", type=int, default=100, help="held-out pairs for BLEU")
    ap.add_argument("--out", default="out/variants")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ctx = d2t.try_gpu()
    cfg = d2t.CHAPTER.replace(num_epochs=args.epochs)
    rows, fig = [], plt.figure(figsize=(5, 3.5))
    for name, changes in VARIANTS:
        d2t.set_seed(args.seed)
        src_vocab, tgt_vocab, data_iter = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps,
                                                             cfg.num_examples)
        model = d2t.build_model(cfg.replace(**changes), len(src_vocab), len(tgt_vocab))
        curve = []
        s = d2t.train_s2s_ch8(model, data_iter, cfg.lr, cfg.num_epochs, ctx,
                              on_epoch=lambda e, loss, c=curve: c.append((e, loss)))
        src, ref = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, 2000)["in_vocab"]
        src, ref = src[:args.heldout], ref[:args.heldout]
        hyps = [d2t.predict_s2s_ch8(model, " ".join(x), src_vocab, tgt_vocab, cfg.num_steps, ctx)
                for x in src]
        hyps = [h if isinstance(h, str) else h[0] for h in hyps]
        b = corpus_bleu(hyps, [" ".join(r) for r in ref]).score
        rows.append((name, s["loss"], s["loss_per_token"], b, s["tokens_per_sec"]))
        plt.plot([e for e, _ in curve], [v for _, v in curve], label=name)
        print(f"| {name} | {s['loss']:.4f} | {s['loss_per_token']:.3f} | {b:.1f} | "
              f"{s['tokens_per_sec']:.0f} |", flush=True)
    plt.xlabel("epoch"), plt.ylabel("loss (book units)"), plt.yscale("log"), plt.legend(fontsize=7)
    plt.tight_layout()
    fig.savefig(os.path.join(args.out, "loss_curves.png"), dpi=100)
    base = rows[0][4]
    print(f"\n{args.epochs} epochs, seed {args.seed}, chapter data, {len(src)} held-out pairs, {ctx}")
    print("| variant | loss (book) | loss / token | held-out BLEU | tokens/s | speed vs chapter |")
    print("|---|---|---|---|---|---|")
    for name, loss, lpt, b, tps in rows:
        print(f"| {name} | {loss:.4f} | {lpt:.3f} | {b:.1f} | {tps:.0f} | {tps / base:.2f} |")


if __name__ == "__main__":
    main()
