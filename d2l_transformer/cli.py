"""``d2l-transformer train|translate|evaluate|compare|launch``: the package's console script.

Only wiring: data from `data`, the model from `train.build_model`, decoding from `beam`, BLEU
from `evaluate`, model directories from `checkpoint`, the book table from `book`.
Errors the user can cause (bad option, missing model or data, bad input line) print one line
``error: ...`` on stderr and exit non-zero; they never print a traceback.
"""

import argparse
import logging
import sys
import time

from mxnet import init

from .book import SENTENCES, compare_table, load_run
from .config import PRESETS
from .context import parse_ctx, parse_ctx_list
from .data import (
    DataError,
    heldout_nmt,
    load_data_nmt,
    load_data_split,
    preprocess_nmt,
    read_data_nmt,
    tokenize_nmt,
)
from .dist.kvstore import KVSTORES, announce_rank, create_kvstore, worker_info
from .dist.launch import LAUNCHERS, LaunchError, launch
from .evaluate import BLEU_PAIRS, SACREBLEU_TOKENIZE, bleu, corpus_bleu
from .inference.beam import ALPHA, BEAM_SIZE, beam_search
from .io import checkpoint
from .model import build_model
from .training import MaskedSoftmaxCELoss, book_line, make_trainer, set_seed, train_s2s_ch8

EXIT_BAD_INPUT, EXIT_ERROR = 1, 2
BATCH = 64  # sentences decoded together


class UserError(Exception):
    """A problem with the command line or the files it names: printed as one line."""


# ---------------------------------------------------------------------------------- translating
def _tokens(line):
    """A sentence as the model's tokens: d2l's preprocessing (lower case, space before , . !)."""
    return preprocess_nmt(line).split()


def check_sentence(tokens, src_vocab, max_positions):
    """None when the sentence can be translated, else why not (one line)."""
    if not tokens:
        return "empty line"
    if all(src_vocab[t] == src_vocab.unk for t in tokens):
        return "no word of it is in the model's vocabulary"
    if len(tokens) > max_positions:
        return f"{len(tokens)} tokens, longer than the model's {max_positions} positions"
    return None


def translate_tokens(model, sentences, src_vocab, tgt_vocab, cfg, ctx, beam=1, alpha=ALPHA):
    """Translations (strings) of token lists, `BATCH` at a time; beam 1 is greedy decoding."""
    max_positions = model.decoder.pos_encoding.max_len
    out = []
    for i in range(0, len(sentences), BATCH):
        batch = sentences[i:i + BATCH]
        # room for a translation a bit longer than the longest source, at least num_steps
        max_length = min(max([cfg.num_steps] + [len(s) + 10 for s in batch]), max_positions)
        results = beam_search(model, batch, src_vocab, tgt_vocab, cfg.num_steps, ctx,
                              beam_size=beam, alpha=alpha, max_length=max_length)
        out.extend(" ".join(tokens) for tokens, _ in results)
    return out


def _read_lines(args):
    """``[(label, text or None, problem or None), ...]`` from the arguments or stdin bytes."""
    if args.sentences:
        return [(f"argument {i}", s, None) for i, s in enumerate(args.sentences, 1)]
    lines = []
    for i, raw in enumerate(sys.stdin.buffer.read().splitlines(), 1):
        try:
            lines.append((f"line {i}", raw.decode("utf-8"), None))
        except UnicodeDecodeError as e:
            lines.append((f"line {i}", None, f"not UTF-8 ({e.reason} at byte {e.start})"))
    return lines


def cmd_translate(args):
    ctx = parse_ctx(args.ctx)
    model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(args.model, ctx)
    max_positions = model.encoder.pos_encoding.max_len
    lines = _read_lines(args)
    good, ok = [], []
    for label, text, problem in lines:
        tokens = _tokens(text) if problem is None else None
        problem = problem or check_sentence(tokens, src_vocab, max_positions)
        if problem:
            print(f"error: {label}: {problem}; skipped", file=sys.stderr)
        else:
            good.append(tokens)
        ok.append(problem is None)
    translations = iter(translate_tokens(model, good, src_vocab, tgt_vocab, cfg, ctx,
                                         args.beam, args.alpha))
    outputs = [next(translations) if line_ok else "" for line_ok in ok]
    for out in outputs:  # one output line per input line, empty when skipped
        print(out)
    if args.attention and good:
        from .viz.png import plot_attention_maps
        first = outputs[ok.index(True)].split()
        for path in plot_attention_maps(model, good[0], first, src_vocab, tgt_vocab,
                                        cfg.num_steps, ctx, args.attention):
            print(f"wrote {path}", file=sys.stderr)
    problems = ok.count(False)
    return EXIT_BAD_INPUT if problems else 0


