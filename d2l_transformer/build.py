"""`build_model`: the one function that reads a config and builds the chapter's EncoderDecoder
(with the variants' subclasses when the config asks for one), or the 2019 book's seq2seq model
the config names (``cfg.architecture``)."""

from mxnet import name as mx_name

from .model import EncoderDecoder, TransformerDecoder, TransformerEncoder
from .seq2seq import Seq2SeqDecoder, Seq2SeqEncoder
from .seq2seq_attention import Seq2SeqAttentionDecoder
from .variants import VariantTransformerDecoder, VariantTransformerEncoder

VARIANTS = ("pre_norm", "norm", "fixnorm", "layerdrop", "drophead", "fused_qkv", "pos_encoding")
DECODER_SWITCHES = ("tile_valid_lengths", "mask_in_training_only", "restart_positions")
_OFF = {"pre_norm": False, "norm": "layer", "fixnorm": False, "layerdrop": 0.0,
        "drophead": 0.0, "fused_qkv": False, "pos_encoding": "sincos"}


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
    if variants and (cfg.exact_chapter or cfg.architecture != "transformer"):
        raise ValueError(f"the variants ({', '.join(variants)}) need the corrected Transformer, "
                         "not " + ("exact_chapter" if cfg.exact_chapter
                                   else f"the {cfg.architecture} model"))
    if cfg.architecture != "transformer":
        with mx_name.NameManager():
            return _seq2seq(cfg, src_vocab_size, tgt_vocab_size)
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


def _seq2seq(cfg, src_vocab_size, tgt_vocab_size):
    """8.14's or 9.2's model as its section builds it: ``EncoderDecoder(Seq2SeqEncoder(...),
    Seq2SeqDecoder(...) or Seq2SeqAttentionDecoder(...))``, embed ``cfg.embedding_size``, LSTMs
    of ``cfg.rnn_hidden_size`` units and ``cfg.num_layers`` layers, with the book's flaws the
    config keeps (``state_after_padding``, ``tanh_before_sum``) as their switches."""
    args = (cfg.embedding_size, cfg.rnn_hidden_size, cfg.num_layers, cfg.dropout)
    encoder = Seq2SeqEncoder(src_vocab_size, *args, "state_after_padding" in cfg.bugs)
    if cfg.architecture == "seq2seq":
        return EncoderDecoder(encoder, Seq2SeqDecoder(tgt_vocab_size, *args))
    return EncoderDecoder(encoder, Seq2SeqAttentionDecoder(tgt_vocab_size, *args,
                                                           "tanh_before_sum" in cfg.bugs))
