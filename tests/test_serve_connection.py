"""`serve.connection`: uvicorn's own server over real sockets, with the deadline on each
request's head (slowloris) and JSON protocol errors; the body keeps its own deadline."""

import http.client
import json
import select
import socket
import time

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed")
from browser import ServerThread, read_until_closed  # noqa: E402

HEAD = 0.6  # seconds: the deadline of these servers


async def echo(scope, receive, send):
    """An ASGI app that reads the whole body and answers its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = json.dumps({"bytes": size}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    s = ServerThread(echo, http=HEAD)
    yield s
    s.stop()


def connect(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def read_response(sock):
    """One whole response (its head, then Content-Length bytes) from a kept-alive `sock`."""
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
            if len(body) >= int(fields.get(b"content-length", b"0")):
                return data
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk


def request(path="/", body=b""):
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            "\r\n").encode() + body


def parse(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


def test_a_head_sent_a_byte_at_a_time_is_cut_off_with_a_408(server):
    """Slowloris: bytes keep coming, but the head is not finished by the deadline. The client
    stops sending once the server has answered (writing on would draw a reset)."""
    with connect(server) as sock:
        tic = time.monotonic()
        for byte in request(body=b"{}")[:-6]:  # never the end of the head
            if select.select([sock], [], [], 0.05)[0]:  # answered, or closed
                break
            sock.sendall(bytes([byte]))
        status, body = parse(read_until_closed(sock))
        elapsed = time.monotonic() - tic
    assert status == "HTTP/1.1 408 Request Timeout"
    assert body == {"error": f"request headers not received within {HEAD:g} s"}
    assert HEAD - 0.1 < elapsed < HEAD + 3


def test_a_connection_that_sends_nothing_is_closed_without_a_word(server):
    with connect(server) as sock:
        tic = time.monotonic()
        assert read_until_closed(sock) == b""
        assert HEAD - 0.1 < time.monotonic() - tic < HEAD + 3


def test_the_deadline_restarts_for_each_request_of_a_connection(server):
    """Keep-alive: the next head, sent slowly but in time, is served; one sent too slowly
    (uvicorn's own keep-alive timer stops at its first byte) gets the 408."""
    with connect(server) as sock:
        for _ in range(3):  # each head in ~half the deadline, three times the deadline in all
            data = request(body=b"abc")
            for i in range(0, len(data), 10):
                sock.sendall(data[i:i + 10])
                time.sleep(HEAD / 2 / (len(data) / 10))
            reply = read_response(sock)
            assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b'{"bytes": 3}')
        sock.sendall(b"POST / HT")  # then the head stops
        assert parse(read_until_closed(sock))[0] == "HTTP/1.1 408 Request Timeout"


def test_a_slow_body_is_the_bodys_deadline_not_the_heads(server):
    """The head arrives at once; the body takes twice the head's deadline: served (the app's
    own body deadline, `app.BodyLimit`, governs it)."""
    with connect(server) as sock:
        body = b"x" * 20
        sock.sendall(request(body=body)[:-len(body)])
        for i in range(0, len(body), 2):
            sock.sendall(body[i:i + 2])
            time.sleep(2 * HEAD / 10)
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b'{"bytes": 20}')


@pytest.mark.parametrize("raw", [
    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
    b"NOT HTTP\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000])  # a head over 16 KiB, unfinished
def test_what_is_not_http_is_a_json_400(server, raw):
    """Answered at once (not at the head's deadline), in JSON where uvicorn answers in plain
    text."""
    with connect(server) as sock:
        tic = time.monotonic()
        sock.sendall(raw)
        status, body = parse(read_until_closed(sock))
        assert time.monotonic() - tic < HEAD / 2
    assert status == "HTTP/1.1 400 Bad Request"
    assert body == {"error": "Invalid HTTP request received."}


def test_a_real_client_is_served_as_before(server):
    """http.client (the standard library's), keep-alive, several requests."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for n in (0, 5, 70000):
        conn.request("POST", "/", body=b"y" * n)
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"bytes": n}
    conn.close()
