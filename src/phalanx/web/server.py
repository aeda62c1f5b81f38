"""Bind and serve the dashboard with uvicorn (``phalanx ui``)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Callable
from urllib.parse import quote

from ..errors import UsageError
from .app import LOOPBACK_HOSTS, create_app, plotly_js


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), so the URL can be printed before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}", "pick another --port (0 = any free one)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url(host: str, port: int, token: str | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={quote(token)}" if token else "")


def serve(host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          announce: Callable[[str], None] = print) -> None:
    """Serve until interrupted. Blocking. Refuses a non-loopback address without a token."""
    if not is_loopback(host) and not token:
        raise UsageError(
            f"serving on {host} would show every job's logs to the network without a password",
            "pass --token SECRET (then open the printed URL), or bind 127.0.0.1",
        )
    if port < 0 or port > 65535:
        raise UsageError(f"invalid --port {port}", "use 0..65535 (0 = any free port)")
    plotly_js()  # fail now, with the remedy, rather than on the first chart
    import uvicorn

    app = create_app(token=token, check_host=is_loopback(host))
    sock = bind(host, port)
    announce(url(host, sock.getsockname()[1], token))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
