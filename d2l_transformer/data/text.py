"""The English-French dataset exactly as the d2l library the chapter calls prepares it (d2l 9.5).

The pairs are read from disk, never downloaded (`sources`): ``fra-eng.zip`` by default (the
path given, else the environment variable ``D2L_TRANSFORMER_DATA``, else ``data/fra-eng.zip``
in the source tree this package sits in), or any corpus and direction a `sources.DataSource`
names, in the layout of ``fra.txt``."""

import collections
import functools
import re

from mxnet import np

from .batches import ArrayBatches, load_array, shard
from .corpus import plain_spaces, read_corpus

RESERVED_TOKENS = ["<pad>", "<bos>", "<eos>"]


def read_data_nmt(path=None):
    """The raw text of a corpus, ``source<TAB>target`` a line (d2l's reads ``fra-eng/fra.txt``
    inside the zip, English then French): `path` is what `corpus.read_corpus` reads (default
    `sources.default_data_path`: fra-eng.zip), in its direction, or a read `corpus.Corpus`."""
    return read_corpus(path).text()


def tab_pairs(text, start=0, stop=None):
    """The (source, target) strings of the lines ``start <= i < stop`` of a corpus's text (all
    after start if None) that hold exactly one tab: the lines d2l's `tokenize_nmt` keeps."""
    for i, line in enumerate(text.split("\n")):
        if stop is not None and i >= stop:
            break
        if i < start:
            continue
        parts = line.split("\t")
        if len(parts) == 2:
            yield parts[0], parts[1]


def punctuation(edition="0.11"):
    """The marks `preprocess_nmt` spaces off: , . ! in d2l 0.11; , . ! ? from d2l 0.17 on."""
    return ",.!" if edition == "0.11" else ",.!?"


_CHAPTER_MARKS = punctuation()  # the default of `preprocess_nmt` and `preprocess_fast`


def preprocess_nmt(text, marks=_CHAPTER_MARKS):
    """Lower-case, replace non-breaking spaces, and put a space before each of `marks` (d2l;
    each edition's are `punctuation`'s, d2l 0.11's by default)."""

    def no_space(char, prev_char):
        return char in set(marks) and prev_char != " "

    text = plain_spaces(text).lower()
    out = [" " + char if i > 0 and no_space(char, text[i - 1]) else char
           for i, char in enumerate(text)]
    return "".join(out)


@functools.lru_cache(maxsize=None)
def space_before(marks):
    """The regular expression of `preprocess_fast`: one of `marks` that follows a non-space
    (replaced by ``r" \\1"``, a space and the mark)."""
    return r"(?<=[^ ])([%s])" % re.escape(marks)


def preprocess_fast(text, marks=_CHAPTER_MARKS):
    """`preprocess_nmt` as one regular expression (`space_before`): the same text (all of
    fra.txt is checked in tests/test_data.py), without a Python loop over characters."""
    text = plain_spaces(text).lower()
    return re.sub(space_before(marks), r" \1", text)


def tokenize_nmt(text, num_examples=None):
    """Split lines into (source tokens, target tokens); keeps lines 0..num_examples (d2l), all
    when None (d2l also reads 0 as "all"; here 0 keeps line 0 alone)."""
    return tokenize_nmt_lines(text, 0, None if num_examples is None else num_examples + 1)


def tokenize_nmt_lines(text, start=0, stop=None):
    """`tokenize_nmt` for the lines ``start <= i < stop`` of the text (all after start if None)."""
    source, target = [], []
    for src, tgt in tab_pairs(text, start, stop):
        source.append(src.split(" "))
        target.append(tgt.split(" "))
    return source, target


def count_corpus(sentences):
    """Token frequencies over a list of token lists."""
    return collections.Counter(tk for line in sentences for tk in line)


