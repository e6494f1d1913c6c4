"""ASGI middleware in front of the app (`serve.app`): the ``Host`` allow-list (`HostCheck`,
`allowed_hosts_for`) and the request body's size limit and deadline (`BodyLimit`). What they
refuse is answered as every bad request is: a 4xx JSON ``{"error": "<one line>"}``
(`error_response`)."""

import asyncio

from fastapi.responses import JSONResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

MAX_BODY = 1 << 20  # bytes
BODY_SECONDS = 30  # a request body must arrive within this time (slow clients hold a slot)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")  # Host headers of a loopback server


def error_response(status, message, headers=None):
    """``{"error": message}``: one line, at most 300 characters, always encodable (a lone
    surrogate from the request, say in a field's name, becomes ``?``)."""
    message = " ".join(str(message).split())[:300].encode("utf-8", "replace").decode("utf-8")
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def allowed_hosts_for(host, allowed=None):
    """The ``Host`` headers a server bound to `host` answers (any port): `allowed` when given;
    for a loopback address localhost, 127.0.0.1 and [::1] (a web page elsewhere cannot make
    the user's browser talk to it through DNS rebinding); for 0.0.0.0 or :: any (it is meant to
    be reached under names it cannot know); else `host` itself."""
    if allowed:
        return list(allowed)
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    literal = f"[{host}]" if ":" in host else host  # an IPv6 address, as a Host header has it
    if host in ("localhost", "::1") or host.startswith("127."):
        return sorted(set(LOOPBACK_HOSTS) | {literal})
    return [literal]


class HostCheck:
    """ASGI middleware: Starlette's `TrustedHostMiddleware` decides whether the ``Host``
    header is one of `allowed_hosts` (its parsing of ports and IPv6 literals, its ``*`` and
    ``*.example.org`` patterns; no ``www.`` redirect); a foreign one is answered as every bad
    request is, 400 ``{"error": ...}``, where Starlette answers in plain text."""

    _OK = "d2l_transformer.host_ok"  # set in the scope when Starlette lets the request through

    def __init__(self, app, allowed_hosts):
        self.app = app
        self.check = TrustedHostMiddleware(self._passed, allowed_hosts=allowed_hosts,
                                           www_redirect=False)
        self.others = TrustedHostMiddleware(app, allowed_hosts=allowed_hosts,
                                            www_redirect=False)  # websockets, lifespan

    @classmethod
    async def _passed(cls, scope, receive, send):
        scope[cls._OK] = True

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.others(scope, receive, send)

        async def refused(message):  # Starlette's own answer, replaced below
            pass

        await self.check(scope, receive, refused)
        if scope.pop(self._OK, False):
            return await self.app(scope, receive, send)
        await error_response(400, "Invalid host header: not a name this server answers to (its "
                          "--host or --allowed-hosts)")(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request body over `max_body` bytes is answered 413 before the app
    reads it (by Content-Length, or counted as it streams in: the chunks are kept in a list
    and joined once, linear in the body's size); a body that has not arrived within `seconds`
    is answered 408."""

    def __init__(self, app, max_body, seconds=BODY_SECONDS):
        self.app, self.max_body, self.seconds = app, max_body, seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = error_response(413, f"request body over {self.max_body} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await too_large(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                return await error_response(408, f"request body not received within {self.seconds} s")(
                    scope, receive, send)
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await too_large(scope, receive, send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
