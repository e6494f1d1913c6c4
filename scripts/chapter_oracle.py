#!/usr/bin/env python
"""The chapter's own run, as a learner runs it, in any of the book's MXNet editions (--edition).

0.11 (the 2019 chapter, 9.3): its classes verbatim (oracles/chapter_0_11.py) trained by the
`d2l==0.11.4` library the chapter imported (`d2l.train_s2s_ch9`), then the four translations by its
`d2l.predict_s2s_ch9`. 0.17 (the classic edition, 10.7) and 1.0 (11.7): the section's classes and
its training and prediction cells verbatim (oracles/chapter_0_17.py, oracles/chapter_1_0.py), run
as a notebook runs them on that release's `d2l` (0.17.6, 1.0.3: `make venv` unpacks each into
VENV/oracles/d2l-VERSION, imported from there here), with only the epochs and the device taken
from the command line. Every random stream is seeded once, before the training cell
(`mx.random.seed`, `random.seed`, `numpy.random.seed`). Writes OUT/summary.json in the format of
scripts/train_chapter.py's, with the loss of every epoch (1.0: the training and the validation
loss, each the mean of what `Module.plot` receives in that epoch), so runs can be compared.

It is an independent oracle: nothing of d2l_transformer is imported (only its step before MXNet
loads, loaded from its folder: the NumPy-alias shim MXNet 1.9.1 needs on NumPy >= 1.24, the
threads, the CPU's kernels). The data is d2l's own reader on this project's fra-eng.zip (d2l's
`download` is pointed at a copy of it instead of the web: the shipped file is not byte for byte
the one whose sha1 the later editions check). OpenMP: ``OMP_NUM_THREADS=1`` unless it is set,
the thread count d2l_transformer uses at the chapter's sizes: the thread count changes the
rounding of MXNet's CPU operators (seed 0, two threads: epoch 2's loss differs in the 9th
digit), and MXNet's own default, half the logical CPUs, is one thread only on a 2-CPU machine.
The CPU's kernels are pinned as the package pins them (its step before MXNet loads,
`d2l_transformer/_runtime`, loaded from its folder; ``D2L_TRANSFORMER_CPU=native`` leaves them
alone), so that the chapter's code and the exact runs compute alike on any x86-64 CPU with AVX2.
Exit 2 with one line when that edition's d2l is not installed."""

import argparse
import ast
import contextlib
import importlib.machinery
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
# edition -> (its d2l release, the module of oracles/ with its code, the book's epochs)
EDITIONS = {"0.11": ("0.11.4", "chapter_0_11", 100), "0.17": ("0.17.6", "chapter_0_17", 200),
            "1.0": ("1.0.3", "chapter_1_0", 30)}
SECTIONS = {"transformer": 100, "seq2seq": 300, "attention": 200}  # 9.3's, 8.14's, 9.2's epochs


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edition", choices=list(EDITIONS), default="0.11",
                   help="the book's edition whose code runs (default: 0.11, the 2019 chapter)")
    p.add_argument("--architecture", choices=list(SECTIONS), default="transformer",
                   help="0.11 only: the chapter's transformer (9.3), or the 2019 book's earlier "
                        "models, 8.14's seq2seq and 9.2's attention (the section's code, "
                        "oracles/chapter_9_2.py, on d2l 0.11.4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None,
                   help="default: the edition's own (0.11: 100, 0.17: 200, 1.0: 30; 8.14: 300, "
                        "9.2: 200)")
    p.add_argument("--library", default=None,
                   help="folder holding the 0.17/1.0 edition's d2l package "
                        "(default: <venv>/oracles/d2l-VERSION)")
    p.add_argument("--ctx", default="auto",
                   help="auto (d2l.try_gpu(), the chapter's), cpu, gpu or gpu:N")
    p.add_argument("--data", default=os.path.join(ROOT, "data", "fra-eng.zip"),
                   help="path of fra-eng.zip")
    p.add_argument("--out", default=None, help="directory for summary.json (default: none)")
    return p


def _import_from(folder, name):
    """``import NAME`` found in FOLDER alone (oracles/, or a d2l release unpacked there by pip
    --target), without putting FOLDER on sys.path: registered in sys.modules under NAME, so
    what imports NAME after it (an oracle's ``from d2l import mxnet as d2l``) gets this one, and
    a package's submodules are found in its own folder."""
    spec = importlib.machinery.PathFinder.find_spec(name, [folder])
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r} in {folder}", name=name)
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _before_mxnet():
    """The package's step before MXNet loads (`d2l_transformer/_runtime`, loaded from its folder,
    the package itself not imported): the NumPy-alias shim, one OpenMP thread unless set, the
    CPU math pinned as d2l_transformer pins it, the CUDA libraries. What its runs get. Returns
    the runtime's `cpu_math` module (its record of the kernels)."""
    runtime = _import_from(os.path.join(ROOT, "d2l_transformer"), "_runtime")
    runtime.prepare()
    return runtime.cpu_math


