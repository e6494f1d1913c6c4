"""The rules of translation, each in one place: which source sentences a model translates
(used by the library's `Translator`, the command line's ``translate`` and the server's
``serve``, so that all three refuse the same inputs with the same words), what a model trained
with ``--exact-chapter`` cannot do (`require_corrected`), the tokens never emitted (`BANNED`)
and how long a translation may grow (`decode_limit`).

The command line and the server refuse a sentence that is not valid Unicode (a lone
surrogate), longer than `MAX_CHARS` characters, empty, longer than `MAX_TOKENS` tokens or the
model's positions (whichever is fewer), or has no word the model knows (`sentence_tokens`).
The `Translator` refuses, with the same words, what no model can translate: an empty sentence
or one longer than the model's positions (`check_length`); it still translates a sentence of
unknown words, as the chapter's ``predict_s2s_ch8`` does. The messages are one line, without
the sentence itself (callers prefix where it was: ``line 3: ``, ``text[2]: ``,
``sentence 0: ``).

The command line's input (`input_sentences`, `screen_inputs`): its arguments, or the lines of
stdin's bytes, a byte-order mark opening either dropped; a line that is not UTF-8 is refused.
Its refusals are reported one by one, then counted by reason (`refusal_report`).
"""

import codecs
import math
from collections import Counter

from ..data.corpus import MAX_CHARS  # characters per sentence: the translator's and the corpus's

BANNED = ("<pad>", "<bos>")  # target tokens a translation never contains (and <unk> on request)
EXTRA_LENGTH = 10  # a translation may have ratio x its source's length + 10 tokens (`decode_limit`)
MAX_TOKENS = 200  # tokens per sentence (and never more than the model's positions): the
# training sentences of fra-eng have at most ~60, so longer inputs are mistakes or attacks
SHOWN = 5  # refusals reported one by one; the rest are counted by reason (`refusal_report`)
BOM = "\ufeff"  # a byte-order mark: Windows editors open UTF-8 files with it


class SentenceError(ValueError):
    """A sentence the model cannot translate (one line). `too_large` tells a size limit (HTTP
    413) from a sentence that is wrong in itself (HTTP 422); `reason` is its kind in a few
    words (``"empty"``, ``"too long"``), to count many (`refusal_report`)."""

    def __init__(self, message, too_large=False, reason=None):
        super().__init__(message)
        self.too_large = too_large
        self.reason = reason or ("too long" if too_large else "refused")


def check_text(text, max_chars=MAX_CHARS):
    """Refuse (SentenceError) a text that is not valid Unicode or longer than `max_chars`
    characters; checked before the tokenizer sees it."""
    if len(text) > max_chars:
        raise SentenceError(f"{len(text)} characters; at most {max_chars}", too_large=True)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: JSON "\ud800", or undecodable argv bytes
        raise SentenceError(f"not valid Unicode (a lone surrogate at character {e.start})",
                            reason="not valid Unicode") from None


def check_length(tokens, max_positions, max_tokens=MAX_TOKENS):
    """Refuse (SentenceError) a token list that is empty or longer than `max_tokens` (None: no
    such cap) or the model's `max_positions`: what no model can translate. The `Translator`
    checks this much (with no cap but the positions: a library call may translate anything the
    model can compute, as the chapter's ``predict_s2s_ch8`` does)."""
    if not tokens:
        raise SentenceError("empty sentence", reason="empty")
    limit = max_positions if max_tokens is None else min(max_tokens, max_positions)
    if len(tokens) > limit:
        whose = "the model's positions" if limit == max_positions else "the sentence limit"
        raise SentenceError(f"{len(tokens)} tokens; at most {limit} ({whose})", too_large=True)


def check_lengths(sentences, max_positions):
    """`check_length` with no cap but the model's positions on each token list of a batch, the
    SentenceError naming the sentence (``sentence 3: ``): what the engines translate."""
    for i, tokens in enumerate(sentences):
        try:
            check_length(tokens, max_positions, max_tokens=None)
        except SentenceError as e:
            raise SentenceError(f"sentence {i}: {e}", e.too_large, e.reason) from None


def check_search(beam_size, n_best=None):
    """Refuse (ValueError) a beam size below 1, or an `n_best` outside 1 .. `beam_size`."""
    if beam_size < 1:
        raise ValueError(f"beam size must be at least 1, not {beam_size}")
    if n_best is not None and not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be 1 to the beam size {beam_size}, not {n_best}")


def check_sentence(tokens, src_vocab, max_positions, max_tokens=MAX_TOKENS):
    """`check_length`, and refuse (SentenceError) a sentence made only of words outside
    `src_vocab`: what the command line and the server translate."""
    check_length(tokens, max_positions, max_tokens)
    if all(src_vocab[t] == src_vocab.unk for t in tokens):
        raise SentenceError("no word of it is in the model's vocabulary",
                            reason="with no known word")


def sentence_tokens(text, tokenizer, src_vocab, max_positions, *, max_chars=MAX_CHARS,
                    max_tokens=MAX_TOKENS):
    """The tokens of `text` by the model's `tokenizer`, after `check_text` and
    `check_sentence` (SentenceError when refused)."""
    check_text(text, max_chars)
    tokens = tokenizer.encode(text)
    check_sentence(tokens, src_vocab, max_positions, max_tokens)
    return tokens


