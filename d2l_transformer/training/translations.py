"""The chapter's four sentences translated at the end of a training run, as each edition's
prediction cells do (`book_translations`: d2l 0.11's; `edition_translations`: 0.17's and 1.0's,
with their BLEU); a model of another pair translates four sentences of its own data
(`corpus_translations`)."""

from ..data import detokenize_words
from ..evaluate import bleu
from ..inference.decode import chapter_greedy, predict_s2s_ch8, predict_step
from ..inference.engines import MXNetEngine
from ..inference.limits import chapter_only
from ..inference.translator import Translator
from ..report.book import EDITIONS, SENTENCES


def book_translations(model, src_vocab, tgt_vocab, cfg, ctx, tokenizer=None):
    """The chapter's four sentences translated by its `predict_s2s_ch8` (in exact mode with the
    chapter's behaviour): ``{sentence: translation}``. A subword model gets them as text
    (``Go.``) through its tokenizer, greedy (`MXNetEngine`: the chapter's loop for a seq2seq
    model), and answers in text."""
    if tokenizer is not None and tokenizer.kind != "word":
        engine = MXNetEngine(model, src_vocab, tgt_vocab, cfg, tokenizer, ctx)
        hyps = engine.translate([tokenizer.encode(detokenize_words(s)) for s in SENTENCES])
        return {s: tokenizer.decode(h.tokens) for s, h in zip(SENTENCES, hyps)}
    return {s: predict_s2s_ch8(model, s, src_vocab, tgt_vocab, cfg.num_steps, ctx)
            for s in SENTENCES}


def edition_translations(model, src_vocab, tgt_vocab, cfg, ctx):
    """The later editions' four sentences as their prediction cells translate and score them:
    ``({sentence: translation}, {sentence: d2l's bleu with k=2})``. Exact 0.17: its
    ``predict_seq2seq`` (`chapter_greedy` on the source and ``<eos>``); exact 1.0: its
    ``predict_step`` (`predict_step`: the four as one batch); corrected: the `Translator`,
    greedy, nothing masked."""
    references = EDITIONS[cfg.edition]["references"]
    sources = [s.split(" ") + ["<eos>"] for s in references]
    if not chapter_only(cfg):
        translator = Translator(model, src_vocab, tgt_vocab, ctx, num_steps=cfg.num_steps,
                                max_length=cfg.num_steps, suppress=False)
        outs = [hyp.tokens for hyp in translator.translate(sources)]
    elif cfg.edition == "0.17":
        outs = [chapter_greedy(model, s, src_vocab, tgt_vocab, cfg.num_steps, ctx) for s in sources]
    else:
        outs = predict_step(model, sources, src_vocab, tgt_vocab, cfg.num_steps, ctx)
    translations = {s: " ".join(out) for s, out in zip(references, outs)}
    return translations, {s: bleu(translations[s], ref, 2) for s, ref in references.items()}


def corpus_translations(model, src_vocab, tgt_vocab, cfg, ctx, tokenizer, sources, count=4):
    """The first `count` distinct sentences of `sources` (text, the data's source side)
    translated greedily through `tokenizer` (`MXNetEngine`: the chapter's loop for an exact or
    seq2seq model): ``{sentence: translation}``, for a model whose pair is not the book's."""
    chosen = list(dict.fromkeys(sources))[:count]
    engine = MXNetEngine(model, src_vocab, tgt_vocab, cfg, tokenizer, ctx)
    hyps = engine.translate([tokenizer.encode(s) for s in chosen])
    return {s: tokenizer.decode(h.tokens) for s, h in zip(chosen, hyps)}
