"""Hyperparameters: one frozen dataclass, the chapter's values as the `CHAPTER` preset, and
the overrides a user gives on top of a preset (``train --config FILE.json --set field=value``)."""

import dataclasses
import json
import typing
from typing import Optional


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Model, data and training sizes. Defaults are the chapter's (9.3.7)."""

    embedding_size: int = 32
    ffn_hidden_size: int = 64  # the chapter's `num_hiddens`
    num_heads: int = 4
    num_layers: int = 2
    dropout: float = 0.0
    batch_size: int = 64  # sentences a batch (at most, with batch_tokens)
    # the chapter's: sentences cut or padded to it (9.5); with the held-out pipeline
    # (`held_out`), the longest training pair (longer ones dropped, counted); 0: the training
    # part's lengths decide (data.lengths), and the run records the number
    num_steps: int = 10
    lr: float = 0.005
    num_epochs: int = 100
    num_examples: Optional[int] = 1000  # d2l keeps lines 0..num_examples: 1001 pairs; None: all
    exact_chapter: bool = False  # True: the book's bugs, bit for bit
    edition: str = "0.11"  # whose chapter: d2l 0.11 (2019), 0.17 (classic) or 1.0 (EDITIONS)
    # which model: the chapter's "transformer", or the 2019 book's earlier ones, 8.14's LSTM
    # "seq2seq" and 9.2's "attention" (seq2seq with MLP attention); only those two read:
    architecture: str = "transformer"
    rnn_hidden_size: int = 32  # the LSTMs' num_hiddens (8.14, 9.2: 32)
    # the literature's variants (defaults = the chapter); read only by model.build_model
    pre_norm: bool = False
    norm: str = "layer"  # "layer", "scale" (ScaleNorm), "batch" or "masked_batch" (BatchNorm)
    fixnorm: bool = False
    layerdrop: float = 0.0
    drophead: float = 0.0
    fused_qkv: bool = False
    pos_encoding: str = "sincos"  # the chapter's; "none", "learned" or "alibi" (ALiBi)
    # weight tying (Press & Wolf 2017): "none" (the chapter's), "target" (the decoder's embedding
    # is its output layer's weight), "all" (and the encoder's, over one joint subword vocabulary)
    tie_embeddings: str = "none"
    # beyond the chapter (the `full` preset); the defaults keep the chapter's run unchanged
    min_freq: int = 3  # d2l's vocabulary threshold
    label_smoothing: float = 0.0  # paper 5.4: 0.1
    warmup_steps: int = 0  # > 0: linear warmup to `lr`, then lr * sqrt(warmup / step) (paper 5.3)
    num_valid: int = 0  # held-out pairs (a fixed-seed random split of the kept pairs)
    num_test: int = 0
    num_buckets: int = 0  # > 0: batches of similar lengths, padded to their bucket (BucketBatches)
    batch_tokens: int = 0  # > 0: with buckets, at most this many padded tokens a batch
    tokenizer: str = "word"  # "word": d2l's lower-cased words; "subword": sentencepiece, cased
    vocab_size: int = 0  # "subword": pieces per language (one sentencepiece model each)
    loss_reduction: str = "book"  # "book": each sentence's loss averaged over the padded width
    # (d2l; the book's loss); "token": summed over the real tokens, so the gradient and the
    # reported cross-entropy do not depend on how a batch was padded (MaskedSoftmaxCELoss)
    # num_valid/num_test hold out groups of pairs sharing a "folded" sentence (data.keys), or
    # d2l's "group"s, "source" sentences, random "pair"s (how model directories written
    # before were split: they keep being evaluated on their own parts)
    split_by: str = "folded"
    # drop (and count) exact duplicates, sides over 1,000 characters, misaligned pairs (data.corpus,
    # data.lengths); False for model directories written before, split from the pairs as read
    clean: bool = True
    # a translation's most tokens: length_ratio x its source's + 10, at most num_steps; 0: set by
    length_ratio: float = 0.0  # the run from its training part (data.lengths); none: 0, the chapter's rule
    # the languages, translated from source_lang to target_lang (codes: docs/data.md); None:
    # from the data's file names, the first column to the second (fra-eng.zip: en to fr)
    source_lang: Optional[str] = None
    target_lang: Optional[str] = None
    # Adam's moment decays and epsilon (MXNet's defaults: the chapter's; the paper's 5.3 uses
    # 0.9, 0.98, 1e-9)
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    clip_per_token: bool = False  # True: clip the gradient of the mean loss per token to norm
    # 1 (fairseq, PyTorch recipes); False: the chapter's clip of the summed loss's gradient
    valid_sentences: int = 500  # validation during training: greedy BLEU on the first N valid pairs
    # the graph path's matrix products: "float32", "bfloat16" (float32 master weights, Adam and
    # checkpoints), or "auto": bfloat16 for the whole corpus's big runs on a CPU with bfloat16
    # units, float32 otherwise (training/precision.py decides, once per run)
    precision: str = "auto"

    @property
    def bugs(self):
        """The book's bugs this config's model and training keep, by switch name (`BUGS`): its
        exact run's (`EXACT_BUGS`: the Transformer's by edition, a seq2seq model's by its name)
        with ``exact_chapter``, none otherwise."""
        if not self.exact_chapter:
            return ()
        return EXACT_BUGS[self.edition if self.architecture == "transformer" else self.architecture]

    @property
    def variants(self):
        """``{field: value}`` of the variants this config asks for (docs/variants.md): the
        `VARIANTS` fields off the value that builds the chapter's model."""
        return {name: getattr(self, name) for name, off in VARIANTS.items()
                if getattr(self, name) != off}

    @property
    def variants_problem(self):
        """Why this config's variants cannot be built (they need the corrected Transformer),
        in one line, or None."""
        if self.variants and (self.exact_chapter or self.architecture != "transformer"):
            return (f"the variants ({', '.join(self.variants)}) need the corrected Transformer, "
                    "not " + ("exact_chapter" if self.exact_chapter
                              else f"the {self.architecture} model"))
        return None

    @property
    def output_width(self):
        """The width of the rows the output layer multiplies: the Transformer's
        ``embedding_size``, a seq2seq model's ``rnn_hidden_size`` (its LSTMs' units)."""
        return self.embedding_size if self.architecture == "transformer" else self.rnn_hidden_size

    @property
    def held_out(self):
        """Whether this config's data goes through the held-out pipeline
        (`data.pipeline.load_data_split`): it holds out valid or test pairs, batches by buckets,
        or tokenizes into subwords (trained on a training part); else the chapter's pipeline of
        its edition."""
        return bool(self.num_valid or self.num_test or self.num_buckets or self.tokenizer != "word")

    @property
    def pair(self):
        """``(source_lang, target_lang)``; a config saved without languages (written before
        they existed, or by `checkpoint.save` of a preset) is the package's English to French."""
        return self.source_lang or "en", self.target_lang or "fr"

    def replace(self, **changes):
        """A copy with some fields changed (the dataclass is frozen)."""
        return dataclasses.replace(self, **changes)

    def with_overrides(self, overrides):
        """A copy with the fields of the mapping `overrides` changed, each value checked against
        its field's type (an int for an int field; a float field takes an int too; None only
        for an Optional field) and the result against `check`. Unknown fields and bad values
        are a one-line ValueError."""
        if not isinstance(overrides, dict):
            raise ValueError("the overrides must be a JSON object of config fields, "
                             f"not {type(overrides).__name__}")
        fields = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"unknown config field{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)} (fields: {', '.join(fields)})")
        changes = {name: _coerce(name, fields[name].type, value)
                   for name, value in overrides.items()}
        return self.replace(**changes).check()

    def check(self):
        """`self` when its values make sense together, else a one-line ValueError."""
        problems = []
        for name in ("embedding_size", "ffn_hidden_size", "num_heads", "num_layers", "batch_size",
                     "num_steps", "num_epochs", "min_freq", "valid_sentences", "rnn_hidden_size"):
            least = 0 if name == "min_freq" or (name == "num_steps" and self.held_out) else 1
            if getattr(self, name) < least:
                problems.append(f"{name} must be at least {least}")
        for name in ("warmup_steps", "num_valid", "num_test", "num_buckets", "vocab_size",
                     "batch_tokens", "length_ratio"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative")
        if self.num_examples is not None and self.num_examples < 0:
            problems.append("num_examples must not be negative (or null: all pairs)")
        for name in ("dropout", "layerdrop", "drophead", "label_smoothing", "beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name} must be in [0, 1)")
        if not self.lr > 0 or not self.epsilon > 0:
            problems.append("lr and epsilon must be positive")
        if self.num_heads >= 1 and self.embedding_size % self.num_heads:
            problems.append(f"embedding_size {self.embedding_size} must be a multiple of "
                            f"num_heads {self.num_heads}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {', '.join(allowed)}")
        if self.norm == "masked_batch" and self.edition == "1.0":  # variants.norm.PAD_ID
            problems.append("norm masked_batch finds <pad> at id 1: not in edition 1.0's vocabularies")
        if self.edition != "0.11" and (self.tokenizer != "word" or self.num_buckets
                                       or self.num_test or (self.num_valid and self.edition != "1.0")):
            problems.append(f"edition {self.edition} is that chapter's word-level run: no "
                            "subwords, buckets or held-out parts of ours")
        if self.architecture != "transformer" and self.edition != "0.11":
            problems.append(f"the {self.architecture} model is the 2019 book's (edition 0.11)")
        if self.variants_problem:
            problems.append(self.variants_problem)
        if self.tie_embeddings == "all" and self.tokenizer != "subword":
            problems.append("tie_embeddings all needs one joint vocabulary: tokenizer subword")
        if self.tokenizer == "subword" and self.vocab_size < 1:
            problems.append("the subword tokenizer needs vocab_size >= 1")
        if problems:
            raise ValueError("bad config: " + "; ".join(problems))
        return self

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        """Inverse of `to_json`; unknown fields are a one-line ValueError, missing ones take
        their defaults (a config.json written before a field existed still loads)."""
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"config has unknown fields: {', '.join(unknown)}")
        data.setdefault("split_by", "pair")  # written before held-out sources: a split of pairs
        data.setdefault("clean", False)  # written before cleaning: the parts of the pairs as read
        data.setdefault("length_ratio", 0.0)  # before it: max(num_steps, source + 10) tokens
        data.setdefault("source_lang", "en")  # written before languages: English to French
        data.setdefault("target_lang", "fr")
        return cls(**data)


