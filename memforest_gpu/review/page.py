"""The review page: one self-contained HTML file (styles, Plotly and the page's script
inside it; nothing is fetched, a Content-Security-Policy forbids it).

The data (:func:`~.data.review_data`) sits in the page as JSON in a
``<script type="application/json">`` element, with ``<``, ``>``, ``&`` and the two JavaScript
line separators written as ``\\uXXXX`` escapes, so no text of a memory can end the element;
the script puts every text into the page with ``textContent`` (never as HTML).
"""
from __future__ import annotations

import json
from importlib import resources

__all__ = ["render_page", "embed_json", "plotly_js"]

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
        "font-src data:; connect-src 'none'")


def embed_json(data) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return "".join(_ESCAPES.get(c, c) for c in text) if any(c in text for c in _ESCAPES) else text


def plotly_js() -> str:
    """Plotly's JavaScript bundle, from the ``plotly`` package (``pip install -e '.[review]'``)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ImportError("the review page draws its plots with Plotly: install it with pip install plotly "
                          "(or pip install -e '.[review]')") from None
    js = get_plotlyjs()
    if "</script" in js.lower():  # never seen; a bundle that holds it would end its element early
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    return js


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render_page(data: dict) -> str:
    """The whole page as a string."""
    plotly = plotly_js()
    title = "memforest review"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{title}</title>",
        "<style>", _asset("page.css"), "</style>",
        "</head><body>",
        _asset("page.html"),
        '<script type="application/json" id="review-data">' + embed_json(data) + "</script>",
        "<script>" + plotly + "</script>",
        "<script>", _asset("page.js"), "</script>",
        "</body></html>",
    ])
