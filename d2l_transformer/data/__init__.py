"""Text to batches: where pairs come from (`sources`), a corpus read once and cleaned (`corpus`),
the chapter's pipeline (`text`), held-out parts by groups of sentences (`split`), tokenizers
(`tokenize`), the lengths a training pair may have (`lengths`), batching (`batches`), and which
of them a config's data goes through (`pipeline.load_data`)."""

from .batches import ArrayBatches, BucketBatches, bucket_widths, load_array, load_bucketed, shard
from .corpus import (
    MAX_CHARS,
    Corpus,
    clean_pairs,
    clean_text,
    format_counts,
    plain_spaces,
    read_corpus,
    read_heldout,
)
from .keys import fold_sentence, normalize_sentence, strict_sentence
from .languages import language_code, language_name
from .lengths import format_lengths, keep_pairs, length_limit, length_ratio
from .pipeline import Data, SplitData, load_data, load_data_split, make_tokenizer, trained_part
from .sources import (
    DATA_ENV,
    DataError,
    DataSource,
    default_data_path,
    fingerprint,
    open_corpora,
    open_data,
    read_lines,
)
from .split import (
    SPLIT_SEED,
    SPLITS,
    Overlap,
    Pairs,
    Split,
    evaluation_sets,
    group_split,
    heldout_nmt,
    make_parts,
    overlap,
    overlaps,
    read_pairs,
    scored,
    split_by_group,
    split_by_pair,
    split_by_source,
    split_corpus,
)
from .text import (
    RESERVED_TOKENS,
    Vocab,
    build_array,
    count_corpus,
    load_data_mt_fra_eng,
    load_data_nmt,
    preprocess_fast,
    preprocess_nmt,
    punctuation,
    read_data_nmt,
    tab_pairs,
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
