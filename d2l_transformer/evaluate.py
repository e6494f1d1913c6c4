"""BLEU: d2l's per-sentence `bleu` (d2l 1.0, 10.7.6) and corpus BLEU through sacrebleu.

Our sentences are already tokenized by `preprocess_nmt` (lower-case, a space before , . !),
so corpus BLEU uses ``tokenize="none"``: sacrebleu splits on spaces, exactly the tokens `bleu`
and the model see. (``"13a"`` would re-split words such as ``l'ai`` and inflate the score.)
"""

import collections
import math

import sacrebleu

# d2l 1.0 (10.7.6) translates these with the trained seq2seq model and prints their BLEU
BLEU_PAIRS = [("go .", "va !"), ("i lost .", "j'ai perdu ."), ("he's calm .", "il est calme ."),
              ("i'm home .", "je suis chez moi .")]
SACREBLEU_TOKENIZE = "none"


def bleu(pred_seq, label_seq, k):
    """Compute the BLEU (d2l): brevity penalty times the n-gram precisions p_n^(1/2^n), n <= k.

    pred_seq, label_seq: space-separated token strings. 1.0 for a perfect match, 0.0 when a
    precision is 0. d2l-en ``chapter_recurrent-modern/seq2seq.md``, kept as written (n-grams
    keyed by ``"".join``, as d2l does), with one addition: a prediction shorter than n tokens
    has no n-grams and scores 0 where d2l divides by zero.
    """
    pred_tokens, label_tokens = pred_seq.split(" "), label_seq.split(" ")
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    score = math.exp(min(0, 1 - len_label / len_pred))
    for n in range(1, k + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs["".join(label_tokens[i: i + n])] += 1
        for i in range(len_pred - n + 1):
            if label_subs["".join(pred_tokens[i: i + n])] > 0:
                num_matches += 1
                label_subs["".join(pred_tokens[i: i + n])] -= 1
        if len_pred - n + 1 <= 0:
            return 0.0
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def corpus_bleu(hypotheses, references):
    """Corpus BLEU (0-100) of hypothesis strings against one reference string each (sacrebleu,
    ``tokenize="none"``: the text is already tokenized). Returns sacrebleu's BLEUScore."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    # force=True: the text is tokenized on purpose (else sacrebleu warns about "tokenized periods")
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=SACREBLEU_TOKENIZE,
                                 force=True)
