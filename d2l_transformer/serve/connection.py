"""One HTTP/1.1 connection of ``d2l-transformer serve``: uvicorn's h11 protocol with a deadline
on each request's head, and its protocol errors answered in this API's JSON.

uvicorn times out neither a connection that opens and sends nothing nor a request head (the
request line and the headers) sent a byte at a time: its keep-alive timer runs only between
requests and stops at the first byte. A few hundred such connections ("slowloris") hold the
server's sockets for as long as the client likes. Here each request's head must arrive within
`HEAD_SECONDS` of the connection's opening or of the previous response, as nginx's
``client_header_timeout`` and Apache's ``mod_reqtimeout`` do: a head begun and not finished
is answered 408 ``{"error": ...}``, a connection that sent nothing is closed without a word
(browsers open spare connections that they may never use). The body has its own deadline
(`app.BodyLimit`). A request that is not HTTP (a bad request line, a bad ``Content-Length``, a
head still unfinished past h11's 16 KiB buffer) is uvicorn's 400, with ``{"error": ...}``
instead of plain text.

The h11 protocol is used whatever else is installed (httptools, uvloop): these hooks are its
own, and at the chapter's sizes the model, not the parser, sets the pace.
"""

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_SECONDS = 30.0  # a request's line and headers must arrive within this time


def _response(status, reason, message):
    """A whole HTTP/1.1 response ``{"error": message}`` that closes the connection (bytes)."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class Connection(H11Protocol):
    """uvicorn's `H11Protocol` with a deadline on each request's head (`HEAD_SECONDS`, or the
    `head_seconds` of `protocol`) and JSON protocol errors."""

    head_seconds = HEAD_SECONDS

    def connection_made(self, transport):
        self._head_timer = None
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data):
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self):
        super().on_response_complete()
        self._watch_head()

    def connection_lost(self, exc):
        self._stop_head_timer()
        super().connection_lost(exc)

    def _watch_head(self):
        """Waiting for a request's head (h11's client state IDLE): the clock runs, from the
        first time it is seen waiting; once the head has arrived, it stops."""
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def _stop_head_timer(self):
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self):
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # a head begun: say why the connection ends
            self.transport.write(_response(
                408, "Request Timeout",
                f"request headers not received within {self.head_seconds:g} s"))
        self.transport.close()

    def send_400_response(self, msg):
        """uvicorn's answer to what h11 cannot parse, as ``{"error": msg}`` (if no response
        has begun on the connection; else it is only closed)."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(_response(400, "Bad Request", msg))
        self.transport.close()


def protocol(head_seconds=HEAD_SECONDS):
    """The connection class to give uvicorn (``uvicorn.run(..., http=protocol())``)."""
    if head_seconds == Connection.head_seconds:
        return Connection
    return type("Connection", (Connection,), {"head_seconds": float(head_seconds)})
