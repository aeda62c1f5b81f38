"""How a route answers: the face of the request's user, a blocking call run off the event loop,
its JSON (or its error, ``api/wire.py``), request bodies checked (``schema.py``) and query
parameters typed."""

from __future__ import annotations

import json
from typing import Any, Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..api import wire
from ..api.face import LocalFace
from ..core.identity import Principal
from ..errors import PhalanxError, UsageError
from . import schema
from .stream import Sink, internal, stream

# Blocking calls (store reads, a stop that waits) run in threads; a long stream has a thread of its own.
LIMITER = anyio.CapacityLimiter(64)
NDJSON = "application/x-ndjson"


def principal(request: Request) -> Principal:
    """Who asks, narrowed to one project when the request says so (a command's ``--project``)."""
    who: Principal = request.scope["state"]["principal"]
    return who.narrowed(request.headers.get("x-phalanx-project") or None)


def face(request: Request) -> LocalFace:
    return LocalFace(principal(request))


RETRY_AFTER = wire.RETRY_AFTER


def error(exc: PhalanxError) -> JSONResponse:
    status = wire.status_of(exc)
    headers = {"Cache-Control": "no-store", **({"Retry-After": RETRY_AFTER} if status == 503 else {})}
    return JSONResponse({"error": wire.error_body(exc)}, status_code=status, headers=headers)


async def call(request: Request, work: Callable[[LocalFace], Any]) -> Any:
    """``work(face)`` in a thread (PhalanxErrors raised: the app's handler answers them)."""
    return await anyio.to_thread.run_sync(work, face(request), limiter=LIMITER)


async def answer(request: Request, work: Callable[[LocalFace], Any], status: int = 200) -> Response:
    """``work(face)`` in a thread; its result as ``{"result": ...}``."""
    try:
        result = await call(request, work)
    except PhalanxError as exc:
        return error(exc)
    except Exception as exc:  # noqa: BLE001 - one line for the client, the traceback in the log
        return JSONResponse({"error": internal(exc)}, status_code=500)
    return JSONResponse({"result": result}, status_code=status, headers={"Cache-Control": "no-store"})


def streamed(request: Request, work: Callable[[LocalFace, Sink], Any]) -> Response:
    me = face(request)
    return StreamingResponse(stream(lambda sink: work(me, sink), name=f"phalanx-{request.url.path}"),
                             media_type=NDJSON, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def body(request: Request, shape: schema.Schema) -> Any:
    """The request's JSON, checked against ``shape`` (the size was bounded by the guard)."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise UsageError(f"the request body is not JSON: {exc}", "send Content-Type: application/json") from None
    return schema.check(data, shape)


def flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "")
    if raw.lower() in ("", "0", "false", "no"):
        return False
    if raw.lower() in ("1", "true", "yes"):
        return True
    raise UsageError(f"'{name}' must be 1 or 0, not '{raw[:40]}'", f"e.g. ?{name}=1")


def number(request: Request, name: str, kind: type = int) -> Any:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"'{name}' must be a number, not '{raw[:40]}'", f"e.g. ?{name}=0") from None
    return value


def text(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name)
    if raw is not None and len(raw) > 4096:
        raise UsageError(f"'{name}' is too long", "send at most 4096 characters")
    return raw


def ranks(value: Any) -> set[int] | None:
    return None if value is None else {int(r) for r in value}
