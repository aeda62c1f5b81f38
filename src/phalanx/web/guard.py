"""Who may use the dashboard, and how a request proves it. ASGI middleware, no web framework.

- **Loopback without a token** (the default, ``phalanx ui``): requests must name a loopback
  host (``localhost``, ``127.x.y.z``, ``::1``: a page on another site that resolves its name to
  127.0.0.1, DNS rebinding, is refused), and on Linux must come from a process of the user who
  runs the dashboard (the peer socket's owner in ``/proc/net/tcp``; root may too): another
  account on a shared machine cannot read the jobs or stop them.
- **A token** (required on any other address; ``phalanx ui`` makes a strong one): the URL the
  server prints carries it once (``?token=``); the server then sets it as a cookie (HttpOnly,
  SameSite=Strict) and redirects to the same page without it, so it never stays in the
  address bar, the history or a Referer. Scripts send ``Authorization: Bearer TOKEN``.
- **Changes** (POST: stop, resume, retry, delete) need the page's CSRF token in the
  ``X-Phalanx-CSRF`` header and, from a browser, an ``Origin`` (or ``Referer``) of this very
  server: a page on another site can neither read the token nor send the header. A GET never
  changes anything (the routes that do accept POST only).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
from http.cookies import SimpleCookie
from typing import Any, Awaitable, Callable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
COOKIE = "phalanx_token"
CSRF_HEADER = "x-phalanx-csrf"
CHANGES = ("POST", "PUT", "PATCH", "DELETE")
MIN_TOKEN = 16


def new_token() -> str:
    """A token of 192 random bits, URL-safe."""
    return secrets.token_urlsafe(24)


def weak_token(token: str) -> str | None:
    """Why ``token`` is too weak to guard the dashboard, or None."""
    if len(token) < MIN_TOKEN:
        return f"it has {len(token)} characters, fewer than {MIN_TOKEN}"
    if len(set(token)) < 8:
        return "it repeats too few different characters"
    return None


def is_loopback_name(host: str) -> bool:
    """``localhost``, any 127.0.0.0/8 address, ``::1`` (a Host header's name part)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(host: str) -> str:
    """The name part of a Host header: ``127.0.0.1:8000`` -> ``127.0.0.1``, ``[::1]:80`` -> ``::1``."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def peer_uid(client: tuple[str, int] | None, server: tuple[str, int] | None) -> int | None:
    """The uid owning the client end of a loopback TCP connection (Linux ``/proc/net/tcp*``),
    or None when it cannot be told (another system, a connection already gone)."""
    if not client or not server:
        return None
    want_local = _proc_address(client[0], client[1])
    want_remote = _proc_address(server[0], server[1])
    if want_local is None or want_remote is None:
        return None
    for table in ("/proc/net/tcp6", "/proc/net/tcp") if ":" in client[0] else ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 7 and fields[1] in want_local and fields[2] in want_remote:
                        return int(fields[7])
        except OSError:
            continue
    return None


def _proc_address(ip: str, port: int) -> set[str] | None:
    """How ``/proc/net/tcp{,6}`` writes ``ip:port`` (both tables' spellings of an IPv4 address)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    out = set()
    v4 = addr if addr.version == 4 else addr.ipv4_mapped  # type: ignore[union-attr]
    if v4 is not None:
        out.add(f"{int.from_bytes(v4.packed, 'little'):08X}:{port:04X}")
        addr = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + v4.packed)
    packed = addr.packed
    words = "".join(f"{int.from_bytes(packed[i:i + 4], 'little'):08X}" for i in range(0, 16, 4))
    out.add(f"{words}:{port:04X}")
    return out


class Guard:
    """The ASGI middleware (see the module docstring). ``loopback``: serving on a loopback
    address (host and user checks apply when there is no token)."""

    def __init__(self, app: ASGIApp, token: str | None, loopback: bool, csrf: str | None = None,
                 check_user: bool = True) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback
        self.csrf = csrf or secrets.token_urlsafe(24)
        self.check_user = check_user and hasattr(os, "getuid")
        self._uids: dict[tuple[Any, Any], int | None] = {}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, text, extra = refusal
            await plain(send, status, text, extra)
            return
        if self.token is not None and scope["method"] == "GET" and _query_token(scope) is not None:
            await self._set_cookie_and_redirect(scope, headers, send)
            return
        scope.setdefault("state", {})["csrf"] = self.csrf
        await self.app(scope, receive, with_headers(send))

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, dict[str, str]] | None:
        if self.token is None and self.loopback:
            if not is_loopback_name(host_name(headers.get("host", ""))):
                return 400, "unknown host: this dashboard answers to localhost and 127.0.0.1 only", {}
            if self.check_user and not self._same_user(scope):
                return 403, "this dashboard belongs to another user of this machine", {}
        bearer = False
        if self.token is not None:
            given, bearer = _given_token(scope, headers)
            if given is None or not secrets.compare_digest(given.encode(), self.token.encode()):
                return 401, ("a token is required: open the URL `phalanx ui` printed (it carries ?token=...), "
                             "or send the header Authorization: Bearer TOKEN"), {"WWW-Authenticate": "Bearer"}
        if scope["method"] in CHANGES:
            return self._change_refusal(scope, headers, bearer)
        return None

    def _change_refusal(self, scope: Scope, headers: dict[str, str], bearer: bool) -> tuple[int, str, dict[str, str]] | None:
        why = change_refusal(scope, headers, self.csrf, bearer)
        return None if why is None else (403, why, {})

    def _same_user(self, scope: Scope) -> bool:
        key = (tuple(scope.get("client") or ()), tuple(scope.get("server") or ()))
        if key not in self._uids:
            if len(self._uids) > 4096:
                self._uids.clear()
            self._uids[key] = peer_uid(scope.get("client"), scope.get("server"))
        uid = self._uids[key]
        return uid is None or uid in (os.getuid(), 0)

    async def _set_cookie_and_redirect(self, scope: Scope, headers: dict[str, str], send: Any) -> None:
        query = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
                 if k != "token"]
        location = scope.get("path", "/") + ("?" + urlencode(query) if query else "")
        cookie = SimpleCookie()
        cookie[COOKIE] = str(self.token)
        cookie[COOKIE]["httponly"] = True
        cookie[COOKIE]["samesite"] = "Strict"
        cookie[COOKIE]["path"] = "/"
        await plain(send, 303, "", {"Location": location, "Set-Cookie": cookie[COOKIE].OutputString(),
                                     "Cache-Control": "no-store"})