def input_sentences(arguments, stream):
    """The command line's sentences, each with where it came from and what is wrong with it:
    ``[(label, text or None, SentenceError or None)]``, of the `arguments` (``argument 1``,
    ...) or, when there are none, of the lines of the binary `stream` (``line 1``, ...; a line
    that is not UTF-8 has its error; None: no lines). A byte-order mark opening the stream or
    an argument is dropped: an editor's mark, not part of the sentence."""
    if arguments:
        return [(f"argument {i}", _without(BOM, s), None) for i, s in enumerate(arguments, 1)]
    lines = []
    data = _without(codecs.BOM_UTF8, b"" if stream is None else stream.read())
    for i, raw in enumerate(data.splitlines(), 1):
        try:
            lines.append((f"line {i}", raw.decode("utf-8"), None))
        except UnicodeDecodeError as e:
            lines.append((f"line {i}", None, SentenceError(
                f"not UTF-8 ({e.reason} at byte {e.start})", reason="not UTF-8")))
    return lines


def _without(prefix, text):
    """`text` (str or bytes) without a leading `prefix` (``str.removeprefix``, Python 3.9)."""
    return text[len(prefix):] if text.startswith(prefix) else text


def screen_inputs(inputs, tokenizer, src_vocab, max_positions):
    """The tokens of each of `inputs` (`input_sentences`) by `sentence_tokens`, None for one
    refused, and the refused ones: ``([tokens or None, ...], [(label, SentenceError), ...])``."""
    tokens, refused = [], []
    for label, text, error in inputs:
        if error is None:
            try:
                tokens.append(sentence_tokens(text, tokenizer, src_vocab, max_positions))
                continue
            except SentenceError as e:
                error = e
        tokens.append(None)
        refused.append((label, error))
    return tokens, refused


def refusal_report(refused, shown=SHOWN):
    """The lines reporting the refused inputs ``[(label, SentenceError)]``: the first `shown`
    one by one (``line 3: empty sentence; skipped``), then one line counting the rest by
    reason (``15,599 more lines skipped (15,604 in all): 15,384 not UTF-8, 215 empty``)."""
    if len(refused) <= shown + 1:  # one more line tells more than a count of one
        shown = len(refused)
    lines = [f"{label}: {error}; skipped" for label, error in refused[:shown]]
    rest = refused[shown:]
    if rest:
        unit = rest[0][0].split()[0]  # "line" or "argument", as `input_sentences` labels them
        counts = ", ".join(f"{n:,} {reason}" for reason, n in Counter(
            error.reason for _, error in rest).most_common())
        lines.append(f"{len(rest):,} more {unit}s skipped ({len(refused):,} in all): {counts}")
    return lines


class ExactChapterError(ValueError):
    """What a model only the chapter's loop decodes cannot do (`chapter_only`); one line."""


def chapter_only(model_or_cfg):
    """Whether only the chapter's own loop (`decode.chapter_greedy`) decodes this model: a
    Transformer whose decoder restarts the positions at every step (bug 3,
    ``restart_positions``; every edition's exact run keeps it: `config.EXACT_BUGS`), which the
    `Translator`'s cached step does not, or the 2019 book's seq2seq models (``cfg.architecture``),
    whose LSTM state the cached step does not hold. `model_or_cfg`: a config, a model or its
    decoder; a decoder without the switch (the book's own classes, the LSTM decoders) is the
    chapter loop's."""
    if hasattr(model_or_cfg, "bugs"):  # a TransformerConfig
        cfg = model_or_cfg
        return "restart_positions" in cfg.bugs or cfg.architecture != "transformer"
    return getattr(getattr(model_or_cfg, "decoder", model_or_cfg), "restart_positions", True)


def require_corrected(model_or_cfg, what):
    """Refuse (ExactChapterError) `what` (e.g. ``"beam search"``) for a model only the chapter's
    loop decodes (`chapter_only`): an exact-chapter Transformer or a seq2seq model."""
    if not chapter_only(model_or_cfg):
        return
    decoder = getattr(model_or_cfg, "decoder", model_or_cfg)
    lstm = "seq2seq" if hasattr(decoder, "rnn") else "transformer"  # a model: its decoder tells
    model = getattr(model_or_cfg, "architecture", lstm)
    if model != "transformer":
        raise ExactChapterError(f"{what} needs the Transformer; this is the book's {model} model "
                                "(greedy decoding by the chapter's loop only)")
    raise ExactChapterError(f"{what} needs the corrected model; this one was trained with "
                            "--exact-chapter (the book's bugs)")


def source_positions(model):
    """The longest source `model` can encode: a Transformer's positions (its encoding table's
    rows); `MAX_TOKENS` for an LSTM encoder, which has no such table (the chapter's loop, which
    decodes it, cuts the source at ``num_steps`` anyway)."""
    encoding = getattr(model.encoder, "pos_encoding", None)
    return MAX_TOKENS if encoding is None else encoding.P.shape[1]


def decode_limit(num_steps, source_length, max_positions=None, length_ratio=0.0):
    """The most tokens a translation of a `source_length`-token source may have, never more
    than the model's target `max_positions` (None: no such cap). Two rules, by where the
    model's lengths come from:

    * ``length_ratio > 0`` (measured on the model's training part, `data.lengths`):
      ceil(`length_ratio` x `source_length`) + `EXTRA_LENGTH`, and at most `num_steps` (the
      data's limit, a ceiling, never a floor): a short source gets a short translation;
    * ``length_ratio == 0`` (the chapter's pipeline, which measures no lengths):
      max(`num_steps`, `source_length` + `EXTRA_LENGTH`), the rule the book table was made
      with."""
    if length_ratio:
        limit = min(num_steps, math.ceil(length_ratio * source_length) + EXTRA_LENGTH)
    else:
        limit = max(num_steps, source_length + EXTRA_LENGTH)
    return limit if max_positions is None else min(limit, max_positions)
