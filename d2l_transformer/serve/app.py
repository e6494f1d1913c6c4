"""The HTTP API (FastAPI): ``POST /translate``, ``GET /health``, ``GET /`` (the attention
explorer page), the OpenAPI docs at ``/docs``, and LibreTranslate's API at its own paths
(``POST /translate`` with ``q``, ``GET /languages``, ``POST /detect``) so that LibreTranslate
clients pointed at the server's base URL work unchanged (docs/serving.md).

Every bad request is a 4xx JSON ``{"error": "<one line>"}`` naming the problem (what is not
HTTP at all too: `connection`); the request's content is never echoed back and no
traceback leaves the server. Both APIs share the worker, the limits and the checks: the body
limit and the host allow-list come first (middleware), the sentences are checked by the
package's one rule (`inference.limits`), as the command line and the `Translator` check them.
"""

import asyncio
import hmac
import json
import re
import urllib.parse
from typing import Any, Dict, List, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.exceptions import HTTPException

from .._version import __version__
from ..data import language_name
from ..inference import limits as _limits
from ..inference.translator import BEAM_SIZE
from ..viz.attention_html import explorer_page
from . import engine as _engine
from .engine import Busy, TooLarge, Unavailable
from .middleware import LOOPBACK_HOSTS, MAX_BODY, BodyLimit, HostCheck, error_response

MAX_SENTENCES = 256  # per request
MAX_BEAM = 16
MAX_ALTERNATIVES = MAX_BEAM - 1  # LibreTranslate's `alternatives`: the beam's next best
JSON_TYPES = ("application/json",)
FORM_TYPE = "application/x-www-form-urlencoded"
LIBRE_FIELDS = ("q", "source", "target")  # a JSON object with one of these (and no text)


class TranslateRequest(BaseModel):
    """The body of ``POST /translate`` (this package's shape)."""

    model_config = ConfigDict(extra="forbid")
    text: List[StrictStr] = Field(description=f"sentences to translate (1 to {MAX_SENTENCES})")
    beam: StrictInt = Field(BEAM_SIZE, ge=1, le=MAX_BEAM, description="beam size (1: greedy "
                                                                       "decoding)")
    attention: StrictBool = Field(False, description="also return every layer's and head's "
                                                     "attention weights with the tokens")
    api_key: Optional[StrictStr] = Field(None, description="the server's key, when it was "
                                                           "started with --api-key")


class Translation(BaseModel):
    source: str
    translation: str
    score: float = Field(description="log P(Y|X) / ((5 + |Y|) / 6) ** 0.6 (GNMT length penalty)")
    attention: Optional[Dict[str, Any]] = Field(
        None, description="src_tokens, tgt_tokens, out_tokens and the encoder, decoder and cross "
                          "weights (layers x heads x queries x keys); only when asked for")


class TranslateResponse(BaseModel):
    translations: List[Translation]
    model: Dict[str, Any]


class ErrorResponse(BaseModel):
    error: str


