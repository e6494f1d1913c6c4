"""Text <-> tokens: d2l's lower-cased words (the chapter, d2l 9.5) or sentencepiece subwords.

A tokenizer turns a source sentence into the model's source tokens (``encode``), a target
sentence into target tokens (``encode_target``, for training), and the model's target tokens
back into text (``decode``); ``detokenize`` maps decoded text to the form that is scored (see
docs/data.md and docs/evaluation.md).

Subwords (Kudo & Richardson 2018, sentencepiece): one unigram model per language, trained on the
training part only, on cased text. Separate rather than shared vocabularies, by default
(``tie_embeddings`` "none" or "target"), because the source and target embeddings are separate
matrices (only the decoder's own embedding and output layer may be one, both over the target
vocabulary, so a joint vocabulary would buy no shared parameters) and the target softmax costs
O(vocabulary) per token on a CPU: a joint model of 2V pieces would spend half of its output
layer on English-only pieces. ``tie_embeddings="all"`` is the exception that pays for it: the
encoder's embedding is the same matrix as the decoder's and its output layer (three-way tying,
Press & Wolf 2017, section 5; Vaswani et al. 2017, section 3.4), which needs one vocabulary for
both languages, so ``joint=True`` trains ONE unigram model on the training part's source and
target text together, ``vocab_size`` pieces in all, kept under both file names (spm_src.model
and spm_tgt.model, the same bytes) so that loading is unchanged. ``byte_fallback`` with
``character_coverage=1.0`` spells any character the training text lacks as UTF-8 byte pieces,
so ordinary input never becomes ``<unk>``. The model ids ARE the vocabulary ids: sentencepiece
is told ``<unk>=0, <pad>=1, <bos>=2, <eos>=3`` (the chapter's `Vocab` layout), and the `Vocab`
of a tokenizer is the list of its pieces in id order.
"""

import io
import itertools
import os
import re

import numpy as onp

from .batches import Ragged
from .corpus import NO_BREAK_SPACES
from .languages import language_name
from .sources import progress
from .text import RESERVED_TOKENS, Vocab, preprocess_fast, punctuation, space_before

SPM_SRC, SPM_TGT = "spm_src.model", "spm_tgt.model"  # file names inside a model directory
TOKENIZERS = ("word", "subword")


class TokenizerError(ValueError):
    """A tokenizer cannot be built or loaded; the message is one line."""


_SPACE_BEFORE_STOP = re.compile(r" ([.,])")


def detokenize_words(text):
    """d2l's tokenized French back to text: drop the space `preprocess_nmt` puts before ``.``
    and ``,``. French typography keeps a space before ``! ? : ;`` (fra.txt has one in 98% of
    the cases), so those stay. On fra.txt this restores 167,078 of the 167,130 lower-cased
    targets exactly (the rest are ``bord!``-style lines without that space)."""
    return _SPACE_BEFORE_STOP.sub(r"\1", text)


class WordTokenizer:
    """The chapter's pipeline (d2l 9.5): ``preprocess_nmt(text).split()`` (computed by
    `preprocess_fast`), tokens joined with spaces. Lower-cased, so its output is scored
    case-insensitively (``lowercase``). ``edition``: a later d2l's (0.17, 1.0) also spaces
    ``?`` off and ends each source with ``<eos>``, as its models were trained."""

    kind, lowercase = "word", True

    def __init__(self, edition="0.11"):
        self.edition = edition
        self.marks, self.eos = punctuation(edition), [] if edition == "0.11" else ["<eos>"]

    def rule(self):
        """``encode`` as data, for programs without this package (the exports' manifests):
        replace each of ``no_break_spaces`` by a space, lower-case, put a space before each
        match of the regular expression ``space_before`` (a mark of ``marks`` after a
        non-space), split on spaces, append ``source_end``."""
        return {"edition": self.edition, "no_break_spaces": list(NO_BREAK_SPACES),
                "lowercase": self.lowercase, "marks": self.marks, "space_before": space_before(self.marks),
                "source_end": list(self.eos)}

    def encode(self, text):
        return self.encode_target(text) + self.eos

    def encode_target(self, text):
        return preprocess_fast(text, self.marks).split()

    def decode(self, tokens):
        return " ".join(tokens)

    def detokenize(self, text):
        return detokenize_words(text)

    def files(self):
        return {}


