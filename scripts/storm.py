#!/usr/bin/env python
"""A storm of hostile requests, mixed with good ones, against ``d2l-transformer serve`` running
in its own process on the loopback (docs/serving.md, "Hostile requests").

Hostile: malformed JSON, wrong types, lone surrogates (JSON and form), bodies over the limit
(by Content-Length and chunked), attention requests over the cell cap (refused before and after
decoding), wrong or missing content types, foreign Host headers, a bad Content-Length, bodies
that stall and request heads sent a byte a second (both answered 408 after the server's
deadlines) and bodies sent slowly but in time; LibreTranslate requests
with a wrong language or format. Good: our API's and LibreTranslate's requests (JSON and form)
whose translations must equal the server's answer to the same sentence sent alone before the
storm, and small attention requests. The count and the time are bounded (``--requests``,
``--seconds``); the server only listens on 127.0.0.1.

Reported: requests by kind, answers 5xx (target 0), hostile requests without their expected
4xx, good requests with a wrong or no answer (target 0), the server's peak resident memory
(VmHWM of /proc/PID/status) and its resident memory after start-up.

    scripts/storm.py [--model DIR] [--requests 2000] [--clients 8] [--seconds 600] [--json F]
"""

import argparse
import concurrent.futures
import http.client
import io
import json
import os
import random
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

SENTENCES = ["Go .", "I won !", "I'm OK .", "Hi .", "Run !", "Help !", "I lost .", "Stop !",
             "I'm home .", "He's calm ."]
JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None,
                   help="the model directory to serve (default: a chapter model trained 2 "
                        "epochs into a temporary directory)")
    p.add_argument("--requests", type=int, default=2000, help="requests in the storm")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients")
    p.add_argument("--seconds", type=float, default=600, help="stop sending after this time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    return p


def send(port, method, path, body=None, headers=None, host=None, chunked=False, timeout=120):
    """``(status, body bytes)`` of one request on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or f"127.0.0.1:{port}")
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if chunked:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for start in range(0, len(body), 65536):
                piece = body[start:start + 65536]
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        else:
            if body is not None and "Content-Length" not in (headers or {}):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    except (ConnectionError, http.client.HTTPException, socket.timeout) as e:
        return None, str(e).encode()  # a hostile body may be cut off once answered
    finally:
        conn.close()


def slow(port, body, pause, stall=False, timeout=120):
    """Send `body` one byte every `pause` seconds (or two bytes, then nothing); the status."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                  % len(body))
        try:
            for i in range(2 if stall else len(body)):
                s.sendall(body[i:i + 1])
                time.sleep(pause)
        except OSError:
            return None, b""
        return answer(s)


def answer(s):
    """``(status, body)`` of what the server sends on socket `s` until it closes it."""
    data = b""
    try:
        while True:
            part = s.recv(65536)
            if not part:
                break
            data += part
    except OSError:
        pass
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else None
    return status, data.split(b"\r\n\r\n", 1)[-1]


def slow_head(port, pause=1.0, timeout=120):
    """A request head sent one byte every `pause` seconds (slowloris), until the server answers
    or closes: ``(status, body)``."""
    head = (b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nContent-Length: 2\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        for i in range(len(head) - 4):  # never the end of the head
            if select.select([s], [], [], pause)[0]:  # answered or closed: stop writing
                break
            s.sendall(head[i:i + 1])
        return answer(s)


def hostile():
    """``[(name, request kwargs for `send`, expected status)]``."""
    big = json.dumps({"text": ["go ."] * 300000}).encode()  # 2.4 MB
    long_sources = json.dumps({"text": ["go " * 200] * 4, "attention": True}).encode()
    # 128 sources of 30 tokens: at least 953,344 weights (a one-token translation), over the
    # 1,000,000 cap from a two-token translation on: refused after decoding
    after = json.dumps({"text": [" ".join(["i", "won", "!"] * 10)] * 128, "attention": True})
    lt = {"q": "Go .", "source": "en", "target": "fr"}
    return [
        ("malformed JSON", dict(body=b'{"text": ["go ."', headers=JSON), 400),
        ("not UTF-8", dict(body=b'{"text": ["\xff\xfe go"]}', headers=JSON), 400),
        ("nested too deeply", dict(body=b"[" * 100000, headers=JSON), 400),
        ("wrong type: text a string", dict(body=b'{"text": "go ."}', headers=JSON), 422),
        ("wrong type: beam a string", dict(body=b'{"text": ["go ."], "beam": "4"}',
                                           headers=JSON), 422),
        ("wrong type: a number in text", dict(body=b'{"text": ["go .", 7]}', headers=JSON), 422),
        ("unknown field", dict(body=b'{"text": ["go ."], "beam_size": 4}', headers=JSON), 422),
        ("lone surrogate (JSON)", dict(body=b'{"text": ["go . \\ud800"]}', headers=JSON), 422),
        ("lone surrogate in a key", dict(body=b'{"text": ["go ."], "\\udc80": 1}',
                                         headers=JSON), 422),
        ("lone surrogate (form)", dict(body=b"q=go%20.%ED%A0%80&source=en&target=fr",
                                       headers=FORM), 400),
        ("lone surrogate (LibreTranslate JSON)", dict(
            body=b'{"q": "go . \\ud800", "source": "en", "target": "fr"}', headers=JSON), 422),
        ("huge body (Content-Length)", dict(body=big, headers=JSON), 413),
        ("huge body (chunked)", dict(body=big, headers=JSON, chunked=True), 413),
        ("bad Content-Length", dict(body=b"{}", headers={**JSON, "Content-Length": "12x"}), 400),
        ("too many sentences", dict(body=json.dumps({"text": ["go ."] * 300}).encode(),
                                    headers=JSON), 413),
        ("sentence too long", dict(body=json.dumps({"text": ["go " * 400]}).encode(),
                                   headers=JSON), 413),
        ("huge attention (refused before decoding)", dict(body=long_sources, headers=JSON), 413),
        ("huge attention (refused after decoding)", dict(body=after.encode(), headers=JSON), 413),
        ("text/plain body", dict(body=b'{"text": ["go ."]}',
                                 headers={"Content-Type": "text/plain"}), 415),
        ("no Content-Type", dict(body=b'{"text": ["go ."]}'), 415),
        ("multipart body", dict(body=b"--x\r\n\r\n--x--", headers={
            "Content-Type": "multipart/form-data; boundary=x"}), 415),
        ("foreign Host header", dict(body=b'{"text": ["go ."]}', headers=JSON,
                                     host="attacker.example"), 400),
        ("foreign Host (rebinding name)", dict(body=b"q=Go%20.&source=en&target=fr",
                                               headers=FORM, host="127.0.0.1.nip.io:8000"), 400),
        ("LibreTranslate: wrong source", dict(body=json.dumps({**lt, "source": "de"}).encode(),
                                              headers=JSON), 400),
        ("LibreTranslate: html", dict(body=json.dumps({**lt, "format": "html"}).encode(),
                                      headers=JSON), 400),
        ("LibreTranslate: no q", dict(body=b"source=en&target=fr", headers=FORM), 400),
        ("unknown path", dict(method="POST", path="/nowhere", body=b"{}", headers=JSON), 404),
        ("wrong method", dict(method="GET", path="/translate"), 405),
    ]


def serve(model_dir, port, log):
    return subprocess.Popen([sys.executable, "-m", "d2l_transformer.cli", "serve", "--model",
                             model_dir, "--port", str(port), "--ctx", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT)


def memory(pid):
    """``{"VmHWM": kB, "VmRSS": kB}`` of a process (Linux)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                out[name] = int(value.split()[0])
    return out


def storm(args, model_dir, tmp):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(tmp, "server.log"), "w")
    server = serve(model_dir, port, log)
    try:
        deadline = time.time() + 300
        while send(port, "GET", "/health")[0] != 200:
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit("the server did not start:\n" + open(log.name).read()[-2000:])
            time.sleep(0.2)

        def ours(sentence):
            status, data = send(port, "POST", "/translate", json.dumps(
                {"text": [sentence], "beam": 4}).encode(), JSON)
            return json.loads(data)["translations"][0]["translation"] if status == 200 else None

        expected = {s: ours(s) for s in SENTENCES}  # one at a time, before the storm
        started = memory(server.pid)

        def good(i):
            sentence = SENTENCES[i % len(SENTENCES)]
            kind = ("ours", "libre JSON", "libre form", "attention")[i % 4]
            if kind == "ours":
                status, data = send(port, "POST", "/translate", json.dumps(
                    {"text": [sentence], "beam": 4}).encode(), JSON)
                get = lambda d: d["translations"][0]["translation"]  # noqa: E731
            elif kind == "attention":
                status, data = send(port, "POST", "/translate", json.dumps(
                    {"text": [sentence], "beam": 4, "attention": True}).encode(), JSON)
                get = lambda d: d["translations"][0]["translation"] if \
                    d["translations"][0]["attention"]["out_tokens"][-1] == "<eos>" else None  # noqa: E731
            else:
                fields = {"q": sentence, "source": "en", "target": "fr"}
                body = json.dumps(fields).encode() if kind == "libre JSON" else \
                    "&".join(f"{k}={v}" for k, v in fields.items()).replace(" ", "+").encode()
                status, data = send(port, "POST", "/translate", body,
                                    JSON if kind == "libre JSON" else FORM)
                get = lambda d: d["translatedText"]  # noqa: E731
            try:
                ok = status == 200 and get(json.loads(data)) == expected[sentence]
            except (ValueError, KeyError, IndexError, TypeError):
                ok = False
            return "good: " + kind, status, ok

        bad = hostile()

        def one(job):
            i, what = job
            if what == "good":
                return good(i)
            if what == "slow":  # a whole body, a byte every 0.05 s: served
                status, data = slow(port, json.dumps({"text": [SENTENCES[0]]}).encode(), 0.05)
                ok = status == 200 and json.loads(data)["translations"][0]["translation"] == \
                    expected[SENTENCES[0]]
                return "good: slow body", status, ok
            if what in ("stall", "slow head"):  # 408 after the server's deadlines
                status, data = (slow(port, b'{"text": ["go ."]}', 0.1, stall=True)
                                if what == "stall" else slow_head(port))
                return "hostile: " + ("stalled body" if what == "stall" else "slow head"), \
                    status, status == 408 and "error" in json.loads(data or b"{}")
            name, request, want = bad[what]
            request = dict(request)
            status, data = send(port, request.pop("method", "POST"),
                                request.pop("path", "/translate"), **request)
            ok = status == want
            if ok:  # {"error": ...}
                try:
                    ok = "error" in json.loads(data)
                except ValueError:
                    ok = False
            return "hostile: " + name, status, ok

        rng = random.Random(args.seed)
        jobs = []
        for i in range(args.requests):  # 1 good for 2 hostile; a few slow and stalled bodies,
            r = rng.random()  # and slow heads
            jobs.append((i, "good" if r < 1 / 3 else "slow" if r < 0.345 else
                         "stall" if r < 0.35 else "slow head" if r < 0.355 else
                         rng.randrange(len(bad))))
        results, stop = [], time.time() + args.seconds
        lock = threading.Lock()

        def run(job):
            if time.time() > stop:
                return None
            result = one(job)
            with lock:
                results.append(result)
            return result

        tic = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(run, jobs))
        seconds = time.time() - tic
        after = {s: ours(s) for s in SENTENCES}  # and the server still answers as before
        peak = memory(server.pid)
        health = json.loads(send(port, "GET", "/health")[1])
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    kinds = {}
    for kind, status, ok in results:
        k = kinds.setdefault(kind, {"sent": 0, "wrong": 0, "statuses": {}})
        k["sent"] += 1
        k["wrong"] += not ok
        k["statuses"][str(status)] = k["statuses"].get(str(status), 0) + 1
    return {
        "requests": len(results), "seconds": round(seconds, 1), "clients": args.clients,
        "answers_5xx": sum(1 for _, s, _ in results if s is not None and s >= 500),
        "no_answer": sum(1 for _, s, _ in results if s is None),
        "hostile": sum(1 for k, _, _ in results if k.startswith("hostile")),
        "hostile_without_their_4xx": sum(1 for k, _, ok in results
                                         if k.startswith("hostile") and not ok),
        "good": sum(1 for k, _, _ in results if k.startswith("good")),
        "good_wrong": sum(1 for k, _, ok in results if k.startswith("good") and not ok),
        "answers_unchanged_after": after == expected,
        "server_rss_after_start_mb": round(started["VmRSS"] / 1024, 1),
        "server_peak_rss_mb": round(peak["VmHWM"] / 1024, 1),
        "model_calls": health.get("batches"), "kinds": kinds}


def main(argv=None):
    args = get_parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            import mxnet as mx

            from d2l_transformer.config import CHAPTER
            from d2l_transformer.training.run import train_model
            model_dir = os.path.join(tmp, "model")
            train_model(CHAPTER.replace(num_epochs=2), model_dir, ctx=mx.cpu(), progress=False,
                        preset="chapter", log=io.StringIO())
        figures = storm(args, model_dir, tmp)
    for kind, k in sorted(figures["kinds"].items()):
        print(f"  {kind:45s} {k['sent']:5d} sent, {k['wrong']:3d} wrong; statuses {k['statuses']}")
    print(json.dumps({k: v for k, v in figures.items() if k != "kinds"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 1 if figures["answers_5xx"] or figures["good_wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
