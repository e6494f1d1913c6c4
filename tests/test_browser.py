"""The attention explorer as a person uses it, in headless Chromium (selenium): the served page
translates "I won !", and after switching kind, layer and head the weight shown on hover is the
JSON API's; the standalone HTML file written by ``translate --attention-html`` shows the same
weights with the network off. Also (no browser): the inlined data survives hostile text."""

import html
import json
import re
import urllib.request

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from browser import Browser, ServerThread, missing, train_small_model  # noqa: E402

from d2l_transformer.serve.app import create_app  # noqa: E402
from d2l_transformer.serve.engine import Engine  # noqa: E402
from d2l_transformer.viz.attention_html import iframe_html, render_explorer  # noqa: E402

NO_BROWSER = missing()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=f"no browser: {NO_BROWSER}")
VIEWS = [("cross", 1, 2), ("encoder", 0, 3), ("decoder", 1, 1)]  # (kind, layer, head)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return train_small_model(str(tmp_path_factory.mktemp("browser") / "model"))


@pytest.fixture(scope="module")
def server(model_dir):
    engine = Engine(model_dir, "cpu", engine="mxnet")
    server = ServerThread(create_app(engine))
    yield server.url
    server.stop()
    engine.close()


@pytest.fixture(scope="module")
def browser():
    if NO_BROWSER:
        pytest.skip(f"no browser: {NO_BROWSER}")
    browser = Browser()
    yield browser
    browser.close()


