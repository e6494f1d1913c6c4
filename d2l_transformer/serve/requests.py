"""What both of the server's APIs do with a request (`app`'s own and `libretranslate`'s): read
its body, check its key and its sentences by the package's one rule (`inference.limits`), run it
on the engine's worker, and say what is wrong as an `ApiError` (a 4xx JSON ``{"error": "<one
line>"}``, the request's content never echoed back)."""

import asyncio
import hmac
import json
import re
import urllib.parse

from pydantic import BaseModel

from ..inference import limits as _limits
from .engine import Busy, TooLarge, Unavailable

MAX_SENTENCES = 256  # per request
MAX_BEAM = 16
JSON_TYPES = ("application/json",)
FORM_TYPE = "application/x-www-form-urlencoded"


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


def validation_message(e):
    """A pydantic ValidationError as one line: the first problem, and how many more."""
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


def shown_code(value):
    """A language code to name in an error, or a stand-in when it is not one."""
    return value if re.fullmatch(r"[A-Za-z_-]{1,12}", value) else "that language"


def check_key(api_key, given):
    """Nothing when the server has no key or `given` is it; else ApiError 403."""
    if api_key is None:
        return
    if not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), api_key.encode("utf-8")):
        raise ApiError(403, "Invalid API key" if given else "this server needs an api_key")


def tokens_of(engine, where, text):
    """The sentence's tokens by the one rule (`inference.limits`); ApiError 413/422."""
    try:
        return _limits.sentence_tokens(text, engine.tokenizer, engine.src_vocab,
                                       engine.max_positions)
    except _limits.SentenceError as e:
        raise ApiError(413 if e.too_large else 422, f"{where}: {e}") from None


async def run(engine, sources, tokens, beam, attention=False, n_best=1):
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
