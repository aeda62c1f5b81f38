"""Who is asking a team server, as ASGI middleware: never an open server.

- Every request but the public ones (``/login``, ``/healthz``, ``/metrics``, ``/static/``)
  carries an API token: ``Authorization: Bearer phx_...`` (the CLI, scripts), or the cookie the
  login page set (a browser: HttpOnly, SameSite=Strict, Secure over TLS). The token becomes the
  ``Principal`` every call on the face gets (``api/users.authenticate``); without a valid one a
  page redirects to ``/login`` and an API call answers 401 naming the fix.
- Changes from a browser (POST, PUT, DELETE with the cookie) need an ``Origin`` (or
  ``Referer``) of this very server and the page's CSRF token in ``X-Phalanx-CSRF``: derived
  from the session's token, so a page on another site can neither read nor make it, and every
  replica of the server derives the same one. Bearer requests are not a browser's: no CSRF.
- Failed logins (a wrong or revoked token, from the CLI or the login page) are counted per
  client address: ``FAILURES`` within ``WINDOW`` seconds and that address gets 429 until the
  window has passed.
- Request bodies are bounded (``BODY_LIMIT``; an object upload ``objects.MAX_OBJECT``): a
  larger Content-Length, or more bytes than it said, is refused with 413.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable
from urllib.parse import quote

import anyio

from ..api.wire import PREFIX, RETRY_AFTER, error_body
from ..core.identity import Principal
from ..errors import NotAuthenticated, PhalanxError, StoreUnavailable, TooLarge
from ..storage.objects import MAX_OBJECT
from ..web.guard import CHANGES, COOKIE, SECURITY_HEADERS, change_refusal, plain, with_headers

PUBLIC = ("/login", "/healthz", "/metrics")
BODY_LIMIT = 32 * 1024 * 1024  # a manifest of 200,000 files fits
FAILURES, WINDOW = 10, 300.0
Scope = dict[str, Any]


def csrf_for(token: str) -> str:
    return hashlib.sha256(b"phalanx-csrf\0" + token.encode()).hexdigest()[:32]


class FailedLogins:
    """Failed token checks per client address, in a sliding window."""

    def __init__(self, most: int = FAILURES, window: float = WINDOW) -> None:
        self.most, self.window = most, window
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._seen.setdefault(client, deque())
        while times and times[0] < now - self.window:
            times.popleft()
        return times

    def blocked_for(self, client: str) -> float:
        """Seconds until ``client`` may try again (0: now)."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            return times[0] + self.window - now if len(times) >= self.most else 0.0

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._seen) > 100_000:
                self._seen.clear()
            self._recent(client, now).append(now)


def given_token(headers: dict[str, str]) -> tuple[str | None, bool]:
    """The token of a request and whether it came as a bearer (else: the login cookie)."""
    from http.cookies import SimpleCookie

    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip(), True
    cookie: SimpleCookie = SimpleCookie()
    try:
        cookie.load(headers.get("cookie", ""))
    except Exception:  # noqa: BLE001 - a malformed cookie header is no token
        return None, False
    return (cookie[COOKIE].value, False) if COOKIE in cookie else (None, False)


class Auth:
    """The middleware (see the module docstring). ``authenticate``: token -> Principal, raising
    NotAuthenticated (it reads the store: called in a thread)."""

    def __init__(self, app: Any, authenticate: Callable[[str | None], Principal],
                 failures: FailedLogins | None = None, failed: Callable[[str, str, str], None] | None = None) -> None:
        self.app = app
        self.authenticate = authenticate
        self.failures = failures or FailedLogins()
        self.failed = failed  # (token, client address, why): a failed login, for the audit log

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path, method = scope.get("path", "/"), scope["method"]
        limit = MAX_OBJECT if method == "PUT" and path.startswith(f"{PREFIX}/objects/") else BODY_LIMIT
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _refuse(send, path, TooLarge(f"the request body ({length} bytes) is over the limit of {limit} bytes",
                                               "send less at once"), 413)
            return
        receive = _bounded(receive, limit)
        state = scope.setdefault("state", {})
        state["failures"] = self.failures
        if path in PUBLIC or path.startswith("/static/") or (path == "/logout" and method == "POST"):
            await self.app(scope, receive, with_headers(send))
            return
        client = (scope.get("client") or ("?", 0))[0]
        wait = self.failures.blocked_for(client)
        if wait:
            await _refuse(send, path, NotAuthenticated(f"too many failed logins from {client}",
                                                       f"try again in {int(wait) + 1}s"), 429)
            return
        token, bearer = given_token(headers)
        try:
            principal = await anyio.to_thread.run_sync(self.authenticate, token)
        except StoreUnavailable as exc:  # who asks cannot be told now: 503, ask again shortly
            await _refuse(send, path, exc, 503, {"Retry-After": RETRY_AFTER, "Cache-Control": "no-store"})
            return
        except NotAuthenticated as exc:
            if token:
                self.failures.failed(client)
                if self.failed is not None:
                    await anyio.to_thread.run_sync(self.failed, token, client, str(exc))
            if not bearer and method == "GET" and not path.startswith("/api/"):
                query = scope.get("query_string", b"").decode("latin-1")
                target = path + (f"?{query}" if query else "")
                await plain(send, 303, "", {"Location": f"/login?next={quote(target, safe='')}", "Cache-Control": "no-store"})
                return
            await _refuse(send, path, exc, 401, {"WWW-Authenticate": "Bearer"})
            return
        assert token is not None
        if method in CHANGES and not bearer:
            refusal = change_refusal(scope, headers, csrf_for(token))
            if refusal is not None:
                await plain(send, 403, refusal, {})
                return
        state["principal"] = replace(principal, address=client)
        state["csrf"] = csrf_for(token)
        await self.app(scope, receive, with_headers(send))


def failed_login(token: str, client: str, why: str) -> None:
    """A token that did not work, in the audit log (whose it claims to be, never the token)."""
    from ..api import audit, query
    from ..api.users import token_owner

    store = query.open_store()
    audit.record(store, Principal(user=token_owner(store, token), address=client), "login", None, None, "denied",
                 {"message": why})


def logged_in(who: Principal, how: str) -> None:
    """A login (the login page, ``phalanx login``), in the audit log."""
    from ..api import audit, query

    audit.record(query.open_store(), who, "login", who.user, None, "ok", {"by": how})


def _bounded(receive: Any, limit: int) -> Any:
    seen = 0

    async def wrapped() -> Any:
        nonlocal seen
        message = await receive()
        if message.get("type") == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise TooLarge(f"the request body is over the limit of {limit} bytes", "send less at once")
        return message

    return wrapped


async def _refuse(send: Any, path: str, exc: PhalanxError, status: int, extra: dict[str, str] | None = None) -> None:
    if path.startswith("/api/"):
        body = json.dumps({"error": error_body(exc)}).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()), *SECURITY_HEADERS]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})
        return
    await plain(send, status, str(exc), extra or {})
