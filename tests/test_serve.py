"""The HTTP API (`d2l_transformer.serve`) through FastAPI's TestClient: the translations are the
package translator's, bad requests are one-line 4xx JSON errors after which the server still
answers, and concurrent requests (micro-batched on the model's one thread) give the sequential
answers."""

import concurrent.futures
import json
import socket
import threading

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from browser import train_small_model  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from d2l_transformer import checkpoint  # noqa: E402
from d2l_transformer.inference.translator import Translator  # noqa: E402
from d2l_transformer.serve.app import create_app  # noqa: E402
from d2l_transformer.serve.engine import Engine  # noqa: E402

BASE = "http://127.0.0.1:8000"  # a Host header the loopback allow-list answers
SENTENCES = ["Go .", "I won !", "I'm OK .", "Hi .", "Run !", "Help !", "I lost .", "Stop !"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return train_small_model(str(tmp_path_factory.mktemp("serve") / "model"))


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = Engine(model_dir, "cpu", engine="mxnet")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine), base_url=BASE, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def direct(model_dir, ctx):
    """The package's translator on the same model, called directly on this thread."""
    model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(model_dir, ctx)
    return Translator(model, src_vocab, tgt_vocab, ctx, num_steps=cfg.num_steps)


def post(client, body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/translate", content=raw, headers={"Content-Type": "application/json"})


def good(client, text=("I won !",), beam=2):
    r = post(client, {"text": list(text), "beam": beam})
    assert r.status_code == 200, r.text
    return [t["translation"] for t in r.json()["translations"]]


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_the_translators(client, engine, direct, beam):
    r = post(client, {"text": SENTENCES, "beam": beam})
    assert r.status_code == 200
    body = r.json()
    tokens = [engine.encode(s) for s in SENTENCES]
    expected = direct.translate(tokens, beam_size=beam)
    assert [t["source"] for t in body["translations"]] == SENTENCES
    assert [t["translation"] for t in body["translations"]] == [" ".join(h.tokens) for h in expected]
    assert [t["score"] for t in body["translations"]] == pytest.approx(
        [h.score for h in expected], abs=1e-4)
    assert all("attention" not in t for t in body["translations"])
    assert body["model"]["layers"] == 2 and body["model"]["heads"] == 4
    assert body["model"]["src_vocab"] == len(direct.src_vocab)


def test_attention_weights(client, engine, direct):
    r = post(client, {"text": ["I won !", "Go ."], "beam": 4, "attention": True})
    assert r.status_code == 200
    for item in r.json()["translations"]:
        att = item["attention"]
        src, out = engine.encode(item["source"]), item["translation"].split()
        assert att == direct.attention(src, out)  # the translator's, unchanged
        assert att["src_tokens"] == src and att["tgt_tokens"] == ["<bos>"] + out
        assert att["out_tokens"] == out + ["<eos>"]
        n, m = len(src), len(out) + 1
        for kind, rows, cols in (("encoder", n, n), ("decoder", m, m), ("cross", m, n)):
            w = att[kind]
            assert (len(w), len(w[0]), len(w[0][0]), len(w[0][0][0])) == (2, 4, rows, cols)
            for head in (h for layer in w for h in layer):
                assert all(abs(sum(row) - 1) < 1e-3 for row in head)
        assert all(head[i][j] == 0 for layer in att["decoder"] for head in layer
                   for i in range(m) for j in range(i + 1, m))  # causal


LONG = json.dumps({"text": ["go " * 400]}).encode()
BAD = [
    (b'{"text": ["go ."', 400, "the body is not JSON (Expecting ',' delimiter"),
    (b"", 400, "the body is not JSON (Expecting value"),
    (b'{"text": ["\xff\xfe go"]}', 400, "the body is not UTF-8 (invalid start byte at byte 11)"),
    (b"[" * 100000, 400, "the body is not JSON (nested too deeply)"),
    (b'["go ."]', 422, "body: Input should be a valid dictionary or instance of TranslateRequest"),
    (b'{"beam": 2}', 422, "text: Field required"),
    (b'{"text": "go ."}', 422, "text: Input should be a valid list"),
    (b'{"text": ["go .", 3]}', 422, "text[1]: Input should be a valid string"),
    (b'{"text": ["go ."], "beam": "4"}', 422, "beam: Input should be a valid integer"),
    (b'{"text": ["go ."], "beam": true}', 422, "beam: Input should be a valid integer"),
    (b'{"text": ["go ."], "attention": "yes"}', 422, "attention: Input should be a valid boolean"),
    (b'{"text": ["go ."], "beam_size": 4}', 422, "beam_size: Extra inputs are not permitted"),
    (b'{"text": [1, 2], "beam": 0}', 422, "text[0]: Input should be a valid string (and 2 more"),
    (b'{"text": []}', 422, "text: 0 sentences; send 1 to 256 per request"),
    (b'{"text": ["go .", "  "]}', 422, "text[1]: empty sentence"),
    (b'{"text": ["zzz qqq"]}', 422, "text[0]: no word of it is in the model's vocabulary"),
    (b'{"text": ["go ."], "beam": 0}', 422, "beam: Input should be greater than or equal to 1"),
    (b'{"text": ["go ."], "beam": 17}', 422, "beam: Input should be less than or equal to 16"),
    (json.dumps({"text": ["go ."] * 257}).encode(), 413, "text: 257 sentences; send 1 to 256"),
    (LONG, 413, "text[0]: 1200 characters; at most 1000"),
    (json.dumps({"text": ["go " * 333]}).encode(), 413,
     "text[0]: 333 tokens; at most 200 (the sentence limit)"),
    (json.dumps({"text": ["go " * 350000]}).encode(), 413, "request body over 1048576 bytes"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_requests_are_one_line_4xx(client, body, status, message):
    r = post(client, body)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error.startswith(message) and "\n" not in error and len(error) < 200
    assert "go go go" not in error  # the request is never echoed back
    assert good(client) == good(client)  # and the server still answers


def test_limits_of_the_model_and_the_body(engine, direct, monkeypatch):
    # a model with fewer positions than the sentence limit: its positions are the limit
    monkeypatch.setattr(engine, "max_positions", 50)
    with TestClient(create_app(engine), base_url=BASE) as client:
        r = post(client, {"text": ["go " * 51]})
        assert r.status_code == 413
        assert r.json()["error"] == "text[0]: 51 tokens; at most 50 (the model's positions)"
        assert client.get("/health").json()["limits"]["max_tokens"] == 50
        # a streamed (chunked) body is counted as it arrives
        chunks = (b" " * 65536 for _ in range(20))
        r = client.post("/translate", content=chunks, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json() == {"error": "request body over 1048576 bytes"}
        r = client.post("/translate", content=b"{}", headers={"Content-Length": "12x"})
        assert r.status_code == 413
        assert good(client, ["go ."], beam=1) == [" ".join(direct.translate([["go", "."]])[0].tokens)]
    monkeypatch.undo()


def test_other_routes(client, engine):
    assert client.get("/nope").json() == {"error": "Not Found"}
    r = client.get("/translate")
    assert r.status_code == 405 and r.json() == {"error": "Method Not Allowed"}
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model"] == engine.info
    assert health["limits"]["max_tokens"] == 200 and health["pending"] == 0
    page = client.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert 'id="translate"' in page.text and "http:" not in page.text and "https:" not in page.text
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]
    assert set(body["schema"]["properties"]) == {"text", "beam", "nbest", "attention", "api_key"}
    assert client.get("/docs").status_code == 200


def test_our_own_bug_is_a_500_json_and_the_server_goes_on(client, engine, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.translator, "translate", broken)
    r = post(client, {"text": ["go ."]})
    assert r.status_code == 500
    assert r.json() == {"error": "internal error (RuntimeError); see the server's log"}
    monkeypatch.undo()
    assert good(client) and client.get("/health").json()["pending"] == 0


def test_concurrent_requests_give_the_sequential_answers(client):
    requests = [(SENTENCES[i % 8:i % 8 + 1 + i % 3], 1 + i % 3) for i in range(24)]
    sequential = [good(client, text, beam) for text, beam in requests]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        concurrent_ = list(pool.map(lambda r: good(client, *r), requests))
    assert concurrent_ == sequential


def test_waiting_requests_are_translated_together(engine, monkeypatch):
    """Micro-batching: what queues up while the model is busy goes in one translate call."""
    calls, started, release = [], threading.Event(), threading.Event()
    translate = engine.translator.translate

    def slow_first(sentences, **kwargs):
        calls.append(len(sentences))
        if len(calls) == 1:
            started.set()
            release.wait(60)
        return translate(sentences, **kwargs)

    monkeypatch.setattr(engine.translator, "translate", slow_first)
    first = engine.submit(["Go ."], [["go", "."]], beam=2)
    assert started.wait(60)
    waiting = [engine.submit([s], [engine.encode(s)], beam=2) for s in SENTENCES[1:5]]
    waiting.append(engine.submit(["Go ."], [["go", "."]], beam=1))  # another beam: its own call
    release.set()
    results = [f.result(60) for f in [first] + waiting]
    assert calls[0] == 1 and sorted(calls[1:]) == [1, 4]  # 4 sentences of beam 2 together
    assert [r[0]["source"] for r in results] == SENTENCES[:5] + ["Go ."]


def test_a_bad_model_directory_is_one_line(tmp_path, capsys):
    from d2l_transformer.cli import commands as cli

    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        Engine(str(tmp_path / "nope"), "cpu")
    assert cli.main(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == f"error: model directory {tmp_path / 'nope'} does not exist"
    with socket.socket() as busy:  # a port already taken: one line, before the model loads
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--model", str(tmp_path / "nope"), "--port", str(port)]) == 2
    assert capsys.readouterr().err.strip() == \
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


# ------------------------------------------------------------------------------ hardening
def test_lone_surrogates_are_422_never_500(client):
    for raw, message in ((b'{"text": ["go . \\ud800"]}',
                          "text[0]: not valid Unicode (a lone surrogate at character 5)"),
                         (b'{"text": ["go ."], "\\udc80x": 1}',
                          "body: Input should be a valid string, unable to parse raw data as "
                          "a unicode string")):
        r = post(client, raw)
        assert r.status_code == 422 and r.json() == {"error": message}
    assert good(client)


def test_the_one_rule_refuses_the_same_inputs_with_the_same_words(client, engine, model_dir,
                                                                  monkeypatch, capsys):
    """The CLI, the server and the library (`inference.limits`) say the same thing."""
    import io

    from d2l_transformer.cli import commands as cli
    from d2l_transformer.inference.limits import SentenceError

    cases = ["   ", "zzz qqq", "go " * 201, "go " * 400, "go . \ud800"]
    server = [post(client, {"text": [c]} if "\ud800" not in c else
                   b'{"text": ["go . \\ud800"]}').json()["error"] for c in cases]
    assert all(e.startswith("text[0]: ") for e in server)
    words = [e[len("text[0]: "):] for e in server]
    assert words == ["empty sentence", "no word of it is in the model's vocabulary",
                     "201 tokens; at most 200 (the sentence limit)",
                     "1200 characters; at most 1000",
                     "not valid Unicode (a lone surrogate at character 5)"]
    raw = "\n".join(cases).encode("utf-8", "surrogatepass")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert cli.main(["translate", "--engine", "mxnet", "--model", model_dir]) == 1
    err = capsys.readouterr().err.splitlines()
    expected = [f"error: line {i}: {w}; skipped" for i, w in enumerate(words, 1)]
    expected[-1] = "error: line 5: not UTF-8 (invalid continuation byte at byte 5); skipped"
    assert err == expected  # the last line's bytes are not UTF-8 on stdin
    assert cli.main(["translate", "--engine", "mxnet",
                     "--model", model_dir, "go . \udcff"]) == 1  # argv's bytes
    assert capsys.readouterr().err.strip() == \
        "error: argument 1: not valid Unicode (a lone surrogate at character 5); skipped"
    with pytest.raises(SentenceError, match="^sentence 1: empty sentence$"):
        engine.translator.translate([["go", "."], []])
    with pytest.raises(SentenceError, match="^sentence 0: 1001 tokens; at most 1000 "
                                            r"\(the model's positions\)$"):
        engine.translator.translate([["go"] * 1001])


def _cells(attention):
    return sum(len(head) * len(head[0]) for kind in ("encoder", "decoder", "cross")
               for layer in attention[kind] for head in layer)


def test_attention_is_capped_by_its_cells(client, engine, direct, monkeypatch):
    from d2l_transformer.serve import engine as serve_engine

    # the count the cap uses is the number of weights the answer carries
    r = post(client, {"text": ["I won !", "Go ."], "beam": 1, "attention": True})
    for item in r.json()["translations"]:
        n, m = len(engine.encode(item["source"])), len(item["translation"].split()) + 1
        assert _cells(item["attention"]) == engine.attention_cells(n, m) == \
            4 * (2 * n * n + 2 * (m * m + m * n))
    # refused before decoding: 4 sentences of 200 tokens need at least 4 * 321,608 weights
    r = post(client, {"text": ["go " * 200] * 4, "attention": True})
    assert r.status_code == 413
    assert r.json()["error"] == ("attention: at least 1286432 weights (layers x heads x queries "
                                 "x keys); at most 1000000 per request: send fewer or shorter "
                                 "sentences")
    assert post(client, {"text": ["go " * 200] * 4}).status_code == 200  # without: fine
    # refused after decoding when only the translation's length tells
    hyp = direct.translate([engine.encode("I won !")])[0]
    cells = engine.attention_cells(3, len(hyp.tokens) + 1)
    assert engine.attention_cells(3, 1) < cells
    for cap, status in ((cells - 1, 413), (cells, 200)):  # the documented constant, smaller
        monkeypatch.setattr(serve_engine, "MAX_ATTENTION_CELLS", cap)
        assert client.get("/health").json()["limits"]["max_attention_cells"] == cap
        r = post(client, {"text": ["I won !"], "beam": 1, "attention": True})
        assert r.status_code == status
        if status == 413:
            assert r.json()["error"] == (f"attention: {cells} weights (layers x heads x "
                                         f"queries x keys); at most {cap} per request: send "
                                         "fewer or shorter sentences")
        else:
            assert _cells(r.json()["translations"][0]["attention"]) == cells


def test_json_content_type_is_required(client):
    body = json.dumps({"text": ["go ."]}).encode()
    for ctype, status in (("application/json", 200), ("application/json; charset=utf-8", 200),
                          ("text/plain", 415), (None, 415), ("multipart/form-data; b=x", 415)):
        headers = {"Content-Type": ctype} if ctype else {}
        r = client.post("/translate", content=body, headers=headers)
        assert r.status_code == status, (ctype, r.text)
        if status == 415:
            assert r.json()["error"].startswith(
                "the body's Content-Type must be application/json or "
                "application/x-www-form-urlencoded")
    # a form body is LibreTranslate's request: without q it is refused as LibreTranslate does
    r = client.post("/translate", data={"text": "go ."})
    assert r.status_code == 400 and r.json() == {"error": "Invalid request: missing q parameter"}


def test_foreign_host_headers_are_refused(engine):
    from d2l_transformer.serve.middleware import allowed_hosts_for

    assert allowed_hosts_for("127.0.0.1") == ["127.0.0.1", "[::1]", "localhost"]
    assert allowed_hosts_for("localhost") == ["127.0.0.1", "[::1]", "localhost"]
    assert allowed_hosts_for("::1") == ["127.0.0.1", "[::1]", "localhost"]
    assert allowed_hosts_for("0.0.0.0") == ["*"]
    assert allowed_hosts_for("0.0.0.0", ["mt.example.org"]) == ["mt.example.org"]
    assert allowed_hosts_for("192.168.1.5") == ["192.168.1.5"]
    app = create_app(engine)  # the default: loopback names, any port
    for base, status in (("http://127.0.0.1:8000", 200), ("http://localhost:1234", 200),
                         ("http://[::1]:8000", 200), ("http://attacker.example", 400),
                         ("http://127.0.0.1.attacker.example:8000", 400)):
        with TestClient(app, base_url=base) as c:
            r = c.get("/health")
            assert r.status_code == status, base
            if status == 400:  # as every bad request: one line of JSON, the host not echoed
                assert r.json() == {"error": "Invalid host header: not a name this server "
                                             "answers to (its --host or --allowed-hosts)"}
                assert post(c, {"text": ["go ."]}).json() == r.json()
    with TestClient(create_app(engine, allowed_hosts=["*"]), base_url="http://any.example") as c:
        assert c.get("/health").status_code == 200
    app = create_app(engine, allowed_hosts=["*.example.org", "www.mt.example"])
    for base, status in (("http://mt.example.org", 200), ("http://a.b.example.org:80", 200),
                         ("http://example.org", 400), ("http://www.mt.example", 200),
                         ("http://mt.example", 400)):  # no redirect to www. either
        with TestClient(app, base_url=base, follow_redirects=False) as c:
            assert c.get("/health").status_code == status, base


def test_the_body_limit_is_linear_and_has_a_deadline():
    """Many tiny chunks are counted, not concatenated, and refused as soon as they pass the
    limit; a body that stalls is answered 408."""
    import asyncio

    from d2l_transformer.serve.middleware import BodyLimit

    def run(chunks, max_body, seconds=30, stall=False):
        seen, sent = [], []

        async def app(scope, receive, send):
            seen.append((await receive())["body"])

        async def receive():
            if stall and len(received) == 2:
                await asyncio.sleep(60)
            received.append(1)
            return {"type": "http.request", "body": chunks[len(received) - 1],
                    "more_body": len(received) < len(chunks)}

        async def send(message):
            sent.append(message)

        received = []
        scope = {"type": "http", "headers": []}
        asyncio.run(BodyLimit(app, max_body, seconds)(scope, receive, send))
        return seen, sent, len(received)

    chunks = [b"abcd"] * (1 << 16)  # 256 KiB in 4-byte chunks
    seen, sent, read = run(chunks, max_body=(1 << 18) - 1)
    assert seen == [] and sent[0]["status"] == 413 and read == 1 << 16
    assert json.loads(sent[1]["body"]) == {"error": "request body over 262143 bytes"}
    seen, sent, read = run(chunks, max_body=1 << 18)
    assert seen == [b"abcd" * (1 << 16)] and sent == []
    seen, sent, read = run([b"a"] * 10, max_body=100, seconds=0.2, stall=True)
    assert seen == [] and sent[0]["status"] == 408
    assert json.loads(sent[1]["body"]) == {"error": "request body not received within 0.2 s"}


def test_a_closed_or_dead_engine_answers_at_once(model_dir):
    from d2l_transformer.serve.engine import Unavailable

    engine = Engine(model_dir, "cpu", engine="mxnet")
    with TestClient(create_app(engine), base_url=BASE) as c:
        assert c.get("/health").json()["status"] == "ok"
        real = engine._thread
        dead = threading.Thread(target=lambda: None)
        dead.start()
        dead.join()
        engine._thread = dead  # the worker thread has died
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json() == {"status": "unavailable", "error": "the model's worker thread has stopped"}
        r = post(c, {"text": ["go ."]})
        assert r.status_code == 503
        assert r.json() == {"error": "the model's worker thread has stopped"}
        engine._thread = real
        engine.close()
        with pytest.raises(Unavailable, match="the server is shutting down"):
            engine.submit(["Go ."], [["go", "."]], beam=1)  # at once, never queued
        r = post(c, {"text": ["go ."]})
        assert r.status_code == 503 and r.json() == {"error": "the server is shutting down"}
        assert c.get("/health").status_code == 503


def test_work_taken_by_a_worker_that_dies_fails_at_once(model_dir, monkeypatch):
    from d2l_transformer.serve.engine import Unavailable

    engine = Engine(model_dir, "cpu", engine="mxnet")

    def dies(jobs):
        raise SystemExit("the worker thread ends")  # not an Exception: the thread itself ends

    monkeypatch.setattr(engine, "_serve", dies)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # expected: no report
    future = engine.submit(["Go ."], [["go", "."]], beam=1)
    with pytest.raises(Unavailable, match="^the model's worker thread has stopped$"):
        future.result(60)
    engine._thread.join(60)
    assert not engine.alive()
    with pytest.raises(Unavailable):
        engine.submit(["Go ."], [["go", "."]], beam=1)
    engine.close()  # and closing a dead engine returns


def test_a_full_queue_is_429(engine, monkeypatch):
    monkeypatch.setattr(engine, "max_pending", 0)
    with TestClient(create_app(engine), base_url=BASE) as c:
        r = post(c, {"text": ["go ."]})
    assert r.status_code == 429 and r.json() == {"error": "0 sentences are waiting; retry later"}
    assert r.headers["retry-after"] == "1"


def test_the_api_key_guards_our_requests_too(engine):
    with TestClient(create_app(engine, api_key="s3cret"), base_url=BASE) as c:
        r = post(c, {"text": ["go ."]})
        assert r.status_code == 403 and r.json() == {"error": "this server needs an api_key"}
        r = post(c, {"text": ["go ."], "api_key": "wrong"})
        assert r.status_code == 403 and r.json() == {"error": "Invalid API key"}
        assert post(c, {"text": ["go ."], "api_key": "s3cret"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200


def test_an_exact_chapter_model_is_refused_in_one_line(tmp_path, capsys):
    import io

    import mxnet as mx

    from d2l_transformer.cli import commands as cli
    from d2l_transformer.config import CHAPTER
    from d2l_transformer.serve import ServeError
    from d2l_transformer.training.run import train_model

    out = str(tmp_path / "exact")
    train_model(CHAPTER.replace(num_epochs=1, exact_chapter=True), out, ctx=mx.cpu(),
                progress=False, preset="chapter", log=io.StringIO())
    message = (f"{out}: the server needs the corrected model; this one was trained with "
               "--exact-chapter (the book's bugs); translate it with d2l-transformer translate "
               f"--model {out}")
    with pytest.raises(ServeError) as e:
        Engine(out, "cpu", engine="mxnet")
    assert str(e.value) == message
    assert cli.main(["serve", "--model", out, "--port", "0"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_serve_options_reach_the_server(monkeypatch):
    from d2l_transformer import serve
    from d2l_transformer.cli import commands as cli

    calls = []
    monkeypatch.setattr(serve, "run", lambda *a, **k: calls.append((a, k)))
    monkeypatch.delenv("D2L_TRANSFORMER_API_KEY", raising=False)
    assert cli.main(["serve", "--model", "m", "--host", "0.0.0.0", "--allowed-hosts",
                     "mt.example.org, 10.0.0.2", "--api-key", "k"]) == 0
    assert calls[-1] == (("m", "0.0.0.0", 8000, "auto"),
                         {"allowed_hosts": ["mt.example.org", "10.0.0.2"], "api_key": "k",
                          "engine": "auto", "engine_threads": 0, "compute_type": None})
    monkeypatch.setenv("D2L_TRANSFORMER_API_KEY", "from-env")
    assert cli.main(["serve", "--model", "m", "--engine", "ctranslate2", "--engine-threads",
                     "3", "--compute-type", "int8"]) == 0
    assert calls[-1][1] == {"allowed_hosts": None, "api_key": "from-env", "engine": "ctranslate2",
                            "engine_threads": 3, "compute_type": "int8"}
