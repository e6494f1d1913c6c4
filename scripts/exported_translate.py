#!/usr/bin/env python
"""Greedy translation with an exported model (`d2l-transformer export`), with MXNet alone.

    python exported_translate.py EXPORT_DIR [--words] [--max-length N] [--batch-size 64]
        < sentences.txt > translations.txt

Each input line is a sentence as the model's tokens separated by spaces (``--words``: raw text,
tokenized by the rule the manifest gives, ``tokens.words``, for word-level models); each
output line is its translation's tokens. Imports only mxnet, numpy and the standard library:
a reference for programs that serve the exported graphs (docs/export.md). It decodes as the
package's translator does, by the rules the export's manifest carries (``decoding``, written
from the package's own): sources padded to max(num_steps, longest) of their batch, sentences
sorted by length into batches, at most min(num_steps, ceil(length_ratio x source length) +
extra_length) tokens each (length_ratio 0: max(num_steps, source length + extra_length)), never
one of the banned tokens.
"""

import argparse
import builtins
import hashlib
import json
import math
import os
import re
import sys
import warnings

import numpy

# MXNet 1.9.1 uses NumPy's aliases np.bool, np.int, ... (removed in NumPy 1.24, the NumPy of
# Python 3.12+): set the missing ones before importing it, as d2l_transformer/_runtime/compat.py does
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # NumPy < 1.24 still has them, with a warning
    for _name in ("bool", "int", "float", "object", "complex", "str"):
        if not hasattr(numpy, _name):
            setattr(numpy, _name, getattr(builtins, _name))

import mxnet as mx  # noqa: E402
from mxnet import np, npx  # noqa: E402


def load(export_dir, ctx):
    """(manifest, encoder graph, step graph, source vocabulary, target tokens)."""
    with open(os.path.join(export_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    for name, entry in manifest["files"].items():  # refuse damaged files
        with open(os.path.join(export_dir, name), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != entry["sha256"]:
                sys.exit(f"error: {name} does not match manifest.json")
    if not {"extra_length", "banned"} <= set(manifest["decoding"]):
        sys.exit(f"error: {export_dir} was exported by an older d2l-transformer: export it again")
    npx.set_np()  # the graphs use MXNet's numpy operators
    warnings.filterwarnings("ignore", "Cannot decide type")  # the inputs' types come later
    graphs = {}
    for name, spec in manifest["graphs"].items():
        graphs[name] = mx.gluon.SymbolBlock.imports(
            os.path.join(export_dir, spec["symbol"]), [i["name"] for i in spec["inputs"]],
            os.path.join(export_dir, spec["params"]), ctx=ctx)
        graphs[name].hybridize(static_alloc=True, static_shape=True)
    vocab = {}
    for side in ("src", "tgt"):
        with open(os.path.join(export_dir, f"{side}_vocab.json"), encoding="utf-8") as f:
            vocab[side] = json.load(f)["idx_to_token"]
    src = {token: i for i, token in enumerate(vocab["src"])}
    return manifest, graphs["encoder"], graphs["decoder_step"], src, vocab["tgt"]


def words(line, rule):
    """A line of text as the model's source tokens, by the word tokenizer's `rule` (the
    manifest's ``tokens.words``: d2l's preprocess_nmt of the model's edition, split)."""
    for char in rule["no_break_spaces"]:
        line = line.replace(char, " ")
    line = line.lower() if rule["lowercase"] else line
    return re.sub(rule["space_before"], r" \1", line).split() + rule["source_end"]


def limit(manifest, length):
    """The most tokens of a translation of a `length`-token source (the package's
    ``limits.decode_limit``, by the manifest's ``decoding``)."""
    rules, num_steps = manifest["decoding"], manifest["decoding"]["num_steps"]
    ratio, extra = rules.get("length_ratio", 0.0), rules["extra_length"]
    most = (min(num_steps, math.ceil(ratio * length) + extra) if ratio
            else max(num_steps, length + extra))
    return min(most, manifest["model"]["max_positions"])


def translate(batch, manifest, encoder, step, max_length, ctx):
    """Greedy decoding of a batch of id lists; returns the target ids of each."""
    pad, bos = manifest["special_tokens"]["<pad>"], manifest["target_special_tokens"]["<bos>"]
    eos = manifest["target_special_tokens"]["<eos>"]
    num_steps, hidden = manifest["decoding"]["num_steps"], manifest["model"]["hidden_size"]
    width = max([num_steps] + [len(ids) for ids in batch])
    X = np.array([ids + [pad] * (width - len(ids)) for ids in batch], ctx=ctx)  # (B, width)
    valid = np.array([len(ids) for ids in batch], ctx=ctx)  # (B,)
    enc = encoder(X, valid)  # keys, values of each block: (B, width, hidden)
    banned = [manifest["target_special_tokens"][t] for t in manifest["decoding"]["banned"]]
    limits = [max_length or limit(manifest, len(ids)) for ids in batch]
    empty = np.zeros((len(batch), max(limits), hidden), ctx=ctx)  # the self caches at start
    caches = []
    for i in range(0, len(enc), 2):
        caches += [empty, empty, enc[i], enc[i + 1]]
    tokens = np.full((len(batch), 1), bos, ctx=ctx)  # (B, 1)
    out, done = [[] for _ in batch], [False] * len(batch)
    for t in range(max(limits)):
        log_probs, *self_caches = step(tokens, np.array([t], ctx=ctx), valid, *caches)
        caches[0::4], caches[1::4] = self_caches[0::2], self_caches[1::2]
        scores = log_probs.asnumpy()  # (B, V)
        scores[:, banned] = -numpy.inf  # never emitted, as in the package's translator
        best = scores.argmax(axis=1)  # (B,)
        for b, token in enumerate(best.tolist()):
            if not done[b]:
                done[b] = token == eos or len(out[b]) + 1 >= limits[b]
                if token != eos:
                    out[b].append(token)
        if all(done):
            break
        tokens = np.array(best.reshape(-1, 1), ctx=ctx)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("export_dir")
    p.add_argument("--words", action="store_true", help="input is raw text (word-level models)")
    p.add_argument("--max-length", type=int, default=None, help="at most N tokens a translation")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)
    ctx = mx.cpu()
    manifest, encoder, step, src, tgt = load(args.export_dir, ctx)
    rule = manifest["tokens"].get("words")
    if args.words and rule is None:
        sys.exit(f"error: --words is for word-level models; {args.export_dir} takes "
                 f"{manifest['tokens']['source']}")
    lines = [words(line, rule) if args.words else line.split()
             for line in sys.stdin.read().splitlines()]
    ids = [[src.get(token, manifest["special_tokens"]["<unk>"]) for token in line] for line in lines]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # as the translator batches
    result = [None] * len(ids)
    for start in range(0, len(order), args.batch_size):
        part = order[start:start + args.batch_size]
        for i, out in zip(part, translate([ids[i] for i in part], manifest, encoder, step,
                                          args.max_length, ctx)):
            result[i] = " ".join(tgt[token] for token in out)
    print("\n".join(result))


if __name__ == "__main__":
    main()
