"""What "the same sentence" means, three ways, each written on its own so that one can check
another.

* `normalize_sentence`, d2l's preprocessing (lower case, a space before ``, . !``): the key of
  the chapter's held-out lines and of the splits model directories were trained on before
  (``split_by`` ``group`` and ``source``), kept so that they still get their own parts.
* `fold_sentence`, the key of today's split (``split_by`` ``folded``): Unicode compatibility
  forms (NFKC), case folded, the words alone: every punctuation mark, apostrophe and quote
  (any variant) is a word break, so ``minute ?`` and ``minute?``, ``J’ai`` and ``J'ai``,
  ``Wait!`` and ``Wait.`` are one sentence.
* `strict_sentence`, the key that counts what a held-out part shares with training
  (`split.overlaps`): NFKC, case folded, letters and digits only. It is stricter than the
  split's (it joins every pair of sentences the split's key joins, and more), so a count of
  0 under it means no sentence of the part was trained on, however it is spelled.
"""

import unicodedata

from .text import preprocess_fast


def normalize_sentence(sentence):
    """d2l's key: its preprocessing (lower case, a space before ``, . !``) with whitespace
    collapsed. `sentence`: text, or d2l tokens."""
    if not isinstance(sentence, str):
        return " ".join(" ".join(sentence).split())  # already preprocessed tokens
    return " ".join(preprocess_fast(sentence).split())


def fold_sentence(sentence):
    """The split's key: NFKC, case folded, each character that is not a letter or a digit
    (punctuation, apostrophes, quotes, spaces of any kind) a word break, words joined by one
    space. `sentence`: text, or tokens."""
    sentence = sentence if isinstance(sentence, str) else " ".join(sentence)
    text = unicodedata.normalize("NFKC", sentence).casefold()
    return " ".join("".join(c if c.isalnum() else " " for c in text).split())


def strict_sentence(sentence):
    """The overlap counter's key: NFKC, case folded, the letters and digits alone (no space,
    no punctuation). Written apart from `fold_sentence` on purpose."""
    text = unicodedata.normalize("NFKC", sentence).casefold()
    return "".join(c for c in text if c.isalnum())
