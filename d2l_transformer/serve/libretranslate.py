"""LibreTranslate's API at its own paths (LibreTranslate/LibreTranslate, libretranslate/app.py):
``POST /translate`` with ``q``, ``source`` and ``target`` (a JSON body or a form; the server's
own ``/translate`` hands such a body here, `translate_libre`), ``GET /languages``, ``POST
/detect``, so that LibreTranslate clients pointed at the server's base URL work unchanged. The
model translates one pair (`languages`): a request for another is a 400 naming the pair."""

import re

from fastapi import Request
from fastapi.responses import JSONResponse

from ..data import language_name
from ..inference.translator import BEAM_SIZE
from .requests import (
    MAX_BEAM,
    MAX_SENTENCES,
    ApiError,
    ErrorResponse,
    check_key,
    read_body,
    run,
    shown_code,
    tokens_of,
)

MAX_ALTERNATIVES = MAX_BEAM - 1  # LibreTranslate's `alternatives`: the beam's next best
LIBRE_FIELDS = ("q", "source", "target")  # a JSON object with one of these (and no text)


def languages(pair):
    """LibreTranslate's ``/languages`` for a model of the languages `pair` (source, target):
    the one pair it translates, each language with its name."""
    source, target = pair
    return [{"code": source, "name": language_name(source), "targets": [target]},
            {"code": target, "name": language_name(target), "targets": []}]


def detected(pair):
    """``/detect`` and ``source: "auto"``: the server translates from one language and has no
    language classifier, so it answers as LibreTranslate does when it cannot tell: the model's
    source language, confidence 0."""
    return {"confidence": 0.0, "language": pair[0]}


def _libre_fields(api_key, data, pair):
    """LibreTranslate's request fields, checked as LibreTranslate checks them (400); `pair`:
    the model's (source, target) languages, the only ones it takes."""
    if not isinstance(data, dict):
        raise ApiError(400, "Invalid JSON format")
    check_key(api_key, data.get("api_key"))
    q = data.get("q")
    if not q:
        raise ApiError(400, "Invalid request: missing q parameter")
    if not (isinstance(q, str) or (isinstance(q, list)
                                   and all(isinstance(t, str) for t in q))):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    for name, value, ok in (("source", data.get("source"), (pair[0], "auto")),
                            ("target", data.get("target"), (pair[1],))):
        if not value:
            raise ApiError(400, f"Invalid request: missing {name} parameter")
        if not isinstance(value, str) or value.lower() not in ok:
            shown = shown_code(value) if isinstance(value, str) else "that language"
            raise ApiError(400, f"{shown} is not supported as {name}: this server "
                                f"translates {pair[0]} to {pair[1]}")
    text_format = data.get("format") or "text"
    if text_format == "html":
        raise ApiError(400, "html format is not supported by this server: send plain text "
                            "(format=text)")
    if text_format != "text":
        raise ApiError(400, f"{shown_code(str(text_format))} format is not supported")
    alternatives = data.get("alternatives", 0)
    if isinstance(alternatives, str) and re.fullmatch(r"\s*-?\d{1,6}\s*", alternatives):
        alternatives = int(alternatives)
    if isinstance(alternatives, bool) or not isinstance(alternatives, int):
        raise ApiError(400, "Invalid request: alternatives parameter is not a number")
    alternatives = max(0, alternatives)
    if alternatives > MAX_ALTERNATIVES:
        raise ApiError(400, "Invalid request: alternatives parameter must be <= "
                            f"{MAX_ALTERNATIVES}")
    return q, data["source"].lower() == "auto", alternatives


def _libre_sentences(engine, q, lines):
    """The non-blank lines of `lines` (each text's lines) and their tokens; ApiError 413/422."""
    sources, tokens = [], []
    for i, text_lines in enumerate(lines):
        for k, line in enumerate(text_lines):
            if line.strip():
                where = ("q" if isinstance(q, str) else f"q[{i}]") + \
                    (f" line {k + 1}" if len(text_lines) > 1 else "")
                sources.append(line)
                tokens.append(tokens_of(engine, where, line))
                if len(sources) > MAX_SENTENCES:
                    raise ApiError(413, f"q: over {MAX_SENTENCES} sentences; send at most "
                                        f"{MAX_SENTENCES} per request")
    return sources, tokens


def _libre_texts(lines, items, alternatives):
    """Each text's translation, and its distinct alternatives, from the engine's `items` (an
    iterator over the non-blank lines' results); blank lines stay blank."""
    translated, others = [], []
    for text_lines in lines:
        best, alts = [], [[] for _ in range(alternatives)]
        for line in text_lines:
            item = next(items) if line.strip() else {"translation": line}
            best.append(item["translation"])
            found = [h["translation"] for h in item.get("nbest", [])[1:]]
            for a in range(alternatives):
                alts[a].append(found[a] if a < len(found) else item["translation"])
        translated.append("\n".join(best))
        unique = []
        for alt in ("\n".join(a) for a in alts):
            if alt != translated[-1] and alt not in unique:
                unique.append(alt)
        others.append(unique)
    return translated, others


async def translate_libre(engine, api_key, data):
    """LibreTranslate's ``/translate``: each line of each text is one sentence; blank
    lines stay blank."""
    q, auto, alternatives = _libre_fields(api_key, data, engine.pair)
    texts = [q] if isinstance(q, str) else q
    lines = [text.splitlines() or [""] for text in texts]
    sources, tokens = _libre_sentences(engine, q, lines)
    n_best = alternatives + 1
    items = iter(await run(engine, sources, tokens, max(BEAM_SIZE, n_best), n_best=n_best)
                 if sources else [])
    translated, others = _libre_texts(lines, items, alternatives)
    batch = isinstance(q, list)
    result = {"translatedText": translated if batch else translated[0]}
    if auto:
        found = detected(engine.pair)
        result["detectedLanguage"] = [found] * len(texts) if batch else found
    if alternatives:
        result["alternatives"] = others if batch else others[0]
    return JSONResponse(result)


def add_libretranslate(app, engine, api_key):
    """LibreTranslate's ``GET /languages`` and ``POST /detect`` (its ``/translate`` is ours,
    told apart by its body)."""
    @app.get("/languages")
    async def list_languages():
        """LibreTranslate's ``/languages``: the model's source language, translated to its
        target language."""
        return languages(engine.pair)

    @app.post("/detect", responses={400: {"model": ErrorResponse}, 403: {"model": ErrorResponse}})
    async def detect(request: Request):
        """LibreTranslate's ``/detect``: always the model's source language, with confidence 0
        (the server has no language classifier, and translates from that language only)."""
        _, data = read_body(request.headers.get("content-type"), await request.body())
        if not isinstance(data, dict):
            raise ApiError(400, "Invalid JSON format")
        check_key(api_key, data.get("api_key"))
        if not data.get("q"):
            raise ApiError(400, "Invalid request: missing q parameter")
        return [detected(engine.pair)]
