"""The lab's web server: an ASGI application (Starlette) that uvicorn serves.

What it takes, so that no other page in the browser and nothing else on the network can drive it:

* a token, random for each start and printed in the URL, on every request (``?token=`` for the
  page, the ``X-Lab-Token`` header for the page's own requests), compared in constant time;
* a Host header naming the address it listens on (a page of another site that resolves its own
  name to 127.0.0.1, DNS rebinding, is refused);
* no path from the page: the models are those the command line named, by their index;
* bounded inputs: a request body of at most :data:`MAX_BODY` bytes, a text of
  :data:`~attnlab.lab.models.MAX_CHARS` characters and :data:`~attnlab.lab.models.MAX_TOKENS`
  tokens, an image file of :data:`~attnlab.lab.models.MAX_IMAGE_BYTES` bytes and
  :data:`~attnlab.lab.models.MAX_IMAGE_SIDE` pixels a side, each limit named in the refusal.

The model work runs in a thread pool, each model one request at a time (its lock), so a slow
request on one model does not hold the page or the others.
"""

from __future__ import annotations

import hmac
import json
from importlib import resources
from typing import Any, Awaitable, Callable

from ..errors import InputError
from ..viz.explorer.page import render_page
from .models import MAX_CHARS, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, MAX_TOKENS, START_TEXT, LabModel

__all__ = ["create_app", "MAX_BODY", "lab_page", "require_lab"]

MAX_BODY = 64 * 1024  # a request's JSON: a text, a few numbers
TOKEN_HEADER = "x-lab-token"


def require_lab() -> None:
    """The lab's server packages, or one line saying how to install them."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise InputError(f"attnlab lab needs {exc.name} (its web server): pip install 'attnlab[lab]'") from None


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def lab_page(models: list[LabModel], first: dict[str, Any], text: str) -> str:
    """The lab's page: the explorer showing ``first`` (the first model's page data for ``text``),
    with the lab's panel and script over it."""
    config = {"models": [m.describe() for m in models], "text": text, "max_chars": MAX_CHARS,
              "max_tokens": MAX_TOKENS, "max_image_bytes": MAX_IMAGE_BYTES, "max_image_side": MAX_IMAGE_SIDE}
    payload = json.dumps(config, ensure_ascii=False).replace("<", "\\u003c")
    html = _asset("lab.html").replace("{{LAB_CONFIG}}", payload)
    # one language switch, the lab's, for its panel and the explorer's views alike
    return render_page(first, extra_html=html, extra_js=_asset("lab.js"), extra_css=_asset("lab.css"), connect=True,
                       language_switch=False)


def create_app(models: list[LabModel], token: str, hosts: set[str], *, text: str = START_TEXT) -> Any:
    """The ASGI application over ``models``; ``token`` is required on every request and ``hosts``
    (``"127.0.0.1:8765"``, ...) are the Host headers it answers."""
    require_lab()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    page: dict[str, str] = {}  # made on the first visit: the first model's views of the start text

    def model_of(body: dict[str, Any]) -> LabModel:
        index = body.get("model", 0)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(models):
            raise InputError(f"model must be an index in [0, {len(models) - 1}] (the models the command line "
                             f"named); got {index!r}")
        return models[index]

    async def read_bytes(request: Request, limit: int) -> bytes:
        size, chunks = 0, []
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _TooLarge(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_body(request: Request) -> dict[str, Any]:
        data = await read_bytes(request, MAX_BODY)
        try:
            body = json.loads(data or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise InputError("the request's body must be JSON") from None
        if not isinstance(body, dict):
            raise InputError("the request's body must be a JSON object")
        return body

    def api(work: Callable[[Any], Any], read: Callable[[Request], Awaitable[Any]] = read_body
            ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                body = await read(request)
                result = await run_in_threadpool(work, body)
            except _TooLarge as exc:
                return JSONResponse({"error": f"the request is larger than {exc.args[0]:,} bytes"}, status_code=413)
            except InputError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            return JSONResponse(result)
        return endpoint

    def analyze(body: dict[str, Any]) -> Any:
        return model_of(body).analyze(body.get("text"))

    def next_tokens(body: dict[str, Any]) -> Any:
        return model_of(body).next_tokens(body.get("text"), temperature=_number(body, "temperature", 0.0),
                                          top_k=body.get("top_k"), top_p=body.get("top_p"), off=body.get("off") or [])

    def step(body: dict[str, Any]) -> Any:
        return model_of(body).step(body.get("text"), body.get("layer"), body.get("head"), body.get("query"))

    async def read_image(request: Request) -> tuple[LabModel, bytes]:
        """An upload: the file's bytes as the body, the model's index in the query (``?model=1``)."""
        given = request.query_params.get("model", "0")
        model = model_of({"model": int(given) if given.isdecimal() and len(given) < 6 else given})
        return model, await read_bytes(request, MAX_IMAGE_BYTES)

    def image(upload: tuple[LabModel, bytes]) -> Any:
        return upload[0].analyze_image(upload[1])

    def first(body: dict[str, Any]) -> Any:  # what a model opens with (an image model's own picture)
        return model_of(body).first(text)

    async def index(request: Request) -> Response:
        if "html" not in page:
            first = await run_in_threadpool(models[0].first, text)
            page["html"] = lab_page(models, first, text)
        return HTMLResponse(page["html"])

    async def listing(request: Request) -> Response:
        return JSONResponse({"models": [m.describe() for m in models]})

    routes = [Route("/", index, methods=["GET"]), Route("/api/models", listing, methods=["GET"]),
              Route("/api/analyze", api(analyze), methods=["POST"]),
              Route("/api/next", api(next_tokens), methods=["POST"]),
              Route("/api/step", api(step), methods=["POST"]),
              Route("/api/image", api(image, read_image), methods=["POST"]),
              Route("/api/first", api(first), methods=["POST"])]
    return _Guard(Starlette(routes=routes), token, hosts)


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{key} must be a number; got {value!r}")
    return float(value)


class _TooLarge(Exception):
    pass


class _Guard:
    """The ASGI middleware of every request: its Host header one of ``hosts`` and the token in
    the query (``token=``) or the ``X-Lab-Token`` header; else 403 before anything runs. Every
    answer says not to cache it and not to send the URL (its token) to another site."""

    def __init__(self, app: Any, token: str, hosts: set[str]) -> None:
        self.app, self.token, self.hosts = app, token.encode(), {h.lower() for h in hosts}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        host = headers.get("host", b"").decode("latin-1").lower()
        given = headers.get(TOKEN_HEADER, b"")
        if not given:
            from urllib.parse import parse_qs

            given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0].encode()
        if host not in self.hosts:
            await _refuse(send, 403, "this lab answers requests to its own address only")
            return
        if not hmac.compare_digest(given, self.token):
            await _refuse(send, 403, "the lab's token is missing or wrong: open the URL the command printed")
            return

        async def guarded_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"cache-control", b"no-store"),
                                      (b"referrer-policy", b"no-referrer"), (b"x-content-type-options", b"nosniff"),
                                      (b"x-frame-options", b"DENY")]
            await send(message)

        await self.app(scope, receive, guarded_send)


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
