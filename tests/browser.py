"""Headless Chromium for the browser tests: Debian's ``chromium`` and ``chromium-driver``
driven by selenium (browsers cannot be downloaded here, so no selenium-manager)."""

import os
import shutil
import socket
import sys
import tempfile
import threading
import time

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900"]
# no host name resolves and every request that is not to the loopback goes to a closed port
OFFLINE_FLAGS = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
                 "--proxy-bypass-list=<-loopback>"]


def missing():
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not found (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    return None


class Browser:
    """A fresh headless Chromium (own profile directory); ``offline=True``: no network at all
    except the loopback."""

    def __init__(self, offline=False):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        os.environ.setdefault("SE_AVOID_STATS", "true")
        self.profile = tempfile.mkdtemp(prefix="d2l-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS + (OFFLINE_FLAGS if offline else []):
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER),
                                       options=options)
        self.driver.set_page_load_timeout(60)
        if offline:  # and the DevTools switch, for what the flags miss
            self.set_offline(True)

    def set_offline(self, offline):
        """Switch this tab's network off (or back on) through the DevTools protocol."""
        self.driver.execute_cdp_cmd("Network.enable", {})
        self.driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": offline, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})

    def reachable(self, url):
        """Can the page reach `url` (any answer, CORS aside)?"""
        return self.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {mode: 'no-cors', cache: 'no-store'})"
            ".then(() => done(true), () => done(false));", url)

    def resources(self):
        """The URLs the page loaded besides itself (Resource Timing)."""
        return self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")

    def close(self):
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


def train_small_model(out, epochs=2):
    """A chapter-sized model directory trained `epochs` epochs (seconds on a CPU)."""
    import io

    import mxnet as mx

    from d2l_transformer.config import CHAPTER
    from d2l_transformer.training.run import train_model

    train_model(CHAPTER.replace(num_epochs=epochs), out, ctx=mx.cpu(), progress=False,
                preset="chapter", log=io.StringIO())
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_until_closed(sock):
    """Every byte a server sends on `sock` until it closes the connection."""
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


class ServerThread:
    """uvicorn serving `app` on a free loopback port, in a thread of this process, with the
    connections of `serve` (`serve.connection.protocol`; `http`: another class or its
    `head_seconds`)."""

    def __init__(self, app, http=None):
        import uvicorn

        from d2l_transformer.serve.connection import protocol

        if not isinstance(http, type):
            http = protocol() if http is None else protocol(http)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", http=http))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


def screenshot(model_dir, path, sentence="I won !", kind="cross", layer=1, head=3):
    """The served page after translating `sentence`, one head selected and a cell hovered, as a
    PNG (docs/figures/explorer.png: ``python tests/browser.py out/chapter docs/figures/explorer.png``)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from d2l_transformer.serve.app import create_app
    from d2l_transformer.serve.engine import Engine

    engine = Engine(model_dir, "cpu", engine="mxnet")
    server, browser = ServerThread(create_app(engine)), Browser()
    try:
        d = browser.driver
        d.set_window_size(1280, 880)
        d.get(server.url + "/")
        box = d.find_element(By.ID, "text")
        box.clear()
        box.send_keys(sentence)
        d.find_element(By.ID, "translate").click()
        WebDriverWait(d, 120).until(lambda d: d.find_element(By.ID, "translation").text)
        d.find_element(By.CSS_SELECTOR, f"#kind-{kind} + span").click()
        Select(d.find_element(By.ID, "layer")).select_by_value(str(layer))
        d.find_element(By.CSS_SELECTOR, f"#thumbs [data-head='{head}']").click()
        cells = d.find_elements(By.CSS_SELECTOR, "#heatmap td")
        best = max(cells[len(cells) // 3:], key=lambda c: float(c.get_attribute("data-weight")))
        ActionChains(d).move_to_element(best).perform()
        WebDriverWait(d, 10).until(lambda d: d.find_element(By.ID, "tooltip").is_displayed())
        d.save_screenshot(path)
    finally:
        browser.close()
        server.stop()
        engine.close()
    return path


if __name__ == "__main__":
    print(screenshot(*sys.argv[1:3]))
