#!/usr/bin/env python
"""d2l 9.3 top to bottom: the toy checks, 100 epochs of training, the four translations, and
the book's printed output beside ours; ``--edition 0.17|1.0``: that edition's run instead, its
printed output and, for 1.0, its training and validation loss plot (docs/editions.md). Writes
OUT/summary.json, the figures and the model directory OUT/model (for `d2l-transformer
translate --model OUT/model`). The script owns its runs: run again, it replaces the model
directory OUT/model it wrote (never a directory that is not a model directory).

It trains exactly as ``d2l-transformer train --edition E`` does (`train_model`): the same
seed gives the same loss and translations. By default on the hybridized graph path; the
chapter's imperative loop with --imperative, and always with --exact-chapter.

With --chapter-code it also runs the chapter's own code (scripts/chapter_oracle.py: its classes
verbatim on the edition's d2l, 0.11.4, 0.17.6 or 1.0.3, seeded the same way) with the same
seed, epochs, device and data, into OUT/chapter_code, and prints it beside this run; an exact
run gives its loss at every epoch, bit for bit, and its translations (docs/chapter.md and
docs/editions.md say on what conditions)."""

import argparse
import json
import os
import subprocess
import sys

import d2l_transformer as d2t  # isort: skip  (first: its NumPy-alias shim must precede mxnet)
from mxnet import autograd, np
from mxnet.gluon import nn

from d2l_transformer.cli.commands import USER_ERRORS, UserError, guarded
from d2l_transformer.config import EDITIONS
from d2l_transformer.data import default_data_path
from d2l_transformer.io import atomic
from d2l_transformer.report.book import EDITIONS as PRINTED
from d2l_transformer.report.book import compare, printed_lines
from d2l_transformer.training.run import check_out_dir, train_model
from d2l_transformer.viz.png import plot_loss, plot_losses, plot_positional_encoding

ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chapter_oracle.py")


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--edition", choices=sorted(EDITIONS), default="0.11",
                   help="whose chapter: d2l 0.11 (2019, the default), 0.17 (classic) or 1.0")
    p.add_argument("--epochs", type=int, default=None, help="default: the edition's (100, 200, 30)")
    p.add_argument("--ctx", default="auto", help="auto (GPU 0 if any, else CPU), cpu, gpu, gpu:N")
    p.add_argument("--exact-chapter", action="store_true",
                   help="reproduce the book exactly, its three bugs included (on the chapter's "
                        "imperative loop)")
    p.add_argument("--imperative", action="store_true",
                   help="train with the chapter's imperative loop instead of the default "
                        "hybridized graph path (same numbers to float rounding, slower)")
    p.add_argument("--out", default="out/chapter", help="directory for summary.json and figures")
    p.add_argument("--data", default=None, help="path of fra-eng.zip (default: data/fra-eng.zip)")
    p.add_argument("--skip-toys", action="store_true",
                   help="do not print the 2019 chapter's toy checks (later editions skip them)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--chapter-code", action="store_true",
                   help="also run the chapter's own code (scripts/chapter_oracle.py, on the "
                        "edition's d2l) "
                        "with the same seed and print it beside this run")
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


def chapter_code(args, ctx, out):
    """The chapter's own run with this run's seed, epochs, device and data, in a child process
    (which inherits this one's OpenMP thread count): its summary, or None after one line on
    stderr when the edition's d2l is not installed."""
    device = "cpu" if ctx.device_type == "cpu" else f"gpu:{ctx.device_id}"
    cmd = [sys.executable, ORACLE, "--edition", args.edition, "--seed", str(args.seed),
           "--epochs", str(args.epochs),
           "--ctx", device, "--data", args.data or default_data_path(), "--out", out]
    print(f"running the chapter's own code (seed {args.seed}, {args.epochs} epochs on {device})",
          file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 2:
        reason = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "exit 2"
        print("chapter's own code not run: " + reason.split("error: ", 1)[-1], file=sys.stderr)
        return None
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise RuntimeError(f"scripts/chapter_oracle.py failed (exit {r.returncode})")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def run(args):
    try:
        ctx = d2t.parse_ctx(args.ctx)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.epochs is None:
        args.epochs = EDITIONS[args.edition].num_epochs
    if args.epochs < 1:
        raise UserError("--epochs must be at least 1")
    model_dir = os.path.join(args.out, "model")
    check_out_dir(model_dir, overwrite=True)  # before anything is written
    os.makedirs(args.out, exist_ok=True)
    d2t.set_seed(args.seed)
    if not args.skip_toys and args.edition == "0.11":
        toy_checks(args.out)
    cfg = EDITIONS[args.edition].replace(num_epochs=args.epochs, exact_chapter=args.exact_chapter)
    summary = train_model(cfg, model_dir, seed=args.seed, ctx=ctx, fast=not args.imperative,
                          data_path=args.data, preset="chapter", checkpoint_every=cfg.num_epochs,
                          progress=not args.quiet, overwrite=True)
    print("\n".join(printed_lines(summary)))
    print("loss per target token (cross-entropy): %.3f" % summary["loss_per_token"])
    png = os.path.join(args.out, "loss.png")
    if args.edition == "1.0":  # the book's figure: training and validation loss per epoch
        book = PRINTED["1.0"]
        summary["loss_png"] = plot_losses(summary["epoch_history"], png,
                                          {"book's last train_loss": book["loss"],
                                           "book's last val_loss": book["val_loss"]})
    else:
        summary["loss_png"] = plot_loss(summary["history"], png, cfg.num_epochs)
    atomic.write_text(os.path.join(args.out, "summary.json"),
                      json.dumps(summary, indent=2, ensure_ascii=False))
    runs = [("exact chapter" if cfg.exact_chapter else "corrected", summary)]
    if args.chapter_code:
        theirs = chapter_code(args, ctx, os.path.join(args.out, "chapter_code"))
        runs = ([(theirs["title"], theirs)] if theirs else []) + runs
    print()
    print(compare(runs))
    return 0


def main(argv=None):
    args = get_parser().parse_args(argv)
    paths = [os.path.abspath(p) for p in (args.out, args.data) if p]
    return guarded(run, args, USER_ERRORS, paths)


if __name__ == "__main__":
    sys.exit(main())
