"""Bind and serve the dashboard with uvicorn (``phalanx ui``)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Callable

from ..errors import UsageError
from .app import create_app, plotly_js
from .guard import new_token, resolve, weak_token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) means only this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return all(ipaddress.ip_address(a).is_loopback for a in resolve(host))
    except UsageError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), so the URL can be printed before serving."""
    address = resolve(host)[0] if not _is_address(host) else host
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}", "pick another --port (0 = any free one)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def url(host: str, port: int, token: str | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def access(host: str, token: str | None) -> tuple[bool, str | None]:
    """Whether ``host`` is loopback, and the token to require (None: none). Raises UsageError
    for a host that does not resolve and for a weak token."""
    resolve(host)  # a name that resolves to nothing is a typo: say so before anything else
    loopback = is_loopback(host)
    if token is not None:
        why = weak_token(token)
        if why is not None:
            raise UsageError(f"--token is too weak: {why}",
                             "leave --token out and phalanx ui makes a strong one, or use e.g. $(openssl rand -hex 16)")
        return loopback, token
    return loopback, None if loopback else new_token()


def serve(host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          announce: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> None:
    """Serve until interrupted. Blocking. Any address but loopback is served with a token: the
    one given (refused when weak), or a strong one made now and printed in the URL, once."""
    if port < 0 or port > 65535:
        raise UsageError(f"invalid --port {port}", "use 0..65535 (0 = any free port)")
    loopback, token = access(host, token)
    plotly_js()  # fail now, with the remedy, rather than on the first chart
    import uvicorn

    app = create_app(token=token, loopback=loopback)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    if not loopback:
        warn(f"phalanx ui: serving on {host} over plain HTTP: whoever can reach port {bound} and read the traffic "
             f"can read the token and every job's logs; to keep them private, serve on 127.0.0.1 and tunnel: "
             f"ssh -L {bound}:127.0.0.1:{bound} THIS_HOST")
    announce(url(host, bound, token))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
