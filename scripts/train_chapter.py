#!/usr/bin/env python
"""d2l 9.3 top to bottom: the toy checks, 100 epochs of training, the four translations, and
the book's printed output beside ours. Writes OUT/summary.json, the figures and the model
directory OUT/model (for `d2l-transformer translate --model OUT/model`). The script owns its
runs: run again, it replaces the model directory OUT/model it wrote (never a directory that is
not a model directory).

It trains exactly as ``d2l-transformer train --preset chapter`` does (`train_model`): the same
seed gives the same loss and translations. By default on the hybridized graph path; the
chapter's imperative loop with --imperative, and always with --exact-chapter."""

import argparse
import json
import os
import sys

import d2l_transformer as d2t  # isort: skip  (first: its NumPy-alias shim must precede mxnet)
from mxnet import autograd, np
from mxnet.gluon import nn

from d2l_transformer.book import compare_table
from d2l_transformer.cli import UserError, guarded
from d2l_transformer.io import atomic
from d2l_transformer.training.run import check_out_dir, train_model
from d2l_transformer.viz.png import plot_loss, plot_positional_encoding


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=d2t.CHAPTER.num_epochs)
    p.add_argument("--ctx", default="auto", help="auto (GPU 0 if any, else CPU), cpu, gpu, gpu:N")
    p.add_argument("--exact-chapter", action="store_true",
                   help="reproduce the book exactly, its three bugs included (on the chapter's "
                        "imperative loop)")
    path = p.add_mutually_exclusive_group()
    path.add_argument("--imperative", action="store_true",
                      help="train with the chapter's imperative loop instead of the default "
                           "hybridized graph path (same numbers to float rounding, slower)")
    path.add_argument("--fast", action="store_true",
                      help="the hybridized graph path: the default, accepted for compatibility")
    p.add_argument("--out", default="out/chapter", help="directory for summary.json and figures")
    p.add_argument("--data", default=None, help="path of fra-eng.zip (default: data/fra-eng.zip)")
    p.add_argument("--skip-toys", action="store_true", help="do not print the toy checks")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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
    try:
        ctx = d2t.parse_ctx(args.ctx)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.epochs < 1:
        raise UserError("--epochs must be at least 1")
    model_dir = os.path.join(args.out, "model")
    check_out_dir(model_dir, overwrite=True)  # before anything is written
    os.makedirs(args.out, exist_ok=True)
    d2t.set_seed(args.seed)
    if not args.skip_toys:
        toy_checks(args.out)
    cfg = d2t.CHAPTER.replace(num_epochs=args.epochs, exact_chapter=args.exact_chapter)
    summary = train_model(cfg, model_dir, seed=args.seed, ctx=ctx, fast=not args.imperative,
                          data_path=args.data, preset="chapter", checkpoint_every=cfg.num_epochs,
                          progress=not args.quiet, overwrite=True)
    print(d2t.training.book_line(summary))
    print("loss per target token (cross-entropy): %.3f" % summary["loss_per_token"])
    for sentence, translation in summary["translations"].items():
        print(sentence + " => " + translation)
    summary["loss_png"] = plot_loss(summary["history"], os.path.join(args.out, "loss.png"),
                                    cfg.num_epochs)
    atomic.write_text(os.path.join(args.out, "summary.json"),
                      json.dumps(summary, indent=2, ensure_ascii=False))
    title = "exact chapter" if cfg.exact_chapter else "corrected"
    print()
    print(compare_table([(title, summary)]))
    return 0


def main(argv=None):
    return guarded(run, get_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
