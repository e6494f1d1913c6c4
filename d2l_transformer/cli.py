"""``d2l-transformer train|translate|evaluate|export|compare|launch``: the package's console script.

Only wiring: training from `training.run`, decoding from `inference.translator`, BLEU from
`evaluate`, model
directories from `checkpoint`, the book table from `book`.
Errors the user can cause (bad option, missing model or data, bad input line) print one line
``error: ...`` on stderr and exit non-zero; they never print a traceback. Anything else is a bug:
its traceback is printed, then one line saying so, and the exit status is 3 (`guarded`).
"""

import argparse
import errno
import logging
import os
import sys
import time
import traceback

from .book import compare_table, load_run
from .config import PRESETS
from .context import parse_ctx, parse_ctx_list
from .data import DataError, TokenizerError, WordTokenizer, evaluation_sets
from .distributed.kvstore import KVSTORES, create_kvstore
from .distributed.launch import LAUNCHERS, LaunchError, launch
from .evaluate import (
    BLEU_PAIRS_TEXT,
    bleu,
    format_score,
    score,
    score_all_references,
    score_files,
)
from .inference.text import TranslationError, check_sentence, translate_texts, translate_tokens
from .inference.translator import ALPHA, BEAM_SIZE, Translator
from .io import checkpoint
from .training import book_line
from .training.run import RunError, TrainingStopped, train_model

EXIT_BAD_INPUT, EXIT_ERROR, EXIT_BUG = 1, 2, 3


class UserError(Exception):
    """A problem with the command line or the files it names: printed as one line."""


USER_ERRORS = (UserError, checkpoint.CheckpointError, DataError, RunError,  # one line each
               TokenizerError, TranslationError)


# ---------------------------------------------------------------------------------- translating
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
    ctx = _device(args.ctx)
    model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(args.model, ctx)
    if cfg.exact_chapter and (args.attention or args.attention_html):
        raise UserError("attention maps need the corrected model; this one was trained with "
                        "--exact-chapter")
    tokenizer = checkpoint.load_tokenizer(args.model, cfg)
    max_positions = model.encoder.pos_encoding.max_len
    lines = _read_lines(args)
    good, ok = [], []
    for label, text, problem in lines:
        tokens = tokenizer.encode(text) if problem is None else None
        problem = problem or check_sentence(tokens, src_vocab, max_positions)
        if problem:
            print(f"error: {label}: {problem}; skipped", file=sys.stderr)
        else:
            good.append(tokens)
        ok.append(problem is None)
    translations = iter(translate_tokens(model, good, src_vocab, tgt_vocab, cfg, ctx,
                                         args.beam, args.alpha))
    outputs = [next(translations) if line_ok else "" for line_ok in ok]  # target tokens
    for out in outputs:  # one output line per input line, empty when skipped
        print(tokenizer.decode(out.split()))
    if args.attention and good:
        from .viz.png import plot_attention_maps
        first = outputs[ok.index(True)].split()
        for path in plot_attention_maps(model, good[0], first, src_vocab, tgt_vocab,
                                        cfg.num_steps, ctx, args.attention):
            print(f"wrote {path}", file=sys.stderr)
    if args.attention_html and good:  # the interactive explorer, data inlined
        from .viz.attention_html import explorer_items, write_explorer
        translator = Translator(model, src_vocab, tgt_vocab, ctx, num_steps=cfg.num_steps)
        texts = [text for (_, text, _), line_ok in zip(lines, ok) if line_ok]
        write_explorer(args.attention_html,
                       explorer_items(translator, tokenizer, texts, args.beam, args.alpha))
        print(f"wrote {args.attention_html}", file=sys.stderr)
    problems = ok.count(False)
    return EXIT_BAD_INPUT if problems else 0


