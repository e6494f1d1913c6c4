"""Text to batches: where pairs come from (`sources`), the chapter's pipeline (`text`),
tokenizers (`tokenize`), batching (`batches`), held-out splits by source sentence (`split`), and
which of them a config's data goes through (`pipeline.load_data`)."""

from .batches import ArrayBatches, BucketBatches, bucket_widths, load_array, load_bucketed, shard
from .pipeline import load_data
from .sources import (
    DATA_ENV,
    DataError,
    DataSource,
    default_data_path,
    language_name,
    open_data,
)
from .split import (
    SPLIT_SEED,
    Pairs,
    Split,
    SplitData,
    clean_text,
    evaluation_sets,
    heldout_nmt,
    load_data_split,
    make_tokenizer,
    normalize_source,
    read_pairs,
    source_overlap,
    split_by_pair,
    split_corpus,
    split_pairs,
)
from .text import (
    RESERVED_TOKENS,
    Vocab,
    build_array,
    count_corpus,
    fra_pairs,
    load_data_mt_fra_eng,
    load_data_nmt,
    plain_spaces,
    preprocess_fast,
    preprocess_nmt,
    punctuation,
    read_data_nmt,
    tokenize_nmt,
    tokenize_nmt_lines,
    truncate_pad,
)
from .tokenize import (
    SPM_SRC,
    SPM_TGT,
    SubwordTokenizer,
    TokenizerError,
    WordTokenizer,
    detokenize_words,
    load_tokenizer,
    words_problem,
)
