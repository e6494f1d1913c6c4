"""The argument parser of ``d2l-transformer`` (`cli`): every subcommand's options, defaults and
help. It imports only the names the options list (presets, engines, formats, ...), none of the
commands' modules: `cli` hands it the functions (`get_parser(commands)`).
"""

import argparse
import os

from ..config import ARCHITECTURES, EDITIONS, PRESETS
from ..distributed.kvstore import KVSTORES
from ..distributed.launch import LAUNCHERS
from ..inference.engines import CHOICES, DEFAULT_ENGINE
from ..inference.export import DEFAULT_FORMAT as DEFAULT_EXPORT_FORMAT
from ..inference.export import FORMATS as EXPORT_FORMATS
from ..inference.export.ctranslate2 import QUANTIZATIONS
from ..inference.stream import FORMATS as OUTPUT_FORMATS
from ..inference.translator import ALPHA, BEAM_SIZE


def _engine_option(parser):
    parser.add_argument("--engine", choices=CHOICES, default=DEFAULT_ENGINE,
                        help="auto (default): ctranslate2 where CTranslate2 is installed, the "
                             "context is the CPU and the model exports, else mxnet (one line "
                             "on stderr says which); mxnet: the package's translator (the "
                             "reference); ctranslate2: CTranslate2 on the CPU, over the "
                             "model's export kept beside it (made on first use; attention maps "
                             "still come from MXNet)")
    parser.add_argument("--engine-threads", type=int, default=0, metavar="N",
                        help="--engine ctranslate2: CTranslate2's threads (intra_threads); 0 "
                             "(default): the fastest of 1, 2, 4, 8 up to the physical cores, "
                             "measured on first use and cached per machine (docs/export.md); "
                             "the mxnet engine ignores it")
    parser.add_argument("--compute-type", default=None, metavar="TYPE",
                        help="--engine ctranslate2: CTranslate2's compute type, converted at "
                             "load: int8, int8_float32, int16, bfloat16, ... where this CPU "
                             "supports it (default: float32, the export's; docs/export.md)")


def _data_option(parser, text):
    parser.add_argument("--data", nargs="+", action="append", metavar="PATH", default=None,
                        help=text + "; repeat --data for several corpora, read in order")


def get_parser(commands):
    """The parser of every subcommand; `commands`: ``{name: function}``, the function each
    command's arguments go to (``args.func``)."""
    p = argparse.ArgumentParser(prog="d2l-transformer")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_translate_and_evaluate, _add_score, _add_launch, _add_serve,
                _add_export, _add_compare):
        add(sub, commands)
    p.description = (f"The Transformer of d2l 9.3 in MXNet: {', '.join(sub.choices)} (each "
                     "command's options: d2l-transformer COMMAND --help).")
    return p


def _add_train(sub, commands):
    t = sub.add_parser("train", help="train a model and keep it as a model directory")
    t.add_argument("--preset", choices=sorted(PRESETS), default="chapter")
    t.add_argument("--edition", choices=sorted(EDITIONS), default="0.11",
                   help="the chapter of d2l 0.11 (2019), 0.17 (classic) or 1.0, with its data, "
                        "sizes and loop (docs/editions.md)")
    t.add_argument("--architecture", choices=ARCHITECTURES, default="transformer",
                   help="the chapter's transformer, or the 2019 book's earlier models: 8.14's "
                        "LSTM seq2seq, 9.2's seq2seq with attention (docs/exercises.md)")
    t.add_argument("--epochs", type=int, default=None, help="default: the preset's")
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
    _train_data_options(t)
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
    t.set_defaults(func=commands["train"])


def _train_data_options(t):
    """``train``'s options of what it reads: the corpora, the languages, the user's own sets, a
    model to fine-tune."""
    _data_option(t, "train on: a Tatoeba zip (xxx-eng.zip), a TSV file (source<TAB>target), or "
                    "two aligned files, one sentence a line, each may be .gz, .xz or .bz2 "
                    "(default: the shipped fra-eng.zip; docs/data.md)")
    for part, what in (("valid", "validate, early-stop and keep OUT/best on"),
                       ("test", "keep as the test set evaluate scores")):
        t.add_argument(f"--{part}", nargs=2, metavar=("SRC", "REF"), default=None,
                       help=f"your own {part} set to {what}: a file of sources and one of their "
                            f"references, a sentence a line, instead of {part} pairs held out "
                            "of the data (training pairs sharing a sentence with it are dropped)")
    t.add_argument("--init-from", metavar="MODEL", default=None,
                   help="fine-tune the model directory MODEL on --data: its parameters, "
                        "vocabularies and tokenizer, a new optimizer, epochs from 1, into --out "
                        "(its config, with --set of what fine-tuning may change: docs/usage.md)")
    t.add_argument("--source-lang", default=None, metavar="CODE",
                   help="the language to translate from (en, fr, de, ...): one of the data's "
                        "two, or the first column's of a file whose name does not tell "
                        "(default: the first column's)")
    t.add_argument("--target-lang", default=None, metavar="CODE",
                   help="the language to translate into (default: the other one)")
    t.add_argument("--max-pairs", type=int, default=None,
                   help="use only the first N pairs of the data (of --data, or of fra-eng.zip)")