# ---------------------------------------------------------------------------------- evaluating
def _write_json(path, data):
    import json
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _evaluate_files(args):
    """``evaluate --hyp FILE --ref FILE``: score a file of translations, no model needed."""
    if not (args.hyp and args.ref):
        raise UserError("--hyp and --ref go together")
    if args.model:
        raise UserError("give either --model or --hyp/--ref")
    try:
        result = score_files(args.hyp, args.ref, args.lowercase)
    except ValueError as e:
        raise UserError(str(e)) from None
    print(f"{format_score(result)}  ({result['sentences']} sentences)")
    print(f"BLEU signature: {result['bleu_signature']}")
    print(f"chrF signature: {result['chrf_signature']}")
    if args.json:
        ref = args.ref[0] if len(args.ref) == 1 else args.ref
        _write_json(args.json, {"hyp": args.hyp, "ref": ref, **result})
    return 0


def cmd_evaluate(args):
    if args.hyp or args.ref:
        return _evaluate_files(args)
    if not args.model:
        raise UserError("evaluate needs --model DIR, or --hyp FILE --ref FILE")
    ctx = _device(args.ctx)
    model, src_vocab, tgt_vocab, cfg, summary = checkpoint.load(args.model, ctx)
    tok = checkpoint.load_tokenizer(args.model, cfg)
    lowercase = tok.lowercase or args.lowercase
    decoders = [("greedy", 1)] + ([] if cfg.exact_chapter else [(f"beam {args.beam}", args.beam)])
    report = {"model": args.model, "preset": summary.get("preset"), "tokenizer": tok.kind,
              "lowercase": lowercase, "chapter_sentences": [], "sets": []}
    words = WordTokenizer()  # d2l's bleu compares d2l's lower-cased tokens

    def d2l_tokens(text):
        return " ".join(words.encode(text))
    print("the chapter's sentences, per-sentence BLEU (d2l's bleu, k=2, on d2l's lower-cased "
          "tokens):")
    for name, beam in decoders:
        outs = translate_texts(model, [e for e, _ in BLEU_PAIRS_TEXT], tok, src_vocab, tgt_vocab,
                               cfg, ctx, beam, args.alpha)
        for (eng, fra), out in zip(BLEU_PAIRS_TEXT, outs):
            shown = eng if tok.kind == "subword" else " ".join(tok.encode(eng))
            value = bleu(d2l_tokens(out), d2l_tokens(fra), k=2)
            print(f"  [{name}] {shown} => {out}, bleu {value:.3f}")
            report["chapter_sentences"].append({"source": eng, "reference": fra, "decoder": name,
                                                "translation": out, "d2l_bleu": value})
    sets, note = evaluation_sets(cfg, src_vocab, tgt_vocab, args.data)
    if note:
        print(note)
    print("corpus BLEU and chrF (sacreBLEU, detokenized output against the untokenized "
          "references" + (", case-insensitive" if lowercase else "") + "):")
    signatures = {}
    for name, pairs, overlap in sets:
        n = len(pairs.source)
        src, refs = pairs.source[:args.max_sentences], pairs.target[:args.max_sentences]
        entry = {"name": name, "pairs": n, "scored": len(src), "sources_seen_in_training": overlap,
                 "decoders": {}}
        report["sets"].append(entry)
        seen = "" if overlap is None else f"  [sources seen in training: {overlap}]"
        if not src:
            print(f"  {name}: no pairs{seen}")
            continue
        cells, multi_cells = [], []
        for decoder, beam in decoders:
            tic = time.time()
            hyps = translate_texts(model, src, tok, src_vocab, tgt_vocab, cfg, ctx, beam, args.alpha)
            outs = [tok.detokenize(h) for h in hyps]
            result = score(outs, refs, lowercase)
            result["seconds"] = round(time.time() - tic, 1)
            result["all_references"] = score_all_references(outs, src, pairs, lowercase)
            entry["decoders"][decoder] = result
            signatures = {"BLEU": result["bleu_signature"], "chrF": result["chrf_signature"],
                          "all references' BLEU": result["all_references"]["bleu_signature"]}
            cells.append(f"{decoder}: {format_score(result)} ({result['seconds']:.0f} s)")
            multi_cells.append(f"{decoder}: {format_score(result['all_references'])}")
        print(f"  {name} ({len(src)} of {n}): " + "  ".join(cells) + seen)
        multi = result["all_references"]
        print(f"    each of its {multi['sentences']} sources once, against all its references "
              f"(1 to {multi['most_references']}): " + "  ".join(multi_cells))
        if args.examples:
            for s, r, h in list(zip(src, refs, hyps))[:args.examples]:
                print(f"    {s} => {h}   [reference: {r}]")
    for metric, signature in signatures.items():
        print(f"{metric} signature: {signature}")
    if args.json:
        _write_json(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------- training
def _devices(spec):
    """``--ctx`` as a list of contexts; a bad one is a user error."""
    try:
        return parse_ctx_list(spec)
    except ValueError as e:
        raise UserError(str(e)) from None


def _device(spec):
    """``--ctx`` as one context; a bad one is a user error."""
    try:
        return parse_ctx(spec)
    except ValueError as e:
        raise UserError(str(e)) from None


def _train_config(args):
    for option, value, least in (("--epochs", args.epochs, 1), ("--max-pairs", args.max_pairs, 1),
                                 ("--checkpoint-every", args.checkpoint_every, 1)):
        if value is not None and value < least:
            raise UserError(f"{option} must be at least {least}")
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
    ctxs = _devices(args.ctx)
    cfg = _train_config(args)
    try:
        kvstore = create_kvstore(args.kvstore)
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        summary = train_model(cfg, args.out, seed=args.seed, ctx=ctxs, kvstore=kvstore,
                              fast=not args.imperative, resume=args.resume, data_path=args.data,
                              checkpoint_every=args.checkpoint_every, progress=not args.quiet,
                              preset=args.preset, stop_after=args.stop_after,
                              overwrite=args.overwrite)
    except TrainingStopped as e:
        print(f"stopped after epoch {e.epoch} (--stop-after); continue with --resume",
              file=sys.stderr)
        return 0
    if "translations" in summary:  # rank 0 of a finished run
        print(book_line(summary))
        for sentence, translation in summary["translations"].items():
            print(f"{sentence} => {translation}")
    return 0


def cmd_launch(args):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        return launch(command, args.num_workers, args.num_servers, args.launcher, args.hostfile,
                      args.timeout)
    except LaunchError as e:
        raise UserError(str(e)) from None


def cmd_serve(args):
    from .serve import ServeError, run
    _device(args.ctx)  # a bad --ctx is one line before anything starts
    try:
        run(args.model, args.host, args.port, args.ctx)
    except ServeError as e:
        raise UserError(str(e)) from None
    return 0


def cmd_export(args):
    from .inference.export import ExportError, export
    try:
        manifest = export(args.model, args.out, _device(args.ctx))
    except ExportError as e:
        raise UserError(str(e)) from None
    print(f"wrote {args.out}: " + ", ".join(sorted(manifest["files"])), file=sys.stderr)
    return 0


def cmd_compare(args):
    try:
        runs = [load_run(d) for d in args.runs]
    except (OSError, ValueError) as e:  # load_run's errors are one line naming the file
        raise UserError(f"cannot read a run: {e}") from None
    print(compare_table(runs))
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
    path = t.add_mutually_exclusive_group()
    path.add_argument("--imperative", action="store_true",
                      help="train with the chapter's imperative loop instead of the default "
                           "hybridized graph path (same numbers to float rounding, slower); "
                           "--exact-chapter always uses it")
    path.add_argument("--fast", action="store_true",
                      help="the hybridized graph path: the default, accepted for compatibility")
    t.add_argument("--out", default="out/model", help="the model directory (checkpoints too)")
    t.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="save the model directory every N epochs (and at the end)")
    again = t.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue from the checkpoint in --out")
    again.add_argument("--overwrite", action="store_true",
                       help="replace the model directory --out if it holds one (without "
                            "--resume or --overwrite an existing model is never replaced; a "
                            "directory that is not a model directory never is)")
    t.add_argument("--exact-chapter", action="store_true",
                   help="the book's three bugs (trains on the chapter's imperative loop)")
    t.add_argument("--data", default=None, help="path of fra-eng.zip")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_train)

    for name, func, text in (("translate", cmd_translate, "translate English sentences"),
                             ("evaluate", cmd_evaluate, "BLEU and chrF of a model directory "
                                                        "(or of a file of translations)")):
        e = sub.add_parser(name, help=text)
        e.add_argument("--model", required=name == "translate",
                       help="a model directory written by train")
        e.add_argument("--beam", type=int, default=1 if name == "translate" else BEAM_SIZE,
                       help="beam size (1: greedy)")
        e.add_argument("--alpha", type=float, default=ALPHA, help="length penalty exponent")
        e.add_argument("--ctx", default="auto")
        e.set_defaults(func=func)
        if name == "translate":
            e.add_argument("sentences", nargs="*", help="sentences (default: one per stdin line)")
            e.add_argument("--attention", metavar="DIR", default=None,
                           help="write attention heatmaps (PNG) of the first sentence into DIR")
            e.add_argument("--attention-html", metavar="FILE", default=None,
                           help="write the sentences' attention explorer as one HTML file")
        else:
            e.add_argument("--data", default=None, help="path of fra-eng.zip")
            e.add_argument("--max-sentences", type=int, default=1000,
                           help="evaluate at most N sentences of each set")
            e.add_argument("--examples", type=int, default=0, help="print N example translations")
            e.add_argument("--json", metavar="FILE", default=None,
                           help="also write the scores and their signatures to FILE")
            e.add_argument("--hyp", metavar="FILE", default=None,
                           help="score this file of translations (one a line) against --ref, "
                                "no model needed")
            e.add_argument("--ref", metavar="FILE", nargs="+", default=None,
                           help="the references of --hyp: one file, or several (a line of each "
                                "is one more reference of that sentence)")
            e.add_argument("--lowercase", action="store_true",
                           help="case-insensitive scores (always so for lower-casing models)")

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

    sv = sub.add_parser("serve", help="serve a model directory over HTTP: POST /translate, "
                                      "the attention explorer at /, API docs at /docs")
    sv.add_argument("--model", required=True, help="a model directory written by train")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--ctx", default="auto")
    sv.set_defaults(func=cmd_serve)

    x = sub.add_parser("export", help="write a model directory in MXNet's deployment format "
                                      "(encoder and decoding-step graphs, docs/export.md)")
    x.add_argument("--model", required=True, help="a model directory written by train")
    x.add_argument("--out", required=True, help="the export directory to write")
    x.add_argument("--ctx", default="cpu")
    x.set_defaults(func=cmd_export)

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
    return guarded(args.func, args)


