"""`build_model`: the one function that reads a config and builds the chapter's EncoderDecoder
(with the variants' subclasses when the config asks for one)."""

from mxnet import name as mx_name

from .model import EncoderDecoder, TransformerDecoder, TransformerEncoder
from .variants import VariantTransformerDecoder, VariantTransformerEncoder

VARIANTS = ("pre_norm", "norm", "fixnorm", "layerdrop", "drophead", "fused_qkv")
_OFF = {"pre_norm": False, "norm": "layer", "fixnorm": False, "layerdrop": 0.0,
        "drophead": 0.0, "fused_qkv": False}


def build_model(cfg, src_vocab_size, tgt_vocab_size):
    """9.3.7's model: ``EncoderDecoder(TransformerEncoder(...), TransformerDecoder(...))``.

    ``cfg.exact_chapter`` builds the decoder with ``src_vocab_size`` outputs, as the book does
    (bug 1); otherwise ``tgt_vocab_size``. The later editions (``cfg.edition`` 0.17, 1.0) fixed
    bugs 1 and 2: their exact model keeps only the decoder's (its position restart, its causal
    mask in training only). A config with a variant (docs/variants.md) builds
    the variants' subclasses. The model is built under a fresh `mx.name.NameManager`, so that
    its parameters have the names a fresh process gives them whatever was built before:
    `gluon.Trainer` orders the parameters by name, and the Adam state saved with a model is
    matched to them by that order when a run resumes.
    """
    args = (cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_heads, cfg.num_layers, cfg.dropout)
    variants = {name: getattr(cfg, name) for name in VARIANTS if getattr(cfg, name) != _OFF[name]}
    if variants and cfg.exact_chapter:
        raise ValueError(f"the variants ({', '.join(variants)}) need the corrected model, not "
                         "exact_chapter")
    with mx_name.NameManager():
        if variants:
            return EncoderDecoder(VariantTransformerEncoder(src_vocab_size, *args, **variants),
                                  VariantTransformerDecoder(tgt_vocab_size, *args, **variants))
        bugs_2019 = cfg.exact_chapter and cfg.edition == "0.11"
        decoder_vocab_size = src_vocab_size if bugs_2019 else tgt_vocab_size  # bug 1
        model = EncoderDecoder(TransformerEncoder(src_vocab_size, *args, bugs_2019),
                               TransformerDecoder(decoder_vocab_size, *args, cfg.exact_chapter))
    if cfg.exact_chapter and not bugs_2019:  # d2l 0.17's attention repeats the lengths right
        for blk in model.decoder.blks:
            blk.attention_1.exact_chapter = blk.attention_2.exact_chapter = False
    return model
