"""Row (g) of scripts/bench.py: ``d2l-transformer serve`` on loopback under concurrent clients,
then a bad-request storm (docs/serving.md)."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import SERVE_MODEL_ENV


def _serving_sizes(quick):
    import d2l_transformer as d2t
    if quick:
        return dict(cfg=d2t.TINY, clients=4, requests=60, storm=120, after=20)
    return dict(cfg=d2t.CHAPTER, clients=8, requests=2000, storm=400, after=200)


def _serving_bad_requests():
    """``[(method, path, body, expected status)]``: one of each kind of bad request."""
    big = json.dumps({"text": ["go . " * 220000]}).encode()  # over the 1 MB cap
    return [("POST", "/translate", b'{"text": ["go ."', 400),
            ("POST", "/translate", b'\xff\xfe{"text": ["go ."]}', 400),
            ("POST", "/translate", b"[" * 50000, 400),
            ("POST", "/translate", b'["go ."]', 422),
            ("POST", "/translate", b'{"beam": 4}', 422),
            ("POST", "/translate", b'{"text": "go ."}', 422),
            ("POST", "/translate", b'{"text": ["go .", 7]}', 422),
            ("POST", "/translate", b'{"text": []}', 422),
            ("POST", "/translate", b'{"text": ["   "]}', 422),
            ("POST", "/translate", b'{"text": ["go ."], "beam": 99}', 422),
            ("POST", "/translate", b'{"text": ["go ."], "beam": true}', 422),
            ("POST", "/translate", json.dumps({"text": ["go ."] * 1000}).encode(), 413),
            ("POST", "/translate", json.dumps({"text": ["go " * 600]}).encode(), 413),
            ("POST", "/translate", big, 413),
            ("GET", "/translate", None, 405),
            ("POST", "/nowhere", b"{}", 404)]


class _Client:
    """One keep-alive HTTP/1.1 connection (http.client); reconnects after the server closed it."""

    def __init__(self, port):
        self.port, self.conn = port, None

    def send(self, method, path, body=None):
        import http.client
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            try:
                headers = {"Content-Type": "application/json"} if body is not None else {}
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                if response.getheader("connection", "").lower() == "close":
                    self.close()
                return response.status, data
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def serving_row(quick):
    """(g) ``d2l-transformer serve`` in its own process on loopback; `clients` threads, each on
    a keep-alive connection, send `requests` one-sentence requests (beam 4, training sentences).
    Figures: requests/s, p50/p99 latency, errors (a failed request, a non-200, or a translation
    other than the server's answer to that sentence sent alone before the load), the mean
    micro-batch. Then the bad-request storm: `storm` malformed requests of every kind, one good
    request after every 3 bad ones, and `after` good requests: every bad one must get its 4xx,
    every good one its translation."""
    import concurrent.futures
    import io
    import socket
    import threading

    from d2l_transformer import checkpoint
    from d2l_transformer.data import preprocess_nmt, read_data_nmt, tokenize_nmt
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return float("nan"), {"skipped": "the serve extra is not installed"}
    z = _serving_sizes(quick)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.environ.get(SERVE_MODEL_ENV)
        if not model_dir:
            import mxnet as mx

            from d2l_transformer.training.run import train_model
            model_dir = os.path.join(tmp, "model")
            train_model(z["cfg"], model_dir, ctx=mx.cpu(), progress=False, log=io.StringIO())
        cfg = checkpoint.load_config(model_dir)
        source, _ = tokenize_nmt(preprocess_nmt(read_data_nmt()), cfg.num_examples)
        sentences = sorted({" ".join(tokens) for tokens in source})[:200]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        log = open(os.path.join(tmp, "server.log"), "w")
        server = subprocess.Popen([sys.executable, "-m", "d2l_transformer.cli", "serve", "--model",
                                   model_dir, "--port", str(port), "--ctx", "cpu"],
                                  stdout=log, stderr=subprocess.STDOUT)
        local = threading.local()

        def send(method, path, body=None):
            if not hasattr(local, "client"):
                local.client = _Client(port)
            return local.client.send(method, path, body)

        def translate(sentence):
            status, data = send("POST", "/translate",
                                json.dumps({"text": [sentence], "beam": 4}).encode())
            return json.loads(data)["translations"][0]["translation"] if status == 200 else None

        try:
            deadline = time.time() + 300
            while True:
                try:
                    if _Client(port).send("GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the server did not start:\n" + open(log.name).read()[-2000:])
                time.sleep(0.2)
            expected = {s: translate(s) for s in sentences}  # one at a time, before the load
            before = json.loads(send("GET", "/health")[1])

            def good(i):
                sentence = sentences[i % len(sentences)]
                tic = time.perf_counter()
                try:
                    ok = translate(sentence) == expected[sentence]
                except OSError:
                    ok = False
                return ok, time.perf_counter() - tic

            with concurrent.futures.ThreadPoolExecutor(z["clients"]) as pool:
                tic = time.perf_counter()
                load = list(pool.map(good, range(z["requests"])))
                seconds = time.perf_counter() - tic
                after_load = json.loads(send("GET", "/health")[1])
                bad = _serving_bad_requests()

                def storm(i):  # 3 bad, 1 good, ...
                    if i % 4 == 3:
                        return "good", good(i)[0]
                    method, path, body, status = bad[(i - i // 4) % len(bad)]
                    try:
                        got, data = send(method, path, body)
                        return "bad", got == status and "error" in json.loads(data)
                    except OSError:
                        return "bad", False

                stormed = list(pool.map(storm, range(z["storm"] * 4 // 3)))
                afterwards = list(pool.map(good, range(z["after"])))
        finally:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
    latencies = sorted(t for _, t in load)
    batches = after_load["batches"] - before["batches"]
    sentences_done = after_load["sentences"] - before["sentences"]
    bad_ok = [ok for kind, ok in stormed if kind == "bad"]
    good_ok = [ok for kind, ok in stormed if kind == "good"] + [ok for ok, _ in afterwards]
    extra = {"clients": z["clients"], "requests": len(load), "seconds": seconds,
             "p50_ms": 1000 * statistics.median(latencies),
             "p99_ms": 1000 * statistics.quantiles(latencies, n=100, method="inclusive")[98],
             "errors": sum(not ok for ok, _ in load),
             "mean_batch": sentences_done / max(batches, 1),
             "storm_bad": len(bad_ok), "storm_bad_wrong": sum(not ok for ok in bad_ok),
             "storm_good": len(good_ok), "storm_good_wrong": sum(not ok for ok in good_ok),
             "model": os.path.basename(os.path.normpath(model_dir)), "beam": 4}
    extra["detail"] = (f"{extra['clients']} clients, {extra['requests']} requests: p50 "
                       f"{extra['p50_ms']:.0f} ms, p99 {extra['p99_ms']:.0f} ms, errors "
                       f"{extra['errors']}, mean micro-batch {extra['mean_batch']:.1f}; storm: "
                       f"{extra['storm_bad']} bad requests, {extra['storm_bad_wrong']} without "
                       f"their 4xx; {extra['storm_good']} good ones, {extra['storm_good_wrong']} "
                       "wrong")
    if extra["errors"] or extra["storm_bad_wrong"] or extra["storm_good_wrong"]:
        raise RuntimeError("serving: " + extra["detail"])
    return len(load) / seconds, extra
