"""A trained model in MXNet's deployment format: two graphs any MXNet 1.9 program can load.

`export(model_dir, out_dir, format="mxnet")` (`inference.export`) writes::

    encoder-symbol.json, encoder-0000.params
        `inference.step.EncoderKV`: source ids and valid lengths -> each decoder block's keys and values
        of the encoder's output (projected once per sentence)
    decoder_step-symbol.json, decoder_step-0000.params
        `inference.step.DecoderStep`, the translator's step graph, and MXNet's log-softmax: one
        target position with the key/value caches -> the next token's log-probabilities and the
        updated caches
    src_vocab.json, tgt_vocab.json, config.json    copied from the model directory
    *.model                                        its tokenizer files (sentencepiece), if any
    manifest.json    versions, the graphs' inputs and outputs (names, shapes, meaning), the
                     model's tokenization (`source.tokens_manifest`), the decoding conventions
                     (`source.decoding_rules`), size and SHA-256 of every file

Both graphs contain MXNet's own operators only; they load with
``mx.gluon.SymbolBlock.imports`` (numpy mode, ``npx.set_np()``). scripts/exported_translate.py
decodes with them using nothing of this package; docs/export.md shows how to call them from
another program.
"""

import datetime
import os

import mxnet as mx
from mxnet import np
from mxnet.gluon import nn

from ... import _gluon, checkpoint
from ..step import DecoderStep, EncoderKV, call, hybridized
from .source import copy_file, decoding_rules, limit_text, tokens_manifest, write_tokenizer_files

FORMAT = "d2l_transformer export 1"
ENCODER, STEP = "encoder", "decoder_step"


class _ExportStep(nn.HybridBlock):
    """`DecoderStep` whose first output is the log-softmax of its logits (rows, V)."""

    def __init__(self, decoder, **kwargs):
        super().__init__(**kwargs)
        self.step = DecoderStep(decoder)

    def hybrid_forward(self, F, *args):
        logits, *caches = self.step(*args)
        return (F.npx.log_softmax(logits), *caches)


def _io_spec(num_layers, hidden, vocab):
    """The two graphs' inputs and outputs, in MXNet's order (``data0``, ``data1``, ...)."""
    per_layer_enc = [(f"enc_keys_{i}", ["batch", "source_length", hidden],
                      f"block {i}'s encoder-decoder keys") for i in range(num_layers)]
    enc_outputs = []
    for i in range(num_layers):
        enc_outputs += [per_layer_enc[i],
                        (f"enc_values_{i}", ["batch", "source_length", hidden],
                         f"block {i}'s encoder-decoder values")]
    encoder = {
        "inputs": [("source", ["batch", "source_length"],
                    "source token ids (float32), padded with <pad>"),
                   ("valid_length", ["batch"], "number of source tokens of each row (float32)")],
        "outputs": enc_outputs}
    caches, new_caches = [], []
    for i in range(num_layers):
        caches += [(f"self_keys_{i}", ["rows", "max_length", hidden],
                    f"block {i}'s self-attention keys, newest position first (zeros at start)"),
                   (f"self_values_{i}", ["rows", "max_length", hidden],
                    f"block {i}'s self-attention values, newest position first"),
                   (f"enc_keys_{i}", ["rows", "source_length", hidden], "from the encoder graph"),
                   (f"enc_values_{i}", ["rows", "source_length", hidden], "from the encoder graph")]
        new_caches += [(f"self_keys_{i}", ["rows", "max_length", hidden], "next step's input"),
                       (f"self_values_{i}", ["rows", "max_length", hidden], "next step's input")]
    step = {
        "inputs": [("tokens", ["rows", 1], "the token at this position (float32); <bos> first"),
                   ("position", [1], "this position, 0 for <bos> (float32)"),
                   ("valid_length", ["rows"], "number of source tokens of each row (float32)"),
                   *caches],
        "outputs": [("log_probs", ["rows", vocab], "log-probabilities of the next token"),
                    *new_caches]}

    def named(spec):
        return {"inputs": [{"name": f"data{i}", "role": r, "shape": s, "meaning": m}
                           for i, (r, s, m) in enumerate(spec["inputs"])],
                "outputs": [{"index": i, "role": r, "shape": s, "meaning": m}
                            for i, (r, s, m) in enumerate(spec["outputs"])]}
    return {ENCODER: named(encoder), STEP: named(step)}


