"""The attention explorer (static/explorer.html) as one self-contained HTML file.

The page shows the three attentions of d2l 9.3 -- encoder self-attention, decoder (causal)
self-attention and encoder-decoder attention -- for every layer and head, with tokens on both
axes and the weight on hover. Served by ``d2l-transformer serve`` it has a text box; written by
`render_explorer` its data is inlined and it needs no server and no network.

An item is ``{"source": text, "translation": text, "attention": ATTENTION JSON}`` where the
ATTENTION JSON is what ``Translator.attention`` returns.
"""

import html
import json
import os

from ..data.languages import language_name

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", "explorer.html")
_SLOT = '<script id="data" type="application/json">null</script>'
KINDS = ("encoder", "decoder", "cross")


def explorer_page():
    """The page as the server sends it (no data: it asks the server)."""
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def script_json(obj):
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` (so no ``</script>`` or
    ``<!--``), and no U+2028/U+2029; ``JSON.parse`` reads it back unchanged."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def _check(items):
    if not isinstance(items, list) or not items:
        raise ValueError("the explorer needs a non-empty list of items")
    for i, item in enumerate(items):
        missing = {"source", "translation", "attention"} - set(item)
        if missing:
            raise ValueError(f"item {i} has no {', '.join(sorted(missing))}")
        att = item["attention"]
        absent = [k for k in ("src_tokens", "tgt_tokens", "out_tokens") + KINDS if k not in att]
        if absent:
            raise ValueError(f"item {i}: its attention has no {', '.join(absent)}")


def page_languages(pair):
    """The page's labels for a model of the languages `pair` (source, target): ``[{"code",
    "name"}, ...]``, the shape of the first two entries of the server's ``/languages``."""
    return [{"code": code, "name": language_name(code)} for code in pair]


def render_explorer(items, title="Attention explorer", pair=("en", "fr")):
    """The explorer page with `items` inlined: one self-contained HTML string; `pair`: the
    model's (source, target) languages, which the page names."""
    _check(items)
    page = explorer_page()
    assert page.count(_SLOT) == 1, "explorer.html lost its data slot"
    inline = {"title": title, "items": items, "languages": page_languages(pair)}
    return page.replace(_SLOT, _SLOT.replace(">null<", ">" + script_json(inline) + "<"))


def write_explorer(path, items, title="Attention explorer", pair=("en", "fr")):
    """Write `render_explorer(items, title, pair)` to `path` (UTF-8); returns `path`."""
    text = render_explorer(items, title, pair)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def explorer_items(translator, tokenizer, sentences, beam_size=1, alpha=None):
    """Translate `sentences` (texts) with `translator` (``inference.translator.Translator``) and
    return the explorer's items, each with the attention weights of its translation (one
    teacher-forced pass, ``Translator.attention``)."""
    tokens = [tokenizer.encode(s) for s in sentences]
    options = {} if alpha is None else {"alpha": alpha}
    hyps = translator.translate(tokens, beam_size=beam_size, **options)
    return [{"source": s, "translation": tokenizer.decode(list(h.tokens)),
             "attention": translator.attention(t, list(h.tokens))}
            for s, t, h in zip(sentences, tokens, hyps)]


def iframe_html(items, height=660, title="Attention explorer", pair=("en", "fr")):
    """The standalone explorer in an ``<iframe srcdoc>``, for ``IPython.display.HTML``."""
    doc = html.escape(render_explorer(items, title, pair), quote=True)
    return (f'<iframe srcdoc="{doc}" title="{html.escape(title)}" style="width: 100%; '
            f'height: {int(height)}px; border: 1px solid #d8dee6; border-radius: 8px"></iframe>')
