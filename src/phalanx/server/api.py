"""``/api/v1``: every call of the face over HTTP, as the request's user (``calls.face``). One
handler per route, each a few lines: parse, one call on the face, answer. Submitting (code,
inputs, runs and sweeps) is ``submit.py``'s.

    GET    /whoami                          who the token belongs to, the server's version
    GET    /jobs?all&state&name&...         ps (JSON lines: the listing, then a row per job)
    DELETE /jobs?ref=A&ref=B&dry_run&all_named  rm
    GET    /jobs/{ref}                      status (a job's view, or a sweep's)
    GET    /jobs/{ref}/logs?follow&rank&attempt&tail&since&trial     logs [-f] (JSON lines)
    GET    /jobs/{ref}/metrics?attempt&rank  metrics;  /metrics/records: metrics --jsonl (JSON lines)
    GET    /jobs/{ref}/top | /artifacts | /files?logs&state (download: a tar)
    POST   /jobs/{ref}/wait | /stop | /interrupt       (JSON lines while waiting)
    GET    /sweeps/{ref} | /sweeps/{ref}/trials?sort&column  sweep show, ps --trials [--sort] [-c]
    POST   /prune                            prune (admins)
    GET    /usage?by&since&project           usage
    PUT    /secrets/{name}  body {value}      secret set (NAME: the caller's own; PROJECT/NAME: a project's)
    GET    /secrets                          secret list (names, owners, dates: never a value)
    DELETE /secrets/{name}                   secret rm
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..api.face import LocalFace
from ..api.ps import PsRequest
from ..errors import UsageError
from . import schema
from .calls import answer, body, call, flag, number, streamed, text
from .stream import Sink


def _ref(request: Request) -> str:
    return str(request.path_params["ref"])


async def whoami(request: Request) -> Response:
    """Who the token belongs to (what ``phalanx login`` asks: the audit log records a login)."""
    from .auth import logged_in

    if flag(request, "login"):
        await call(request, lambda face: logged_in(face.principal, "phalanx login"))
    return await answer(request, lambda face: face.whoami())


def ps(request: Request) -> Response:
    q = request.query_params
    unknown = sorted(set(q) - {"all", "wide", "mine", "name", "backend", "since", "search", "sort", "user", "states",
                               "tags", "columns", "limit", "project"})
    if unknown:
        raise UsageError(f"unknown parameter '{unknown[0]}' of ps", "see the API in docs/server.md")
    wanted = PsRequest(all=flag(request, "all"), states=tuple(q.getlist("states")), name=text(request, "name"),
                       backend=text(request, "backend"), tags=tuple(q.getlist("tags")), since=text(request, "since"),
                       search=text(request, "search"), sort=text(request, "sort"), columns=tuple(q.getlist("columns")),
                       limit=number(request, "limit"), wide=flag(request, "wide"), user=text(request, "user"),
                       mine=flag(request, "mine"), project=text(request, "project"))

    def work(face: LocalFace, sink: Sink) -> int:
        listing = face.ps(wanted)
        sink.send({"listing": {"everything": listing.everything, "columns": listing.columns, "wide": listing.wide}})
        count = 0
        for row in listing.rows:
            sink.send({"row": row})
            count += 1
        return count

    return streamed(request, work)


async def rm(request: Request) -> Response:
    refs = request.query_params.getlist("ref")
    if not refs:
        raise UsageError("no job or sweep to remove", "pass ?ref=ID (repeatable)")
    dry, all_named = flag(request, "dry_run"), flag(request, "all_named")
    return await answer(request, lambda face: face.rm(refs, dry, all_named))


async def status(request: Request) -> Response:
    return await answer(request, lambda face: face.status(_ref(request)))


def logs(request: Request) -> Response:
    ref, follow = _ref(request), flag(request, "follow")
    args = {"rank": number(request, "rank"), "attempt": number(request, "attempt"), "tail": number(request, "tail"),
            "since": text(request, "since"), "trial": number(request, "trial")}
    return streamed(request, lambda face, sink: face.logs(ref, sink.out, follow=follow, events=sink.event, **args))


async def metrics(request: Request) -> Response:
    ref, attempt, rank = _ref(request), number(request, "attempt"), number(request, "rank")
    return await answer(request, lambda face: face.metrics(ref, attempt=attempt, rank=rank))


def metric_records(request: Request) -> Response:
    ref, attempt, rank = _ref(request), number(request, "attempt"), number(request, "rank")
    return streamed(request, lambda face, sink: face.metric_records(ref, sink.out, attempt=attempt, rank=rank))


async def top(request: Request) -> Response:
    return await answer(request, lambda face: face.top(_ref(request)))


async def artifacts(request: Request) -> Response:
    return await answer(request, lambda face: face.artifacts(_ref(request)))


async def files(request: Request) -> Response:
    """``download``: the job's outputs (and logs, state) as a tar whose top directory is
    ``NAME-ID``; what each part held in the header ``X-Phalanx-Counts``."""
    import json

    ref, logs_too, state = _ref(request), flag(request, "logs"), flag(request, "state")
    scratch = Path(tempfile.mkdtemp(prefix="phalanx-download-"))

    def gather(face: LocalFace) -> tuple[str, dict[str, int]]:
        found = face.artifacts(ref)
        where, counts = face.download(found["id"], scratch / f"{found['name']}-{found['id']}", logs=logs_too, state=state)
        return Path(where).name, counts

    try:
        name, counts = await call(request, gather)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise

    def tar() -> Iterator[bytes]:
        pipe = _Pipe()
        try:
            with tarfile.open(fileobj=pipe, mode="w|") as out:  # type: ignore[call-overload]
                for path in sorted((scratch / name).rglob("*")):
                    out.add(path, arcname=path.relative_to(scratch).as_posix(), recursive=False)
                    yield from pipe.take()
            yield from pipe.take()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    return StreamingResponse(tar(), media_type="application/x-tar",
                             headers={"X-Phalanx-Dir": name, "X-Phalanx-Counts": json.dumps(counts)})


class _Pipe:
    """A write-only file collecting what ``tarfile`` writes, handed out in pieces."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> Iterator[bytes]:
        parts, self._parts = self._parts, []
        yield from parts


