"""The literature's variants of the chapter's blocks (docs/variants.md): pre-norm, ScaleNorm,
FixNorm, LayerDrop, DropHead and fused QKV (`blocks`), batch norms (`norm`), other positional
encodings (`position`), and the rule that keeps the chapter's Gluon names (`names`)."""

from .blocks import (
    NORMS,
    DropHeadAttention,
    FixNormEmbedding,
    ScaleNorm,
    VariantAddNorm,
    VariantDecoderBlock,
    VariantEncoderBlock,
    VariantMultiHeadAttention,
    VariantTransformerDecoder,
    VariantTransformerEncoder,
    drophead_schedule,
    every_other_layers,
    fuse_qkv_params,
    make_norm,
)
