"""``d2l-transformer train|translate|evaluate|launch|serve|export|compare``: the console script.

Only wiring: the options from `cli.parser`, training from `training.run`, translating from
`inference.engines`, BLEU from `evaluate`, model directories from `checkpoint`, the book table
from `report.book`.
Errors the user can cause print one line ``error: ...`` and exit non-zero; anything else is a
bug and keeps its traceback (`cli.guard`).
"""

import json
import logging
import os
import sys

from .. import checkpoint
from ..config import load_overrides, parse_overrides, preset_config
from ..context import parse_ctx, parse_ctx_list
from ..data import DataError, TokenizerError, read_lines
from ..distributed.kvstore import create_kvstore
from ..distributed.launch import LaunchError, launch
from ..evaluate import evaluate_model, format_files_report, score_files
from ..inference.engines import EngineError, MXNetEngine, open_engine
from ..inference.export import ExportError
from ..inference.limits import ExactChapterError, refusal_report, require_corrected
from ..inference.stream import input_chunks, output_lines, progress, translate_chunks
from ..io import atomic
from ..report.book import compare, load_run, printed_lines
from ..report.evaluation import format_report
from ..training.inputs import saved_config
from ..training.run import RunError, train_model
from . import parser
from .guard import EXIT_BAD_INPUT, EXIT_BUG, EXIT_ERROR, guarded  # noqa: F401 (EXIT_BUG)


class UserError(Exception):
    """A problem with the command line or the files it names: printed as one line."""


USER_ERRORS = (UserError, checkpoint.CheckpointError, DataError, RunError,  # one line each
               TokenizerError, ExactChapterError, ExportError, EngineError)


# ---------------------------------------------------------------------------------- translating
def _open_engine(args, ctx):
    """The engine of ``--model`` and ``--engine`` (`open_engine`)."""
    return open_engine(args.model, args.engine, ctx, no_unk=getattr(args, "no_unk", False),
                       engine_threads=args.engine_threads, compute_type=args.compute_type)


def _say_choice(engine):
    """``auto``'s choice in one line on stderr; said once the engine has done its first work,
    so that a refusal before that stays the one line it is."""
    if engine.choice:
        print(engine.choice, file=sys.stderr)


def _decoding(args):
    """``translate``'s decoding keywords (`stream.decode`): ``n_best`` or ``sampling``."""
    sampling = (args.sample_topk, 1.0 if args.temperature is None else args.temperature,
                args.seed)
    if args.sample_topk is None:
        if args.temperature is not None or args.seed is not None:
            raise UserError("--temperature and --seed go with --sample-topk")
        return {"n_best": args.nbest}
    if args.nbest is not None or args.beam > 1:
        raise UserError("--sample-topk draws one translation a sentence: no --beam or --nbest")
    if not sampling[1] > 0:
        raise UserError(f"--temperature must be above 0, not {args.temperature}")
    return {"sampling": sampling}


def cmd_translate(args):
    ctx = _device(args.ctx)
    decoding = _decoding(args)
    engine = _open_engine(args, ctx)
    explainer = None  # the MXNet model: attention maps, whichever engine translates
    if args.attention or args.attention_html:
        explainer = engine if engine.name == "mxnet" else MXNetEngine.load(args.model, ctx)
        require_corrected(explainer.cfg, "attention maps")
    tokenizer, fmt = engine.tokenizer, args.format or ("tsv" if args.nbest else "text")
    chunks = input_chunks(args.sentences, getattr(sys.stdin, "buffer", None))
    refused, first, texts, index = [], None, [], 0
    with progress() as bar:  # a bar on a terminal's stderr; each chunk written as it is done
        for inputs, tokens, hyps, bad in translate_chunks(engine, chunks, args.beam, args.alpha,
                                                          **decoding):
            if not index:  # the first chunk translated
                _say_choice(engine)
            for h in hyps:  # text: a line per input line; tsv, jsonl: none for a refused one
                for line in output_lines(index, h, tokenizer, fmt):
                    print(line)
                index += 1
            sys.stdout.flush()
            refused += bad
            bar.update(len(inputs))
            good = [(t, h[0].tokens) for t, h in zip(tokens, hyps) if h is not None]
            first = first or (good[0] if good else None)
            if args.attention_html:
                texts += [text for (_, text, _), h in zip(inputs, hyps) if h is not None]
    for line in refusal_report(refused):  # bad lines said once, then counted
        print(f"error: {line}", file=sys.stderr)
    if args.attention and first:
        from ..viz.png import plot_attention_maps
        m = explainer  # the first sentence's maps, of the engine's translation
        for path in plot_attention_maps(m.model, first[0], list(first[1]), m.src_vocab,
                                        m.tgt_vocab, m.cfg.num_steps, ctx, args.attention):
            print(f"wrote {path}", file=sys.stderr)
    if args.attention_html and texts:  # the interactive explorer (MXNet's), data inlined
        from ..viz.attention_html import explorer_items, write_explorer
        write_explorer(args.attention_html,
                       explorer_items(explainer, tokenizer, texts, args.beam, args.alpha),
                       pair=engine.cfg.pair)
        print(f"wrote {args.attention_html}", file=sys.stderr)
    return EXIT_BAD_INPUT if refused else 0