class ApiError(Exception):
    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def _where(loc):
    """pydantic's error location ``("text", 3)`` as ``text[3]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _validation_message(e):
    errors = e.errors(include_input=False, include_url=False)
    first = f"{_where(errors[0]['loc'])}: {errors[0]['msg']}"
    more = len(errors) - 1
    return first + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def read_body(content_type, body, form=True):
    """``(kind, data)`` of a request body: ``("json", the decoded JSON)`` for a JSON content
    type, ``("form", {name: first value})`` for a URL-encoded form when `form` (LibreTranslate's
    API allows one); else ApiError 415. Bad UTF-8 or JSON: ApiError 400."""
    media = (content_type or "").split(";")[0].strip().lower()
    is_json = media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json"))
    if not is_json and not (form and media == FORM_TYPE):
        allowed = "application/json" + (f" or {FORM_TYPE}" if form else "")
        got = f"not {media[:60]}" if media else "none was given"
        raise ApiError(415, f"the body's Content-Type must be {allowed} ({got})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 ({e.reason} at byte {e.start})") from None
    if not is_json:
        try:
            pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, encoding="utf-8",
                                           errors="strict", max_num_fields=64)
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the form is not UTF-8 ({e.reason})") from None
        except ValueError as e:  # too many fields
            raise ApiError(400, f"the body is not a form ({e})") from None
        data = {}
        for name, value in pairs:
            data.setdefault(name, value)  # the first value of a name, as LibreTranslate reads it
        return "form", data
    try:
        return "json", json.loads(text)
    except ValueError as e:
        raise ApiError(400, f"the body is not JSON ({e})") from None
    except RecursionError:
        raise ApiError(400, "the body is not JSON (nested too deeply)") from None


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


def _code(value):
    """A language code to name in an error, or a stand-in when it is not one."""
    return value if re.fullmatch(r"[A-Za-z_-]{1,12}", value) else "that language"


def create_app(engine, *, allowed_hosts=LOOPBACK_HOSTS, api_key=None):
    """The FastAPI app serving `engine` (a `serve.engine.Engine`). `allowed_hosts`: the
    ``Host`` headers answered (``["*"]``: any; `middleware.allowed_hosts_for`); `api_key`: when
    set, every translation and detection request must carry it (403 otherwise). The limits are
    the package's (`inference.limits`, `serve.engine.check_attention`) and this module's
    `MAX_SENTENCES`, `MAX_BEAM` and `middleware.MAX_BODY`."""
    source, target = (language_name(code) for code in engine.pair)
    app = FastAPI(title="d2l_transformer", version=__version__,
                  description=f"{source} to {target} with the Transformer of d2l 9.3, and its "
                              "attention weights. The page at / explores them. LibreTranslate's "
                              "API is served at its own paths.")
    app.add_middleware(BodyLimit, max_body=MAX_BODY)
    app.add_middleware(HostCheck, allowed_hosts=list(allowed_hosts))  # outermost
    _add_error_handlers(app)
    _add_explorer(app)
    _add_our_api(app, engine, api_key)
    _add_libretranslate(app, engine, api_key)
    return app


def _add_error_handlers(app):
    """Every error as ``{"error": "<one line>"}``: ours (`ApiError`), Starlette's, a request
    that does not validate (422) and our own bugs (500)."""
    @app.exception_handler(ApiError)
    async def apierror_response(request, e):
        return error_response(e.status, e.message, e.headers)

    @app.exception_handler(HTTPException)
    async def httperror_response(request, e):  # 404, 405, ...
        return error_response(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internalerror_response(request, e):  # our bug: logged with its traceback by the server
        return error_response(500, f"internal error ({type(e).__name__}); see the server's log")

    @app.exception_handler(RequestValidationError)
    async def requesterror_response(request, e):
        return error_response(422, _validation_message(e))


def _add_explorer(app):
    """``GET /``: the attention explorer's page."""
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(explorer_page())


# ---------------------------------------------------------------------------------- both APIs
def _check_key(api_key, given):
    """Nothing when the server has no key or `given` is it; else ApiError 403."""
    if api_key is None:
        return
    if not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), api_key.encode("utf-8")):
        raise ApiError(403, "Invalid API key" if given else "this server needs an api_key")


def _tokens_of(engine, where, text):
    """The sentence's tokens by the one rule (`inference.limits`); ApiError 413/422."""
    try:
        return _limits.sentence_tokens(text, engine.tokenizer, engine.src_vocab,
                                       engine.max_positions)
    except _limits.SentenceError as e:
        raise ApiError(413 if e.too_large else 422, f"{where}: {e}") from None


async def _run(engine, sources, tokens, beam, attention=False, n_best=1):
    """The engine's result dicts; its refusals as ApiErrors (429, 503, 413)."""
    try:
        future = engine.submit(sources, tokens, beam, attention, n_best=n_best)
    except Busy as e:
        raise ApiError(429, str(e), {"Retry-After": "1"}) from None
    except Unavailable as e:
        raise ApiError(503, str(e)) from None
    except TooLarge as e:  # attention for these sources, before decoding
        raise ApiError(413, str(e)) from None
    try:
        return await asyncio.wrap_future(future)
    except TooLarge as e:
        raise ApiError(413, str(e)) from None
    except Unavailable as e:
        raise ApiError(503, str(e)) from None


# ---------------------------------------------------------------------------------- our API
def _parse(engine, api_key, data):
    """Our request checked: ``(TranslateRequest, each sentence's tokens)``; ApiError else."""
    try:
        req = TranslateRequest.model_validate(data)
    except ValidationError as e:
        raise ApiError(422, _validation_message(e)) from None
    _check_key(api_key, req.api_key)
    n = len(req.text)
    if not 1 <= n <= MAX_SENTENCES:
        raise ApiError(422 if n == 0 else 413,
                       f"text: {n} sentences; send 1 to {MAX_SENTENCES} per request")
    return req, [_tokens_of(engine, f"text[{i}]", s) for i, s in enumerate(req.text)]