class Vocab:
    """d2l's vocabulary: ``<unk>`` = 0, the reserved tokens, then tokens with frequency >=
    `min_freq` by descending frequency, ties broken by the token itself (d2l 0.11).

    ``order``: how a later d2l orders it: ``"first"`` breaks ties by first occurrence (d2l
    0.17); ``"sorted"`` sorts all kept tokens, ``<unk>`` and the reserved ones included, as
    strings (d2l 1.0: ``<unk>`` is then not id 0)."""

    def __init__(self, tokens, min_freq=0, reserved_tokens=None, order="token"):
        reserved_tokens = list(reserved_tokens or [])
        counter = count_corpus(tokens)
        self.token_freqs = sorted(counter.items(), key=lambda x: x[0]) if order == "token" \
            else list(counter.items())
        self.token_freqs.sort(key=lambda x: x[1], reverse=True)
        uniq_tokens = ["<unk>"] + reserved_tokens
        uniq_tokens += [token for token, freq in self.token_freqs
                        if freq >= min_freq and token not in uniq_tokens]
        self.idx_to_token = sorted(uniq_tokens) if order == "sorted" else uniq_tokens
        self.token_to_idx = {token: idx for idx, token in enumerate(self.idx_to_token)}
        self.unk = self.token_to_idx["<unk>"]

    def __len__(self):
        return len(self.idx_to_token)

    def __getitem__(self, tokens):
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self.__getitem__(token) for token in tokens]

    def to_tokens(self, indices):
        if not isinstance(indices, (list, tuple)):
            return self.idx_to_token[indices]
        return [self.idx_to_token[index] for index in indices]

    def to_dict(self):
        """The tokens in id order (all that is needed to rebuild the vocabulary)."""
        return {"idx_to_token": list(self.idx_to_token)}

    @classmethod
    def from_dict(cls, d):
        vocab = cls([])
        vocab.idx_to_token = list(d["idx_to_token"])
        vocab.token_to_idx = {t: i for i, t in enumerate(vocab.idx_to_token)}
        if len(vocab.token_to_idx) != len(vocab.idx_to_token) or "<unk>" not in vocab.token_to_idx:
            raise ValueError("vocabulary is malformed: duplicate tokens or no <unk>")
        vocab.unk = vocab.token_to_idx["<unk>"]
        return vocab


def truncate_pad(line, num_steps, padding_token):
    """Cut or pad a list of ids to exactly `num_steps` (d2l)."""
    if len(line) > num_steps:
        return line[:num_steps]  # Trim
    return line + [padding_token] * (num_steps - len(line))  # Pad


def build_array(lines, vocab, num_steps, is_source):
    """Ids (targets wrapped in <bos> ... <eos>), padded to num_steps, and valid lengths (d2l)."""
    lines = [vocab[line] for line in lines]
    if not is_source:
        lines = [[vocab["<bos>"]] + line + [vocab["<eos>"]] for line in lines]
    array = np.array([truncate_pad(line, num_steps, vocab["<pad>"]) for line in lines])
    valid_len = (array != vocab["<pad>"]).sum(axis=1)
    return array, valid_len


def build_array_nmt(lines, vocab, num_steps):
    """d2l 0.17: ids with ``<eos>`` appended (source and target), cut or padded to `num_steps`,
    and int32 valid lengths."""
    lines = [vocab[line] + [vocab["<eos>"]] for line in lines]
    array = np.array([truncate_pad(line, num_steps, vocab["<pad>"]) for line in lines])
    return array, (array != vocab["<pad>"]).astype("int32").sum(axis=1)


def with_bos(array, valid_len, bos):
    """``<bos>`` prepended to every row: (n, T) -> (n, T + 1), valid lengths + 1. Later
    editions put ``<bos>`` in front of the cut target in the training loop (0.17) or the data
    (1.0); here it is data, so that one loop trains every edition (`Y[:, :-1]` is the decoder's
    input, `Y[:, 1:]` its labels)."""
    column = np.full((array.shape[0], 1), bos, dtype=array.dtype)  # (n, 1)
    return np.concatenate([column, array], axis=1), valid_len + 1


