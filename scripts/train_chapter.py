#!/usr/bin/env python
"""d2l 9.3 top to bottom: the toy checks, 100 epochs of training, the four translations, and
the book's printed output beside ours. Writes OUT/summary.json and the figures."""

import argparse
import json
import os
import sys

from mxnet import autograd, np
from mxnet.gluon import nn

import d2l_transformer as d2t
from d2l_transformer.book import SENTENCES, compare_table
from d2l_transformer.viz.png import plot_loss, plot_positional_encoding


def get_parser():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=d2t.CHAPTER.num_epochs)
    p.add_argument("--ctx", default="auto", help="auto (GPU 0 if any, else CPU), cpu, gpu, gpu:N")
    p.add_argument("--exact-chapter", action="store_true",
                   help="reproduce the book exactly, its three bugs included")
    p.add_argument("--fast", action="store_true",
                   help="issue 4: train as one hybridized graph with fused clipping + Adam "
                        "(same numbers to float rounding, ~5x faster on a CPU; not with --exact-chapter)")
    p.add_argument("--out", default="out/chapter", help="directory for summary.json and figures")
    p.add_argument("--data", default=None, help="path of fra-eng.zip (default: data/fra-eng.zip)")
    p.add_argument("--skip-toys", action="store_true", help="do not print the toy checks")
    return p


def toy_checks(out):
    """Each toy example the chapter prints, in its order."""
    cell = d2t.MultiHeadAttention(100, 10, 0.5)
    cell.initialize()
    X = np.ones((2, 4, 5))
    valid_length = np.array([2, 3])
    print("9.3.1 MultiHeadAttention:", cell(X, X, X, valid_length).shape)
    ffn = d2t.PositionWiseFFN(4, 8)
    ffn.initialize()
    print("9.3.2 PositionWiseFFN(4, 8)(ones((2, 3, 4)))[0]:\n", ffn(np.ones((2, 3, 4)))[0])
    layer, batch = nn.LayerNorm(), nn.BatchNorm()
    layer.initialize()
    batch.initialize()
    X = np.array([[1, 2], [2, 3]])
    with autograd.record():  # batch norm uses batch statistics in training mode
        print("9.3.3 layer norm:", layer(X), "\nbatch norm:", batch(X))
    add_norm = d2t.AddNorm(0.5)
    add_norm.initialize()
    print("9.3.3 AddNorm:", add_norm(np.ones((2, 3, 4)), np.ones((2, 3, 4))).shape)
    pe = d2t.PositionalEncoding(20, 0)
    pe.initialize()
    Y = pe(np.zeros((1, 100, 20)))
    path = plot_positional_encoding(Y[0], os.path.join(out, "positional_encoding.png"))
    print("9.3.4 PositionalEncoding dims 4-7 plotted to", path)
    X = np.ones((2, 100, 24))
    encoder_blk = d2t.EncoderBlock(24, 48, 8, 0.5)
    encoder_blk.initialize()
    print("9.3.5 EncoderBlock:", encoder_blk(X, valid_length).shape)
    encoder = d2t.TransformerEncoder(200, 24, 48, 8, 2, 0.5)
    encoder.initialize()
    print("9.3.5 TransformerEncoder:", encoder(np.ones((2, 100)), valid_length).shape)
    decoder_blk = d2t.DecoderBlock(24, 48, 8, 0.5, 0)
    decoder_blk.initialize()
    state = [encoder_blk(X, valid_length), valid_length, [None]]
    print("9.3.6 DecoderBlock:", decoder_blk(X, state)[0].shape)


def run(args):
    os.makedirs(args.out, exist_ok=True)
    if args.fast and args.exact_chapter:
        get_parser().error("--fast needs the corrected model: --exact-chapter runs the faithful path")
    d2t.set_seed(args.seed)
    if not args.skip_toys:
        toy_checks(args.out)
    cfg = d2t.CHAPTER.replace(num_epochs=args.epochs, exact_chapter=args.exact_chapter)
    ctx = d2t.parse_ctx(args.ctx)
    d2t.set_seed(args.seed)  # the run does not depend on whether the toys ran
    src_vocab, tgt_vocab, train_iter = d2t.load_data_nmt(
        cfg.batch_size, cfg.num_steps, cfg.num_examples, path=args.data,
        fast_loader=args.fast)  # the same batches either way
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    summary = d2t.train_s2s_ch8(model, train_iter, cfg.lr, cfg.num_epochs, ctx,
                                fast=args.fast)
    print(d2t.training.book_line(summary))
    print("loss per target token (cross-entropy): %.3f" % summary["loss_per_token"])
    translations = {}
    for sentence in SENTENCES:
        translations[sentence] = d2t.predict_s2s_ch8(
            model, sentence, src_vocab, tgt_vocab, cfg.num_steps, ctx)
        print(sentence + " => " + translations[sentence])
    summary.update(seed=args.seed, exact_chapter=cfg.exact_chapter, translations=translations)
    summary["loss_png"] = plot_loss(summary["history"], os.path.join(args.out, "loss.png"),
                                    cfg.num_epochs)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    title = "exact chapter" if cfg.exact_chapter else "corrected"
    print()
    print(compare_table([(title, summary)]))
    return summary


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        run(args)
    except (ValueError, OSError) as e:  # bad option, missing data: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
