"""The HTTP API (FastAPI): ``POST /translate``, ``GET /health``, ``GET /`` (the attention
explorer page) and the OpenAPI docs at ``/docs``.

Every bad request is a 4xx JSON ``{"error": "<one line>"}`` naming the problem; the request's
content is never echoed back and no traceback leaves the server.
"""

import asyncio
import json
from typing import Any, Dict, List, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.exceptions import HTTPException

from .. import __version__
from ..viz.attention_html import explorer_page
from .engine import Busy

MAX_SENTENCES = 256  # per request
MAX_CHARS = 1000  # per sentence
MAX_TOKENS = 200  # per sentence (and never more than the model's positions)
MAX_ATTENTION = 32  # sentences per request when the attention weights are asked for
MAX_BODY = 1 << 20  # bytes
MAX_BEAM = 16


class TranslateRequest(BaseModel):
    """The body of ``POST /translate``."""

    model_config = ConfigDict(extra="forbid")
    text: List[StrictStr] = Field(description=f"sentences to translate (1 to {MAX_SENTENCES})")
    beam: StrictInt = Field(4, ge=1, le=MAX_BEAM, description="beam size (1: greedy decoding)")
    attention: StrictBool = Field(False, description="also return every layer's and head's "
                                                     "attention weights with the tokens")


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
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def _error(status, message, headers=None):
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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


class BodyLimit:
    """ASGI middleware: a request body over `max_body` bytes is answered 413 before the app
    reads it (by Content-Length, or counted as it streams in)."""

    def __init__(self, app, max_body):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = _error(413, f"request body over {self.max_body} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await too_large(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await too_large(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(engine, *, max_sentences=MAX_SENTENCES, max_chars=MAX_CHARS,
               max_tokens=MAX_TOKENS, max_attention=MAX_ATTENTION, max_body=MAX_BODY):
    """The FastAPI app serving `engine` (a `serve.engine.Engine`)."""
    app = FastAPI(title="d2l_transformer", version=__version__,
                  description="English to French with the Transformer of d2l 9.3, and its "
                              "attention weights. The page at / explores them.")
    app.add_middleware(BodyLimit, max_body=max_body)
    token_limit = min(max_tokens, engine.max_positions)
    limits = {"max_sentences": max_sentences, "max_chars": max_chars, "max_tokens": token_limit,
              "max_attention": max_attention, "max_beam": MAX_BEAM, "max_body": max_body}

    @app.exception_handler(ApiError)
    async def api_error(request, e):
        return _error(e.status, e.message)

    @app.exception_handler(HTTPException)
    async def http_error(request, e):  # 404, 405, ...
        return _error(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request, e):  # our bug: logged with its traceback by the server
        return _error(500, f"internal error ({type(e).__name__}); see the server's log")

    @app.exception_handler(RequestValidationError)
    async def request_error(request, e):
        return _error(422, _validation_message(e))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(explorer_page())

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": engine.info, "limits": limits,
                "pending": engine.pending(), "batches": engine.batches,
                "sentences": engine.sentences}

    def parse(body):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the body is not UTF-8 ({e.reason} at byte {e.start})") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ApiError(400, f"the body is not JSON ({e})") from None
        except RecursionError:
            raise ApiError(400, "the body is not JSON (nested too deeply)") from None
        try:
            req = TranslateRequest.model_validate(data)
        except ValidationError as e:
            raise ApiError(422, _validation_message(e)) from None
        n = len(req.text)
        if not 1 <= n <= max_sentences:
            raise ApiError(422 if n == 0 else 413,
                           f"text: {n} sentences; send 1 to {max_sentences} per request")
        if req.attention and n > max_attention:
            raise ApiError(413, f"text: {n} sentences; attention weights are returned for at "
                                f"most {max_attention} per request")
        tokens = []
        for i, sentence in enumerate(req.text):
            if len(sentence) > max_chars:
                raise ApiError(413, f"text[{i}]: {len(sentence)} characters; at most {max_chars}")
            toks = engine.encode(sentence)
            if not toks:
                raise ApiError(422, f"text[{i}]: empty sentence")
            if len(toks) > token_limit:
                whose = "the model's positions" if token_limit == engine.max_positions else \
                    "this server's limit"
                raise ApiError(413, f"text[{i}]: {len(toks)} tokens; at most {token_limit} "
                                    f"({whose})")
            if all(engine.src_vocab[t] == engine.src_vocab.unk for t in toks):
                raise ApiError(422, f"text[{i}]: no word of it is in the model's vocabulary")
            tokens.append(toks)
        return req, tokens

    @app.post("/translate", response_model=TranslateResponse,
              responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse},
                         422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": TranslateRequest.model_json_schema()}}}})
    async def translate(request: Request):
        """Translate sentences (batched with other requests through the package's translator);
        with ``"attention": true`` each translation carries its attention weights."""
        req, tokens = parse(await request.body())
        try:
            future = engine.submit(req.text, tokens, req.beam, req.attention)
        except Busy as e:
            return _error(503, str(e), {"Retry-After": "1"})
        items = await asyncio.wrap_future(future)
        return JSONResponse({"translations": items, "model": engine.info})

    return app
