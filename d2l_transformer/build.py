"""`build_model`: the one function that reads a config and builds the chapter's EncoderDecoder
(with the variants' subclasses when the config asks for one, and its embeddings tied when it
asks for that: `tie_embeddings`), or the 2019 book's seq2seq model the config names
(``cfg.architecture``)."""

from mxnet import name as mx_name

from . import _gluon
from .model import EncoderDecoder, TransformerDecoder, TransformerEncoder
from .seq2seq import Seq2SeqDecoder, Seq2SeqEncoder
from .seq2seq_attention import Seq2SeqAttentionDecoder
from .variants import VariantTransformerDecoder, VariantTransformerEncoder

DECODER_SWITCHES = ("tile_valid_lengths", "mask_in_training_only", "restart_positions")


def build_model(cfg, src_vocab_size, tgt_vocab_size):
    """9.3.7's model: ``EncoderDecoder(TransformerEncoder(...), TransformerDecoder(...))``.

    The blocks get the book's bugs the config keeps (``cfg.bugs``, `config.EXACT_BUGS`: none
    unless ``exact_chapter``) as their switches, at construction; ``decoder_vocab_from_source``
    (bug 1) builds the decoder with ``src_vocab_size`` outputs, as the 2019 book does. A config
    with a variant (docs/variants.md) builds the variants' subclasses; ``cfg.tie_embeddings``
    then ties the embeddings and the output layer (`tie_embeddings`, on the built blocks). The
    model is built under a fresh `mx.name.NameManager`, so that its parameters have the names a
    fresh process gives them whatever was built before: `gluon.Trainer` orders the parameters
    by name, and the Adam state saved with a model is matched to them by that order when a run
    resumes.
    """
    if cfg.variants_problem:
        raise ValueError(cfg.variants_problem)
    args = (cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_heads, cfg.num_layers, cfg.dropout)
    variants = {k: v for k, v in cfg.variants.items() if k != "tie_embeddings"}  # the blocks'
    if cfg.tie_embeddings == "all" and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"tie_embeddings all needs one joint vocabulary, not {src_vocab_size} "
                         f"source and {tgt_vocab_size} target tokens")
    if cfg.architecture != "transformer":
        with mx_name.NameManager():
            return _seq2seq(cfg, src_vocab_size, tgt_vocab_size)
    with mx_name.NameManager():
        if variants:
            model = EncoderDecoder(VariantTransformerEncoder(src_vocab_size, *args, **variants),
                                   VariantTransformerDecoder(tgt_vocab_size, *args, **variants))
            return tie_embeddings(model, cfg.tie_embeddings)
        switches = {name: name in cfg.bugs for name in DECODER_SWITCHES}
        from_source = "decoder_vocab_from_source" in cfg.bugs  # bug 1
        model = EncoderDecoder(
            TransformerEncoder(src_vocab_size, *args, switches["tile_valid_lengths"]),
            TransformerDecoder(src_vocab_size if from_source else tgt_vocab_size, *args,
                               **switches))
        return tie_embeddings(model, cfg.tie_embeddings)


def tie_embeddings(model, how):
    """Weight tying (Press & Wolf 2017, "Using the Output Embedding to Improve Language
    Models"), put in place on a built, not yet initialised Transformer; `model` returned.

    ``"none"``: `model` as built (the chapter's). ``"target"``: the decoder's output layer
    (``decoder.dense``: logits = X W^T + b, W of shape (V_tgt, d)) takes the decoder's
    embedding matrix (V_tgt, d) as its W and keeps its own bias b (fairseq's
    ``--share-decoder-input-output-embed``). ``"all"``: the encoder's embedding is that matrix
    too (three-way tying, Press & Wolf 2017, section 5; Vaswani et al. 2017, section 3.4), over
    one joint vocabulary (`data.tokenize`). Tied here, once, rather than in the blocks: the
    chapter's classes stay the chapter's (every block keeps its class and attribute names), and
    one Parameter object sits in every place that uses it (`_gluon.share_parameter`), so the
    graphs take it as one input and sum its gradients, the Trainer and ``collect_params`` see
    it once, ``save_parameters`` writes it under each structural name and `checkpoint.load`,
    which builds the model through here, ties again before filling it.
    """
    if how == "none":
        return model
    shared = model.encoder.embed.weight if how == "all" else model.decoder.embed.weight
    if how == "all":
        _gluon.share_parameter(model.decoder.embed, "weight", shared)
    _gluon.share_parameter(model.decoder.dense, "weight", shared)
    return model


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
