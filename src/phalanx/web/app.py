"""The dashboard's Starlette application: JSON API under /api, pages, and static assets.

Read-only. Chart code (plotly.js) is served from the installed ``plotly`` package, never a
CDN, so the dashboard works without internet. Access control is :class:`Guard`: a token (when
set) on every request, and Host-header checking when serving loopback without a token, so a
web page the user visits cannot read the API through DNS rebinding.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import query
from ..errors import JobNotFound, PhalanxError, UsageError
from ..store import JobRecord
from . import data, pages

STATIC = Path(__file__).parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def plotly_js() -> Path:
    """plotly.min.js inside the installed plotly package (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise PhalanxError("the Python package 'plotly' is not installed", "install it with: pip install 'phalanx[web]'")
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise PhalanxError(f"plotly.min.js is missing from {path.parent}", "reinstall plotly: pip install --force-reinstall plotly")
    return path


class Guard:
    """ASGI middleware: a token on every request when one is set; loopback Host headers only
    when serving without one."""

    def __init__(self, app: ASGIApp, token: str | None, check_host: bool) -> None:
        self.app = app
        self.token = token
        self.check_host = check_host

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.check_host and _host_name(headers.get("host", "")) not in LOOPBACK_HOSTS:
            await PlainTextResponse("unknown host", status_code=400)(scope, receive, send)
            return
        if self.token is not None and not self._authorized(scope, headers):
            response = PlainTextResponse("a token is required: add ?token=... or the header Authorization: Bearer ...",
                                         status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope, headers: dict[str, str]) -> bool:
        assert self.token is not None
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = given or auth[7:].strip()
        return bool(given) and secrets.compare_digest(given.encode(), self.token.encode())


def _host_name(host: str) -> str:
    """The name part of a Host header: ``127.0.0.1:8000`` -> ``127.0.0.1``, ``[::1]:80`` -> ``::1``."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _int(request: Request, name: str, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "" or raw == "all":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"'{name}' must be a whole number, not '{raw}'", f"e.g. ?{name}=0") from None


def _record(request: Request) -> JobRecord:
    return query.get_job(request.path_params["job"])


def _json(payload: Any) -> JSONResponse:
    return JSONResponse(payload, headers={"Cache-Control": "no-store"})


def api_jobs(request: Request) -> Response:
    """The newest jobs, ``?limit=`` (default 500) at a time; the header ``X-Next-Page`` holds
    the cursor of the next page (``?after=``) when there are more."""
    limit = _int(request, "limit", 500) or 500
    rows, after = data.jobs_page(limit, request.query_params.get("after") or None)
    response = _json(rows)
    if after is not None:
        response.headers["X-Next-Page"] = after
    return response


def api_job(request: Request) -> Response:
    return _json(data.job_detail(_record(request)))


def api_metrics(request: Request) -> Response:
    record = _record(request)
    rank = _int(request, "rank")
    points = max(10, min(_int(request, "points", data.MAX_POINTS) or data.MAX_POINTS, 20000))
    return _json(data.metric_series(record, _int(request, "attempt"), None if rank is None else [rank], points))


def api_resources(request: Request) -> Response:
    return _json(data.resource_series(_record(request), _int(request, "attempt")))


def api_logs(request: Request) -> Response:
    record = _record(request)
    rank = _int(request, "rank", 0)
    assert rank is not None
    query = request.query_params.get("q")
    if query:
        return _json(data.search_log(record, rank, query, _int(request, "attempt")))
    return _json(data.read_log(record, rank, _int(request, "attempt"), _int(request, "offset"),
                               _int(request, "limit", data.LOG_CHUNK) or data.LOG_CHUNK))


def _compare_records(request: Request) -> list[JobRecord]:
    refs = [r for r in request.query_params.get("jobs", "").split(",") if r.strip()]
    if not refs:
        raise UsageError("no jobs to compare", "pass ?jobs=ID1,ID2")
    return [query.get_job(r.strip()) for r in refs[:20]]


def api_compare(request: Request) -> Response:
    return _json(data.compare_series(_compare_records(request)))


def page_jobs(request: Request) -> Response:
    return HTMLResponse(pages.jobs_page(request.app.state.token))


def page_job(request: Request) -> Response:
    record = _record(request)
    return HTMLResponse(pages.job_page(record, request.app.state.token))


def page_compare(request: Request) -> Response:
    return HTMLResponse(pages.compare_page([r.id for r in _compare_records(request)], request.app.state.token))


def static_plotly(request: Request) -> Response:
    return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})


def _static(name: str, media_type: str) -> Callable[[Request], Response]:
    def handler(request: Request) -> Response:
        return FileResponse(STATIC / name, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return handler


async def _phalanx_error(request: Request, exc: Exception) -> Response:
    status = 404 if isinstance(exc, JobNotFound) else 403 if isinstance(exc, data.Forbidden) else (
        400 if isinstance(exc, UsageError) else 500)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": str(exc)}, status_code=status)
    return HTMLResponse(pages.error_page(status, str(exc)), status_code=status)


def create_app(token: str | None = None, check_host: bool = True) -> Any:
    """The ASGI application. ``token``: required on every request when set. ``check_host``:
    accept only loopback Host headers (use when bound to loopback without a token)."""
    routes = [
        Route("/", page_jobs),
        Route("/jobs/{job}", page_job),
        Route("/compare", page_compare),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{job}", api_job),
        Route("/api/jobs/{job}/metrics", api_metrics),
        Route("/api/jobs/{job}/resources", api_resources),
        Route("/api/jobs/{job}/logs", api_logs),
        Route("/api/compare", api_compare),
        Route("/static/plotly.min.js", static_plotly),
        Route("/static/app.js", _static("app.js", "text/javascript")),
        Route("/static/app.css", _static("app.css", "text/css")),
    ]
    app = Starlette(routes=routes, exception_handlers={PhalanxError: _phalanx_error})
    app.state.token = token
    return Guard(app, token, check_host and token is None)


def dumps(value: Any) -> str:
    """JSON safe to embed in a <script> element."""
    return json.dumps(value).replace("</", "<\\/")
