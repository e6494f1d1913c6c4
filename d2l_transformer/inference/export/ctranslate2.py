"""A trained model as a CTranslate2 model directory (OpenNMT's inference engine: CPU float32,
int8, int16; NVIDIA GPUs through CUDA 12), built with its spec API from the weights alone.

`export(model_dir, out_dir, format="ctranslate2")` (`inference.export`) writes::

    model.bin, config.json                       CTranslate2's model and its configuration
    source_vocabulary.json, target_vocabulary.json    the model's vocabularies, in id order
    spm_src.model, spm_tgt.model                 subword models: the sentencepiece models
    README.md        how to translate with it (only `ctranslate2` and `sentencepiece`), its
                     Python generated from the manifest (`snippet`)
    manifest.json    versions, the model's sizes, the special tokens, the model's tokenization
                     (`source.tokens_manifest`), the `translate_batch` options that decode as
                     the package does, size and SHA-256 of every file

The chapter's architecture (d2l 9.3) is CTranslate2's ``TransformerSpec`` exactly:
post-norm (``pre_norm=False``), embeddings scaled by sqrt(d), the chapter's interleaved sin/cos
table as the position table (CTranslate2's own sinusoid concatenates sin and cos), attention
without biases, ReLU FFN, separate vocabularies, LayerNorm epsilon 1e-5, nothing appended to
the source tokens (the tokenizer's own: a later edition's end with ``<eos>``). Gluon's
``Dense`` weights are already (out, in), CTranslate2's layout; W_q/W_k/W_v are concatenated
for self-attention and W_k/W_v for the encoder-decoder attention (`_attention`).
The variants: pre-norm (with its final norms), FixNorm (unit-norm rows baked into the
embedding table), fused QKV; LayerDrop and DropHead change nothing at inference. ScaleNorm has
no CTranslate2 counterpart and is refused. docs/export.md has the table of names.
"""

import datetime
import functools
import json
import os
import tempfile
import textwrap

import numpy as onp

from ...data.languages import language_name
from ...io import atomic
from ...io.manifest import MANIFEST
from ...variants import FixNormEmbedding
from ..limits import BANNED, decode_limit
from .source import ExportError, copy_file, decoding_rules, limit_text, tokens_manifest, write_tokenizer_files

FORMAT = "d2l_transformer export ctranslate2 1"
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")  # CTranslate2's weight types (`ModelSpec.optimize`)
SPECIAL_TOKENS = ("<unk>", "<pad>", "<bos>", "<eos>")
LAYER_NORM_EPSILON = 1e-5  # Gluon's LayerNorm default, the chapter's
INSTALL = "pip install 'd2l_transformer[ctranslate2]'"


def import_ctranslate2(what="--format ctranslate2"):
    """The `ctranslate2` module, or ExportError saying how to install it (for `what`)."""
    try:
        import ctranslate2
    except ImportError:
        raise ExportError(f"{what} needs the ctranslate2 package: {INSTALL}") from None
    return ctranslate2


def check(cfg, quantization):
    """ExportError (one line) for what CTranslate2 cannot express."""
    if cfg.norm != "layer":
        raise ExportError(f"CTranslate2 has no {cfg.norm!r} norm (only LayerNorm); this model can "
                          "be exported with --format mxnet")
    if cfg.pos_encoding in ("none", "alibi"):
        raise ExportError(f"CTranslate2's Transformer adds a position table: this model has none "
                          f"(pos_encoding {cfg.pos_encoding}); it can be exported with --format mxnet")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(f"unknown quantization {quantization!r}: use one of "
                          f"{', '.join(QUANTIZATIONS)}")


def decoding_options(cfg, longest, max_positions=None):
    """`ctranslate2.Translator.translate_batch` options that decode as the package's greedy
    `Translator` does, for a batch whose longest source has `longest` tokens (the package's
    limit is per sentence, `limits.decode_limit`, at most the model's `max_positions`:
    equal for a batch of sentences of one limit, and for any sentence that ends before the
    batch's limit)."""
    return {"beam_size": 1, "min_decoding_length": 0, "length_penalty": 0,
            "max_decoding_length": decode_limit(cfg.num_steps, longest, max_positions,
                                                cfg.length_ratio),
            "max_input_length": 0, "suppress_sequences": [[t] for t in BANNED]}