ARCHITECTURES = ("transformer", "seq2seq", "attention")  # the chapter's, 8.14's, 9.2's
PRECISIONS = ("auto", "float32", "bfloat16")  # `precision` (training/precision.py)
# the variants' fields (docs/variants.md), each with the value that builds the chapter's model
VARIANTS = {"pre_norm": False, "norm": "layer", "fixnorm": False, "layerdrop": 0.0,
            "drophead": 0.0, "fused_qkv": False, "pos_encoding": "sincos", "tie_embeddings": "none"}
_CHOICES = {"norm": ("layer", "scale", "batch", "masked_batch"), "tokenizer": ("word", "subword"),
            "pos_encoding": ("sincos", "none", "learned", "alibi"),
            "tie_embeddings": ("none", "target", "all"),
            "loss_reduction": ("book", "token"), "split_by": ("folded", "group", "source", "pair"),
            "edition": ("0.11", "0.17", "1.0"), "architecture": ARCHITECTURES,
            "precision": PRECISIONS}
# what a resumed run may change: the schedule and regularisation, not the model or its data
RESUMABLE = ("num_epochs", "lr", "warmup_steps", "dropout", "layerdrop", "drophead",
             "label_smoothing", "beta1", "beta2", "epsilon", "clip_per_token", "valid_sentences",
             "precision")