def change_refusal(scope: Mapping[str, Any], headers: dict[str, str], csrf: str | None, bearer: bool = False) -> str | None:
    """Why a change (POST, PUT, DELETE) is refused, or None: from a browser it needs an Origin
    (or Referer) of this very server and the page's CSRF token (``csrf``; None: the Origin
    only, for a form that has no session yet); a bearer's request is no browser's."""
    origin = headers.get("origin") or origin_of(headers.get("referer", ""))
    if origin is None and not bearer:
        return "a change needs an Origin header (send it from the dashboard's page)"
    if origin is not None and origin != own_origin(scope, headers):
        return f"refused a change requested by another site ({origin})"
    if not bearer and csrf is not None and not secrets.compare_digest(headers.get(CSRF_HEADER, "").encode(), csrf.encode()):
        return "the page's CSRF token is missing or stale: reload the page"
    return None


def _query_token(scope: Scope) -> str | None:
    for key, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
        if key == "token":
            return value
    return None


def _given_token(scope: Scope, headers: dict[str, str]) -> tuple[str | None, bool]:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip(), True
    cookie = SimpleCookie()
    try:
        cookie.load(headers.get("cookie", ""))
    except Exception:  # noqa: BLE001 - a malformed cookie header is no token
        pass
    if COOKIE in cookie:
        return cookie[COOKIE].value, False
    if scope["method"] == "GET":
        return _query_token(scope), False  # accepted once: answered with the cookie and a redirect
    return None, False


def origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def own_origin(scope: Mapping[str, Any], headers: dict[str, str]) -> str:
    return f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"


SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


def with_headers(send: Any) -> Any:
    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            present = {k.lower() for k, _ in message.get("headers", [])}
            message["headers"] = [*message.get("headers", []), *(h for h in SECURITY_HEADERS if h[0] not in present)]
        await send(message)

    return wrapped


async def plain(send: Any, status: int, text: str, headers: dict[str, str]) -> None:
    body = text.encode()
    raw = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
           *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()), *SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


def resolve(host: str) -> list[str]:
    """The addresses ``host`` names (UsageError when it names none). A name that is no host
    name at all is refused without asking DNS."""
    from ..errors import UsageError

    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.match(host or ""):
            raise UsageError(f"cannot resolve --host '{host}': it is not a host name",
                             "give an address of this machine (127.0.0.1, 0.0.0.0, ::1) or a name it resolves") from None
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise UsageError(f"cannot resolve --host '{host}'",
                         "give an address of this machine (127.0.0.1, 0.0.0.0, ::1) or a name it resolves") from None
    return sorted({str(info[4][0]) for info in infos})
