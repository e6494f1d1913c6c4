"""Translating many sentences as a toolkit does: in chunks, in order, with bounded memory and a
progress bar on stderr when stderr is a terminal (tqdm); the best translation, the n best or a
sample of each (`decode`); and their output formats (`output_lines`).

Output formats (``d2l-transformer translate --format``; docs/usage.md):

* ``text``: one line per input line, the best (or sampled) translation; an empty line where the
  input was refused.
* ``tsv``: one line per hypothesis, ``index<TAB>rank<TAB>score<TAB>log_prob<TAB>translation``:
  the input's index (0 for the first sentence), the hypothesis' rank (1: the best), the score
  beam search ranks by (GNMT's length-penalised ``log P / ((5 + |Y|) / 6) ** alpha``), the
  plain ``log P(Y | X)`` (the sum over its tokens and ``<eos>``), and the text (the two scores
  empty for a model only the chapter's loop decodes); a refused input has no line.
* ``jsonl``: the same, one JSON object per hypothesis: ``index``, ``rank``, ``score``,
  ``log_prob``, ``translation``.
"""

import itertools
import json
import sys

from .limits import input_sentences, screen_inputs

FORMATS = ("text", "tsv", "jsonl")
CHUNK = 1000  # sentences read, translated and written at a time


def progress(total=None, unit="sentences", desc=None):
    """A tqdm bar on stderr, shown only when stderr is a terminal (update it by sentences)."""
    from tqdm import tqdm
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=False,
                disable=not sys.stderr.isatty())


def decode(engine, tokens, beam=1, alpha=None, *, n_best=None, sampling=None):
    """Each token list's hypotheses (a list, best first) by `engine`: the `n_best` best of a
    beam of `beam` (None: the best only), or with ``sampling=(topk, temperature, seed)`` one
    sample each (`engine.sample`)."""
    if sampling is not None:
        return [[h] for h in engine.sample(tokens, *sampling)]
    kwargs = {} if alpha is None else {"alpha": alpha}
    if n_best is None:
        return [[h] for h in engine.translate(tokens, beam, **kwargs)]
    return engine.translate(tokens, max(beam, n_best), n_best=n_best, **kwargs)


def decode_all(engine, tokens, beam=1, alpha=None, *, chunk=CHUNK // 2, desc=None, **options):
    """`decode` of a list of token lists, `chunk` at a time with a `progress` bar."""
    out = []
    with progress(len(tokens), desc=desc) as bar:
        for start in range(0, len(tokens), chunk):
            out += decode(engine, tokens[start:start + chunk], beam, alpha, **options)
            bar.update(min(chunk, len(tokens) - start))
    return out


def output_lines(index, hyps, tokenizer, fmt="text"):
    """The output lines of input `index` (0-based) whose hypotheses are `hyps` (None: refused)
    in the format `fmt` (`FORMATS`)."""
    if fmt == "text":
        return [tokenizer.decode(list(hyps[0].tokens)) if hyps else ""]
    lines = []
    for rank, h in enumerate(hyps or (), 1):
        text = tokenizer.decode(list(h.tokens))
        score = None if h.score is None else round(float(h.score), 4)
        log_prob = None if h.log_prob is None else round(float(h.log_prob), 4)
        if fmt == "jsonl":
            lines.append(json.dumps({"index": index, "rank": rank, "score": score,
                                     "log_prob": log_prob, "translation": text},
                                    ensure_ascii=False))
        else:
            shown = ["" if x is None else x for x in (score, log_prob)]  # None: the chapter's loop
            lines.append(f"{index}\t{rank}\t{shown[0]}\t{shown[1]}\t{text}")
    return lines


def input_chunks(arguments, stream, size=CHUNK):
    """`limits.input_sentences` of the command line's `arguments`, or of the binary `stream`'s
    lines read `size` at a time (a long file is never held whole): lists of ``(label, text or
    None, SentenceError or None)``, labelled ``line N`` through the whole stream."""
    if arguments or stream is None:
        yield input_sentences(arguments, stream)
        return
    import io
    lines, done = iter(stream), 0
    while True:
        raw = list(itertools.islice(lines, size))
        if not raw:
            return
        chunk = input_sentences(None, io.BytesIO(b"".join(raw)))
        yield [(f"line {done + i}", text, error) for i, (_, text, error) in enumerate(chunk, 1)]
        done += len(chunk)


def translate_chunks(engine, chunks, beam=1, alpha=None, **options):
    """For each chunk of inputs (`input_chunks`), in order: ``(inputs, [tokens or None per
    input], [hypotheses or None per input], [(label, SentenceError) refused])``, the inputs
    checked by the package's one rule (`limits.screen_inputs`) and the good ones decoded
    together (`decode`)."""
    for inputs in chunks:
        tokens, refused = screen_inputs(inputs, engine.tokenizer, engine.src_vocab,
                                        engine.max_positions)
        good = iter(decode(engine, [t for t in tokens if t is not None], beam, alpha, **options))
        yield inputs, tokens, [None if t is None else next(good) for t in tokens], refused