# ---------------------------------------------------------------------------------- evaluating
def _eval_sets(cfg, src_vocab, tgt_vocab, data_path, max_sentences):
    """``[(name, source token lists, target strings)]``: training pairs and held-out pairs."""
    def cap(name, pair):
        src, tgt = pair
        return (f"{name} ({min(len(src), max_sentences)} of {len(src)})", src[:max_sentences],
                [" ".join(t) for t in tgt[:max_sentences]])

    if cfg.num_valid or cfg.num_test or cfg.num_buckets:  # the full preset's own split
        *_, valid, test = load_data_split(1, cfg.num_steps, cfg.num_examples, cfg.min_freq,
                                          cfg.num_valid, cfg.num_test, 0, data_path)
        return [cap("valid", valid), cap("test", test)]
    train = tokenize_nmt(preprocess_nmt(read_data_nmt(data_path)), cfg.num_examples)
    held = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, path=data_path)
    print(f"held-out: lines {cfg.num_examples + 1}.. of fra.txt: {len(held['unfiltered'][0])} "
          f"pairs, {len(held['in_vocab'][0])} with every token in the vocabularies")
    return [cap("training pairs", train), cap("held-out, in vocabulary", held["in_vocab"]),
            cap("held-out, unfiltered", held["unfiltered"])]


def cmd_evaluate(args):
    ctx = parse_ctx(args.ctx)
    model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(args.model, ctx)
    decoders = [("greedy", 1), (f"beam {args.beam}", args.beam)]
    print("per-sentence BLEU (d2l's bleu, k=2):")
    for name, beam in decoders:
        outs = translate_tokens(model, [e.split() for e, _ in BLEU_PAIRS], src_vocab, tgt_vocab,
                                cfg, ctx, beam, args.alpha)
        for (eng, fra), out in zip(BLEU_PAIRS, outs):
            print(f"  [{name}] {eng} => {out}, bleu {bleu(out, fra, k=2):.3f}")
    print(f"corpus BLEU (sacrebleu, tokenize={SACREBLEU_TOKENIZE!r}):")
    for name, src, refs in _eval_sets(cfg, src_vocab, tgt_vocab, args.data, args.max_sentences):
        if not src:
            print(f"  {name}: no pairs")
            continue
        cells = []
        for _, beam in decoders:
            tic = time.time()
            hyps = translate_tokens(model, src, src_vocab, tgt_vocab, cfg, ctx, beam, args.alpha)
            cells.append(f"{corpus_bleu(hyps, refs).score:6.2f} ({time.time() - tic:.0f} s)")
        print(f"  {name}: " + "  ".join(f"{d}: {c}" for (d, _), c in zip(decoders, cells)))
        if args.examples:
            for s, r, h in list(zip(src, refs, hyps))[:args.examples]:
                print(f"    {' '.join(s)} => {h}   [reference: {r}]")
    return 0


# ---------------------------------------------------------------------------------- training
class Progress:
    """A one-line progress bar on stderr: epoch, batches, loss (book units), tokens/s."""

    def __init__(self, num_epochs, num_batches, stream=sys.stderr):
        self.num_epochs, self.num_batches, self.stream = num_epochs, num_batches, stream
        self.epoch, self.batch, self.tic = None, 0, time.time()
        self.tty = stream.isatty()

    def __call__(self, epoch, loss_sum, num_tokens):
        if epoch != self.epoch:
            self.epoch, self.batch, self.tic = epoch, 0, time.time()
        self.batch += 1
        if self.tty or self.batch == self.num_batches or self.batch % 100 == 0:
            done = self.batch / max(self.num_batches, 1)
            bar = "#" * int(20 * done) + "." * (20 - int(20 * done))
            speed = num_tokens / max(time.time() - self.tic, 1e-9)
            end = "\r" if self.tty and self.batch < self.num_batches else "\n"
            self.stream.write(f"epoch {epoch}/{self.num_epochs} [{bar}] {self.batch}/"
                              f"{self.num_batches} loss {loss_sum / num_tokens:.4f} "
                              f"{speed:.0f} tokens/s{end}")
            self.stream.flush()


def _train_config(args):
    if args.resume:
        cfg = checkpoint.load_config(args.out)
    else:
        cfg = PRESETS[args.preset]
        if args.exact_chapter:
            cfg = cfg.replace(exact_chapter=True)
        if args.max_pairs is not None:
            cfg = cfg.replace(num_examples=args.max_pairs - 1)  # d2l keeps lines 0..num_examples
    if args.epochs is not None:
        cfg = cfg.replace(num_epochs=args.epochs)
    return cfg


