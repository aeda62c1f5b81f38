"""The dashboard's Starlette application: the JSON API under /api, the pages, static assets.

Chart code (plotly.js) is served from the installed ``plotly`` package, never a CDN, so the
dashboard works without internet. Who may call what is :mod:`guard`'s business; every route
that changes something accepts POST only, so a GET (a link, a prefetch, an image tag) never
does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..api import query
from ..api.face import LocalFace
from ..core.identity import Principal
from ..core.rawtext import escaped, escaped_all
from ..errors import JobNotFound, PhalanxError, UsageError
from ..store import JobRecord
from ..supervise.liveness import effective
from . import actions, jobview, pages
from .guard import Guard

STATIC = Path(__file__).parent / "static"
LIST_PARAMS = {"state", "name", "backend", "tag", "since", "q", "sort", "columns", "limit", "after", "view", "user", "mine",
               "project"}


def plotly_js() -> Path:
    """plotly.min.js inside the installed plotly package (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise PhalanxError("the Python package 'plotly' is not installed", "install it with: pip install 'phalanx[web]'")
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise PhalanxError(f"plotly.min.js is missing from {path.parent}", "reinstall plotly: pip install --force-reinstall plotly")
    return path


def _int(request: Request, name: str, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "" or raw == "all":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"'{name}' must be a whole number, not '{raw}'", f"e.g. ?{name}=0") from None


def principal(request: Request) -> Principal:
    """Who asks: the user a team server logged in (``server/auth.py``), else the person at this
    machine (``phalanx ui``: its guard lets nobody else in)."""
    from .. import config

    return (request.scope.get("state") or {}).get("principal") or Principal.here(config.user())


def _face(request: Request) -> LocalFace:
    return LocalFace(principal(request))


def _record(request: Request) -> JobRecord:
    """The job of the URL, as the person asking may see it (another project's: 404, as none)."""
    return _face(request).record(request.path_params["job"])


class ShownJSON(JSONResponse):
    """JSON for a page a person reads: a string holding bytes that are not UTF-8 (a file name, a
    script argument, read by python as surrogates) is sent as ``core.rawtext.escaped`` shows it
    (``caf\\xe9.txt``), where Starlette's UTF-8 encoding would fail the request."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(escaped_all(content))


def _json(payload: Any, status: int = 200) -> JSONResponse:
    return ShownJSON(payload, status_code=status, headers={"Cache-Control": "no-store"})


def _csrf(request: Request) -> str:
    return str((request.scope.get("state") or {}).get("csrf", ""))


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"Content-Security-Policy": pages.CSP, "Cache-Control": "no-store"})


# -- lists ---------------------------------------------------------------------------------------


def _list_query(request: Request, sweeps: bool = False) -> Any:
    from ..api.lists import build_query, check_metrics

    unknown = sorted(set(request.query_params) - LIST_PARAMS)
    if unknown:
        raise UsageError(f"unknown filter '{unknown[0]}'", f"filters: {', '.join(sorted(LIST_PARAMS - {'view', 'after', 'limit'}))}")
    q = request.query_params
    user = principal(request).user if q.get("mine") == "1" else q.get("user")
    wanted = build_query(states=q.getlist("state"), name=q.get("name"), backend=q.get("backend"), tags=q.getlist("tag"),
                        since=q.get("since"), search=q.get("q"), sort=q.get("sort"), columns=q.getlist("columns"),
                        sweeps=sweeps, user=user, projects=_face(request)._projects_asked(q.get("project") or None))
    if not sweeps:
        check_metrics(query.open_store(), wanted.columns, wanted.sort)
    return wanted


def api_jobs(request: Request) -> Response:
    """A page of jobs (``?limit=``, default 50), filtered (``state name backend tag since q
    project``), sorted (``sort``) with metric ``columns``; the header ``X-Next-Page`` holds the
    cursor of the next page (``?after=``) when there are more. A queued job carries its place in
    its project's queue and why it waits."""
    from ..api.lists import page

    wanted = _list_query(request)
    limit = max(1, min(_int(request, "limit", 50) or 50, 1000))
    store = query.open_store()
    rows, after = page(store, wanted, limit, request.query_params.get("after") or None)
    _queue_places(store, rows)
    response = _json(rows)
    if after is not None:
        response.headers["X-Next-Page"] = after
    return response


def _queue_places(store: Any, rows: list[dict[str, Any]]) -> None:
    from ..supervise.admission import places

    waiting = [r for r in rows if r.get("state") == "QUEUED"]
    if not waiting:
        return
    found = places(store, {r["project"] for r in waiting})
    for row in waiting:
        place = found.get(row["id"])
        if place is not None:
            row["queue_place"], row["queue_length"] = place


def api_events(request: Request) -> Response:
    """The audit log, newest first (``?since user project before limit``): project admins see
    their projects' events, server admins all, others get 403."""
    q = request.query_params
    found = _face(request).events(since=q.get("since") or None, user=q.get("user") or None,
                                  project=q.get("project") or None, before=_int(request, "before"),
                                  limit=max(1, min(_int(request, "limit", 100) or 100, 1000)))
    return _json(found)


def page_events(request: Request) -> Response:
    return _html(pages.events_page(_csrf(request), _who(request)))


def api_jobs_count(request: Request) -> Response:
    from ..store.listing import count_jobs

    return _json({"count": count_jobs(query.open_store(), _list_query(request).filter)})


def api_sweeps(request: Request) -> Response:
    from ..api.lists import sweep_row
    from ..store.listing import page_sweeps

    wanted = _list_query(request, sweeps=True)
    limit = max(1, min(_int(request, "limit", 50) or 50, 500))
    store = query.open_store()
    listing = page_sweeps(store, wanted.filter, wanted.sort, limit, request.query_params.get("after") or None)
    rows = [sweep_row(store, effective(s)) for s in listing.rows]  # a vanished runner: LOST, computed on read
    response = _json(rows)
    if listing.next is not None:
        response.headers["X-Next-Page"] = listing.next
    return response


def api_meta(request: Request) -> Response:
    """What the filters offer: states, backends, metric names, tag keys."""
    from ..backends.registry import known
    from ..api.lists import STATES
    from ..store.listing import metric_names, tag_keys

    store = query.open_store()
    me = principal(request)
    mine = {p: me.role(p) for p in sorted(me.projects)} if not me.everywhere and me.projects is not None \
        else {p.name: "admin" for p in store.projects.all()}
    return _json({"states": list(STATES), "backends": sorted(known()), "metrics": metric_names(store),
                  "tag_keys": tag_keys(store), "user": me.user, "admin": me.admin, "local": me.local,
                  "projects": mine, "events": me.local or me.admin or any(r == "admin" for r in mine.values())})


# -- one job -------------------------------------------------------------------------------------


def api_job(request: Request) -> Response:
    return _json(jobview.job_detail(_record(request), principal(request)))


def api_metrics(request: Request) -> Response:
    from .series import MAX_POINTS, metric_series

    record = _record(request)
    rank = _int(request, "rank")
    points = max(10, min(_int(request, "points", MAX_POINTS) or MAX_POINTS, 20000))
    return _json(metric_series(record, _int(request, "attempt"), None if rank is None else [rank], points))


def api_resources(request: Request) -> Response:
    from .series import resource_series

    return _json(resource_series(_record(request), _int(request, "attempt")))


def api_logs(request: Request) -> Response:
    from .logs import LOG_CHUNK, read_log, search_log

    record = _record(request)
    rank = _int(request, "rank", 0)
    assert rank is not None
    wanted = request.query_params.get("q")
    if wanted:
        return _json(search_log(record, rank, wanted, _int(request, "attempt")))
    return _json(read_log(record, rank, _int(request, "attempt"), _int(request, "offset"),
                          _int(request, "limit", LOG_CHUNK) or LOG_CHUNK))


def api_logs_stream(request: Request) -> Response:
    """A rank's log as Server-Sent Events while it is written (the job page's "follow"): one
    long answer, each new piece an event, ``end`` once the job has ended (``logs.follow_log``)."""
    from starlette.responses import StreamingResponse

    from .logs import log_events

    record = _record(request)
    events = log_events(lambda: query.get_job(record.id), _int(request, "rank", 0) or 0, _int(request, "attempt"),
                        _int(request, "offset"))
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def api_artifacts(request: Request) -> Response:
    return _json(jobview.artifacts(_record(request)))


def api_artifact_file(request: Request) -> Response:
    """One output file: images and text to show, anything else to download; never run as a
    page (``Content-Security-Policy: sandbox``)."""
    path, media = jobview.artifact_file(_record(request), request.query_params.get("path", ""))
    if request.query_params.get("preview") == "1":
        with open(path, "rb") as fh:
            head = fh.read(jobview.PREVIEW_BYTES)
        return Response(head.decode("utf-8", errors="replace"), media_type="text/plain; charset=utf-8",
                        headers={"Content-Security-Policy": "sandbox", "Cache-Control": "no-store"})
    download = request.query_params.get("download") == "1" or media == "application/octet-stream"
    headers = {"Content-Security-Policy": "sandbox", "Cache-Control": "no-store"}
    return FileResponse(path, media_type=media, headers=headers,
                        content_disposition_type="attachment" if download else "inline", filename=escaped(path.name))


def api_job_action(request: Request) -> Response:
    return _json(actions.job_action(_face(request), request.path_params["job"], request.path_params["action"]), 202)


def _compare_records(request: Request) -> list[JobRecord]:
    refs = [r for r in request.query_params.get("jobs", "").split(",") if r.strip()]
    if not refs:
        raise UsageError("no jobs to compare", "pass ?jobs=ID1,ID2")
    face = _face(request)
    return [face.record(r.strip()) for r in refs[:20]]


def api_compare(request: Request) -> Response:
    from .series import compare_series

    return _json(compare_series(_compare_records(request)))


# -- sweeps --------------------------------------------------------------------------------------


def _sweep(request: Request) -> Any:
    sweep = _face(request).find_sweep(request.path_params["sweep"])
    if sweep is None:
        raise JobNotFound(f"no sweep '{request.path_params['sweep']}'", "list sweeps with: phalanx ps --all")
    return sweep


def api_sweep(request: Request) -> Response:
    return _json(actions.sweep_detail(_sweep(request), _face(request)))


def api_sweep_action(request: Request) -> Response:
    return _json(actions.sweep_action(_face(request), request.path_params["sweep"], request.path_params["action"]), 202)


# -- pages ---------------------------------------------------------------------------------------


def page_list(request: Request) -> Response:
    view = request.query_params.get("view", "jobs")
    if view not in ("jobs", "sweeps"):
        raise UsageError(f"unknown view '{view}'", "use ?view=jobs or ?view=sweeps")
    return _html(pages.list_page(view, _csrf(request), _who(request)))


def page_job(request: Request) -> Response:
    record = _record(request)
    return _html(pages.job_page(record.id, record.name, record.state.value, _csrf(request), _who(request)))


def page_sweep(request: Request) -> Response:
    sweep = _sweep(request)
    return _html(pages.sweep_page(sweep.id, sweep.name, sweep.state.value, _csrf(request), _who(request)))


def page_compare(request: Request) -> Response:
    return _html(pages.compare_page([r.id for r in _compare_records(request)], _csrf(request), _who(request)))


def _who(request: Request) -> str | None:
    """The user to show in the page's header (with a logout button): a team server's, not ``phalanx ui``'s."""
    me = principal(request)
    return None if me.local else me.user


def static_plotly(request: Request) -> Response:
    return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})