# what a run fine-tuning a model (train --init-from) may change besides: how its new data is
# read and batched; the model, its vocabularies, tokenizer and languages stay
FINETUNABLE = RESUMABLE + ("batch_size", "batch_tokens", "num_steps", "num_examples", "num_valid",
                           "num_test", "num_buckets", "split_by", "clean", "min_freq", "length_ratio")


def _coerce(name, kind, value):
    """`value` (from JSON, or a string from the command line) as field `name` of type `kind`."""
    optional = typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)
    if optional:
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name} cannot be null")
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    raise ValueError(f"{name} must be {'null or ' if optional else ''}{_KIND_NAMES[kind]}, "
                     f"not {json.dumps(value)}")


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def parse_overrides(items):
    """``["field=value", ...]`` (``train --set``) as a mapping for `with_overrides`: each value
    is read as a JSON literal (``0.1``, ``true``, ``null``, ``"word"``), else kept as a string
    (``tokenizer=word``); Python's ``True``/``False``/``None`` are accepted too. A later item
    wins over an earlier one. A malformed item is a one-line ValueError."""
    words = {"True": True, "False": False, "None": None}
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--set takes field=value, not {item!r}")
        text = text.strip()
        if text in words:
            out[name] = words[text]
            continue
        try:
            out[name] = json.loads(text)
        except ValueError:
            out[name] = text
    return out


