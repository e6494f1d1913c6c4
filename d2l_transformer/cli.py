"""``d2l-transformer train|translate|evaluate|launch|serve|export|compare``: the console script.

Only wiring: training from `training.run`, translating from `inference.engines`, BLEU from
`evaluate`, model directories from `checkpoint`, the book table from `book`.
Errors the user can cause print one line ``error: ...`` and exit non-zero; anything else is a
bug and keeps its traceback (`_guard`).
"""

import argparse
import logging
import os
import sys

from . import checkpoint
from ._guard import EXIT_BAD_INPUT, EXIT_BUG, EXIT_ERROR, guarded  # noqa: F401 (EXIT_BUG)
from .book import compare, load_run, printed_lines
from .config import EDITIONS, PRESETS, load_overrides, parse_overrides, preset_config, resume_overrides
from .context import parse_ctx, parse_ctx_list
from .data import DataError, TokenizerError
from .distributed.kvstore import KVSTORES, create_kvstore
from .distributed.launch import LAUNCHERS, LaunchError, launch
from .evaluate import evaluate_model, format_files_report, format_report, score_files
from .inference.engines import DEFAULT_ENGINE, ENGINES, MXNetEngine, open_engine
from .inference.export import DEFAULT_FORMAT as DEFAULT_EXPORT_FORMAT
from .inference.export import FORMATS as EXPORT_FORMATS
from .inference.export import ExportError
from .inference.export.ctranslate2 import QUANTIZATIONS
from .inference.limits import (
    ExactChapterError,
    input_sentences,
    refusal_report,
    require_corrected,
    screen_inputs,
)
from .inference.translator import ALPHA, BEAM_SIZE
from .io import atomic
from .training.run import RunError, train_model


class UserError(Exception):
    """A problem with the command line or the files it names: printed as one line."""


USER_ERRORS = (UserError, checkpoint.CheckpointError, DataError, RunError,  # one line each
               TokenizerError, ExactChapterError, ExportError)


# ---------------------------------------------------------------------------------- translating
def cmd_translate(args):
    ctx = _device(args.ctx)
    engine = open_engine(args.model, args.engine, ctx, no_unk=args.no_unk)
    explainer = None  # the MXNet model: attention maps, whichever engine translates
    if args.attention or args.attention_html:
        explainer = engine if engine.name == "mxnet" else MXNetEngine.load(args.model, ctx)
        require_corrected(explainer.cfg, "attention maps")
    tokenizer = engine.tokenizer
    lines = input_sentences(args.sentences, getattr(sys.stdin, "buffer", None))
    # the one rule of the library and the server (`inference.limits`); bad lines said once
    tokens, refused = screen_inputs(lines, tokenizer, engine.src_vocab, engine.max_positions)
    for line in refusal_report(refused):
        print(f"error: {line}", file=sys.stderr)
    good, ok = [t for t in tokens if t is not None], [t is not None for t in tokens]
    translations = iter(engine.translate(good, args.beam, args.alpha))
    outputs = [list(next(translations).tokens) if line_ok else [] for line_ok in ok]
    for out in outputs:  # one output line per input line, empty when skipped
        print(tokenizer.decode(out))
    if args.attention and good:
        from .viz.png import plot_attention_maps
        m = explainer  # the first sentence's maps, of the engine's translation
        for path in plot_attention_maps(m.model, good[0], outputs[ok.index(True)], m.src_vocab,
                                        m.tgt_vocab, m.cfg.num_steps, ctx, args.attention):
            print(f"wrote {path}", file=sys.stderr)
    if args.attention_html and good:  # the interactive explorer (MXNet's), data inlined
        from .viz.attention_html import explorer_items, write_explorer
        texts = [text for (_, text, _), line_ok in zip(lines, ok) if line_ok]
        write_explorer(args.attention_html,
                       explorer_items(explainer, tokenizer, texts, args.beam, args.alpha))
        print(f"wrote {args.attention_html}", file=sys.stderr)
    return EXIT_BAD_INPUT if False in ok else 0


# ---------------------------------------------------------------------------------- evaluating
def _write_json(path, data):
    import json
    atomic.write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


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
    print(format_files_report(result))
    if args.json:
        ref = args.ref[0] if len(args.ref) == 1 else args.ref
        _write_json(args.json, {"hyp": args.hyp, "ref": ref, **result})
    return 0