def cmd_score(args):
    from ..inference.scoring import score_texts, total
    engine = _open_engine(args, _device(args.ctx))
    sources = read_lines(args.src, what="--src")
    refs = read_lines(args.ref, what="--ref")
    try:
        scores = score_texts(engine, sources, refs)
    except ValueError as e:  # SentenceError included: line N, one line
        raise UserError(str(e)) from None
    _say_choice(engine)
    for i, sc in enumerate(scores):
        log_prob, per_token = total(sc)
        if args.format == "jsonl":
            print(json.dumps({"index": i, "log_prob": round(log_prob, 4),
                              "per_token": round(per_token, 4), "tokens": sc.tokens,
                              "token_log_probs": [round(p, 4) for p in sc.log_probs]},
                             ensure_ascii=False))
        else:
            print(f"{i}\t{log_prob:.4f}\t{per_token:.4f}\t{len(sc.tokens)}")
    return 0


# ---------------------------------------------------------------------------------- evaluating
def _write_json(path, data):
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
    if args.hyp or (args.ref and not args.src):
        return _evaluate_files(args)
    if not args.model:
        raise UserError("evaluate needs --model DIR, or --hyp FILE --ref FILE")
    if bool(args.src) != bool(args.ref):
        raise UserError("--src and --ref go together (your test set and its references)")
    report = evaluate_model(args.model, engine=args.engine, ctx=_device(args.ctx),
                            beam=args.beam, alpha=args.alpha, data_path=args.data,
                            max_sentences=args.max_sentences, lowercase=args.lowercase,
                            examples=args.examples, no_unk=args.no_unk,
                            engine_threads=args.engine_threads,
                            test=(args.src, args.ref) if args.src else None,
                            compute_type=args.compute_type,
                            heldout={"valid": args.valid, "test": args.test})
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
        if args.exact_chapter and not args.resume:
            overrides["exact_chapter"] = True
        for field in ("source_lang", "target_lang"):
            if getattr(args, field) is not None:
                overrides[field] = getattr(args, field)
        if args.max_pairs is not None and not args.resume:
            overrides["num_examples"] = args.max_pairs - 1  # d2l keeps lines 0..num_examples
        if args.resume or args.init_from:
            cfg = saved_config(args.init_from or args.out, overrides, bool(args.init_from))
        else:
            cfg = preset_config(args.preset, args.edition, args.architecture).with_overrides(
                overrides)
    except ValueError as e:
        if isinstance(e, checkpoint.CheckpointError):
            raise
        raise UserError(str(e)) from None
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
                          overwrite=args.overwrite, valid=args.valid, test=args.test,
                          init_from=args.init_from,
                          languages=(args.source_lang, args.target_lang))
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
    from ..serve import ServeError, run
    _device(args.ctx)  # a bad --ctx is one line before anything starts
    try:
        hosts = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()] \
            if args.allowed_hosts else None
        run(args.model, args.host, args.port, args.ctx, allowed_hosts=hosts,
            api_key=args.api_key, engine=args.engine, engine_threads=args.engine_threads,
            compute_type=args.compute_type)
    except ServeError as e:
        raise UserError(str(e)) from None
    return 0


def cmd_export(args):
    from ..inference.export import export
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
COMMANDS = {"train": cmd_train, "translate": cmd_translate, "evaluate": cmd_evaluate,
            "score": cmd_score, "launch": cmd_launch, "serve": cmd_serve, "export": cmd_export,
            "compare": cmd_compare}


def get_parser():
    """The command line's parser (`cli.parser`), each command wired to its ``cmd_*``."""
    return parser.get_parser(COMMANDS)


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = get_parser().parse_args(argv)
    for option, least in (("beam", 1), ("engine_threads", 0), ("nbest", 1), ("sample_topk", 0),
                          ("max_sentences", 0)):
        value = getattr(args, option, None)
        if value is not None and value < least:
            print(f"error: --{option.replace('_', '-')} must be at least {least}",
                  file=sys.stderr)
            return EXIT_ERROR
    return guarded(args.func, args, USER_ERRORS, _user_paths(args))


def _user_paths(args):
    """The paths the command line names, absolute."""
    paths = []
    for k in ("out", "model", "data", "attention", "attention_html", "hostfile", "json", "hyp",
              "src", "ref", "runs", "valid", "test", "init_from"):
        value = getattr(args, k, None)
        for item in value if isinstance(value, list) else [value]:
            paths += item if isinstance(item, list) else [item]
    return [os.path.abspath(p) for p in paths if isinstance(p, str) and p]


if __name__ == "__main__":
    sys.exit(main())