def _array(param):
    return onp.ascontiguousarray(param.data().asnumpy(), dtype="float32")


def _linear(spec, dense):
    spec.weight = _array(dense.weight)  # Gluon's Dense: (out, in), CTranslate2's layout
    if dense.bias is not None:
        spec.bias = _array(dense.bias)


def _norm(spec, norm):
    spec.gamma, spec.beta = _array(norm.gamma), _array(norm.beta)


def _qkv(mha):
    """(W_q, W_k, W_v) of a `MultiHeadAttention`, each (hidden, in)."""
    if hasattr(mha, "W_qkv"):  # the fused-QKV variant
        return tuple(onp.split(_array(mha.W_qkv.weight), 3, axis=0))  # rows: W_q, W_k, W_v
    return _array(mha.W_q.weight), _array(mha.W_k.weight), _array(mha.W_v.weight)


def _attention(spec, mha, self_attention):
    """Self-attention: linear[0] = [W_q; W_k; W_v], linear[1] = W_o. Encoder-decoder
    attention: linear[0] = W_q, linear[1] = [W_k; W_v], linear[2] = W_o. No biases."""
    q, k, v = _qkv(mha)
    if self_attention:
        spec.linear[0].weight = onp.concatenate([q, k, v], axis=0)  # (3 * hidden, in)
    else:
        spec.linear[0].weight = q
        spec.linear[1].weight = onp.concatenate([k, v], axis=0)  # (2 * hidden, in)
    _linear(spec.linear[-1], mha.W_o)


def _ffn(spec, ffn, norm):
    _norm(spec.layer_norm, norm)
    _linear(spec.linear_0, ffn.ffn_1)
    _linear(spec.linear_1, ffn.ffn_2)


