"""`build_model`: the one function that reads a config and builds the chapter's EncoderDecoder
(with the variants' subclasses when the config asks for one)."""

from mxnet import name as mx_name

from .model import EncoderDecoder, TransformerDecoder, TransformerEncoder
from .variants import VariantTransformerDecoder, VariantTransformerEncoder

VARIANTS = ("pre_norm", "norm", "fixnorm", "layerdrop", "drophead", "fused_qkv")
DECODER_SWITCHES = ("tile_valid_lengths", "mask_in_training_only", "restart_positions")
_OFF = {"pre_norm": False, "norm": "layer", "fixnorm": False, "layerdrop": 0.0,
        "drophead": 0.0, "fused_qkv": False}


def build_model(cfg, src_vocab_size, tgt_vocab_size):
    """9.3.7's model: ``EncoderDecoder(TransformerEncoder(...), TransformerDecoder(...))``.

    The blocks get the book's bugs the config keeps (``cfg.bugs``, `config.EXACT_BUGS`: none
    unless ``exact_chapter``) as their switches, at construction; ``decoder_vocab_from_source``
    (bug 1) builds the decoder with ``src_vocab_size`` outputs, as the 2019 book does. A config
    with a variant (docs/variants.md) builds the variants' subclasses. The model is built under
    a fresh `mx.name.NameManager`, so that its parameters have the names a fresh process gives
    them whatever was built before: `gluon.Trainer` orders the parameters by name, and the Adam
    state saved with a model is matched to them by that order when a run resumes.
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
        switches = {name: name in cfg.bugs for name in DECODER_SWITCHES}
        from_source = "decoder_vocab_from_source" in cfg.bugs  # bug 1
        return EncoderDecoder(
            TransformerEncoder(src_vocab_size, *args, switches["tile_valid_lengths"]),
            TransformerDecoder(src_vocab_size if from_source else tgt_vocab_size, *args,
                               **switches))
