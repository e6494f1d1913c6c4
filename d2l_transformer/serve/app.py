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
from .libretranslate import LIBRE_FIELDS, MAX_ALTERNATIVES, add_libretranslate, translate_libre
from .middleware import LOOPBACK_HOSTS, MAX_BODY, BodyLimit, HostCheck, error_response
from .requests import (
    MAX_BEAM,
    MAX_SENTENCES,
    ApiError,
    ErrorResponse,
    check_key,
    read_body,
    run,
    tokens_of,
    validation_message,
)


class TranslateRequest(BaseModel):
    """The body of ``POST /translate`` (this package's shape)."""

    model_config = ConfigDict(extra="forbid")
    text: List[StrictStr] = Field(description=f"sentences to translate (1 to {MAX_SENTENCES})")
    beam: StrictInt = Field(BEAM_SIZE, ge=1, le=MAX_BEAM, description="beam size (1: greedy "
                                                                       "decoding)")
    nbest: StrictInt = Field(1, ge=1, le=MAX_BEAM, description="also return each sentence's "
                             "n best hypotheses with their scores (a beam of at least n)")
    attention: StrictBool = Field(False, description="also return every layer's and head's "
                                                     "attention weights with the tokens")
    api_key: Optional[StrictStr] = Field(None, description="the server's key, when it was "
                                                           "started with --api-key")


class Hypothesis(BaseModel):
    translation: str
    score: float = Field(description="log P(Y|X) / ((5 + |Y|) / 6) ** 0.6 (GNMT length penalty)")
    log_prob: float = Field(description="log P(Y|X): the sum over its tokens and <eos>")


class Translation(Hypothesis):
    source: str
    nbest: Optional[List[Hypothesis]] = Field(
        None, description="the n best hypotheses, best first (the first is the translation); "
                          "only with nbest > 1")
    attention: Optional[Dict[str, Any]] = Field(
        None, description="src_tokens, tgt_tokens, out_tokens and the encoder, decoder and cross "
                          "weights (layers x heads x queries x keys); only when asked for")


class TranslateResponse(BaseModel):
    translations: List[Translation]
    model: Dict[str, Any]


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
    add_libretranslate(app, engine, api_key)
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
        return error_response(422, validation_message(e))


def _add_explorer(app):
    """``GET /``: the attention explorer's page."""
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(explorer_page())


# ---------------------------------------------------------------------------------- our API
def _parse(engine, api_key, data):
    """Our request checked: ``(TranslateRequest, each sentence's tokens)``; ApiError else."""
    try:
        req = TranslateRequest.model_validate(data)
    except ValidationError as e:
        raise ApiError(422, validation_message(e)) from None
    check_key(api_key, req.api_key)
    n = len(req.text)
    if not 1 <= n <= MAX_SENTENCES:
        raise ApiError(422 if n == 0 else 413,
                       f"text: {n} sentences; send 1 to {MAX_SENTENCES} per request")
    return req, [tokens_of(engine, f"text[{i}]", s) for i, s in enumerate(req.text)]


async def _translate_ours(engine, api_key, data):
    req, tokens = _parse(engine, api_key, data)
    items = await run(engine, req.text, tokens, max(req.beam, req.nbest), req.attention,
                      n_best=req.nbest)
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
            return await translate_libre(engine, api_key, data)
        return await _translate_ours(engine, api_key, data)


