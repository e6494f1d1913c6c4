"""Scores: corpus BLEU and chrF as the field reports them (sacreBLEU), and d2l's per-sentence
`bleu` (d2l 1.0, 10.7.6) for the chapter's sentences.

Corpus scores follow sacreBLEU's convention (Post 2018, "A Call for Clarity in Reporting BLEU
Scores"): detokenized hypotheses against untokenized references, sacreBLEU's default ``13a``
tokenizer, and the signature printed beside the score, so that a figure can be compared with
others. Word-level models lower-case, so they are scored case-insensitively (``case:lc`` in
the signature); subword models are cased. See docs/evaluation.md.
"""

import collections
import math
import os
import time

from sacrebleu.metrics import BLEU, CHRF

from . import checkpoint
from .data import (
    DataError,
    Pairs,
    WordTokenizer,
    evaluation_sets,
    make_parts,
    overlaps,
    read_heldout,
    read_lines,
    scored,
    trained_part,
)
from .inference.engines import DEFAULT_ENGINE, open_engine
from .inference.limits import chapter_only
from .inference.stream import decode_all
from .inference.translator import ALPHA, BEAM_SIZE

# the sentences whose BLEU d2l prints (`book.REFERENCES`) as fra.txt spells them (the input of
# a cased, subword model)
MAX_SENTENCES = 2000  # the pairs of each held-out set `evaluate_model` scores unless told
BLEU_PAIRS_TEXT = [("Go.", "Va !"), ("I lost.", "J'ai perdu."), ("He's calm.", "Il est calme."),
                   ("I'm home.", "Je suis chez moi.")]


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


def _check(hypotheses, references):
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("nothing to score: no hypotheses")


def _streams(references):
    """sacreBLEU's reference streams from one entry per hypothesis: a string (one reference) or
    a list of strings (all of its references). Stream j holds each hypothesis's j-th reference,
    None where it has fewer: sacreBLEU's way to a variable number (``nrefs:var``)."""
    per = [[r] if isinstance(r, str) else list(r) for r in references]
    if any(not refs for refs in per):
        raise ValueError("a hypothesis has no reference")
    width = max(len(refs) for refs in per)
    return [[refs[j] if j < len(refs) else None for refs in per] for j in range(width)]


def group_references(sources, references):
    """``{source: [its references]}``: each source once, in the order of its first pair, with
    the references of all its pairs (in pair order). For multi-reference scoring: a held-out
    part of ``fra.txt`` gives one English sentence up to 18 French translations."""
    grouped = {}
    for source, reference in zip(sources, references):
        grouped.setdefault(source, []).append(reference)
    return grouped


def corpus_bleu(hypotheses, references, lowercase=False):
    """Corpus BLEU (0-100) of detokenized hypothesis strings against their references (a
    string, or a list of strings, each): sacreBLEU's default ``13a`` tokenizer. Returns
    sacreBLEU's BLEUScore."""
    _check(hypotheses, references)
    return BLEU(lowercase=lowercase).corpus_score(list(hypotheses), _streams(references))


def score(hypotheses, references, lowercase=False):
    """Corpus BLEU and chrF of detokenized hypotheses, as a dict: ``bleu``, ``bleu_signature``,
    ``chrf``, ``chrf_signature``, ``sentences`` and BLEU's parts (``precisions``, ``bp``,
    ``sys_len``, ``ref_len``). A reference is a string, or a list of strings for a hypothesis
    with several (``nrefs:N`` or ``nrefs:var`` in the signatures). ``lowercase``:
    case-insensitive (``case:lc`` in both signatures), for models that only write lower case."""
    _check(hypotheses, references)
    hyps, refs = list(hypotheses), _streams(references)
    bleu_metric, chrf_metric = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase)
    b, c = bleu_metric.corpus_score(hyps, refs), chrf_metric.corpus_score(hyps, refs)
    return {"bleu": b.score, "bleu_signature": str(bleu_metric.get_signature()),
            "chrf": c.score, "chrf_signature": str(chrf_metric.get_signature()),
            "sentences": len(hyps), "precisions": list(b.precisions), "bp": b.bp,
            "sys_len": b.sys_len, "ref_len": b.ref_len}