def _static(name: str, media_type: str) -> Callable[[Request], Response]:
    def handler(request: Request) -> Response:
        return FileResponse(STATIC / name, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return handler


async def _phalanx_error(request: Request, exc: Exception) -> Response:
    from ..errors import NotAllowed

    status = (404 if isinstance(exc, JobNotFound) else 403 if isinstance(exc, (jobview.Forbidden, NotAllowed)) else
              409 if isinstance(exc, actions.Conflict) else 400 if isinstance(exc, UsageError) else 500)
    if request.url.path.startswith("/api/"):
        return _json({"error": str(exc)}, status)
    return _html(pages.error_page(status, str(exc)), status)


def create_app(token: str | None = None, loopback: bool = True, check_user: bool = True, csrf: str | None = None) -> Any:
    """The ASGI application. ``token``: required on every request when set (see ``guard``).
    ``loopback``: served on a loopback address (without a token: loopback Host headers and
    this machine's user only)."""
    app = Starlette(routes=routes(), exception_handlers={PhalanxError: error_handler})
    return Guard(app, token, loopback, csrf=csrf, check_user=check_user)


error_handler = _phalanx_error


def _on_loop(handler: Callable[[Request], Response]) -> Any:
    """An endpoint that starts a stream: it must run on the event loop (Starlette runs plain
    functions in a thread)."""
    async def endpoint(request: Request) -> Response:
        return handler(request)

    return endpoint


def routes() -> list[Route]:
    """The dashboard's pages, its JSON API under ``/api`` and its static files (a team server
    serves them too, beside ``/api/v1``)."""
    get, post = ["GET"], ["POST"]
    return [
        Route("/", page_list, methods=get),
        Route("/jobs/{job}", page_job, methods=get),
        Route("/sweeps/{sweep}", page_sweep, methods=get),
        Route("/compare", page_compare, methods=get),
        Route("/events", page_events, methods=get),
        Route("/api/events", api_events, methods=get),
        Route("/api/jobs", api_jobs, methods=get),
        Route("/api/jobs/count", api_jobs_count, methods=get),
        Route("/api/meta", api_meta, methods=get),
        Route("/api/sweeps", api_sweeps, methods=get),
        Route("/api/sweeps/{sweep}", api_sweep, methods=get),
        Route("/api/sweeps/{sweep}/{action}", api_sweep_action, methods=post),
        Route("/api/jobs/{job}", api_job, methods=get),
        Route("/api/jobs/{job}/metrics", api_metrics, methods=get),
        Route("/api/jobs/{job}/resources", api_resources, methods=get),
        Route("/api/jobs/{job}/logs", api_logs, methods=get),
        Route("/api/jobs/{job}/logs/stream", _on_loop(api_logs_stream), methods=get),
        Route("/api/jobs/{job}/artifacts", api_artifacts, methods=get),
        Route("/api/jobs/{job}/artifacts/file", api_artifact_file, methods=get),
        Route("/api/jobs/{job}/{action}", api_job_action, methods=post),
        Route("/api/compare", api_compare, methods=get),
        Route("/static/plotly.min.js", static_plotly, methods=get),
        *(Route(f"/static/{name}", _static(name, kind), methods=get) for name, kind in (
            ("common.js", "text/javascript"), ("list.js", "text/javascript"), ("job.js", "text/javascript"),
            ("events.js", "text/javascript"),
            ("jobparts.js", "text/javascript"),
            ("sweep.js", "text/javascript"), ("app.css", "text/css"))),
    ]