def load_data_nmt(batch_size, num_steps, num_examples=1000, path=None, *, rank=0, num_workers=1,
                  fast_loader=False, min_freq=3, edition="0.11"):
    """(src_vocab, tgt_vocab, data_iter) for the first `num_examples` + 1 pairs (d2l).

    With the chapter's arguments: 180 source tokens, 162 target tokens, 1001 pairs.
    ``rank``/``num_workers``: the vocabularies come from all pairs, the batches only
    from this worker's `shard`. ``fast_loader``: `ArrayBatches` instead of Gluon's
    DataLoader (the same batches, faster). ``edition="0.17"``: d2l 0.17's pipeline (a space
    before ``?`` too, vocabulary ties by first occurrence, `build_array_nmt`; `with_bos`).
    """
    later = edition != "0.11"
    text = preprocess_nmt(read_data_nmt(path), punctuation(edition))
    source, target = tokenize_nmt(text, num_examples)
    vocabs = [Vocab(lines, min_freq, RESERVED_TOKENS, order="first" if later else "token")
              for lines in (source, target)]
    if num_workers > 1:
        source, target = shard(source, rank, num_workers), shard(target, rank, num_workers)
    if later:
        src_array, src_valid_len = build_array_nmt(source, vocabs[0], num_steps)
        tgt_array, tgt_valid_len = with_bos(*build_array_nmt(target, vocabs[1], num_steps),
                                            vocabs[1]["<bos>"])
    else:
        src_array, src_valid_len = build_array(source, vocabs[0], num_steps, True)
        tgt_array, tgt_valid_len = build_array(target, vocabs[1], num_steps, False)
    data_arrays = (src_array, src_valid_len, tgt_array, tgt_valid_len)
    data_iter = (ArrayBatches if fast_loader else load_array)(data_arrays, batch_size)
    return vocabs[0], vocabs[1], data_iter


def load_data_mt_fra_eng(batch_size, num_steps=9, num_train=512, num_val=128, path=None, *,
                         fast_loader=False):
    """d2l 1.0's ``MTFraEng``: (src_vocab, tgt_vocab, train_iter, val_iter).

    Lines 0..num_train + num_val of fra.txt (641: d2l reads one more than it says), each side
    with ``<eos>`` appended (empty tokens dropped), cut or padded to `num_steps`, the target
    with ``<bos>`` in front; vocabularies of the padded sentences, tokens seen twice or more,
    sorted (`Vocab` ``order="sorted"``). The first `num_train` pairs train, shuffled; the rest
    (129) validate, in order. Batches as `load_data_nmt`'s: (X, X_valid_len, Y, Y_valid_len).
    """
    text = preprocess_nmt(read_data_nmt(path), punctuation("1.0"))
    sides = [[], []]
    for pair in tab_pairs(text, 0, num_train + num_val + 1):
        for side, sentence in zip(sides, pair):
            side.append([t for t in f"{sentence} <eos>".split(" ") if t])
    arrays, vocabs = [], []
    for lines, is_tgt in zip(sides, (False, True)):
        lines = [truncate_pad(line, num_steps, "<pad>") for line in lines]
        lines = [["<bos>"] + line for line in lines] if is_tgt else lines
        vocab = Vocab(lines, min_freq=2, order="sorted")
        array = np.array([vocab[line] for line in lines])  # (n, num_steps [+ 1])
        arrays += [array, (array != vocab["<pad>"]).astype("int32").sum(axis=1)]
        vocabs.append(vocab)
    load = ArrayBatches if fast_loader else load_array
    train = load([a[:num_train] for a in arrays], batch_size)
    val = load([a[num_train:] for a in arrays], batch_size, is_train=False)
    return vocabs[0], vocabs[1], train, val
