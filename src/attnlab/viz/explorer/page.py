"""The explorer's page: one HTML file holding its styles, its script and its data.

The data is one JSON object (the format below, ``attnlab-explorer/1``) in a
``<script type="application/json" id="attnlab-data">`` element; the script
(``explorer.js``, beside this file) reads it and draws every view in the browser. Nothing is
fetched: the page opens from the disk, offline.

Weights are stored 8 bits a value: ``byte = round(255 * weight)`` (a weight is in [0, 1];
the page shows ``byte / 255``, within half a step, 0.002, of the model's), row-major
``(heads, Lq, Lk)`` per layer, compressed with zlib (deflate) and written in base64; the
browser inflates a layer when a view first needs it (``DecompressionStream("deflate")``).
Deflate makes the file small where attention is: most weights of a long input round to 0
and the upper triangle of a causal map is all zeros.

::

    {"format": "attnlab-explorer/1", "title": str, "subtitle": str, "notes": [str],
     "lang": "en" | "zh",                 # optional (default "en"): the language the page opens in
     "documents": [{                      # one per input
        "title": str, "kind": "text" | "lm" | "translation" | "image", "notes": [str],
        "groups": [{                      # one per (queries, keys) pair of sequences
            "name": str,                  # "self-attention", "cross-attention", ...
            "queries": [str], "keys": [str],   # token labels: rows and columns
            "self": bool,                 # queries and keys are the same sequence
            "causal": bool,
            "layers": [{"name": str, "heads": int, "data": base64 of zlib of uint8 (heads, Lq, Lk)}],
            "stats": null | {             # self-attention groups: per layer, per head, of the exact weights
                "entropy": [[bits]], "distance": [[mean positions back]], "previous": [[mean weight on i-1]],
                "first": [[mean weight on position 0]], "diagonal": [[mean weight on i]],
                "profile_bins": [str], "profile": [[[share of weight per distance bin]]]}}],
        "lm": null | {"prompt_len": int, "top": [[[token, probability], ...] per position]},
        "image": null | {"src": "data:image/png;base64,...", "group": int, "grid": [rows, cols],
                         "prefix": int, "rollout": base64 of zlib of uint8 (N, N) | null}}]}
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib
from importlib import resources
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["FORMAT", "encode_weights", "decode_weights", "render_page", "script_hashes", "page_policy"]

FORMAT = "attnlab-explorer/1"
LEVELS = 255  # one byte a value


def encode_weights(weights: Tensor | np.ndarray) -> str:
    """Weights in [0, 1] (any shape) as the page stores them: bytes ``round(255 w)``, zlib, base64."""
    w = weights.detach().float().cpu().numpy() if isinstance(weights, Tensor) else np.asarray(weights, np.float32)
    q = np.clip(np.rint(w * LEVELS), 0, LEVELS).astype(np.uint8)
    return base64.b64encode(zlib.compress(q.tobytes(), 6)).decode("ascii")


def decode_weights(text: str, shape: tuple[int, ...]) -> Tensor:
    """What the page shows for :func:`encode_weights`' ``text``: float32 ``byte / 255``."""
    q = np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=np.uint8)
    return torch.from_numpy(q.astype(np.float32) / LEVELS).reshape(shape)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def script_hashes(page: str) -> list[str]:
    """The CSP sources (``'sha256-...'``) of the page's executed inline scripts: a page
    that embeds the explorer (a run's report.html) allows exactly these."""
    found = re.findall(r"<script(?![^>]*application/json)[^>]*>(.*?)</script>", page, re.S)
    return [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode('utf-8')).digest()).decode('ascii')}'" for s in found]


def page_policy(hashes: list[str], *, connect: bool = False) -> str:
    """The explorer's Content-Security-Policy: its own script and nothing fetched (a stray
    reference elsewhere shows as a blocked request, not a page that works online only);
    ``connect``: requests to the page's own server (the lab's)."""
    return (f"default-src 'none'; script-src {' '.join(hashes)}; style-src 'unsafe-inline'; img-src data:"
            + (" blob:; connect-src 'self'" if connect else ""))


def render_page(data: dict[str, Any], *, extra_html: str = "", extra_js: str = "", extra_css: str = "",
                connect: bool = False, language_switch: bool = True) -> str:
    """The self-contained HTML page of ``data`` (the format above). A page built on the explorer
    (the lab) adds its own markup after the header, its own script after the explorer's (which
    it drives through ``window.attnlabExplorer``) and its own styles; ``connect``: its script
    talks to the server that served it; ``language_switch=False`` hides the explorer's English /
    Chinese button, for a page that switches the language itself (``attnlabExplorer.setLanguage``)."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("<", "\\u003c")  # no "</script>" or "<!--" in a token can end the data early
    title = data.get("title", "attention explorer")
    escaped = (title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    closed = extra_js.replace("</script", "<\\/script")
    script = f"<script>\n{closed}\n</script>" if extra_js else ""
    values = {"TITLE": escaped, "CSS": _asset("explorer.css") + extra_css, "DATA": payload,
              "JS": _asset("explorer.js").replace("</script", "<\\/script"), "EXTRA_HTML": extra_html,
              "EXTRA_JS": script, "LANG_HIDDEN": "" if language_switch else " hidden"}
    # one pass over the template: what goes in is never searched for placeholders again
    page = re.sub(r"\{\{(TITLE|CSS|JS|DATA|EXTRA_HTML|EXTRA_JS|LANG_HIDDEN)\}\}", lambda m: values[m.group(1)],
                  _asset("template.html"))
    rules = page_policy(script_hashes(page), connect=connect)
    policy = f'<meta http-equiv="Content-Security-Policy" content="{rules}">'
    return page.replace("<head>", "<head>\n" + policy, 1)
