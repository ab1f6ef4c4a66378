"""``attnlab lab MODEL ...``: the attention lab, a page in the browser served on this machine,
where a sentence one types goes through the models named here (:mod:`attnlab.lab`)."""

from __future__ import annotations

import argparse
import ipaddress
import secrets
import socket
import sys

from .common import UsageError

LOOPBACK = "127.0.0.1"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def cmd_lab(args: argparse.Namespace) -> int:
    from ..lab.models import load_models
    from ..lab.server import create_app, require_lab

    require_lab()  # before any model loads
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535] (0: any free port); got {args.port}")
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"--host {args.host} --port {args.port}: cannot listen there ({exc})") from None
    if not _loopback(args.host):
        print(f"attnlab lab: warning: listening on {args.host}, not on this machine's loopback address only: anyone "
              f"who can reach it and has the URL's token can drive the lab and its models", file=sys.stderr)
    port = sock.getsockname()[1]
    models = load_models(args.models, device=args.device)
    token = secrets.token_urlsafe(24)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    hosts = {f"{shown}:{port}"}
    if _loopback(args.host):  # the names a browser on this machine may give the loopback address
        hosts |= {f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
    app = create_app(models, token, hosts)
    import uvicorn

    sock.listen(128)  # before the URL is printed: a browser (or a test) may ask at once
    print(f"attnlab lab: {len(models)} model{'s' * (len(models) != 1)} ready; open this URL (Ctrl-C stops the lab):")
    print(f"http://{'127.0.0.1' if _loopback(args.host) and ':' not in args.host else shown}:{port}/?token={token}",
          flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C, then raises it again: the lab's way to stop
        pass
    print("attnlab lab: stopped")
    return 0


def add_lab(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab lab``."""
    p = sub.add_parser("lab", parents=[plugins],
                       help="the attention lab in the browser: type a sentence, watch every head, switch heads off",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="a run directory, a Hugging Face folder, a GGUF file or a packaged model's name "
                        "(smollm2-135m-instruct); several: chosen in the page")
    p.add_argument("--host", default=LOOPBACK, help="the address to listen on (default 127.0.0.1, this machine only; "
                                                    "another one is said with a warning)")
    p.add_argument("--port", type=int, default=8765, help="the port (default 8765; 0: any free port)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.set_defaults(func=cmd_lab)