def run(args):
    if args.architecture != "transformer" and args.edition != "0.11":
        print("error: --architecture is the 2019 book's (edition 0.11)", file=sys.stderr)
        return 2
    if args.epochs is None:
        args.epochs = (EDITIONS[args.edition][2] if args.edition != "0.11"
                       else SECTIONS[args.architecture])
    for bad, problem in ((args.epochs < 1, "--epochs must be at least 1"),
                         (not os.path.exists(args.data), f"dataset not found: {args.data}")):
        if bad:
            print("error: " + problem, file=sys.stderr)
            return 2
    if args.edition != "0.11":
        return run_edition(args)
    cpu_math = _before_mxnet()
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
    import mxnet as mx
    import numpy
    book = _import_from(os.path.join(ROOT, "oracles"), "chapter_0_11")

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
    batch_size, num_steps, lr, num_epochs = 64, 10, 0.005, args.epochs
    src_vocab, tgt_vocab, train_iter = d2l.load_data_nmt(batch_size, num_steps)
    model = _model(args.architecture, d2l, book, src_vocab, tgt_vocab)
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
        "architecture": args.architecture,
        "exact_chapter": True, "epochs": num_epochs, "loss": history[-1][1],
        # the book's loss is each sequence's mean over the num_steps - 1 label positions
        "loss_per_token": history[-1][1] * (num_steps - 1),
        "tokens_per_sec": float(book_line.split(", ")[1].split()[0]), "ctx": str(ctx),
        "epoch_history": history, "history": [(e, loss) for e, loss in history if e % 10 == 0],
        "num_tokens": last[1], "translations": translations, "train_seconds": seconds,
        "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "cpu_math": cpu_math.describe(str(ctx)),
    }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False)
    return 0


def _model(architecture, d2l, book, src_vocab, tgt_vocab):
    """The section's model as its cell builds it: 9.3.7's Transformer (with its bug 1, the
    decoder's vocabulary the source's), or 8.14's / 9.2's seq2seq (9.2's decoder from
    oracles/chapter_9_2.py)."""
    if architecture == "transformer":  # 9.3.7, as the chapter writes it
        embedding_size, num_layers, dropout = 32, 2, 0.0
        num_hiddens, num_heads = 64, 4
        encoder = book.TransformerEncoder(
            len(src_vocab), embedding_size, num_hiddens, num_heads, num_layers,
            dropout)
        decoder = book.TransformerDecoder(
            len(src_vocab), embedding_size, num_hiddens, num_heads, num_layers,
            dropout)
        return d2l.EncoderDecoder(encoder, decoder)
    # 8.14.3 and 9.2.2, as the sections write them
    embed_size, num_hiddens, num_layers, dropout = 32, 32, 2, 0.0
    encoder = d2l.Seq2SeqEncoder(
        len(src_vocab), embed_size, num_hiddens, num_layers, dropout)
    decoder_class = (d2l.Seq2SeqDecoder if architecture == "seq2seq"
                     else _import_from(os.path.join(ROOT, "oracles"),
                                       "chapter_9_2").Seq2SeqAttentionDecoder)
    decoder = decoder_class(
        len(tgt_vocab), embed_size, num_hiddens, num_layers, dropout)
    return d2l.EncoderDecoder(encoder, decoder)


def _cell(text, changes):
    """The book's cell with each (printed, used) replacement made once: the epochs, the device."""
    for printed, used in changes:
        if text.count(printed) != 1:
            raise RuntimeError(f"the cell no longer reads {printed!r} once")
        text = text.replace(printed, used)
    return text


def _translation(line, edition):
    """(sentence, translation, bleu) from one line the prediction cell prints."""
    if edition == "0.17":  # go . => va !,  bleu 1.000
        head, _, bleu = line.rpartition(",  bleu ")
        sentence, _, translation = head.partition(" => ")
    else:  # go . => ['va', '!'], bleu,1.000
        head, _, bleu = line.rpartition(", bleu,")
        sentence, _, tokens = head.partition(" => ")
        translation = " ".join(ast.literal_eval(tokens))
    return sentence, translation, float(bleu)


