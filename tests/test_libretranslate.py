"""LibreTranslate's API on the server (`d2l_transformer.serve.app`): the request and answer
shapes of LibreTranslate's own ``/translate``, ``/languages`` and ``/detect``
(LibreTranslate/LibreTranslate, libretranslate/app.py), through FastAPI's TestClient, and
through the real ``libretranslatepy`` client against ``d2l-transformer serve`` running in its
own process."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from browser import free_port, read_until_closed, train_small_model  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from d2l_transformer.serve.app import create_app  # noqa: E402
from d2l_transformer.serve.engine import Engine  # noqa: E402

BASE = "http://127.0.0.1:8000"
KEY = "k3y-for-tests"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return train_small_model(str(tmp_path_factory.mktemp("libre") / "model"))


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = Engine(model_dir, "cpu", engine="mxnet")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine), base_url=BASE, raise_server_exceptions=False) as c:
        yield c


def ours(client, sentences, beam=4):
    r = client.post("/translate", json={"text": sentences, "beam": beam})
    assert r.status_code == 200, r.text
    return [t["translation"] for t in r.json()["translations"]]


def test_translate_json_and_form_answer_as_our_api(client):
    expected = ours(client, ["I won !", "Go ."])
    r = client.post("/translate", json={"q": "I won !", "source": "en", "target": "fr"})
    assert r.status_code == 200 and r.json() == {"translatedText": expected[0]}
    r = client.post("/translate", json={"q": ["I won !", "Go ."], "source": "en", "target": "fr",
                                        "format": "text"})
    assert r.json() == {"translatedText": expected}
    r = client.post("/translate", data={"q": "Go .", "source": "en", "target": "fr"})
    assert r.status_code == 200 and r.json() == {"translatedText": expected[1]}
    # several lines: each one sentence, blank lines kept
    r = client.post("/translate", data={"q": "I won !\r\n\r\nGo .", "source": "en",
                                        "target": "fr"})
    assert r.json() == {"translatedText": f"{expected[0]}\n\n{expected[1]}"}
    r = client.post("/translate", json={"q": "I won !", "source": "auto", "target": "fr"})
    assert r.json() == {"translatedText": expected[0],
                        "detectedLanguage": {"confidence": 0.0, "language": "en"}}


def test_alternatives_are_the_beams_next_best(client, engine):
    r = client.post("/translate", json={"q": "I won !", "source": "en", "target": "fr",
                                        "alternatives": 3})
    body = r.json()
    assert set(body) == {"translatedText", "alternatives"}
    hyps = engine.translator.translate([engine.encode("I won !")], beam_size=4, n_best=4)[0]
    texts = [engine.tokenizer.decode(list(h.tokens)) for h in hyps]
    assert body["translatedText"] == texts[0] == ours(client, ["I won !"])[0]
    assert body["alternatives"] == [t for i, t in enumerate(texts[1:])
                                    if t != texts[0] and t not in texts[1:i + 1]]
    assert len(body["alternatives"]) == 3 and [h.score for h in hyps] == sorted(
        [h.score for h in hyps], reverse=True)
    r = client.post("/translate", data={"q": "Go .", "source": "en", "target": "fr",
                                        "alternatives": "2"})
    assert len(r.json()["alternatives"]) == 2
    r = client.post("/translate", json={"q": ["Go .", "I won !"], "source": "en",
                                        "target": "fr", "alternatives": 1})
    assert [len(a) for a in r.json()["alternatives"]] == [1, 1]


def test_our_api_returns_the_n_best_with_their_scores(client, engine):
    r = client.post("/translate", json={"text": ["I won !", "Go ."], "beam": 2, "nbest": 3})
    assert r.status_code == 200, r.text
    items = r.json()["translations"]
    hyps = engine.translator.translate([engine.encode("I won !"), engine.encode("Go .")],
                                       beam_size=3, n_best=3)
    for item, best in zip(items, hyps):
        assert [h["translation"] for h in item["nbest"]] == [
            engine.tokenizer.decode(list(h.tokens)) for h in best]
        assert [h["score"] for h in item["nbest"]] == [round(h.score, 4) for h in best]
        assert [h["log_prob"] for h in item["nbest"]] == [round(h.log_prob, 4) for h in best]
        assert item["nbest"][0] == {k: item[k] for k in ("translation", "score", "log_prob")}
    r = client.post("/translate", json={"text": ["Go ."]})
    assert "nbest" not in r.json()["translations"][0]
    r = client.post("/translate", json={"text": ["Go ."], "nbest": 1000})
    assert r.status_code == 422 and r.json()["error"].startswith("nbest: ")


def test_alternatives_over_http_from_a_running_server(engine):
    """uvicorn on loopback, asked as LibreTranslate's clients ask (libretranslatepy's
    ``translate`` has no ``alternatives``: raw HTTP, as its own requests are made)."""
    from browser import ServerThread

    server = ServerThread(create_app(engine))
    try:
        def post(body):
            req = urllib.request.Request(server.url + "/translate", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())
        status, body = post({"q": "I won !", "source": "en", "target": "fr", "alternatives": 2})
        hyps = engine.translator.translate([engine.encode("I won !")], beam_size=4, n_best=3)[0]
        texts = [engine.tokenizer.decode(list(h.tokens)) for h in hyps]
        assert status == 200 and body["translatedText"] == texts[0]
        assert body["alternatives"] == [t for t in texts[1:] if t != texts[0]]
        assert post({"q": "Go .", "source": "en", "target": "fr", "alternatives": 1000}) == (
            400, {"error": "Invalid request: alternatives parameter must be <= 15"})
    finally:
        server.stop()


BAD = [
    ({"source": "en", "target": "fr"}, 400, "Invalid request: missing q parameter"),
    ({"q": "Go .", "target": "fr"}, 400, "Invalid request: missing source parameter"),
    ({"q": "Go .", "source": "en"}, 400, "Invalid request: missing target parameter"),
    ({"q": "Go .", "source": "fr", "target": "en"}, 400,
     "fr is not supported as source: this server translates en to fr"),
    ({"q": "Go .", "source": "en", "target": "de"}, 400,
     "de is not supported as target: this server translates en to fr"),
    ({"q": "Go .", "source": "en", "target": "\ud800"}, 400,
     "that language is not supported as target: this server translates en to fr"),
    ({"q": "<p>Go .</p>", "source": "en", "target": "fr", "format": "html"}, 400,
     "html format is not supported by this server: send plain text (format=text)"),
    ({"q": "Go .", "source": "en", "target": "fr", "format": "pdf"}, 400,
     "pdf format is not supported"),
    ({"q": "Go .", "source": "en", "target": "fr", "alternatives": "x"}, 400,
     "Invalid request: alternatives parameter is not a number"),
    ({"q": "Go .", "source": "en", "target": "fr", "alternatives": 16}, 400,
     "Invalid request: alternatives parameter must be <= 15"),
    ({"q": "Go .", "source": "en", "target": "fr", "alternatives": 1000}, 400,
     "Invalid request: alternatives parameter must be <= 15"),
    ({"q": ["Go .", 3], "source": "en", "target": "fr"}, 400,
     "Invalid request: q must be a string or a list of strings"),
    ({"q": "zzz qqq", "source": "en", "target": "fr"}, 422,
     "q: no word of it is in the model's vocabulary"),
    ({"q": ["Go .", "go . \ud800"], "source": "en", "target": "fr"}, 422,
     "q[1]: not valid Unicode (a lone surrogate at character 5)"),
    ({"q": "Go .\n" + "go " * 400, "source": "en", "target": "fr"}, 413,
     "q line 2: 1200 characters; at most 1000"),
    ({"q": ["Go ."] * 257, "source": "en", "target": "fr"}, 413,
     "q: over 256 sentences; send at most 256 per request"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_requests_are_one_line_errors(client, body, status, message):
    raw = json.dumps(body).encode()  # ensure_ascii: a lone surrogate travels as \ud800
    r = client.post("/translate", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status and r.json() == {"error": message}
    if not any(isinstance(v, list) or "\ud800" in str(v) for v in body.values()):
        r = client.post("/translate", data=body)  # the same as a form body
        assert r.status_code == status and r.json() == {"error": message}


def test_form_bodies_are_checked_too(client):
    for raw, message in ((b"q=go%20.%ED%A0%80&source=en&target=fr",
                          "the form is not UTF-8 (invalid continuation byte)"),
                         (b"&".join(b"f%d=1" % i for i in range(100)),
                          "the body is not a form (Max number of fields exceeded)")):
        r = client.post("/translate", content=raw,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 400 and r.json()["error"].startswith(message)
    r = client.post("/translate", content=b"q=" + b"a" * (1 << 20),
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413


def test_languages_and_detect(client):
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["fr"]},
        {"code": "fr", "name": "French", "targets": []}]
    for r in (client.post("/detect", json={"q": "Hello world"}),
              client.post("/detect", data={"q": "Bonjour"})):
        assert r.status_code == 200 and r.json() == [{"confidence": 0.0, "language": "en"}]
    r = client.post("/detect", json={})
    assert r.status_code == 400 and r.json() == {"error": "Invalid request: missing q parameter"}
    r = client.post("/detect", content=b"q=x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_api_key(engine):
    with TestClient(create_app(engine, api_key=KEY), base_url=BASE) as c:
        request = {"q": "Go .", "source": "en", "target": "fr"}
        for extra, status in (({}, 403), ({"api_key": "nope"}, 403), ({"api_key": KEY}, 200)):
            assert c.post("/translate", json={**request, **extra}).status_code == status
            assert c.post("/translate", data={**request, **extra}).status_code == status
            assert c.post("/detect", data={"q": "x", **extra}).status_code == status
        assert c.post("/translate", data=request).json() == {
            "error": "this server needs an api_key"}
        assert c.get("/languages").status_code == 200  # as LibreTranslate: no key needed


# ------------------------------------------------------------------------------ the real client
@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """``d2l-transformer serve`` in two processes on loopback: one open, one with an API key."""
    pytest.importorskip("libretranslatepy", reason="pip install libretranslatepy")
    logs = tmp_path_factory.mktemp("logs")
    started = []
    for name, extra in (("open", []), ("keyed", ["--api-key", KEY])):
        port = free_port()
        log = open(logs / f"{name}.log", "w")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen([sys.executable, "-m", "d2l_transformer.cli", "serve", "--engine", "mxnet",
                                 "--model",
                                 model_dir, "--port", str(port), "--ctx", "cpu"] + extra,
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        started.append((name, f"http://127.0.0.1:{port}/", proc, log))
    try:
        for _, url, proc, log in started:
            deadline = time.monotonic() + 300
            while True:
                try:
                    urllib.request.urlopen(url + "health", timeout=5).read()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(open(log.name).read()[-2000:]) from None
                    time.sleep(0.2)
        yield {name: url for name, url, _, _ in started}
    finally:
        for _, _, proc, log in started:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


@pytest.mark.slow
def test_the_real_libretranslatepy_client(servers, client):
    from libretranslatepy import LibreTranslateAPI

    expected = ours(client, ["Go .", "I won !"])
    open_api = LibreTranslateAPI(servers["open"])
    assert open_api.translate("Go .", "en", "fr") == expected[0]
    assert open_api.translate("I won !", "auto", "fr") == expected[1]
    assert open_api.languages() == [{"code": "en", "name": "English", "targets": ["fr"]},
                                    {"code": "fr", "name": "French", "targets": []}]
    assert open_api.detect("Hello") == [{"confidence": 0.0, "language": "en"}]
    with pytest.raises(urllib.error.HTTPError) as e:
        open_api.translate("Go .", "en", "es")  # the client's default target
    assert e.value.code == 400 and json.loads(e.value.read()) == {
        "error": "es is not supported as target: this server translates en to fr"}

    keyed = LibreTranslateAPI(servers["keyed"], api_key=KEY)
    assert keyed.translate("Go .", "en", "fr") == expected[0]
    assert keyed.detect("Hello") == [{"confidence": 0.0, "language": "en"}]
    assert keyed.languages()[0]["code"] == "en"
    for api in (LibreTranslateAPI(servers["keyed"]),
                LibreTranslateAPI(servers["keyed"], api_key="wrong")):
        with pytest.raises(urllib.error.HTTPError) as e:
            api.translate("Go .", "en", "fr")
        assert e.value.code == 403


@pytest.mark.slow
def test_the_served_process_answers_what_is_not_http_and_foreign_hosts_in_json(servers):
    """`d2l-transformer serve` itself (not a test client) runs `serve.connection`'s protocol
    and the JSON host check: a LibreTranslate client reads ``error`` from every refusal."""
    import socket
    import urllib.parse

    url = urllib.parse.urlsplit(servers["open"])
    for raw, status, error in (
            (b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ten\r\n\r\n",
             b"400 Bad Request", "Invalid HTTP request received."),
            (b"GET /languages HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n",
             b"400 Bad Request", "Invalid host header: not a name this server answers to (its "
                                 "--host or --allowed-hosts)")):
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(raw)
            reply = read_until_closed(sock)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 " + status), head
        assert json.loads(body) == {"error": error}