def score_all_references(hypotheses, sources, pairs, lowercase=False):
    """`score` with each source once, against every reference `pairs` has for it.

    hypotheses: one per source in `sources` (a source may repeat: its first hypothesis counts);
    pairs: the whole set (``.source``, ``.target``), where the other references are. The
    per-pair score (`score` of each pair against its own reference, ``nrefs:1``) counts a
    source with six translations six times, and a correct translation that matches another
    of its references as wrong; this one does neither (``nrefs:var``). Adds ``most_references``.
    """
    _check(hypotheses, sources)
    grouped = group_references(pairs.source, pairs.target)
    first = {}  # each source: the index of its first hypothesis
    for i, source in enumerate(sources):
        first.setdefault(source, i)
    missing = [s for s in first if s not in grouped]
    if missing:
        raise ValueError(f"{len(missing)} sources are not in the set, e.g. {missing[0]!r}")
    result = score([hypotheses[i] for i in first.values()], [grouped[s] for s in first],
                   lowercase)
    result["most_references"] = max(len(grouped[s]) for s in first)
    return result


def format_score(result):
    """``BLEU 31.63  chrF 55.20``."""
    return f"BLEU {result['bleu']:5.2f}  chrF {result['chrf']:5.2f}"


def format_files_report(result):
    """What ``d2l-transformer evaluate --hyp FILE --ref FILE`` prints for `score_files`."""
    return "\n".join([f"{format_score(result)}  ({result['sentences']} sentences)",
                      f"BLEU signature: {result['bleu_signature']}",
                      f"chrF signature: {result['chrf_signature']}"])


def score_files(hyp_path, ref_paths, lowercase=False):
    """`score` of a file of hypotheses against one or more files of references, one sentence a
    line (as ``sacrebleu REF [REF ...] < HYP`` scores them; with several files, an empty line is
    no reference for that sentence). Errors are a one-line ValueError."""
    ref_paths = [ref_paths] if isinstance(ref_paths, str) else list(ref_paths)
    hyps = read_lines(hyp_path, what="hypothesis file")
    streams = [read_lines(path, what="reference file") for path in ref_paths]
    for path, refs in zip(ref_paths, streams):
        if len(hyps) != len(refs):
            raise ValueError(f"{hyp_path} has {len(hyps)} lines but {path} has {len(refs)}")
    if len(streams) == 1:
        return score(hyps, streams[0], lowercase)
    per_line = [[r for r in refs if r] for refs in zip(*streams)]
    empty = next((i for i, refs in enumerate(per_line) if not refs), None)
    if empty is not None:
        raise ValueError(f"line {empty + 1} has no reference in any of the reference files")
    return score(hyps, per_line, lowercase)


# ---------------------------------------------------------------------------------- a model
def translate_texts(engine, texts, beam=1, alpha=ALPHA):
    """Translations (text) of sentences (text) by `engine` (`inference.engines`), between its
    tokenizer's ``encode`` and ``decode``. A sentence longer than the model's positions, which
    no model can encode, is translated as nothing (an empty line, scored as such): see
    `untranslatable`."""
    return _translate(engine, texts, beam, alpha)[0]


def _translate(engine, texts, beam, alpha):
    """``(translations, how many were too long to translate)``: `translate_texts`, in chunks
    with a progress bar on a terminal's stderr (`stream.decode_all`)."""
    tok = engine.tokenizer
    tokens = [tok.encode(t) for t in texts]
    fits = [0 < len(t) <= engine.max_positions for t in tokens]
    hyps = iter(decode_all(engine, [t for t, ok in zip(tokens, fits) if ok], beam, alpha,
                           desc="greedy" if beam == 1 else f"beam {beam}"))
    return [tok.decode(list(next(hyps)[0].tokens)) if ok else "" for ok in fits], \
        fits.count(False)


def translate_and_score(engine, sources, references, beam=1, alpha=ALPHA, *, lowercase=False):
    """Translate the texts `sources` with `engine` (`inference.engines`) and score them against
    `references` (`score`): ``(result, translations)``; ``result["seconds"]`` is the time
    taken, ``result["untranslatable"]`` the sources too long for the model (`translate_texts`:
    scored as empty translations). The one pipeline of `evaluate_model` and of the validation during training
    (`training.validation`)."""
    tic = time.time()
    hyps, refused = _translate(engine, sources, beam, alpha)
    result = score([engine.tokenizer.detokenize(h) for h in hyps], references, lowercase)
    result.update(seconds=round(time.time() - tic, 1), untranslatable=refused)
    return result, hyps


