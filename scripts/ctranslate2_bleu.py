#!/usr/bin/env python
"""BLEU of a model's CTranslate2 exports, float32 and quantized, beside the package's own
translator: the same held-out sentences, greedy, scored as `d2l-transformer evaluate` does.

    python scripts/ctranslate2_bleu.py MODEL_DIR [--quantization int8] [--max-sentences 500]

The model directory is exported twice into a temporary directory (`export --format
ctranslate2`, float32 and `--quantization`); the sentences are the first `--max-sentences`
of the set `evaluate` scores last (a preset's test split, or the chapter's unfiltered held-out
pairs); CTranslate2 decodes each length class with the export's options, so its float32
output is the package's token for token (tests/test_ctranslate2.py). Prints sacreBLEU's BLEU
and chrF of the three (detokenized hypotheses against the untokenized references) and how many
translations of the quantized model differ from float32's.
"""

import argparse
import json
import os
import sys
import tempfile

import d2l_transformer  # noqa: F401  # isort: skip  (first: its NumPy-alias shim must precede mxnet)
from d2l_transformer.data import evaluation_sets
from d2l_transformer.evaluate import format_score, score, translate_texts
from d2l_transformer.inference.engines import open_engine
from d2l_transformer.inference.export import export
from d2l_transformer.inference.export.ctranslate2 import QUANTIZATIONS, decoding_options


def ct2_tokens(path, sentences, cfg):
    """CTranslate2's greedy translation of each token list, one call per length class."""
    import ctranslate2
    translator = ctranslate2.Translator(path, device="cpu", intra_threads=2)
    groups, out = {}, [None] * len(sentences)
    for i, s in enumerate(sentences):
        groups.setdefault(len(s), []).append(i)
    for length, idx in groups.items():
        results = translator.translate_batch([sentences[i] for i in idx],
                                             **decoding_options(cfg, length))
        for i, r in zip(idx, results):
            out[i] = r.hypotheses[0]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="int8")
    p.add_argument("--max-sentences", type=int, default=500)
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    engine = open_engine(args.model_dir, "mxnet")  # the package's translator
    cfg, tok = engine.cfg, engine.tokenizer
    sets, _ = evaluation_sets(cfg, engine.src_vocab, engine.tgt_vocab)
    name, pairs, _ = sets[-1]
    sources = pairs.source[:args.max_sentences]
    refs = pairs.target[:args.max_sentences]
    tokens = [tok.encode(s) for s in sources]
    outputs = {"translator": translate_texts(engine, sources)}
    with tempfile.TemporaryDirectory() as tmp:
        for q in ("float32", args.quantization):
            path = os.path.join(tmp, q)
            export(args.model_dir, path, format="ctranslate2",
                   quantization=None if q == "float32" else q)
            outputs[f"ctranslate2 {q}"] = [tok.decode(t) for t in ct2_tokens(path, tokens, cfg)]
    report = {"model_dir": args.model_dir, "set": name, "sentences": len(sources), "scores": {}}
    print(f"{name}: {len(sources)} sentences, greedy")
    for engine, hyps in outputs.items():
        result = score([tok.detokenize(h) for h in hyps], refs, tok.lowercase)
        report["scores"][engine] = result
        print(f"  {engine:24s} {format_score(result)}")
    quantized = outputs[f"ctranslate2 {args.quantization}"]
    report["same_as_translator"] = {e: sum(a == b for a, b in zip(outputs["translator"], h))
                                    for e, h in outputs.items() if e != "translator"}
    delta = (report["scores"][f"ctranslate2 {args.quantization}"]["bleu"]
             - report["scores"]["ctranslate2 float32"]["bleu"])
    report["bleu_delta"] = delta
    print(f"  {args.quantization} - float32: BLEU {delta:+.2f}; translations the same as the "
          f"translator's: " + ", ".join(f"{e} {n}" for e, n in report["same_as_translator"].items())
          + f"; {args.quantization} differs from float32 on "
          f"{sum(a != b for a, b in zip(outputs['ctranslate2 float32'], quantized))}")
    print(f"BLEU signature: {result['bleu_signature']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