def api(url, text, beam=4):
    body = json.dumps({"text": text, "beam": beam, "attention": True}).encode()
    request = urllib.request.Request(url + "/translate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)["translations"]


def choose(driver, kind, layer, head):
    """Click the kind, pick the layer in its menu, click the head in the overview."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.find_element(By.CSS_SELECTOR, f"#kind-{kind} + span").click()
    Select(driver.find_element(By.ID, "layer")).select_by_value(str(layer))
    driver.find_element(By.CSS_SELECTOR, f"#thumbs [data-head='{head}']").click()
    assert Select(driver.find_element(By.ID, "head")).first_selected_option.text == f"head {head + 1}"
    pressed = driver.find_elements(By.CSS_SELECTOR, "#thumbs [aria-pressed='true']")
    assert [b.get_attribute("data-head") for b in pressed] == [str(head)]


def shown(driver):
    """What the page shows: row labels, column labels, every cell's data-weight."""
    return driver.execute_script("""
        const t = document.getElementById('heatmap');
        return [[...t.tBodies[0].rows].map(r => r.cells[0].textContent),
                [...t.tHead.rows[0].cells].slice(1).map(c => c.textContent),
                [...t.tBodies[0].rows].map(r => [...r.cells].slice(1).map(c => c.dataset.weight))];
    """)


def hover(driver, i, j):
    """Move the mouse onto cell (i, j); the weight the tooltip then shows."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cell = driver.find_element(By.CSS_SELECTOR, f"#heatmap td[data-row='{i}'][data-col='{j}']")
    ActionChains(driver).move_to_element(cell).perform()
    tip = driver.find_element(By.ID, "tooltip")
    WebDriverWait(driver, 10).until(lambda d: tip.is_displayed())
    return tip.find_element(By.CLASS_NAME, "tip-weight").text


def check_views(driver, item):
    """Every view of VIEWS shows the API's weights and labels, and the hovered cell's weight."""
    att = item["attention"]
    for kind, layer, head in VIEWS:
        choose(driver, kind, layer, head)
        w = att[kind][layer][head]
        rows, cols, weights = shown(driver)
        assert rows == (att["src_tokens"] if kind == "encoder" else att["out_tokens"])
        assert cols == {"encoder": att["src_tokens"], "decoder": att["tgt_tokens"],
                        "cross": att["src_tokens"]}[kind]
        assert weights == [[f"{x:.4f}" for x in row] for row in w]
        # the largest weight outside the first row, and a cell of the first column
        top = max(((i, j) for i in range(1, len(w)) for j in range(len(w[0]))),
                  key=lambda ij: w[ij[0]][ij[1]])
        for i, j in (top, (len(w) - 1, 0)):
            assert hover(driver, i, j) == f"{w[i][j]:.4f}"


@needs_browser
def test_served_page_translates_and_shows_the_apis_weights(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser.driver
    d.get(server + "/")
    assert d.find_element(By.ID, "form").is_displayed()
    assert not d.find_element(By.ID, "result").is_displayed()
    WebDriverWait(d, 30).until(lambda d: d.find_element(By.ID, "text").get_attribute("lang"))
    assert d.find_element(By.ID, "pair").text == "English \u2192 French"  # from /languages
    assert d.find_element(By.ID, "text-label").text == "English sentence"
    box = d.find_element(By.ID, "text")
    box.clear()
    box.send_keys("I won !")
    d.find_element(By.ID, "translate").click()
    WebDriverWait(d, 120).until(lambda d: d.find_element(By.ID, "translation").text)
    item = api(server, ["I won !"])[0]  # the page's default beam is 4
    assert d.find_element(By.ID, "translation").text == item["translation"]
    assert d.find_element(By.ID, "source").text == "I won !"
    assert item["attention"]["src_tokens"] == ["i", "won", "!"]
    assert len(d.find_elements(By.CSS_SELECTOR, "#thumbs button")) == 4
    check_views(d, item)
    # a bad sentence: the server's one-line error on the page, the last result kept
    box.clear()
    box.send_keys("zzz qqq")
    d.find_element(By.ID, "translate").click()
    status = d.find_element(By.ID, "status")
    WebDriverWait(d, 60).until(lambda d: "Error" in status.text)
    assert status.text == "Error: text[0]: no word of it is in the model's vocabulary"
    assert d.find_element(By.ID, "translation").text == item["translation"]
    assert all(u.startswith(server + "/") for u in browser.resources())  # nothing from elsewhere


@needs_browser
def test_standalone_file_offline_shows_the_same_weights(server, model_dir, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from d2l_transformer.cli import commands as cli

    path = tmp_path / "explorer.html"
    assert cli.main(["translate", "--engine", "mxnet", "--model", model_dir, "--beam", "4", "--ctx", "cpu",
                     "--attention-html", str(path), "I won !", "Go ."]) == 0
    items = api(server, ["I won !", "Go ."])
    browser.set_offline(True)
    try:
        d = browser.driver
        d.get(path.as_uri())
        assert browser.resources() == []  # the page asks for nothing
        assert not browser.reachable(server + "/health")  # and the network is off
        assert not d.find_element(By.ID, "form").is_displayed()
        pick = Select(d.find_element(By.ID, "item"))
        assert [o.text for o in pick.options] == ["I won !", "Go ."]
        for index, item in enumerate(items):
            pick.select_by_value(str(index))
            assert d.find_element(By.ID, "translation").text == item["translation"]
            check_views(d, item)
    finally:
        browser.set_offline(False)
    assert browser.reachable(server + "/health")


@needs_browser
def test_the_pages_labels_follow_the_models_pair(browser, tmp_path):
    """A French-to-English model: the served page names the pair from ``/languages`` and asks
    for a French sentence; the standalone file names it from its inlined data."""
    import io

    import mxnet as mx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from d2l_transformer.config import CHAPTER
    from d2l_transformer.training.run import train_model
    from d2l_transformer.viz.attention_html import write_explorer

    out = str(tmp_path / "fr-en")
    train_model(CHAPTER.replace(num_epochs=2, source_lang="fr"), out, ctx=mx.cpu(),
                progress=False, log=io.StringIO())
    engine = Engine(out, "cpu", engine="mxnet")
    served = ServerThread(create_app(engine))
    try:
        d = browser.driver
        d.get(served.url + "/")
        WebDriverWait(d, 30).until(lambda d: d.find_element(By.ID, "text").get_attribute("lang"))
        assert d.find_element(By.ID, "pair").text == "French \u2192 English"
        assert d.find_element(By.ID, "text-label").text == "French sentence"
        assert d.find_element(By.ID, "text").get_attribute("value") == ""  # no English example
        assert d.find_element(By.ID, "translation").get_attribute("lang") == "en"
    finally:
        served.stop()
        engine.close()
    items = [{"source": "Va !", "translation": "go .", "attention": {
        "src_tokens": ["va", "!"], "tgt_tokens": ["<bos>", "go", "."], "out_tokens": ["go", ".", "<eos>"],
        "encoder": [[[[0.5, 0.5], [0.5, 0.5]]]], "decoder": [[[[1, 0, 0], [0.5, 0.5, 0], [0.3, 0.3, 0.4]]]],
        "cross": [[[[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]]]}}]
    path = write_explorer(str(tmp_path / "explorer.html"), items, pair=("fr", "en"))
    d.get("file://" + path)
    assert d.find_element(By.ID, "pair").text == "French \u2192 English"
    assert d.find_element(By.ID, "source").get_attribute("lang") == "fr"


HOSTILE = "</script><script>alert(1)</script><!-- & \u2028 \"'"


def test_inlined_data_survives_hostile_text():
    att = {"src_tokens": [HOSTILE], "tgt_tokens": ["<bos>", "x"], "out_tokens": ["x", "<eos>"],
           "encoder": [[[[1.0]]]], "decoder": [[[[1.0, 0.0], [0.4, 0.6]]]],
           "cross": [[[[1.0], [1.0]]]]}
    items = [{"source": HOSTILE, "translation": HOSTILE, "attention": att}]
    page = render_explorer(items, title=HOSTILE)
    assert page.count("</script>") == 2 and "alert(1)" not in page.split('id="data"')[0]
    data = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    languages = [{"code": "en", "name": "English"}, {"code": "fr", "name": "French"}]
    assert json.loads(data.group(1)) == {"title": HOSTILE, "items": items, "languages": languages}
    frame = iframe_html(items, title=HOSTILE)
    assert frame.startswith('<iframe srcdoc="') and html.unescape(frame[16:frame.index('" title=')]) == page
    with pytest.raises(ValueError, match="item 0: its attention has no cross"):
        render_explorer([{"source": "a", "translation": "b",
                          "attention": {k: v for k, v in att.items() if k != "cross"}}])
