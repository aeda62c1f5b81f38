"""The team server's ASGI application: ``/api/v1`` (``api.py``, ``submit.py``), the dashboard
(``phalanx.web``'s pages and JSON, as the logged-in user), ``/login`` and ``/logout``,
``/healthz`` and ``/metrics``; behind ``auth.Auth`` (who asks) and ``metrics.Timed``.

Nothing is kept here between requests but counters: jobs, users and tokens are in the store,
job files in the home, so replicas against one store answer alike.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ..api import query
from ..api.wire import PREFIX
from ..core.identity import Principal
from ..errors import NotAuthenticated, PhalanxError, StoreError, StoreUnavailable
from ..web import pages
from ..web import app as web
from ..web.guard import COOKIE
from . import api, calls, metrics, submit, teams
from .auth import Auth, FailedLogins, change_refusal, csrf_for, failed_login, given_token, logged_in


def authenticate(token: str | None) -> Principal:
    from ..api.users import authenticate as check

    return check(query.open_store(), token)


async def healthz(request: Request) -> Response:
    """200 when the store answers (a load balancer's check); 503 with the reason otherwise."""
    import anyio

    def probe() -> None:
        query.open_store().count()

    try:
        await anyio.to_thread.run_sync(probe, limiter=calls.LIMITER)
    except Exception as exc:  # noqa: BLE001 - any failure of the store is "not ready"
        return PlainTextResponse(f"unhealthy: the job store is unavailable ({type(exc).__name__})\n", status_code=503,
                                 headers={"Retry-After": calls.RETRY_AFTER, "Cache-Control": "no-store"})
    return PlainTextResponse("ok\n")


def metrics_route(requests: metrics.Requests) -> Any:
    async def endpoint(request: Request) -> Response:
        import anyio

        from ..store.listing import count_by_state

        def read() -> str:
            store = query.open_store()
            return metrics.text(requests, count_by_state(store), store.users.count())

        try:
            body = await anyio.to_thread.run_sync(read, limiter=calls.LIMITER)
        except StoreError as exc:  # the store is away: no numbers to give (a scrape retries)
            return PlainTextResponse(f"unavailable: {exc.message}\n", status_code=503,
                                     headers={"Retry-After": calls.RETRY_AFTER})
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return endpoint


def _next(raw: str | None) -> str:
    """Where to go after logging in: a path of this server only (never ``//elsewhere``)."""
    return raw if raw and raw.startswith("/") and not raw.startswith("//") and "\\" not in raw else "/"


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"Content-Security-Policy": pages.CSP, "Cache-Control": "no-store"})


async def login_page(request: Request) -> Response:
    return _html(pages.login_page(next_path=_next(request.query_params.get("next"))))


async def login(request: Request) -> Response:
    """The login form: a valid token becomes the session cookie; a wrong one counts as a failed login."""
    import anyio

    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token, target = (form.get("token") or [""])[0].strip(), _next((form.get("next") or ["/"])[0])
    headers = {k.lower(): v for k, v in request.headers.items()}
    refusal = change_refusal(request.scope, headers, None)
    if refusal is not None:
        return PlainTextResponse(refusal, status_code=403)
    failures: FailedLogins = request.scope["state"]["failures"]
    client = request.client.host if request.client else "?"
    wait = failures.blocked_for(client)
    if wait:
        return _html(pages.login_page(f"too many failed logins from {client}: try again in {int(wait) + 1}s", target), 429)
    try:
        who = await anyio.to_thread.run_sync(authenticate, token, limiter=calls.LIMITER)
    except NotAuthenticated as exc:
        failures.failed(client)
        if token:
            await anyio.to_thread.run_sync(failed_login, token, client, str(exc), limiter=calls.LIMITER)
        return _html(pages.login_page(str(exc), target), 401)
    await anyio.to_thread.run_sync(logged_in, replace(who, address=client), "the login page", limiter=calls.LIMITER)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Phalanx-User"] = who.user
    return response


async def logout(request: Request) -> Response:
    """Forget the session cookie (a form POST from a page of this server, with its CSRF token)."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token, _ = given_token({k.lower(): v for k, v in request.headers.items()})
    headers = {k.lower(): v for k, v in request.headers.items()}
    refusal = change_refusal(request.scope, headers, None)
    sent = (form.get("csrf") or [""])[0]
    if refusal is None and token and not secrets.compare_digest(sent.encode(), csrf_for(token).encode()):
        refusal = "the page's CSRF token is missing or stale: reload the page"
    if refusal is not None:
        return PlainTextResponse(refusal, status_code=403)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


async def _error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, PhalanxError):
        raise exc
    if request.url.path.startswith(PREFIX):
        return calls.error(exc)
    if isinstance(exc, StoreUnavailable):  # a page: try again shortly, as an API client would
        response = _html(pages.error_page(503, "the server's job store is unavailable; reload in a few seconds"), 503)
        response.headers["Retry-After"] = calls.RETRY_AFTER
        return response
    return await web.error_handler(request, exc)


def create_app(requests: metrics.Requests | None = None, failures: FailedLogins | None = None) -> Any:
    """The server's application (authenticated against the store ``query.open_store`` opens)."""
    requests = requests or metrics.Requests()
    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_route(requests), methods=["GET"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        *api.routes(PREFIX),
        *submit.routes(PREFIX),
        *teams.routes(PREFIX),
        *web.routes(),
    ]
    app = Starlette(routes=routes, exception_handlers={PhalanxError: _error})
    return metrics.Timed(Auth(app, authenticate, failures, failed_login), requests)