async def wait(request: Request) -> Response:
    ref, given = _ref(request), await body(request, schema.WAIT)

    def work(face: LocalFace, sink: Sink) -> Any:
        heard = (lambda seen: sink.send({"progress": seen})) if given.get("progress") else None
        return face.wait(ref, timeout=given.get("timeout"), progress=heard)

    return streamed(request, work)


async def stop(request: Request) -> Response:
    ref, given = _ref(request), await body(request, schema.STOP)
    return streamed(request, lambda face, sink: face.stop(ref, timeout=given.get("timeout"), events=sink.event,
                                                                  now=bool(given.get("now"))))


async def interrupt(request: Request) -> Response:
    return await answer(request, lambda face: face.interrupt(_ref(request)))


async def sweep(request: Request) -> Response:
    return await answer(request, lambda face: face.sweep(_ref(request)))


async def trials(request: Request) -> Response:
    sort, columns = text(request, "sort"), request.query_params.getlist("column")
    return await answer(request, lambda face: face.trials(_ref(request), sort, columns))


async def prune(request: Request) -> Response:
    given = await body(request, schema.PRUNE)
    return await answer(request, lambda face: face.prune(given["older_than"], given.get("states") or (),
                                                         bool(given.get("dry_run"))))


async def usage(request: Request) -> Response:
    by, since, project = text(request, "by") or "name", text(request, "since"), text(request, "project")
    return await answer(request, lambda face: face.usage(by, since, project))


def _secret(request: Request) -> str:
    return str(request.path_params["name"])


async def secret_set(request: Request) -> Response:
    given = await body(request, schema.SECRET)
    return await answer(request, lambda face: face.secret_set(_secret(request), given["value"]))


async def secret_list(request: Request) -> Response:
    return await answer(request, lambda face: face.secret_list())


async def secret_rm(request: Request) -> Response:
    return await answer(request, lambda face: face.secret_rm(_secret(request)))


def routes(prefix: str) -> list[Route]:
    get, post, put, delete = ["GET"], ["POST"], ["PUT"], ["DELETE"]
    table: list[tuple[str, Any, list[str]]] = [
        ("/whoami", whoami, get),
        ("/jobs", ps, get),
        ("/jobs", rm, delete),
        ("/jobs/{ref}", status, get),
        ("/jobs/{ref}/logs", logs, get),
        ("/jobs/{ref}/metrics", metrics, get),
        ("/jobs/{ref}/metrics/records", metric_records, get),
        ("/jobs/{ref}/top", top, get),
        ("/jobs/{ref}/artifacts", artifacts, get),
        ("/jobs/{ref}/files", files, get),
        ("/jobs/{ref}/wait", wait, post),
        ("/jobs/{ref}/stop", stop, post),
        ("/jobs/{ref}/interrupt", interrupt, post),
        ("/sweeps/{ref}", sweep, get),
        ("/sweeps/{ref}/trials", trials, get),
        ("/prune", prune, post),
        ("/usage", usage, get),
        ("/secrets", secret_list, get),
        ("/secrets/{name:path}", secret_set, put),
        ("/secrets/{name:path}", secret_rm, delete),
    ]
    return [Route(prefix + path, _endpoint(handler), methods=methods) for path, handler, methods in table]


def _endpoint(handler: Any) -> Any:
    """Starlette calls sync endpoints in a thread; these only parse and hand the work on (to
    threads of ``calls``), and a stream must start on the event loop: all run on the loop."""
    import inspect

    if inspect.iscoroutinefunction(handler):
        return handler

    async def endpoint(request: Request) -> Response:
        return handler(request)  # type: ignore[no-any-return]

    return endpoint