def cmd_evaluate(args):
    if args.hyp or args.ref:
        return _evaluate_files(args)
    if not args.model:
        raise UserError("evaluate needs --model DIR, or --hyp FILE --ref FILE")
    report = evaluate_model(args.model, engine=args.engine, ctx=_device(args.ctx),
                            beam=args.beam, alpha=args.alpha, data_path=args.data,
                            max_sentences=args.max_sentences, lowercase=args.lowercase,
                            examples=args.examples, no_unk=args.no_unk)
    print(format_report(report))
    if args.json:
        _write_json(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------- training
def _device(spec, parse=parse_ctx):
    """``--ctx`` as one context (`parse_ctx_list`: a list of them); a bad one is a user error."""
    try:
        return parse(spec)
    except ValueError as e:
        raise UserError(str(e)) from None


def _train_config(args):
    """The run's config: the preset (or, resuming, the saved one) < --config < --set < the
    dedicated options (--exact-chapter, --max-pairs, --epochs)."""
    for option, value, least in (("--epochs", args.epochs, 1), ("--max-pairs", args.max_pairs, 1),
                                 ("--checkpoint-every", args.checkpoint_every, 1),
                                 ("--valid-every", args.valid_every, 0),
                                 ("--patience", args.patience, 1),
                                 ("--average-last", args.average_last, 1)):
        if value is not None and value < least:
            raise UserError(f"{option} must be at least {least}")
    try:
        overrides = load_overrides(args.config) if args.config else {}
        overrides.update(parse_overrides(args.set or []))
        if args.resume:
            cfg = resume_overrides(checkpoint.load_config(args.out), overrides)
        else:
            cfg = preset_config(args.preset, args.edition).with_overrides(overrides)
    except ValueError as e:
        if isinstance(e, checkpoint.CheckpointError):
            raise
        raise UserError(str(e)) from None
    if not args.resume:
        if args.exact_chapter:
            cfg = cfg.replace(exact_chapter=True)
        if args.max_pairs is not None:
            cfg = cfg.replace(num_examples=args.max_pairs - 1)  # d2l keeps lines 0..num_examples
    if args.epochs is not None:
        cfg = cfg.replace(num_epochs=args.epochs)
    return cfg


def cmd_train(args):
    ctxs = _device(args.ctx, parse_ctx_list)
    cfg = _train_config(args)
    try:
        kvstore = create_kvstore(args.kvstore)
    except ValueError as e:
        raise UserError(str(e)) from None
    summary = train_model(cfg, args.out, seed=args.seed, ctx=ctxs, kvstore=kvstore,
                          fast=not args.imperative, resume=args.resume, data_path=args.data,
                          checkpoint_every=args.checkpoint_every, progress=not args.quiet,
                          preset=args.preset, valid_every=args.valid_every,
                          patience=args.patience, average_last=args.average_last,
                          overwrite=args.overwrite)
    if "translations" in summary:  # rank 0 of a finished run
        print("\n".join(printed_lines(summary)))
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
        hosts = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()] \
            if args.allowed_hosts else None
        run(args.model, args.host, args.port, args.ctx, allowed_hosts=hosts,
            api_key=args.api_key, engine=args.engine)
    except ServeError as e:
        raise UserError(str(e)) from None
    return 0


def cmd_export(args):
    from .inference.export import export
    manifest = export(args.model, args.out, _device(args.ctx), format=args.format,
                      quantization=args.quantization)
    print(f"wrote {args.out}: " + ", ".join(sorted(manifest["files"])), file=sys.stderr)
    return 0


def cmd_compare(args):
    try:  # load_run's errors name the file; compare's: a run of another edition, or none
        print(compare([load_run(d) for d in args.runs], args.edition))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot compare: {e}") from None
    return 0


# ---------------------------------------------------------------------------------- wiring
def _engine_option(parser):
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                        help="mxnet: the package's translator (default); ctranslate2: "
                             "CTranslate2 on the CPU, over the model's export kept beside it "
                             "(made on first use; attention maps still come from MXNet)")


def get_parser():
    p = argparse.ArgumentParser(prog="d2l-transformer")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_translate_and_evaluate, _add_launch, _add_serve, _add_export,
                _add_compare):
        add(sub)
    p.description = (f"The Transformer of d2l 9.3 in MXNet: {', '.join(sub.choices)} (each "
                     "command's options: d2l-transformer COMMAND --help).")
    return p


