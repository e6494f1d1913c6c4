"""Token lists in, token lists out, for a model trained with a config: the `Translator`, or for
a model trained with the chapter's bugs the chapter's own loop (`decode.chapter_greedy`); and
text in, text out around them with the model directory's tokenizer."""

from .decode import chapter_greedy
from .limits import require_corrected
from .translator import ALPHA, Translator

BATCH = 64  # sentences decoded together


def no_unk_for(cfg, no_unk=False):
    """Whether translations of a model trained with `cfg` must not contain ``<unk>``: always for
    subword models (a sentencepiece model covers its text, ``<unk>`` only tells that it is
    under-trained), on request (``no_unk``, ``--no-unk``) for word models, whose default is the
    chapter's (the book prints ``Wow ! => <unk> !``)."""
    return bool(no_unk) or cfg.tokenizer == "subword"


def translator_options(cfg, no_unk=False):
    """The `Translator` keywords for a model trained with `cfg`: its `num_steps`, `no_unk_for`,
    and the sources' padding: the chapter's (to `num_steps`) for word models, whose published
    figures were measured so; each batch's longest source for subword models (their
    `num_steps` is 30 while the sentences average ~10 pieces: the encoder masks the padding, so
    the same translations, with less work; the one-hour model's published valid and test
    BLEU and chrF, greedy and beam 4, are unchanged to the last digit)."""
    return {"num_steps": cfg.num_steps, "no_unk": no_unk_for(cfg, no_unk),
            "pad_to_num_steps": cfg.tokenizer != "subword"}


def translate_tokens(model, sentences, src_vocab, tgt_vocab, cfg, ctx, beam=1, alpha=ALPHA, *,
                     no_unk=False):
    """Translations (token lists) of token lists by the `Translator`, `BATCH` sentences at a
    time; beam 1 is greedy decoding; never ``<pad>`` or ``<bos>``, nor ``<unk>`` where
    `no_unk_for` says so. A model trained with --exact-chapter is decoded by the chapter's own
    loop, one sentence at a time (greedy only, nothing masked: `limits.require_corrected`)."""
    if cfg.exact_chapter:
        if beam > 1:
            require_corrected(cfg, "beam search")
        if no_unk:
            require_corrected(cfg, "--no-unk")
        return [chapter_greedy(model, s, src_vocab, tgt_vocab, cfg.num_steps, ctx)
                for s in sentences]
    translator = Translator(model, src_vocab, tgt_vocab, ctx, batch_size=BATCH,
                            **translator_options(cfg, no_unk))
    return [hyp.tokens for hyp in translator.translate(sentences, beam, alpha)]


def translate_texts(model, texts, tokenizer, src_vocab, tgt_vocab, cfg, ctx, beam=1, alpha=ALPHA,
                    *, no_unk=False):
    """Translations (text) of sentences (text): `translate_tokens` between the tokenizer's
    ``encode`` and ``decode``."""
    outs = translate_tokens(model, [tokenizer.encode(t) for t in texts], src_vocab, tgt_vocab,
                            cfg, ctx, beam, alpha, no_unk=no_unk)
    return [tokenizer.decode(out) for out in outs]