def run_edition(args):
    """The 0.17 or 1.0 edition's training and prediction cells on its own d2l (see the top)."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # the cells draw with matplotlib
    version, module, _ = EDITIONS[args.edition]
    library = args.library or os.path.join(sys.prefix, "oracles", "d2l-" + version)
    install = f"pip install --no-deps --target {library} d2l=={version}"
    if not os.path.isfile(os.path.join(library, "d2l", "mxnet.py")):
        print(f"error: d2l {version} is not unpacked in {library}: {install}", file=sys.stderr)
        return 2
    kind, _, index = args.ctx.partition(":")
    if kind not in ("auto", "cpu", "gpu") or (index and (kind != "gpu" or not index.isdigit())):
        print(f"error: unknown context {args.ctx!r}: use auto, cpu, gpu or gpu:N", file=sys.stderr)
        return 2
    if args.edition == "1.0" and kind == "gpu" and int(index or 0) != 0:
        print("error: d2l 1.0's Trainer trains on gpu(0) only", file=sys.stderr)
        return 2
    cpu_math = _before_mxnet()
    try:
        d2l = _import_from(library, "d2l")  # this d2l, not the installed 0.11.4
        from d2l import mxnet as d2l_module
    except Exception as e:  # e.g. a module it needs is missing on this Python
        print(f"error: d2l {version} does not import here ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    if getattr(d2l, "__version__", None) != version:
        print(f"error: {library} holds d2l {d2l.__version__}, not {version}", file=sys.stderr)
        return 2
    import mxnet as mx
    import numpy
    book = _import_from(os.path.join(ROOT, "oracles"), module)

    out = os.path.abspath(args.out) if args.out else None
    tmp = tempfile.mkdtemp(prefix="chapter-oracle-")
    os.makedirs(os.path.join(tmp, "data"))
    os.makedirs(os.path.join(tmp, "work"))
    zip_copy = os.path.join(tmp, "data", "fra-eng.zip")  # where d2l's '../data' points
    shutil.copyfile(args.data, zip_copy)
    d2l_module.download = lambda *a, **k: zip_copy  # no web, no sha1 check; d2l unzips it

    epochs = []  # 0.17: every epoch's Accumulator(2) (loss_sum, num_tokens)
    plotted = []  # 1.0: (epoch, train, loss) of every Module.plot('loss', ...)
    if args.edition == "0.17":
        class Accumulator(d2l_module.Accumulator):
            def __init__(self, n):
                super().__init__(n)
                epochs.append(self)

        d2l_module.Accumulator = Accumulator
        device = {"auto": "d2l.try_gpu()", "cpu": "npx.cpu()"}.get(kind, f"npx.gpu({index or 0})")
        train_changes = [("0.005, 200, d2l.try_gpu()", f"0.005, {args.epochs}, {device}")]
        predict_changes = []
    else:
        plot = d2l_module.Module.plot

        def record(self, key, value, train):
            if key == "loss":
                plotted.append((self.trainer.epoch + 1, train, float(value.item())))
            return plot(self, key, value, train)

        d2l_module.Module.plot = record
        train_changes = [("max_epochs=30", f"max_epochs={args.epochs}")]
        predict_changes = []
        if kind == "cpu":
            train_changes.append(("num_gpus=1", "num_gpus=0"))
            predict_changes.append(("d2l.try_gpu()", "d2l.cpu()"))
    namespace = vars(book)
    mx.random.seed(args.seed)
    random.seed(args.seed)
    numpy.random.seed(args.seed)
    printed = io.StringIO()
    cwd = os.getcwd()
    tic = time.time()
    try:
        os.chdir(os.path.join(tmp, "work"))
        with contextlib.redirect_stdout(printed):  # the figures print as text
            exec(_cell(book.TRAIN_CELL, train_changes), namespace)
        seconds = time.time() - tic
        book_lines = [line for line in printed.getvalue().splitlines() if line.startswith("loss ")]
        printed = io.StringIO()
        stopped = None
        with contextlib.redirect_stdout(printed):
            try:
                exec(_cell(book.PREDICT_CELL, predict_changes), namespace)
            except ZeroDivisionError as e:  # d2l 0.17's bleu on a one-token translation
                stopped = f"{type(e).__name__}: {e}"
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
    book_lines += [line for line in printed.getvalue().splitlines() if " => " in line]
    print("\n".join(book_lines))
    rows = [_translation(line, args.edition) for line in book_lines if " => " in line]
    if stopped:  # the book's loop stopped inside d2l.bleu: its last translation has no score
        rows.append((namespace["eng"], namespace["translation"], None))
        print(f"note: the book's prediction cell stopped at {namespace['eng']!r} => "
              f"{namespace['translation']!r}: {stopped}", file=sys.stderr)

    summary = {"title": f"chapter's code (d2l {args.edition})", "oracle": "d2l " + version,
               "edition": args.edition, "seed": args.seed, "epochs": args.epochs}
    if args.edition == "0.17":
        history = [(e, m[0] / m[1]) for e, m in enumerate(epochs, 1)]
        num_steps = namespace["num_steps"]
        summary.update({
            "loss": history[-1][1],
            # the book's loss is each sequence's mean over its num_steps label positions
            "loss_per_token": history[-1][1] * num_steps,
            "tokens_per_sec": float(book_lines[0].split(", ")[1].split()[0]),
            "ctx": str(namespace["device"]), "epoch_history": history,
            "history": [(e, loss) for e, loss in history if e % 10 == 0],
            "num_tokens": float(epochs[-1][1])})
    else:
        def mean(values):
            return sum(values) / len(values)

        history = [(e, mean([v for x, t, v in plotted if x == e and t]),
                    mean([v for x, t, v in plotted if x == e and not t]))
                   for e in range(1, args.epochs + 1)]
        summary.update({"loss": history[-1][1], "val_loss": history[-1][2],
                        "ctx": str(mx.gpu(0) if namespace["trainer"].gpus else mx.cpu()),
                        "epoch_history": history})
    summary.update({
        "translations": {s: t for s, t, _ in rows}, "bleu": {s: b for s, _, b in rows},
        "printed": book_lines, "predict_error": stopped, "train_seconds": seconds,
        "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "cpu_math": cpu_math.describe(summary["ctx"])})
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False)
    return 0


def main(argv=None):
    return run(get_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