def words_problem(data):
    """Why the chapter's word tokenizer cannot serve the corpus `data` (a `sources.DataSource`),
    in one line, or None. It splits on spaces: a language written without them (Japanese,
    Chinese, Thai) would be one token a sentence. The rule reads the data, not a list of
    languages: more than half of a side's sentences of 10 characters or more hold no space."""
    for lang, side in zip((data.source_lang, data.target_lang), data.pairs()):
        long = [s.strip() for s in side if len(s.strip()) >= 10]
        bare = sum(" " not in s for s in long)
        if long and 2 * bare > len(long):
            return (f"the word tokenizer (the chapter's pipeline) splits on spaces, but {bare} of "
                    f"{len(long)} {language_name(lang)} ({lang}) sentences of 10 characters or "
                    "more have none: use a subword preset (--preset full or hour)")
    return None


class SubwordTokenizer:
    """sentencepiece models for the source and target languages (paths or serialized bytes).

    ``encode`` gives pieces (``"▁Hello"``), ``decode`` joins pieces back into detokenized text;
    ``src_vocab()`` / ``tgt_vocab()`` are the `Vocab` of the model ids (piece ``i`` is id ``i``).
    """

    kind, lowercase = "subword", False

    def __init__(self, src_model, tgt_model=None):
        import sentencepiece as spm
        self._protos = []
        self._models = []
        for model in (src_model, src_model if tgt_model is None else tgt_model):
            if isinstance(model, (str, os.PathLike)):
                try:
                    with open(model, "rb") as f:
                        model = f.read()
                except OSError as e:
                    raise TokenizerError(f"cannot read sentencepiece model {model}: {e.strerror}") from None
            try:
                sp = spm.SentencePieceProcessor(model_proto=model)
            except (RuntimeError, OSError, TypeError) as e:
                raise TokenizerError(f"not a sentencepiece model: {str(e).splitlines()[0]}") from None
            pieces = [sp.id_to_piece(i) for i in range(4)]
            if pieces != ["<unk>"] + RESERVED_TOKENS:
                raise TokenizerError(f"sentencepiece model has ids 0-3 = {pieces}, not "
                                     f"{['<unk>'] + RESERVED_TOKENS}")
            self._protos.append(bytes(model))
            self._models.append(sp)
        self.src, self.tgt = self._models

    @classmethod
    def train(cls, source, target, vocab_size, joint=False):
        """Train one unigram model per language on these sentences (the training part), with
        at most `vocab_size` pieces each (fewer when the text has fewer); ``joint``: one model
        for both, trained on the source sentences then the target ones, `vocab_size` pieces in
        all, as the source and the target model (``tie_embeddings="all"``). Each language's
        sentences are `spm_sample`'s (a large corpus: a fixed-seed sample).

        One thread: sentencepiece's unigram training is deterministic for a given thread count
        but differs between counts, and the model must be the same on every machine."""
        if joint:
            proto = _train_unigram(spm_sample(source) + spm_sample(target), vocab_size)
            return cls(proto, proto)
        return cls(*(_train_unigram(spm_sample(sentences), vocab_size) for sentences in
                     progress((source, target), "training sentencepiece", "language")))

    def encode(self, text):
        return self.src.encode(text, out_type=str)

    def encode_target(self, text):
        return self.tgt.encode(text, out_type=str)

    def decode(self, tokens):
        return self.tgt.decode_pieces(list(tokens))

    def encode_ids(self, texts, target=False, chunk=50_000):
        """The ids of many source (or `target`) sentences as a `batches.Ragged`, encoded by
        sentencepiece in chunks (its threads; a progress bar on a terminal for a long corpus):
        ``vocab[encode(text)]`` for each, without a Python list of tokens per sentence."""
        sp, side = (self.tgt, "target") if target else (self.src, "source")
        lengths, flats = [], []
        for start in progress(range(0, len(texts), chunk), f"encoding the {side} sentences",
                              "chunk"):
            ids = sp.encode(texts[start:start + chunk], out_type=int)
            lengths.append(onp.fromiter(map(len, ids), dtype=onp.int64, count=len(ids)))
            flats.append(onp.fromiter(itertools.chain.from_iterable(ids), dtype=onp.int32,
                                      count=int(lengths[-1].sum())))
        return Ragged(onp.concatenate(flats or [[]]), onp.concatenate(lengths or [[]]))

    def detokenize(self, text):
        return text

    @staticmethod
    def _vocab(sp):
        return Vocab.from_dict({"idx_to_token": [sp.id_to_piece(i) for i in range(sp.get_piece_size())]})

    def src_vocab(self):
        return self._vocab(self.src)

    def tgt_vocab(self):
        return self._vocab(self.tgt)

    def files(self):
        """``{file name: bytes}`` to keep in a model directory."""
        return {SPM_SRC: self._protos[0], SPM_TGT: self._protos[1]}