def cmd_train(args):
    ctxs = parse_ctx_list(args.ctx)
    ctx = ctxs[0]  # where the final translations run
    cfg = _train_config(args)
    if args.fast and cfg.exact_chapter:
        raise UserError("--fast trains the corrected model; --exact-chapter needs the faithful path")
    kvstore = create_kvstore(args.kvstore)
    rank, num_workers = worker_info(kvstore)
    if num_workers > 1:  # `launch` prefixes this worker's lines with its rank from now on
        announce_rank(kvstore)
    batch_size = cfg.batch_size // num_workers  # the preset's batch is the GLOBAL batch
    if batch_size < len(ctxs):
        raise UserError(f"batch size {cfg.batch_size} is too small for {num_workers} workers "
                        f"x {len(ctxs)} devices")
    set_seed(args.seed)
    if cfg.num_valid or cfg.num_test or cfg.num_buckets:
        src_vocab, tgt_vocab, train_iter, _, _ = load_data_split(
            batch_size, cfg.num_steps, cfg.num_examples, cfg.min_freq, cfg.num_valid,
            cfg.num_test, cfg.num_buckets, args.data, rank=rank, num_workers=num_workers)
    else:
        src_vocab, tgt_vocab, train_iter = load_data_nmt(batch_size, cfg.num_steps,
                                                         cfg.num_examples, args.data, rank=rank,
                                                         num_workers=num_workers,
                                                         fast_loader=args.fast)
    writer = rank == 0  # only rank 0 writes the model directory and prints the results
    if args.resume:
        model, saved_src, saved_tgt, _, summary = checkpoint.load(args.out, ctxs)
        if saved_src.idx_to_token != src_vocab.idx_to_token or \
                saved_tgt.idx_to_token != tgt_vocab.idx_to_token:
            raise UserError(f"{args.out}: its vocabularies differ from the data's; "
                            "was it trained on another dataset?")
        if summary.get("seed") != args.seed:
            raise UserError(f"{args.out} was trained with --seed {summary.get('seed')}, "
                            f"not {args.seed}")
        trainer = make_trainer(model, cfg.lr, cfg.warmup_steps, kvstore)
        checkpoint.load_trainer_states(args.out, trainer)
        start_epoch = summary["epochs_done"] + 1
        if start_epoch > cfg.num_epochs:
            print(f"{args.out} has already been trained {summary['epochs_done']} epochs; "
                  "give a larger --epochs to train on", file=sys.stderr)
            return 0
    else:
        model = build_model(cfg, len(src_vocab), len(tgt_vocab))
        model.initialize(init.Xavier(), force_reinit=True, ctx=ctxs)
        trainer = make_trainer(model, cfg.lr, cfg.warmup_steps, kvstore)
        summary = {"seed": args.seed, "preset": args.preset, "exact_chapter": cfg.exact_chapter,
                   "epoch_history": [], "train_seconds": 0.0, "epochs_done": 0}
        start_epoch = 1
    where = ",".join(map(str, ctxs)) + (f", worker {rank} of {num_workers}" if num_workers > 1 else "")
    print(f"training {cfg.num_epochs} epochs (from epoch {start_epoch}) on {where}: "
          f"{len(src_vocab)} source / {len(tgt_vocab)} target tokens, {len(train_iter)} batches "
          f"per epoch; model directory {args.out}", file=sys.stderr)
    tic = [time.time()]

    def on_epoch(epoch, loss):
        summary["epoch_history"].append((epoch, loss))
        summary["train_seconds"] += time.time() - tic[0]
        summary["epochs_done"] = epoch
        tic[0] = time.time()
        if writer and (epoch % args.checkpoint_every == 0 or epoch == cfg.num_epochs):
            checkpoint.save(args.out, model, src_vocab, tgt_vocab, cfg, summary, trainer)
            tic[0] = time.time()
        if args.stop_after and epoch >= args.stop_after:  # for tests of --resume
            raise _Stop()

    try:
        result = train_s2s_ch8(
            model, train_iter, cfg.lr, cfg.num_epochs, ctxs, on_epoch, trainer=trainer,
            loss=MaskedSoftmaxCELoss(cfg.label_smoothing), start_epoch=start_epoch,
            epoch_seed=args.seed * 100000, fast=args.fast, kvstore=kvstore,
            on_batch=None if args.quiet else Progress(cfg.num_epochs, len(train_iter)))
    except _Stop:
        print(f"stopped after epoch {summary['epochs_done']} (--stop-after); "
              f"continue with --resume", file=sys.stderr)
        return 0
    summary.update({k: result[k] for k in ("loss", "loss_per_token", "tokens_per_sec", "ctx")})
    summary["epochs"] = cfg.num_epochs
    if not writer:
        return 0
    if num_workers > 1:
        summary.update(num_workers=num_workers, kvstore=args.kvstore)
    summary["translations"] = dict(zip(SENTENCES, translate_tokens(
        model, [_tokens(s) for s in SENTENCES], src_vocab, tgt_vocab, cfg, ctx)))
    checkpoint.save(args.out, model, src_vocab, tgt_vocab, cfg, summary, trainer)
    print(book_line(summary))
    for sentence, translation in summary["translations"].items():
        print(f"{sentence} => {translation}")
    return 0


