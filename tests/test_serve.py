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

from d2l_transformer.inference.translator import Translator  # noqa: E402
from d2l_transformer.io import checkpoint  # noqa: E402
from d2l_transformer.serve.app import create_app  # noqa: E402
from d2l_transformer.serve.engine import Engine  # noqa: E402

BASE = "http://127.0.0.1:8000"  # a Host header the loopback allow-list answers
SENTENCES = ["Go .", "I won !", "I'm OK .", "Hi .", "Run !", "Help !", "I lost .", "Stop !"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return train_small_model(str(tmp_path_factory.mktemp("serve") / "model"))


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = Engine(model_dir, "cpu")
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


def test_limits_of_the_model_and_the_body(engine, direct):
    # with the server's own caps lifted, the model's positions are the limit
    app = create_app(engine, max_chars=10 ** 6, max_tokens=10 ** 6, max_body=1 << 20)
    with TestClient(app, base_url=BASE) as client:
        r = post(client, {"text": ["go " * 1001]})
        assert r.status_code == 413
        assert r.json()["error"] == "text[0]: 1001 tokens; at most 1000 (the model's positions)"
        # a streamed (chunked) body is counted as it arrives
        chunks = (b" " * 65536 for _ in range(20))
        r = client.post("/translate", content=chunks, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json() == {"error": "request body over 1048576 bytes"}
        r = client.post("/translate", content=b"{}", headers={"Content-Length": "12x"})
        assert r.status_code == 413
        assert good(client, ["go ."], beam=1) == [" ".join(direct.translate([["go", "."]])[0].tokens)]


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
    assert set(body["schema"]["properties"]) == {"text", "beam", "attention", "api_key"}
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
    from d2l_transformer import cli

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
