#!/usr/bin/env python
"""The chapter's own run, as a learner runs it: the classes of 9.3 verbatim
(oracles/chapter_0_11.py) trained by the `d2l==0.11.4` library the chapter imported
(`d2l.train_s2s_ch9`), then the four translations by its `d2l.predict_s2s_ch9`; every random
stream seeded once, before the training cell (`mx.random.seed`, `random.seed`,
`numpy.random.seed`). Writes OUT/summary.json in the format of scripts/train_chapter.py's, with
the loss of every epoch, so `d2l-transformer compare` prints it beside our runs.

It is an independent oracle: nothing of d2l_transformer is imported (only the NumPy-alias shim,
loaded from its file, which MXNet 1.9.1 needs on NumPy >= 1.24). The data is d2l's own reader on
this project's fra-eng.zip (d2l's `download` is pointed at a copy of it instead of the web).
OpenMP: ``OMP_NUM_THREADS=1`` unless it is set, the thread count d2l_transformer uses at the
chapter's sizes: the thread count changes the rounding of MXNet's CPU operators (seed 0, two
threads: epoch 2's loss differs in the 9th digit), and MXNet's own default, half the logical
CPUs, is one thread only on a 2-CPU machine. Exit 2 with one line when d2l 0.11.4 is not
installed."""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = ["Go .", "Wow !", "I'm OK .", "I won !"]


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--ctx", default="auto",
                   help="auto (d2l.try_gpu(), the chapter's), cpu, gpu or gpu:N")
    p.add_argument("--data", default=os.path.join(ROOT, "data", "fra-eng.zip"),
                   help="path of fra-eng.zip")
    p.add_argument("--out", default=None, help="directory for summary.json (default: none)")
    return p


def _numpy_aliases():
    path = os.path.join(ROOT, "d2l_transformer", "_compat.py")
    spec = importlib.util.spec_from_file_location("_d2t_numpy_aliases", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def run(args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before MXNet reads it
    _numpy_aliases()
    try:
        import d2l
        import d2l.d2l as d2l_module
    except ImportError:
        print("error: the chapter's library is not installed: pip install --no-deps d2l==0.11.4",
              file=sys.stderr)
        return 2
    if getattr(d2l, "__version__", None) != "0.11.4":
        print(f"error: d2l {d2l.__version__} is installed; the chapter used 0.11.4", file=sys.stderr)
        return 2
    if args.epochs < 1:
        print("error: --epochs must be at least 1", file=sys.stderr)
        return 2
    if not os.path.exists(args.data):
        print(f"error: dataset not found: {args.data}", file=sys.stderr)
        return 2
    import mxnet as mx
    import numpy
    sys.path.insert(0, os.path.join(ROOT, "oracles"))
    import chapter_0_11 as book

    tmp = tempfile.mkdtemp(prefix="chapter-oracle-")
    zip_copy = os.path.join(tmp, "fra-eng.zip")
    shutil.copyfile(args.data, zip_copy)
    d2l_module.download = lambda name, cache_dir=None: zip_copy  # d2l unzips and reads it

    epochs = []  # every epoch's Accumulator(2): loss_sum, num_tokens

    class Accumulator(d2l_module.Accumulator):
        def __init__(self, n):
            super().__init__(n)
            epochs.append(self)

    d2l_module.Accumulator = Accumulator
    kind, _, index = args.ctx.partition(":")
    if kind not in ("auto", "cpu", "gpu") or (index and (kind != "gpu" or not index.isdigit())):
        print(f"error: unknown context {args.ctx!r}: use auto, cpu, gpu or gpu:N", file=sys.stderr)
        return 2
    ctx = d2l.try_gpu() if kind == "auto" else mx.cpu() if kind == "cpu" else mx.gpu(int(index or 0))

    mx.random.seed(args.seed)
    random.seed(args.seed)
    numpy.random.seed(args.seed)
    # 9.3.7, as the chapter writes it (num_epochs and ctx from the command line)
    embedding_size, num_layers, dropout = 32, 2, 0.0
    batch_size, num_steps = 64, 10
    lr, num_epochs = 0.005, args.epochs
    num_hiddens, num_heads = 64, 4

    src_vocab, tgt_vocab, train_iter = d2l.load_data_nmt(batch_size, num_steps)

    encoder = book.TransformerEncoder(
        len(src_vocab), embedding_size, num_hiddens, num_heads, num_layers,
        dropout)
    decoder = book.TransformerDecoder(
        len(src_vocab), embedding_size, num_hiddens, num_heads, num_layers,
        dropout)
    model = d2l.EncoderDecoder(encoder, decoder)
    printed = io.StringIO()
    tic = time.time()
    try:
        with contextlib.redirect_stdout(printed):  # the animator's figures print as text
            d2l.train_s2s_ch9(model, train_iter, lr, num_epochs, ctx)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.time() - tic
    book_line = [line for line in printed.getvalue().splitlines() if line.startswith("loss ")][-1]
    print(book_line)
    translations = {}
    for sentence in SENTENCES:
        translations[sentence] = d2l.predict_s2s_ch9(
            model, sentence, src_vocab, tgt_vocab, num_steps, ctx)
        print(sentence + ' => ' + translations[sentence])

    history = [(e, m[0] / m[1]) for e, m in enumerate(epochs, 1)]
    last = epochs[-1]
    summary = {
        "title": "chapter's code", "oracle": "d2l " + d2l.__version__, "seed": args.seed,
        "exact_chapter": True, "epochs": num_epochs, "loss": history[-1][1],
        # the book's loss is each sequence's mean over the num_steps - 1 label positions
        "loss_per_token": history[-1][1] * (num_steps - 1),
        "tokens_per_sec": float(book_line.split(", ")[1].split()[0]), "ctx": str(ctx),
        "epoch_history": history, "history": [(e, loss) for e, loss in history if e % 10 == 0],
        "num_tokens": last[1], "translations": translations, "train_seconds": seconds,
        "omp_num_threads": os.environ["OMP_NUM_THREADS"],
    }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False)
    return 0


def main(argv=None):
    return run(get_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
