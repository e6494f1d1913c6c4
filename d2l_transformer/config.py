"""Hyperparameters: one frozen dataclass, the chapter's values as the `CHAPTER` preset."""

import dataclasses
import json
from typing import Optional


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Model, data and training sizes. Defaults are the chapter's (9.3.7)."""

    embedding_size: int = 32
    ffn_hidden_size: int = 64  # the chapter's `num_hiddens`
    num_heads: int = 4
    num_layers: int = 2
    dropout: float = 0.0
    batch_size: int = 64
    num_steps: int = 10
    lr: float = 0.005
    num_epochs: int = 100
    num_examples: Optional[int] = 1000  # d2l keeps lines 0..num_examples: 1001 pairs; None: all
    exact_chapter: bool = False  # True: the book's three bugs, bit for bit
    # the literature's variants (defaults = the chapter); read only by model.build_model
    pre_norm: bool = False
    norm: str = "layer"  # "layer" or "scale" (ScaleNorm)
    fixnorm: bool = False
    layerdrop: float = 0.0
    drophead: float = 0.0
    fused_qkv: bool = False
    # beyond the chapter (the `full` preset); the defaults keep the chapter's run unchanged
    min_freq: int = 3  # d2l's vocabulary threshold
    label_smoothing: float = 0.0  # paper 5.4: 0.1
    warmup_steps: int = 0  # > 0: linear warmup to `lr`, then lr * sqrt(warmup / step) (paper 5.3)
    num_valid: int = 0  # held-out pairs (a fixed-seed random split of the kept pairs)
    num_test: int = 0
    num_buckets: int = 0  # > 0: batches of similar lengths, padded to their bucket (BucketBatches)
    tokenizer: str = "word"  # "word": d2l's lower-cased words; "subword": sentencepiece, cased
    vocab_size: int = 0  # "subword": pieces per language (one sentencepiece model each)
    loss_reduction: str = "book"  # "book": each sentence's loss averaged over the padded width
    # (d2l; the book's loss); "token": summed over the real tokens, so the gradient and the
    # reported cross-entropy do not depend on how a batch was padded (MaskedSoftmaxCELoss)
    split_by: str = "source"  # num_valid/num_test hold out "source" sentences (all their pairs)
    # or random "pair"s (how model directories written before "source" existed were split)

    def replace(self, **changes):
        """A copy with some fields changed (the dataclass is frozen)."""
        return dataclasses.replace(self, **changes)

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
        return cls(**data)


CHAPTER = TransformerConfig()
TINY = TransformerConfig(embedding_size=16, ffn_hidden_size=32, num_heads=2, num_layers=1,
                         batch_size=16, num_epochs=3, num_examples=200)
# All ~167k pairs, sized for about an hour on a 2-core CPU (see README), valid and test held
# out by source sentence (data.split). FULL: sentencepiece subwords, cased (docs/data.md);
# FULL_WORD: the chapter's lower-cased words with min_freq 10, for comparison
FULL_WORD = TransformerConfig(embedding_size=128, ffn_hidden_size=512, num_heads=4, num_layers=2,
                              dropout=0.1, batch_size=256, num_steps=30, lr=0.002, num_epochs=3,
                              num_examples=None, min_freq=10, label_smoothing=0.1,
                              warmup_steps=400, num_valid=2000, num_test=2000, num_buckets=10,
                              loss_reduction="token")
FULL = FULL_WORD.replace(tokenizer="subword", vocab_size=4000, min_freq=0)
# The paper's base model (Vaswani et al. 2017, Table 3), for a GPU
_BASE = dict(embedding_size=512, ffn_hidden_size=2048, num_heads=8, num_layers=6, batch_size=256,
             lr=0.0007, num_epochs=30, warmup_steps=4000)
FULL_GPU = FULL.replace(vocab_size=8000, **_BASE)
FULL_WORD_GPU = FULL_WORD.replace(min_freq=3, **_BASE)
PRESETS = {"chapter": CHAPTER, "tiny": TINY, "full": FULL, "full_word": FULL_WORD,
           "full_gpu": FULL_GPU, "full_word_gpu": FULL_WORD_GPU}
