"""Text to batches: the chapter's pipeline (`text`), batching (`batches`), held-out splits
(`split`)."""

from .batches import ArrayBatches, load_array, load_bucketed, shard
from .split import SPLIT_SEED, heldout_nmt, load_data_split, split_pairs
from .text import (
    DATA_ENV,
    RESERVED_TOKENS,
    DataError,
    Vocab,
    build_array,
    count_corpus,
    default_data_path,
    load_data_nmt,
    preprocess_nmt,
    read_data_nmt,
    tokenize_nmt,
    tokenize_nmt_lines,
    truncate_pad,
)