SPM_SAMPLE = 200_000  # sentences sentencepiece trains on, at most (a fixed-seed sample)
RICH_CHARSET = 1_000  # distinct characters from which a text counts as CJK-like


def spm_sample(sentences, size=SPM_SAMPLE):
    """At most `size` of `sentences`, a fixed-seed random sample in corpus order: sentencepiece
    needs a few hundred thousand sentences, not a whole large corpus (which would cost minutes
    and gigabytes). A corpus of `size` sentences or fewer is used whole."""
    sentences = list(sentences)
    if len(sentences) <= size:
        return sentences
    keep = onp.sort(onp.random.RandomState(0).choice(len(sentences), size, replace=False))
    return [sentences[i] for i in keep]


def character_coverage(sentences):
    """sentencepiece's ``character_coverage``: 1.0 (every character a piece) for a text of a
    few hundred characters (fra.txt: 91 English, 113 French), 0.9995 for a text with a rich
    character set (over `RICH_CHARSET`: Chinese, Japanese), sentencepiece's advice; the rare
    characters left out are spelled as UTF-8 bytes (``byte_fallback``), never ``<unk>``."""
    chars = set()
    for sentence in sentences:
        chars.update(sentence)
    return 1.0 if len(chars) <= RICH_CHARSET else 0.9995


def _train_unigram(sentences, vocab_size):
    """The serialized unigram sentencepiece model of these sentences (`SubwordTokenizer.train`),
    the chapter's special ids first, with their `character_coverage`; a failed training is a
    one-line TokenizerError."""
    import sentencepiece as spm
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=buffer, vocab_size=vocab_size,
            model_type="unigram", character_coverage=character_coverage(sentences),
            byte_fallback=True,
            unk_id=0, pad_id=1, bos_id=2, eos_id=3, unk_piece="<unk>", pad_piece="<pad>",
            bos_piece="<bos>", eos_piece="<eos>", num_threads=1, minloglevel=2,
            hard_vocab_limit=False)  # a small corpus gets fewer pieces, not an error
    except RuntimeError as e:  # e.g. a vocabulary smaller than the text's characters
        small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if small:
            raise TokenizerError(f"vocab_size {small.group(1)} is too small for this text: its "
                                 f"characters and the 256 byte pieces need {small.group(2)} "
                                 "(give a larger --set vocab_size)") from None
        raise TokenizerError(f"sentencepiece training failed: {str(e).splitlines()[0]}") from None
    return buffer.getvalue()


def load_tokenizer(model_dir, cfg):
    """The tokenizer a model directory was trained with (``cfg.tokenizer``; config.json
    without that field is the chapter's word-level pipeline)."""
    kind = getattr(cfg, "tokenizer", "word")
    if kind == "word":
        return WordTokenizer(getattr(cfg, "edition", "0.11"))
    if kind != "subword":
        raise TokenizerError(f"unknown tokenizer {kind!r}: use one of {', '.join(TOKENIZERS)}")
    paths = [os.path.join(model_dir, name) for name in (SPM_SRC, SPM_TGT)]
    for path in paths:
        if not os.path.exists(path):
            raise TokenizerError(f"{model_dir} has no {os.path.basename(path)}")
    return SubwordTokenizer(*paths)