def _add_translate_and_evaluate(sub, commands):
    for name, text in (("translate", "translate sentences (of the model's source language)"),
                       ("evaluate", "BLEU and chrF of a model directory "
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
        e.set_defaults(func=commands[name])
        if name == "translate":
            e.add_argument("sentences", nargs="*", help="sentences (default: one per stdin line)")
            e.add_argument("--attention", metavar="DIR", default=None,
                           help="write attention heatmaps (PNG) of the first sentence into DIR")
            e.add_argument("--attention-html", metavar="FILE", default=None,
                           help="write the sentences' attention explorer as one HTML file")
            _translate_options(e)
        else:
            _data_option(e, "the corpus whose held-out parts are scored (default: the one the "
                            "model was trained on, as its directory records it)")
            e.add_argument("--max-sentences", type=int, default=None,
                           help="evaluate at most the first N pairs of each held-out set "
                                "(default: the first 2,000; 0: all); --src/--ref is scored whole "
                                "unless given")
            e.add_argument("--examples", type=int, default=0, help="print N example translations")
            e.add_argument("--json", metavar="FILE", default=None,
                           help="also write the scores and their signatures to FILE")
            e.add_argument("--hyp", metavar="FILE", default=None,
                           help="score this file of translations (one a line) against --ref, "
                                "no model needed")
            e.add_argument("--src", metavar="FILE", default=None,
                           help="your own test set: translate this file (one sentence a line) "
                                "with --model and score it against --ref, instead of the "
                                "held-out parts")
            e.add_argument("--ref", metavar="FILE", nargs="+", default=None,
                           help="the references of --hyp or --src: one file, or several (a line "
                                "of each is one more reference of that sentence)")
            e.add_argument("--lowercase", action="store_true",
                           help="case-insensitive scores (always so for lower-casing models)")
            for part in ("valid", "test"):
                e.add_argument(f"--{part}", nargs=2, metavar=("SRC", "REF"), default=None,
                               help=f"the --{part} files the model was trained with, at their "
                                    "new place (checked against the SHA-256 it recorded)")


def _translate_options(e):
    """``translate``'s n-best, sampling and output options."""
    e.add_argument("--nbest", type=int, default=None, metavar="N",
                   help="print the N best hypotheses of each sentence with their scores (a beam "
                        "of at least N; default format tsv)")
    e.add_argument("--format", choices=OUTPUT_FORMATS, default=None,
                   help="text: one translation a line (default); tsv: index, rank, score, "
                        "log-probability, translation, a hypothesis a line (default with "
                        "--nbest); jsonl: the same as JSON objects (docs/usage.md)")
    e.add_argument("--sample-topk", type=int, default=None, metavar="K",
                   help="sample each translation from the K most probable tokens at each step "
                        "(0: all) instead of searching: back-translation (docs/usage.md)")
    e.add_argument("--temperature", type=float, default=None,
                   help="--sample-topk: divide the log-probabilities by T (default 1)")
    e.add_argument("--seed", type=int, default=None,
                   help="--sample-topk: the random seed (the same output on one engine)")


def _add_score(sub, commands):
    s = sub.add_parser("score", help="the log-probability a model gives each translation of a "
                                     "pair of files (teacher forcing)")
    s.add_argument("--model", required=True, help="a model directory written by train")
    s.add_argument("--src", required=True, metavar="FILE", help="sources, one a line")
    s.add_argument("--ref", required=True, metavar="FILE",
                   help="their translations to score, one a line")
    s.add_argument("--format", choices=("tsv", "jsonl"), default="tsv",
                   help="tsv (default): index, log P (the sum over the tokens and <eos>), log "
                        "P per token, tokens; jsonl: also each token and its log-probability")
    s.add_argument("--ctx", default="auto")
    _engine_option(s)
    s.set_defaults(func=commands["score"])


def _add_launch(sub, commands):
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
    la.set_defaults(func=commands["launch"])


def _add_serve(sub, commands):
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
    sv.set_defaults(func=commands["serve"])


def _add_export(sub, commands):
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
    x.set_defaults(func=commands["export"])


def _add_compare(sub, commands):
    c = sub.add_parser("compare", help="the book's output beside chapter runs")
    c.add_argument("runs", nargs="*", help="model directories or chapter-script output directories "
                   "(also scripts/chapter_oracle.py's: the chapter's own code)")
    c.add_argument("--edition", choices=sorted(EDITIONS), default=None,
                   help="only this edition's runs; with no run, what its book printed")
    c.set_defaults(func=commands["compare"])