def _embeddings(spec, stack):
    """The embedding table (unit-norm rows with FixNorm, which our blocks compute per lookup)
    and the chapter's position table P (max_len, d); CTranslate2 scales by sqrt(d)."""
    table = _array(stack.embed.weight)
    if isinstance(stack.embed, FixNormEmbedding):  # E / max(||E||, 1e-5), then * sqrt(d)
        table = table / onp.maximum(onp.sqrt((table * table).sum(-1, keepdims=True)), 1e-5)
    (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = table
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(stack.pos_encoding.P)[0]  # (max_len, d)


def build_spec(source, quantization=None):
    """The CTranslate2 `TransformerSpec` of a loaded model directory, validated and optimized
    (`quantization`: one of `QUANTIZATIONS`, None keeps float32)."""
    import_ctranslate2()
    from ctranslate2.specs import TransformerSpec, common_spec
    cfg, model = source.cfg, source.model
    check(cfg, quantization)
    enc, dec = model.encoder, model.decoder
    spec = TransformerSpec.from_config((len(enc.blks), len(dec.blks)), cfg.num_heads,
                                       pre_norm=cfg.pre_norm,
                                       activation=common_spec.Activation.RELU)
    _embeddings(spec.encoder, enc)
    for layer, blk in zip(spec.encoder.layer, enc.blks):
        _attention(layer.self_attention, blk.attention, True)
        _norm(layer.self_attention.layer_norm, blk.addnorm_1.norm)
        _ffn(layer.ffn, blk.ffn, blk.addnorm_2.norm)
    _embeddings(spec.decoder, dec)
    for layer, blk in zip(spec.decoder.layer, dec.blks):
        _attention(layer.self_attention, blk.attention_1, True)
        _norm(layer.self_attention.layer_norm, blk.addnorm_1.norm)
        _attention(layer.attention, blk.attention_2, False)
        _norm(layer.attention.layer_norm, blk.addnorm_2.norm)
        _ffn(layer.ffn, blk.ffn, blk.addnorm_3.norm)
    if cfg.pre_norm:  # the final norms after the last block (the variants' `final_norm`)
        _norm(spec.encoder.layer_norm, enc.final_norm)
        _norm(spec.decoder.layer_norm, dec.final_norm)
    _linear(spec.decoder.projection, dec.dense)
    config = spec.config
    config.unk_token, config.bos_token, config.eos_token = "<unk>", "<bos>", "<eos>"
    config.decoder_start_token = "<bos>"
    config.add_source_bos = config.add_source_eos = False  # the tokenizer's tokens as they are
    config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.register_source_vocabulary(list(source.src_vocab.idx_to_token))
    spec.register_target_vocabulary(list(source.tgt_vocab.idx_to_token))
    spec.validate()
    spec.optimize(quantization=quantization)
    return spec


def write(source, directory, quantization=None):
    """Write the CTranslate2 export of `source` (`source.ModelSource`) into the new directory
    `directory`; returns what the manifest says beside the files' checksums."""
    ctranslate2 = import_ctranslate2()
    spec = build_spec(source, quantization)
    with tempfile.TemporaryDirectory(prefix="d2l_transformer-ct2-") as scratch:
        spec.save(scratch)  # CTranslate2 writes plain files: copied in fsynced
        for name in sorted(os.listdir(scratch)):
            copy_file(os.path.join(scratch, name), os.path.join(directory, name))
    tokenizer_files = write_tokenizer_files(source, directory)
    manifest = _manifest(source, quantization, ctranslate2.__version__, tokenizer_files)
    atomic.write_text(os.path.join(directory, "README.md"), readme(manifest))
    return manifest


def _manifest(source, quantization, ct2_version, tokenizer_files):
    from ..._version import __version__
    cfg, src_vocab, tgt_vocab = source.cfg, source.src_vocab, source.tgt_vocab
    model_manifest = os.path.join(source.directory, MANIFEST)
    tokens = tokens_manifest(source.tokenizer)
    return {
        "format": FORMAT,
        "model_manifest_sha256": (atomic.sha256(model_manifest)  # the model version exported
                                  if os.path.exists(model_manifest) else None),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ctranslate2_version": ct2_version,
        "d2l_transformer_version": __version__,
        "quantization": quantization or "float32",
        "model": {"encoder_layers": len(source.model.encoder.blks),
                  "decoder_layers": len(source.model.decoder.blks),
                  "hidden_size": cfg.embedding_size, "ffn_hidden_size": cfg.ffn_hidden_size,
                  "num_heads": cfg.num_heads, "pre_norm": cfg.pre_norm,
                  "fixnorm": cfg.fixnorm, "source_vocab_size": len(src_vocab),
                  "target_vocab_size": len(tgt_vocab),
                  "max_positions": source.model.decoder.pos_encoding.P.shape[1],
                  "tokenizer": cfg.tokenizer, "preset": source.summary.get("preset"),
                  "source_lang": cfg.pair[0], "target_lang": cfg.pair[1]},
        "config": json.loads(cfg.to_json()),
        "special_tokens": {t: src_vocab[t] for t in SPECIAL_TOKENS},
        "target_special_tokens": {t: tgt_vocab[t] for t in SPECIAL_TOKENS},
        "tokenizer_files": tokenizer_files,
        "tokens": tokens,
        "decoding": {
            "source": tokens["source"],  # the model's own tokenizer (`source.tokens_manifest`)
            "target": tokens["target"],
            "num_steps": cfg.num_steps,
            **decoding_rules(cfg),
            "translate_batch": {k: v for k, v in decoding_options(cfg, 0).items()
                                if k != "max_decoding_length"},
            "max_decoding_length": limit_text(cfg.num_steps, "the longest source's tokens",
                                              cfg.length_ratio),
        },
    }


_INTRO = ("{pair}, exported by `d2l-transformer export --format ctranslate2` "
          "(d2l_transformer {version}, CTranslate2 {ct2}, weights {quantization}). {layers} "
          "encoder + {dec_layers} decoder layers, hidden size {hidden}, {heads} heads, {src} "
          "source and {tgt} target {unit}. Source tokens: {source}.")
_OPTIONS = ("Greedy decoding with these options gives the package's `d2l-transformer translate` "
            "token for token (float32; the package limits each sentence to {limit} tokens, this "
            "call the whole batch to its longest sentence's limit). Beam search (`beam_size=4`) "
            "ranks by `log P / length ** length_penalty`, the package by GNMT's "
            "`((5 + length) / 6) ** alpha`: `length_penalty=0` is the package's `--alpha 0`. On "
            "an NVIDIA GPU (CUDA 12): `ctranslate2.Translator(d, device=\"cuda\")`. manifest.json "
            "lists the sizes, the special tokens' ids and the SHA-256 of every file.")

_SUBWORD = """import ctranslate2, math, os, sentencepiece as spm
d = "{directory}"  # this directory
src, tgt = (spm.SentencePieceProcessor(model_file=f"{{d}}/spm_{{s}}.model") for s in ("src", "tgt"))
tokens = [src.encode(text, out_type=str) for text in {texts}]"""

_WORD = """import ctranslate2, math, os, re
d = "{directory}"  # this directory
def words(text):  # d2l {edition}'s preprocess_nmt, split on spaces{end_comment}
    text = text{plain}.lower()
    return re.sub(r"{space_before}", r" \\1", text).split(){end}
tokens = [words(text) for text in {texts}]"""

_TRANSLATE = """threads = min(4, os.cpu_count() or 1)  # a start: the fastest of 1, 2, 4 depends on the CPU
results = ctranslate2.Translator(d, device="cpu", intra_threads=threads).translate_batch(
    tokens, {options},
    max_decoding_length={limit})
print([{decode} for r in results])"""

_TEXTS = {"subword": ["Hello!", "How are you?"], "word": ["Go.", "I won!", "Who are you?"]}


def _texts(kind, model):
    """The snippet's example sentences: the book's English ones, or a placeholder in the
    model's source language."""
    source = model.get("source_lang", "en")
    return json.dumps(_TEXTS[kind] if source == "en" else [f"a sentence in {language_name(source)}"],
                      ensure_ascii=False)


def _word_snippet(rule, directory, texts):
    """The word tokenizer's `rule` (`WordTokenizer.rule`) as the snippet's ``words``."""
    end = rule["source_end"]
    return _WORD.format(
        directory=directory, edition=rule["edition"], texts=texts,
        plain="".join(f'.replace({json.dumps(c)}, " ")' for c in rule["no_break_spaces"]),
        space_before=rule["space_before"], end=f" + {json.dumps(end)}" if end else "",
        end_comment=f", then {' '.join(end)}" if end else "")


def snippet(manifest, directory="."):
    """The Python that translates with the export (its README's), generated from the manifest:
    the tokenizer's rule (``tokens``) and the package's decoding options."""
    decoding, tokens = manifest["decoding"], manifest["tokens"]
    texts = _texts(tokens["kind"], manifest["model"])
    if tokens["kind"] == "subword":
        head = _SUBWORD.format(directory=directory, texts=texts)
        decode = "tgt.decode(r.hypotheses[0])"
    else:
        head, decode = _word_snippet(tokens["words"], directory, texts), '" ".join(r.hypotheses[0])'
    options = ", ".join(f"{k}={v!r}" for k, v in decoding["translate_batch"].items())
    return head + "\n" + _TRANSLATE.format(
        options=options, decode=decode,
        limit=limit_text(decoding["num_steps"], "max(map(len, tokens))",
                         decoding.get("length_ratio", 0.0)))


def readme(manifest, directory="."):
    """The README.md of an export: what it is and the Python that translates with it."""
    m, subword = manifest["model"], manifest["tokens"]["kind"] == "subword"
    pair = " -> ".join(language_name(m.get(k, d)) for k, d in (("source_lang", "en"),
                                                                  ("target_lang", "fr")))
    intro = _INTRO.format(
        pair=pair, version=manifest["d2l_transformer_version"], ct2=manifest["ctranslate2_version"],
        quantization=manifest["quantization"], layers=m["encoder_layers"],
        dec_layers=m["decoder_layers"], hidden=m["hidden_size"], heads=m["num_heads"],
        src=m["source_vocab_size"], tgt=m["target_vocab_size"],
        unit="sentencepiece pieces" if subword else "words", source=manifest["tokens"]["source"])
    decoding = manifest["decoding"]
    options = _OPTIONS.format(limit=limit_text(decoding["num_steps"], "its length",
                                               decoding.get("length_ratio", 0.0)))
    fill = functools.partial(textwrap.fill, width=95, break_on_hyphens=False)
    return (f"# A d2l_transformer model for CTranslate2\n\n{fill(intro)}\n\n```python\n"
            f"{snippet(manifest, directory)}\n```\n\n{fill(options)}\n")