def load_overrides(path):
    """The JSON object of config fields in the file `path` (``train --config``); a missing or
    malformed file is a one-line ValueError."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the config file {path}: {e}") from None
    except ValueError as e:
        raise ValueError(f"config file {path} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a JSON object of config fields")
    return data


def resume_overrides(saved, overrides, fine_tune=False):
    """`saved` (the config of a model directory being resumed, or fine-tuned: `fine_tune`) with
    `overrides`; only the fields in `RESUMABLE` (`FINETUNABLE`) may change (the architecture,
    vocabulary and tokenizer stay): another field given a different value is a one-line
    ValueError."""
    cfg = saved.with_overrides(overrides)
    allowed = FINETUNABLE if fine_tune else RESUMABLE
    changed = [f.name for f in dataclasses.fields(cfg)
               if getattr(cfg, f.name) != getattr(saved, f.name) and f.name not in allowed]
    if changed:
        what = ("--init-from keeps the model, its vocabularies and tokenizer" if fine_tune else
                "--resume keeps the model, its vocabulary and data")
        raise ValueError(f"{what}: cannot change {', '.join(changed)} (train a new model in "
                         f"another --out; this run may change {', '.join(allowed)})")
    return cfg


CHAPTER = TransformerConfig()
TINY = TransformerConfig(embedding_size=16, ffn_hidden_size=32, num_heads=2, num_layers=1,
                         batch_size=16, num_epochs=3, num_examples=200)
# All ~167k pairs, valid and test held out by groups of sentences (data.split), the lengths from
# the data, batches of at most 256 pairs and 7,680 padded tokens (256 of 30: the cut these
# presets had). FULL: sentencepiece subwords, cased (docs/data.md), d 128, 15 epochs;
# FULL_WORD: the same on the chapter's lower-cased words with min_freq 10, for comparison. Both
# take the paper's Adam (5.3: beta2 0.98, epsilon 1e-9) and clip the mean loss's gradient per
# token (docs/evaluation.md, "Adam, clipping and initialisation"). HOUR: the one-hour recipe of
# a 2-core CPU, FULL twice as wide, chosen by valid BLEU at 60 minutes of training among the
# candidates of docs/evaluation.md, "The one-hour recipe"; 4 epochs averaged over the last two
# (--average-last 2) is the 20-minute one
FULL_WORD = TransformerConfig(
    embedding_size=128, ffn_hidden_size=512, num_heads=4, num_layers=2, dropout=0.1,
    batch_size=256, num_steps=0, batch_tokens=7680, lr=0.002, num_epochs=15, num_examples=None,
    min_freq=10,
    label_smoothing=0.1, warmup_steps=400, num_valid=2000, num_test=2000, num_buckets=10,
    loss_reduction="token", beta2=0.98, epsilon=1e-9, clip_per_token=True)
FULL = FULL_WORD.replace(tokenizer="subword", vocab_size=4000, min_freq=0)
HOUR = FULL.replace(embedding_size=256, ffn_hidden_size=1024, num_epochs=11)
# The paper's base model (Vaswani et al. 2017, Table 3), for a GPU
_BASE = dict(embedding_size=512, ffn_hidden_size=2048, num_heads=8, num_layers=6, batch_size=256,
             lr=0.0007, num_epochs=30, warmup_steps=4000)
FULL_GPU = FULL.replace(vocab_size=8000, **_BASE)
FULL_WORD_GPU = FULL_WORD.replace(min_freq=3, **_BASE)
# Each later edition of the chapter as its book runs it (docs/editions.md). 1.0: d2l's MTFraEng
# trains on the first 512 pairs (num_examples) and validates on the next 128 + 1 (num_valid); its
# loss is the mean over every position, padding included ("mean"), corrected to "token"
EDITIONS = {
    "0.11": CHAPTER,
    "0.17": CHAPTER.replace(edition="0.17", dropout=0.1, num_epochs=200, num_examples=600,
                            min_freq=2),
    "1.0": CHAPTER.replace(edition="1.0", embedding_size=256, dropout=0.2, batch_size=128,
                           num_steps=9, lr=0.001, num_epochs=30, num_examples=512, num_valid=128,
                           min_freq=2, loss_reduction="token"),
}

# The book's bugs, each by the switch that keeps it (docs/chapter.md, docs/editions.md), and which
# edition's exact run keeps which. The default model and training keep none; a block takes its
# switches at construction (`build.build_model`), nothing is flipped after.
BUGS = {
    "decoder_vocab_from_source": "bug 1: TransformerDecoder(len(src_vocab), ...)",
    "tile_valid_lengths": "bug 2: np.tile of the valid lengths where heads are example-major",
    "restart_positions": "bug 3: every prediction step adds position 0",
    "mask_in_training_only": "the decoder's causal mask only under autograd.is_training()",
    "loss_over_padding": "d2l 1.0's loss: the mean over every position, <pad> included",
    "state_after_padding": "8.14 (a, b): the LSTM encoder's state (the decoder's first) after "
                           "the padding steps",
    "tanh_before_sum": "9.1 (c): MLPAttention's tanh inside each projection: the query is ignored",
}
EXACT_BUGS = {  # the Transformer's exact runs by edition, the 2019 seq2seq models' by name
    "0.11": ("decoder_vocab_from_source", "tile_valid_lengths", "restart_positions",
             "mask_in_training_only"),
    "0.17": ("restart_positions", "mask_in_training_only"),
    "1.0": ("restart_positions", "mask_in_training_only", "loss_over_padding"),
    "seq2seq": ("state_after_padding",),
    "attention": ("state_after_padding", "tanh_before_sum"),
}

# The 2019 book's earlier models in their sections' settings (8.14: 300 epochs, 9.2: 200; embed
# 32, hidden 32, 2 layers, dropout 0, batch 64, 10 steps, lr 0.005, as the chapter); on the
# other presets their LSTMs are half the Transformer's FFN wide, as 32 is the chapter's 64's half
SECTIONS = {"seq2seq": CHAPTER.replace(architecture="seq2seq", num_epochs=300),
            "attention": CHAPTER.replace(architecture="attention", num_epochs=200)}


def preset_config(preset, edition="0.11", architecture="transformer"):
    """The config ``train --preset P --edition E --architecture A`` starts from: an edition is a
    chapter run, so a later edition takes only the chapter preset and the Transformer
    (ValueError, one line, otherwise); a seq2seq model's chapter preset is its section's
    (`SECTIONS`), another preset gets LSTMs of ``ffn_hidden_size // 2`` units."""
    if edition != "0.11" and (preset != "chapter" or architecture != "transformer"):
        raise ValueError(f"--edition {edition} is that edition's chapter run: it takes no "
                         + (f"--preset {preset}" if preset != "chapter"
                            else f"--architecture {architecture}"))
    if architecture == "transformer":
        return EDITIONS[edition] if preset == "chapter" else PRESETS[preset]
    if preset == "chapter":
        return SECTIONS[architecture]
    base = PRESETS[preset]
    return base.replace(architecture=architecture, rnn_hidden_size=base.ffn_hidden_size // 2)


PRESETS = {"chapter": CHAPTER, "tiny": TINY, "full": FULL, "full_word": FULL_WORD, "hour": HOUR,
           "full_gpu": FULL_GPU, "full_word_gpu": FULL_WORD_GPU}