def evaluate_model(model_dir, *, engine=DEFAULT_ENGINE, ctx=None, beam=BEAM_SIZE, alpha=ALPHA,
                   data_path=None, max_sentences=None, lowercase=False, examples=0, no_unk=False,
                   engine_threads=0, test=None, compute_type=None, heldout=None):
    """Score the model directory `model_dir` (what ``d2l-transformer evaluate --model`` prints,
    `format_report`) translated by `engine` (``"mxnet"`` or ``"ctranslate2"``,
    `inference.engines`; ``"auto"``: `engines.choose_engine`'s): for an English-to-French
    model the chapter's four sentences with d2l's `bleu`, then corpus BLEU and chrF (`score`,
    and `score_all_references`) of each evaluation set (its first `max_sentences` pairs; 0:
    all; None: all of a ``test`` set, the first `MAX_SENTENCES` of a held-out one, the report's
    ``capped`` saying so), greedy and with a beam of `beam` (greedy
    only for an exact-chapter model). The sets: ``test``, a user's ``(source file, [reference
    files])`` (`read_test_set`), else `data.evaluation_sets` of the data the model was trained on
    (`checkpoint.trained_data`: `data_path`, else what its directory records, with the dev and
    test sets it was given): its valid and test parts, or the chapter's training and held-out
    pairs. Each set's overlap with the training part is counted, both sides, and where a pair
    was seen the pairs unseen on both sides are scored too (`_score_set`). Returns the report
    (a JSON-able dict); ``examples``: keep the first N translations of each set;
    ``engine_threads``, ``compute_type``: CTranslate2's (`open_engine`); ``heldout``: ``{"valid":
    [two files], "test": [two files]}``, the new place of the dev and test files the model was
    trained with (each checked against its recorded SHA-256). Errors are one line
    (CheckpointError, DataError, EngineError, ExactChapterError, ExportError)."""
    translator = open_engine(model_dir, engine, ctx, no_unk=no_unk, engine_threads=engine_threads,
                             compute_type=compute_type)
    cfg, tok = translator.cfg, translator.tokenizer
    lowercase = tok.lowercase or lowercase
    decoders = [("greedy", 1)] + ([] if chapter_only(cfg) else [(f"beam {beam}", beam)])
    if max_sentences is None and test is None:
        max_sentences, report_cap = MAX_SENTENCES, MAX_SENTENCES
    else:
        report_cap = None
    report = {"model": model_dir, "engine": translator.name, "engine_choice": translator.choice,
              "compute_type": translator.compute_type, "engine_threads": translator.intra_threads,
              "preset": translator.summary.get("preset"), "tokenizer": tok.kind,
              "source_lang": cfg.pair[0], "target_lang": cfg.pair[1],
              "lowercase": lowercase, "chapter_sentences": [], "sets": []}
    if cfg.pair == ("en", "fr"):  # the book's sentences are English, their references French
        report["chapter_sentences"] = _chapter_sentences(translator, decoders, alpha)
    if test is not None:
        train = _training_part(model_dir, cfg, data_path, heldout, translator)
        sets, note = [read_test_set(*test, train=train, max_sentences=max_sentences)], None
    else:
        data = checkpoint.trained_data(model_dir, data_path)
        sets, note = evaluation_sets(cfg, translator.src_vocab, translator.tgt_vocab, data,
                                     **checkpoint.trained_heldout(model_dir, heldout),
                                     trained=_trained(translator, model_dir), max_sentences=max_sentences)
    if note:
        report["note"] = note
    for name, pairs, overlap in sets:
        report["sets"].append(_score_set(translator, name, pairs, overlap, decoders, alpha,
                                         max_sentences or None, lowercase, examples,
                                         test is None))
    if report_cap and any(e["pairs"] > e["scored"] for e in report["sets"]):
        report["capped"] = report_cap
    return report


def _chapter_sentences(translator, decoders, alpha):
    """The chapter's four sentences (`BLEU_PAIRS_TEXT`) translated, each decoder, with d2l's
    `bleu` on d2l's lower-cased tokens."""
    words = WordTokenizer()  # d2l's bleu compares d2l's lower-cased tokens

    def d2l_tokens(text):
        return " ".join(words.encode(text))
    out = []
    for name, k in decoders:
        outs = translate_texts(translator, [e for e, _ in BLEU_PAIRS_TEXT], k, alpha)
        for (eng, fra), hyp in zip(BLEU_PAIRS_TEXT, outs):
            out.append({"source": eng, "reference": fra, "decoder": name, "translation": hyp,
                        "d2l_bleu": bleu(d2l_tokens(hyp), d2l_tokens(fra), k=2)})
    return out


