"""Hyperparameters: one frozen dataclass, the chapter's values as the `CHAPTER` preset."""

import dataclasses
import json


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
    num_examples: int = 1000  # d2l keeps lines 0..num_examples: 1001 pairs
    exact_chapter: bool = False  # True: the book's three bugs, bit for bit
    # issue 7 variants (defaults = the chapter); read only by train.build_model
    pre_norm: bool = False
    norm: str = "layer"  # "layer" or "scale" (ScaleNorm)
    fixnorm: bool = False
    layerdrop: float = 0.0
    drophead: float = 0.0
    fused_qkv: bool = False

    def replace(self, **changes):
        """A copy with some fields changed (the dataclass is frozen)."""
        return dataclasses.replace(self, **changes)

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        """Inverse of `to_json`; unknown or missing fields are a one-line ValueError."""
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"config has unknown fields: {', '.join(unknown)}")
        return cls(**data)


CHAPTER = TransformerConfig()
TINY = TransformerConfig(embedding_size=16, ffn_hidden_size=32, num_heads=2, num_layers=1,
                         batch_size=16, num_epochs=3, num_examples=200)
PRESETS = {"chapter": CHAPTER, "tiny": TINY}