async def _translate_ours(engine, api_key, data):
    req, tokens = _parse(engine, api_key, data)
    items = await _run(engine, req.text, tokens, req.beam, req.attention)
    return JSONResponse({"translations": items, "model": engine.info})


def _add_our_api(app, engine, api_key):
    """``GET /health`` and ``POST /translate`` (which answers LibreTranslate's request too)."""
    @app.get("/health")
    async def health():
        """``status`` "ok", or 503 "unavailable" when the model's worker has stopped."""
        if not engine.alive():
            return JSONResponse({"status": "unavailable",
                                 "error": "the model's worker thread has stopped"}, 503)
        limits = {"max_sentences": MAX_SENTENCES, "max_chars": _limits.MAX_CHARS,
                  "max_tokens": min(_limits.MAX_TOKENS, engine.max_positions),
                  "max_attention_cells": _engine.MAX_ATTENTION_CELLS, "max_beam": MAX_BEAM,
                  "max_alternatives": MAX_ALTERNATIVES, "max_body": MAX_BODY}
        return {"status": "ok", "model": engine.info, "limits": limits,
                "pending": engine.pending(), "batches": engine.batches,
                "sentences": engine.sentences}

    @app.post("/translate", response_model=TranslateResponse,
              responses={400: {"model": ErrorResponse}, 403: {"model": ErrorResponse},
                         413: {"model": ErrorResponse}, 415: {"model": ErrorResponse},
                         422: {"model": ErrorResponse}, 429: {"model": ErrorResponse},
                         503: {"model": ErrorResponse}},
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": TranslateRequest.model_json_schema()}}}})
    async def translate(request: Request):
        """Translate sentences (batched with other requests through the package's translator);
        with ``"attention": true`` each translation carries its attention weights. A form body,
        or a JSON object without ``text`` but with ``q``, ``source`` or ``target``, is
        LibreTranslate's request and gets its answer (``{"translatedText": ...}``,
        docs/serving.md)."""
        kind, data = read_body(request.headers.get("content-type"), await request.body())
        if kind == "form" or (isinstance(data, dict) and "text" not in data
                              and any(k in data for k in LIBRE_FIELDS)):
            return await _translate_libre(engine, api_key, data)
        return await _translate_ours(engine, api_key, data)


# ----------------------------------------------------------------------------- LibreTranslate's API
def _libre_fields(api_key, data, pair):
    """LibreTranslate's request fields, checked as LibreTranslate checks them (400); `pair`:
    the model's (source, target) languages, the only ones it takes."""
    if not isinstance(data, dict):
        raise ApiError(400, "Invalid JSON format")
    _check_key(api_key, data.get("api_key"))
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
            shown = _code(value) if isinstance(value, str) else "that language"
            raise ApiError(400, f"{shown} is not supported as {name}: this server "
                                f"translates {pair[0]} to {pair[1]}")
    text_format = data.get("format") or "text"
    if text_format == "html":
        raise ApiError(400, "html format is not supported by this server: send plain text "
                            "(format=text)")
    if text_format != "text":
        raise ApiError(400, f"{_code(str(text_format))} format is not supported")
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
                tokens.append(_tokens_of(engine, where, line))
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
            found = item.get("alternatives", [])
            for a in range(alternatives):
                alts[a].append(found[a] if a < len(found) else item["translation"])
        translated.append("\n".join(best))
        unique = []
        for alt in ("\n".join(a) for a in alts):
            if alt != translated[-1] and alt not in unique:
                unique.append(alt)
        others.append(unique)
    return translated, others


async def _translate_libre(engine, api_key, data):
    """LibreTranslate's ``/translate``: each line of each text is one sentence; blank
    lines stay blank."""
    q, auto, alternatives = _libre_fields(api_key, data, engine.pair)
    texts = [q] if isinstance(q, str) else q
    lines = [text.splitlines() or [""] for text in texts]
    sources, tokens = _libre_sentences(engine, q, lines)
    n_best = alternatives + 1
    items = iter(await _run(engine, sources, tokens, max(BEAM_SIZE, n_best), n_best=n_best)
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


def _add_libretranslate(app, engine, api_key):
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
        _check_key(api_key, data.get("api_key"))
        if not data.get("q"):
            raise ApiError(400, "Invalid request: missing q parameter")
        return [detected(engine.pair)]