class _Stop(Exception):
    """Raised by the epoch callback to stop training (``--stop-after``)."""


def cmd_launch(args):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        return launch(command, args.num_workers, args.num_servers, args.launcher, args.hostfile,
                      args.timeout)
    except LaunchError as e:
        raise UserError(str(e)) from None


def cmd_compare(args):
    print(compare_table([load_run(d) for d in args.runs]))
    return 0


# ---------------------------------------------------------------------------------- wiring
def get_parser():
    p = argparse.ArgumentParser(prog="d2l-transformer", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model and keep it as a model directory")
    t.add_argument("--preset", choices=sorted(PRESETS), default="chapter")
    t.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    t.add_argument("--max-pairs", type=int, default=None, help="use only the first N pairs")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--ctx", default="auto",
                   help="auto, cpu, cpu:N, gpu, gpu:N, or a list: gpu:0,gpu:1 (data parallel)")
    t.add_argument("--kvstore", choices=KVSTORES, default="device",
                   help="device: the devices of --ctx in this process; dist_sync: several "
                        "processes started by `d2l-transformer launch`")
    t.add_argument("--fast", action="store_true",
                   help="the hybridized training path (issue 4): same numbers, faster")
    t.add_argument("--out", default="out/model", help="the model directory (checkpoints too)")
    t.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="save the model directory every N epochs (and at the end)")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    t.add_argument("--exact-chapter", action="store_true", help="the book's three bugs")
    t.add_argument("--data", default=None, help="path of fra-eng.zip")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_train)

    for name, func, text in (("translate", cmd_translate, "translate English sentences"),
                             ("evaluate", cmd_evaluate, "BLEU of a model directory")):
        e = sub.add_parser(name, help=text)
        e.add_argument("--model", required=True, help="a model directory written by train")
        e.add_argument("--beam", type=int, default=1 if name == "translate" else BEAM_SIZE,
                       help="beam size (1: greedy)")
        e.add_argument("--alpha", type=float, default=ALPHA, help="length penalty exponent")
        e.add_argument("--ctx", default="auto")
        e.set_defaults(func=func)
        if name == "translate":
            e.add_argument("sentences", nargs="*", help="sentences (default: one per stdin line)")
            e.add_argument("--attention", metavar="DIR", default=None,
                           help="write attention heatmaps (PNG) of the first sentence into DIR")
        else:
            e.add_argument("--data", default=None, help="path of fra-eng.zip")
            e.add_argument("--max-sentences", type=int, default=1000,
                           help="evaluate at most N sentences of each set")
            e.add_argument("--examples", type=int, default=0, help="print N example translations")

    la = sub.add_parser("launch", help="run a command as a dist_sync job (MXNet's launcher)",
                        description="Run COMMAND as a dist_sync job: a scheduler, -s servers "
                                    "and -n workers, e.g. d2l-transformer launch -n 2 -- "
                                    "d2l-transformer train --kvstore dist_sync")
    la.add_argument("-n", "--num-workers", type=int, required=True)
    la.add_argument("-s", "--num-servers", type=int, default=1)
    la.add_argument("--launcher", choices=LAUNCHERS, default="local")
    la.add_argument("-H", "--hostfile", default=None, help="hosts, one per line (ssh, mpi)")
    la.add_argument("--timeout", type=float, default=None, help="stop the job after S seconds")
    la.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    la.set_defaults(func=cmd_launch)

    c = sub.add_parser("compare", help="the book's output beside chapter runs")
    c.add_argument("runs", nargs="+", help="model directories or chapter-script output directories")
    c.set_defaults(func=cmd_compare)
    return p


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = get_parser().parse_args(argv)
    if getattr(args, "beam", 1) < 1:
        print("error: --beam must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    try:
        return args.func(args)
    except (UserError, checkpoint.CheckpointError, DataError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