def _trace_and_export(model, cfg, src_vocab, tgt_vocab, directory, ctx):
    """Build both graphs (MXNet's operators only), run them once and export them."""
    model_x = np.array([[src_vocab["<pad>"]] * cfg.num_steps], ctx=ctx)  # (1, num_steps)
    valid = np.array([cfg.num_steps], ctx=ctx)  # (1,)
    encoder = hybridized(EncoderKV(model))
    step = hybridized(_ExportStep(model.decoder))
    with ctx:
        kv = list(call(encoder, model_x, valid))
        empty = np.zeros((1, 2, kv[0].shape[-1]), ctx=ctx)  # (rows, max_length, hidden)
        caches = []
        for i in range(0, len(kv), 2):
            caches += [empty, empty, kv[i], kv[i + 1]]
        call(step, np.array([[tgt_vocab["<bos>"]]], ctx=ctx), np.array([0], ctx=ctx), valid,
             *caches)
        mx.nd.waitall()
    for graph, name in ((encoder, ENCODER), (step, STEP)):
        if "d2t_" in _gluon.graph_json(graph):  # our own bug: a kernel in the graph
            raise RuntimeError(f"the exported {name} graph contains a fused kernel")
        graph.export(os.path.join(directory, name), epoch=0)
    return len(kv) // 2, kv[0].shape[-1]


def write(source, directory, ctx):
    """Write the export of `source` (`source.ModelSource`) into the new directory `directory`
    (`inference.export.export` makes it appear whole); returns what the manifest says beside
    the files' checksums."""
    cfg, model, src_vocab, tgt_vocab = source.cfg, source.model, source.src_vocab, source.tgt_vocab
    num_layers, hidden = _trace_and_export(model, cfg, src_vocab, tgt_vocab, directory, ctx)
    for name in os.listdir(directory):  # Gluon's export wrote them: make them durable
        copy_file(os.path.join(directory, name), os.path.join(directory, name))
    for name in (checkpoint.SRC_VOCAB, checkpoint.TGT_VOCAB, checkpoint.CONFIG):
        copy_file(os.path.join(source.directory, name), os.path.join(directory, name))
    write_tokenizer_files(source, directory)
    return _manifest(source, num_layers, hidden)


def _manifest(source, num_layers, hidden):
    from ..._version import __version__
    cfg, model, src_vocab, tgt_vocab = source.cfg, source.model, source.src_vocab, source.tgt_vocab
    tokens = tokens_manifest(source.tokenizer)
    end = tokens.get("words", {}).get("source_end")
    graphs = _io_spec(num_layers, hidden, len(tgt_vocab))
    for name in (ENCODER, STEP):
        graphs[name].update(symbol=f"{name}-symbol.json", params=f"{name}-0000.params")
    return {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mxnet_version": mx.__version__,
        "d2l_transformer_version": __version__,
        "numpy_mode": True,  # load with mx.npx.set_np()
        "dtype": "float32",
        "graphs": graphs,
        "model": {"layers": num_layers, "hidden_size": hidden, "num_heads": cfg.num_heads,
                  "source_vocab_size": len(src_vocab), "target_vocab_size": len(tgt_vocab),
                  "max_positions": model.decoder.pos_encoding.P.shape[1],
                  "tokenizer": getattr(cfg, "tokenizer", "word"),
                  "preset": source.summary.get("preset")},
        "special_tokens": {t: src_vocab[t] for t in ("<unk>", "<pad>", "<bos>", "<eos>")},
        "target_special_tokens": {t: tgt_vocab[t] for t in ("<unk>", "<pad>", "<bos>", "<eos>")},
        "tokens": tokens,  # the model's own tokenizer (`source.tokens_manifest`)
        "decoding": {
            "source": f"ids of the tokens padded with <pad> to max({cfg.num_steps}, the batch's "
                      "longest), never cut; valid_length = number of tokens; "
                      + (f"the tokens end with {' '.join(end)} (tokens.words.source_end)" if end
                         else "no <eos> appended"),
            "num_steps": cfg.num_steps,
            **decoding_rules(cfg),
            "max_length": f"at most {limit_text(cfg.num_steps, 'source length', cfg.length_ratio)} "
                          "tokens, the package's default; never one of banned",
            "step": "position t (0 = <bos>): feed the token at t, read log_probs of the token "
                    "at t + 1; the self caches come back updated (shifted by one, the new "
                    "position first) and are fed to the next step; the encoder caches are "
                    "fed unchanged; a translation ends at <eos>",
        },
    }
