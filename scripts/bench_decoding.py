"""Rows (b), (c) and (f) of scripts/bench.py: the translator (`inference.translator`) decoding.
(b) and (c) with the model the fast training row (a) saved; (f) a `full`-size model with random
weights (or ``--model DIR``), which the (i) and (k) rows of bench_engines.py translate too.
Each row function returns ``(value, extra figures)``."""

import os
import statistics
import time

from bench_common import MODEL_ENV, chapter_data
from bench_training import train_row

DECODE_TOKENS = 50


def _trained_model(s, params_path):
    """The model the fast row (a) trained and saved, and the training sentences; when no fast
    row ran before (``--only decoding``, ``--only batched``), the same run, trained here."""
    import mxnet as mx

    import d2l_transformer as d2t
    if not os.path.exists(params_path):
        train_row(s, True, params_path)
    cfg = s["cfg"]
    src_vocab, tgt_vocab, it = chapter_data(cfg)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.load_parameters(params_path, ctx=mx.cpu())
    sentences = []
    for X, X_vlen, _, _ in it:  # the training sentences, without their <eos>
        for row, n in zip(X.asnumpy().tolist(), X_vlen.asnumpy().tolist()):
            if n > 1:  # not an empty one (the translator refuses those, `inference.limits`)
                sentences.append(" ".join(src_vocab.to_tokens([int(t) for t in row[:int(n) - 1]])))
    return model, src_vocab, tgt_vocab, sentences


def greedy_row(s, params_path):
    """(b) ms/sentence, one sentence at a time, always DECODE_TOKENS steps: the translator's
    key/value cache."""
    import mxnet as mx

    from d2l_transformer.inference.translator import Translator
    model, src_vocab, tgt_vocab, sentences = _trained_model(s, params_path)
    translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=s["cfg"].num_steps,
                            max_length=DECODE_TOKENS)

    def decode(tokens):
        return translator.translate([tokens], early_stop=False)
    run = [sentences[i % len(sentences)].split() for i in range(s["n_greedy"] + 1)]
    decode(run[0])  # warm-up
    tic = time.time()
    for tokens in run[1:]:
        decode(tokens)
    return (time.time() - tic) / s["n_greedy"] * 1000, {"sentences": s["n_greedy"]}


def batch_row(s, params_path, batch_size):
    """(c) sentences/s of batched greedy translation (the translator, stops at <eos>)."""
    import mxnet as mx

    from d2l_transformer.inference.translator import Translator
    model, src_vocab, tgt_vocab, sentences = _trained_model(s, params_path)
    n = s["n_batch_1"] if batch_size == 1 else s["n_batch"]
    sentences = [sentences[i % len(sentences)].split() for i in range(n)]
    num_steps = s["cfg"].num_steps
    translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=num_steps,
                            max_length=num_steps, batch_size=batch_size)
    translator.translate(sentences[:batch_size])  # warm-up
    tic = time.time()
    translator.translate(sentences)
    return n / (time.time() - tic), {"sentences": n}


def translation_setup(s):
    """(f): a model of the `full` preset (d=128, FFN 512, 4 heads, 2+2 layers) with random
    weights (seed 0), its own vocabularies (sentencepiece, 4,000 pieces a side) and the source
    sentences of its held-out test split, tokenized by its tokenizer (with random weights only
    their lengths matter); with ``--model DIR``, that trained model, its vocabularies, its
    tokenizer and its test split instead."""
    import mxnet as mx
    from mxnet import init

    import d2l_transformer as d2t
    from d2l_transformer import checkpoint
    from d2l_transformer.data import load_data, split_corpus
    model_dir = os.environ.get(MODEL_ENV)
    translation_setup.model_dir = model_dir
    if model_dir:  # --model DIR: a trained model, its own split and tokenizer
        model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(model_dir, mx.cpu())
        tokenizer = checkpoint.load_tokenizer(model_dir, cfg)
    else:
        cfg = s["full_cfg"]
        d2t.set_seed(0)
        data = load_data(cfg, cfg.batch_size)
        src_vocab, tgt_vocab, tokenizer = data.src_vocab, data.tgt_vocab, data.tokenizer
        d2t.set_seed(0)
        model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
        model.initialize(init.Xavier(), ctx=mx.cpu())
    _, _, test = split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test, by=cfg.split_by,
                              clean=cfg.clean)
    translation_setup.tokenizer = tokenizer  # (i) saves the model directory with it
    return model, src_vocab, tgt_vocab, cfg, [tokenizer.encode(t) for t in test.source]


def translate_row(s, key):
    """(f) sentences/s of the Translator translating the test sources 64 at a time, at most
    `translate_length` tokens each (random weights: almost every sentence runs to that length),
    greedy or beam 4. Start-up (data, model, the first batch: graphs, memory plans) is
    excluded."""
    import mxnet as mx

    from d2l_transformer.inference.translator import Translator
    beam = 4 if key.endswith("beam4") else 1
    model, src_vocab, tgt_vocab, cfg, sentences = translation_setup(s)
    length, batch = s["translate_length"], 64
    translator = Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=cfg.num_steps,
                            max_length=length, batch_size=batch)
    translator.translate(sentences[:batch], beam_size=beam)  # warm-up
    seconds, tokens = 0.0, []
    for i in range(0, len(sentences), batch):
        tic = time.time()
        tokens += [h.tokens for h in translator.translate(sentences[i:i + batch], beam_size=beam)]
        seconds += time.time() - tic
    return len(sentences) / seconds, {
        "seconds": seconds, "sentences": len(sentences), "beam": beam, "max_length": length,
        "mean_tokens": statistics.mean(len(t) for t in tokens),
        "vocab": [len(src_vocab), len(tgt_vocab)]}