def _user_paths(args):
    """The paths the command line names, absolute."""
    paths = [getattr(args, k, None) for k in ("out", "model", "data", "attention", "attention_html",
                                              "hostfile", "json", "hyp", "ref")]
    paths += list(getattr(args, "runs", None) or [])
    return [os.path.abspath(p) for p in paths if isinstance(p, str) and p]


def _about_user_files(error, args):
    """True when an OSError concerns a path the command line names: the path, a file in it, a
    directory on the way to it, or a save's sibling of it; or the disk being full."""
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    names = [os.path.abspath(os.fsdecode(n)) for n in (error.filename, error.filename2)
             if isinstance(n, (str, bytes))]
    for path in _user_paths(args):
        parent, base = os.path.split(path)
        for name in names:
            if name == path or name.startswith(path + os.sep) or \
                    path.startswith(name.rstrip(os.sep) + os.sep) or \
                    name.startswith(os.path.join(parent, f".{base}.")):
                return True
    return False


def guarded(func, args):
    """``func(args)`` with the command line's error policy: a user's error (bad option,
    missing or damaged model or data, a file named on the command line that cannot be
    read or written) prints one line ``error: ...`` and returns EXIT_ERROR; anything else is a
    bug and keeps its traceback (printed, then one line saying so, EXIT_BUG)."""
    try:
        return func(args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        if not _about_user_files(e, args):
            return _bug(e)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - reported with its traceback
        return _bug(e)


def _bug(error):
    traceback.print_exc()
    print(f"error: unexpected {type(error).__name__} (a bug in d2l-transformer: the traceback "
          "is above)", file=sys.stderr)
    return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
