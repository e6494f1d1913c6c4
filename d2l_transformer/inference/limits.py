"""Which source sentences a model translates: one rule, used by the library (`Translator`),
the command line (``translate``) and the server (``serve``), so that all three refuse the same
inputs with the same words.

The command line and the server refuse a sentence that is not valid Unicode (a lone
surrogate), longer than `MAX_CHARS` characters, empty, longer than `MAX_TOKENS` tokens or the
model's positions (whichever is fewer), or has no word the model knows (`sentence_tokens`).
The `Translator` refuses, with the same words, what no model can translate: an empty sentence
or one longer than the model's positions (`check_length`); it still translates a sentence of
unknown words, as the chapter's ``predict_s2s_ch8`` does. The messages are one line, without
the sentence itself (callers prefix where it was: ``line 3: ``, ``text[2]: ``,
``sentence 0: ``).
"""

MAX_CHARS = 1000  # characters per sentence
MAX_TOKENS = 200  # tokens per sentence (and never more than the model's positions): the
# training sentences of fra-eng have at most ~60, so longer inputs are mistakes or attacks


class SentenceError(ValueError):
    """A sentence the model cannot translate (one line). `too_large` tells a size limit (HTTP
    413) from a sentence that is wrong in itself (HTTP 422)."""

    def __init__(self, message, too_large=False):
        super().__init__(message)
        self.too_large = too_large


def check_text(text, max_chars=MAX_CHARS):
    """Refuse (SentenceError) a text that is not valid Unicode or longer than `max_chars`
    characters; checked before the tokenizer sees it."""
    if len(text) > max_chars:
        raise SentenceError(f"{len(text)} characters; at most {max_chars}", too_large=True)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: JSON "\ud800", or undecodable argv bytes
        raise SentenceError(f"not valid Unicode (a lone surrogate at character {e.start})") \
            from None


def check_length(tokens, max_positions, max_tokens=MAX_TOKENS):
    """Refuse (SentenceError) a token list that is empty or longer than `max_tokens` (None: no
    such cap) or the model's `max_positions`: what no model can translate. The `Translator`
    checks this much (with no cap but the positions: a library call may translate anything the
    model can compute, as the chapter's ``predict_s2s_ch8`` does)."""
    if not tokens:
        raise SentenceError("empty sentence")
    limit = max_positions if max_tokens is None else min(max_tokens, max_positions)
    if len(tokens) > limit:
        whose = "the model's positions" if limit == max_positions else "the sentence limit"
        raise SentenceError(f"{len(tokens)} tokens; at most {limit} ({whose})", too_large=True)


def check_sentence(tokens, src_vocab, max_positions, max_tokens=MAX_TOKENS):
    """`check_length`, and refuse (SentenceError) a sentence made only of words outside
    `src_vocab`: what the command line and the server translate."""
    check_length(tokens, max_positions, max_tokens)
    if all(src_vocab[t] == src_vocab.unk for t in tokens):
        raise SentenceError("no word of it is in the model's vocabulary")


def sentence_tokens(text, tokenizer, src_vocab, max_positions, *, max_chars=MAX_CHARS,
                    max_tokens=MAX_TOKENS):
    """The tokens of `text` by the model's `tokenizer`, after `check_text` and
    `check_sentence` (SentenceError when refused)."""
    check_text(text, max_chars)
    tokens = tokenizer.encode(text)
    check_sentence(tokens, src_vocab, max_positions, max_tokens)
    return tokens