def _add_train(sub):
    t = sub.add_parser("train", help="train a model and keep it as a model directory")
    t.add_argument("--preset", choices=sorted(PRESETS), default="chapter")
    t.add_argument("--edition", choices=sorted(EDITIONS), default="0.11",
                   help="the chapter of d2l 0.11 (2019), 0.17 (classic) or 1.0, with its data, "
                        "sizes and loop (docs/editions.md)")
    t.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    t.add_argument("--max-pairs", type=int, default=None, help="use only the first N pairs")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--ctx", default="auto",
                   help="auto, cpu, cpu:N, gpu, gpu:N, or a list: gpu:0,gpu:1 (data parallel)")
    t.add_argument("--kvstore", choices=KVSTORES, default="device",
                   help="device: the devices of --ctx in this process; dist_sync: several "
                        "processes started by d2l-transformer launch")
    t.add_argument("--imperative", action="store_true",
                   help="train with the chapter's imperative loop instead of the default "
                        "hybridized graph path (same numbers to float rounding, slower); "
                        "--exact-chapter always uses it")
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
    t.add_argument("--config", metavar="FILE", default=None,
                   help="a JSON object of config fields on top of the preset, e.g. "
                        '{"lr": 0.001, "num_layers": 3} (see docs/usage.md)')
    t.add_argument("--set", metavar="FIELD=VALUE", action="append", default=None,
                   help="one config field on top of the preset and --config, e.g. --set "
                        "warmup_steps=200 --set dropout=0.2 (repeatable)")
    t.add_argument("--valid-every", type=int, default=None, metavar="N",
                   help="validate every N epochs: valid loss and greedy BLEU on the first "
                        "valid_sentences valid pairs, the best kept in OUT/best (default 1 "
                        "for presets with a valid part; 0: never)")
    t.add_argument("--patience", type=int, default=None, metavar="K",
                   help="stop after K validations without a better valid BLEU")
    t.add_argument("--average-last", type=int, default=None, metavar="N",
                   help="also write OUT/average: the average of the last N epochs' parameters")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)


def _add_translate_and_evaluate(sub):
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
        _engine_option(e)
        e.add_argument("--no-unk", action="store_true",
                       help="never emit <unk> (always so for subword models; word models "
                            "keep the chapter's default: <unk> may appear)")
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


def _add_launch(sub):
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


def _add_serve(sub):
    sv = sub.add_parser("serve", help="serve a model directory over HTTP: POST /translate, "
                                      "the attention explorer at /, API docs at /docs")
    sv.add_argument("--model", required=True, help="a model directory written by train")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--ctx", default="auto")
    _engine_option(sv)
    sv.add_argument("--allowed-hosts", default=None, metavar="HOST[,HOST...]",
                    help="the Host headers to answer, any port ('*': any); default: localhost, "
                         "127.0.0.1 and [::1] for a loopback --host, any for 0.0.0.0, else "
                         "--host itself")
    sv.add_argument("--api-key", default=os.environ.get("D2L_TRANSFORMER_API_KEY"), metavar="KEY",
                    help="require this key (api_key) of every translation request; default: "
                         "$D2L_TRANSFORMER_API_KEY, else none")
    sv.set_defaults(func=cmd_serve)


def _add_export(sub):
    x = sub.add_parser("export", help="write a model directory in MXNet's deployment format "
                                      "(encoder and decoding-step graphs) or as a CTranslate2 "
                                      "model (docs/export.md)")
    x.add_argument("--model", required=True, help="a model directory written by train")
    x.add_argument("--out", required=True, help="the export directory to write (a previous "
                                                "export there is replaced)")
    x.add_argument("--format", choices=EXPORT_FORMATS, default=DEFAULT_EXPORT_FORMAT,
                   help="mxnet: MXNet graphs (default); ctranslate2: a CTranslate2 model "
                        "directory (pip install 'd2l-transformer[ctranslate2]')")
    x.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                   help="--format ctranslate2: CTranslate2's weight type (default float32)")
    x.add_argument("--ctx", default="cpu")
    x.set_defaults(func=cmd_export)


def _add_compare(sub):
    c = sub.add_parser("compare", help="the book's output beside chapter runs")
    c.add_argument("runs", nargs="*", help="model directories or chapter-script output directories "
                   "(also scripts/chapter_oracle.py's: the chapter's own code)")
    c.add_argument("--edition", choices=sorted(EDITIONS), default=None,
                   help="only this edition's runs; with no run, what its book printed")
    c.set_defaults(func=cmd_compare)


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = get_parser().parse_args(argv)
    if getattr(args, "beam", 1) < 1:
        print("error: --beam must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    return guarded(args.func, args, USER_ERRORS, _user_paths(args))


def _user_paths(args):
    """The paths the command line names, absolute."""
    paths = [getattr(args, k, None) for k in ("out", "model", "data", "attention", "attention_html",
                                              "hostfile", "json", "hyp", "ref")]
    paths += list(getattr(args, "runs", None) or [])
    return [os.path.abspath(p) for p in paths if isinstance(p, str) and p]


if __name__ == "__main__":
    sys.exit(main())