def _score_set(translator, name, pairs, overlap, decoders, alpha, max_sentences, lowercase,
               examples, grouped):
    """One set's entry of the report: each decoder's scores of its first `max_sentences`
    pairs (None: all); ``grouped``: also each source once against all the set's references for
    it (`score_all_references`: a held-out part of a corpus with several translations a
    source). `overlap` (`data.Overlap`, or None: not counted): the sources and references seen
    in training; where there are any, ``unseen`` scores the pairs unseen on both sides too."""
    src, refs = pairs.source[:max_sentences], pairs.target[:max_sentences]
    entry = {"name": name, "pairs": len(pairs.source), "scored": len(src),
             "sources_seen_in_training": overlap and overlap.sources,
             "references_seen_in_training": overlap and overlap.references, "decoders": {}}
    unseen = [i for i in (overlap.unseen if overlap else []) if i < len(src)]
    if overlap and (overlap.sources or overlap.references):
        entry["unseen"] = {"pairs": len(unseen), "decoders": {}}
    for decoder, k in decoders if src else ():
        result, hyps = translate_and_score(translator, src, refs, k, alpha, lowercase=lowercase)
        outs = [translator.tokenizer.detokenize(h) for h in hyps]
        if grouped:
            result["all_references"] = score_all_references(outs, src, pairs, lowercase)
        entry["decoders"][decoder] = result
        if "unseen" in entry and unseen:
            entry["unseen"]["decoders"][decoder] = score(
                [outs[i] for i in unseen], [refs[i] for i in unseen], lowercase)
    if examples and src:  # the last decoder's (the beam's)
        entry["examples"] = [{"source": s, "reference": r, "translation": h}
                             for s, r, h in list(zip(src, refs, hyps))[:examples]]
    return entry


def read_test_set(source_path, ref_paths, train=None, max_sentences=None):
    """A user's test set as an evaluation set ``(name, Pairs, Overlap or None)``: the source
    file and one or more reference files, one sentence a line (`data.read_lines`, as sacreBLEU
    reads them; with several files each line has that many references). ``train``: the
    training part (`Pairs`), to count what the model was trained on (`data.overlaps`, over the
    first `max_sentences` pairs, the ones scored; None: not counted). A file that cannot be
    read, line counts that differ, or an empty source line are a one-line DataError."""
    sources, refs, _ = read_heldout([source_path, ref_paths[0]], None, None, "--src/--ref")
    for path in ref_paths[1:]:
        more = read_lines(path, what="reference file")
        if len(more) != len(sources):
            raise DataError(f"{source_path} has {len(sources)} lines but {path} has {len(more)}")
        refs = [(r if isinstance(r, list) else [r]) + [m] for r, m in zip(refs, more)]
    pairs = Pairs(sources, refs)
    return os.path.basename(source_path), pairs, \
        None if train is None else overlaps(scored(pairs, max_sentences), train)


def _trained(translator, model_dir):
    """The pairs of a training part the model behind `translator` was trained on: those its
    run's length filters kept (`data.trained_part`; every pair for a run that recorded none)."""
    cfg = translator.cfg
    if not (checkpoint.load_summary(model_dir).get("data") or {}).get("lengths"):
        return lambda train: train  # a run before the length filters: every pair (cut or not)
    vocabs = (translator.src_vocab, translator.tgt_vocab)
    return lambda train: trained_part(train, translator.tokenizer, cfg.num_steps, cfg.clean,
                                      vocabs)


def _training_part(model_dir, cfg, data_path, heldout, translator):
    """The pairs the model was trained on (`Pairs`, `_trained`), or None when its data is not
    at hand (a test set is then scored without counting what training saw)."""
    try:
        data = checkpoint.trained_data(model_dir, data_path)
        train = make_parts(data, cfg.num_examples, cfg.num_valid, cfg.num_test, cfg.split_by,
                           clean=cfg.clean, **checkpoint.trained_heldout(model_dir, heldout))[0].train
        return _trained(translator, model_dir)(train)
    except DataError:
        return None
