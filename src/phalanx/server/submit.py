"""``/api/v1``: submitting from another machine. The client first asks which objects of its
code and local inputs the server lacks and sends only those (``storage/objects.py``), then
submits the spec with the manifests (``shipping.py`` lays the code out and makes the spec run
here).

    POST /objects/missing   {"objects": [[sha256, executable], ...]} -> the ones to send
    PUT  /objects/{sha256}?x=0|1   the bytes (checked against the digest)
    POST /jobs              {"spec", "code", "inputs", "detach", "ranks"}: run [-d] (JSON lines)
    POST /plans             the same: --dry-run, the plan as this server would run it
    POST /sweeps            {"spec", "settings", "code", "inputs", "detach"}: a sweep (JSON lines)
    POST /jobs/{ref}/resume {"detach", "ranks"} (JSON lines)
    POST /state/clean       {"spec"}: --clean-state

Every job runs detached here, under a supervisor of its own session, so a restart of the server
leaves it running; a foreground run is that job followed (``face.attach``) until it ends, and
the client's Ctrl-C reaches it as ``POST /jobs/{ref}/interrupt``. A client that goes away
leaves the job running, as ``run -d`` would have.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..api.attach import log_size
from ..api.face import LocalFace
from ..api.query import home
from ..core.paths import HomePaths
from ..errors import UsageError
from ..storage import objects
from . import schema, shipping
from .calls import answer, body, call, flag, ranks, streamed
from .stream import Sink, Writer

async def missing(request: Request) -> Response:
    given = await body(request, schema.MISSING)
    wanted = []
    for item in given["objects"]:
        if len(item) != 2 or not isinstance(item[0], str):
            raise UsageError("request.objects: each item is [sha256, executable]", "see the API in docs/server.md")
        wanted.append((item[0], bool(item[1])))
    return await answer(request, lambda face: [[sha, int(x)] for sha, x in objects.missing(home(), wanted)])


async def put_object(request: Request) -> Response:
    """One object's bytes, written to disk as they arrive (never whole in memory), checked."""
    sha, executable = str(request.path_params["sha"]), flag(request, "x")
    with objects.Upload(home()) as upload:
        async for chunk in request.stream():
            upload.write(chunk)
        stored = await call(request, lambda face: upload.finish(sha, executable))
    return JSONResponse({"result": {"stored": stored}}, status_code=201 if stored else 200)


async def run_job(request: Request) -> Response:
    given = await body(request, schema.SUBMIT)
    shown = ranks(given.get("ranks"))

    def work(face: LocalFace, sink: Sink) -> dict[str, Any]:
        where = home()
        job_id = _new_id(where)
        spec = shipping.receive(where, given, job_id, face.principal.user)
        try:
            record = face.submit(spec, events=sink.event, job_id=job_id)
        except BaseException:
            shipping.abandon(where, job_id)
            raise
        if record["id"] != job_id:  # --skip-if-done: an earlier job stands for it
            shipping.abandon(where, job_id)
        shipping.settled(where, job_id)
        CHILDREN.add(record.get("supervisor_pid"))
        if given.get("detach"):
            return {"job": record}
        sink.send({"started": record})
        final, code = face.attach(record["id"], Writer(sink), shown, sink.event)  # type: ignore[arg-type]
        return {"job": final, "code": code}

    return streamed(request, work)


async def plan(request: Request) -> Response:
    given = await body(request, schema.SUBMIT)

    def work(face: LocalFace) -> dict[str, Any]:
        where = home()
        spec = shipping.receive(where, given, _new_id(where), face.principal.user, plan_only=True)
        return face.dry_run(spec)

    return await answer(request, work)


async def run_sweep(request: Request) -> Response:
    given = await body(request, schema.SUBMIT)

    def work(face: LocalFace, sink: Sink) -> dict[str, Any]:
        from ..sweeps.settings import SweepSettings

        where = home()
        settings = _settings(SweepSettings, given.get("settings") or {})
        sweep_id = _new_id(where)
        spec = shipping.receive(where, given, sweep_id, face.principal.user)
        try:
            sweep, _ = face.run_sweep(spec, settings, detach=True, events=sink.event, sweep_id=sweep_id)
        except BaseException:
            shipping.abandon(where, sweep_id)
            raise
        shipping.settled(where, sweep_id)
        CHILDREN.add(sweep.get("supervisor_pid"))
        if given.get("detach"):
            return {"sweep": sweep, "code": None}
        done = _follow_sweep(face, sweep["id"], where.sweep_log(sweep["id"]), sink)
        return {"sweep": done, "code": done["wait_code"]}

    return streamed(request, work)


def _follow_sweep(face: LocalFace, sweep_id: str, log: Any, sink: Sink) -> dict[str, Any]:
    """A foreground sweep from here: its runner's lines as events until it ends."""
    from ..api.attach import PREFIX, Lines

    lines = Lines(log, 0)
    result: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: result.append(face.wait(sweep_id)), daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(0.2)
        for line in lines.new():
            if line.startswith(PREFIX):
                sink.event(line[len(PREFIX):])
        sink.out("")  # a client gone stops the following (the sweep runs on)
    for line in lines.new():
        if line.startswith(PREFIX):
            sink.event(line[len(PREFIX):])
    if not result:
        raise UsageError(f"sweep {sweep_id} could not be followed", f"see: phalanx sweep show {sweep_id}")
    return result[0]


def _settings(cls: Any, data: dict[str, Any]) -> Any:
    known = set(getattr(cls, "__dataclass_fields__", {}))
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"request.settings: unknown field '{unknown[0]}'", f"fields: {', '.join(sorted(known))}")
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
    except (TypeError, ValueError) as exc:
        raise UsageError(f"request.settings: {exc}", "send what the client's sweep settings hold") from None


async def resume(request: Request) -> Response:
    ref, given = str(request.path_params["ref"]), await body(request, schema.RESUME)
    shown = ranks(given.get("ranks"))

    def work(face: LocalFace, sink: Sink) -> dict[str, Any]:
        found = face.status(ref)
        log_from = log_size(HomePaths(home().root).job(found["id"]).supervisor_log) if found["kind"] == "job" else 0
        done, code = face.resume(ref, detach=True, events=sink.event)
        CHILDREN.add(done.get("supervisor_pid"))
        if given.get("detach") or done["kind"] == "sweep":
            if done["kind"] == "sweep" and not given.get("detach"):
                finished = _follow_sweep(face, done["id"], home().sweep_log(done["id"]), sink)
                return {"job": {"kind": "sweep", **finished}, "code": finished["wait_code"]}
            return {"job": done, "code": None}
        sink.send({"started": done})
        final, code = face.attach(done["id"], Writer(sink), shown, sink.event, log_from=log_from)  # type: ignore[arg-type]
        return {"job": {"kind": "job", **final}, "code": code}

    return streamed(request, work)


async def clean_state(request: Request) -> Response:
    given = await body(request, schema.obj(("spec",), spec=schema.SPEC))
    return await answer(request, lambda face: face.clean_state(shipping.decode_spec(given["spec"])))


def _new_id(where: HomePaths) -> str:
    from ..supervise.submit import new_job_id

    return new_job_id(where)


class _Children:
    """The supervisors this server started: reaped when they end (their records say how they
    ended; a supervisor that outlives the server is adopted by init instead)."""

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, pid: Any) -> None:
        if not isinstance(pid, int) or pid <= 0:
            return
        with self._lock:
            self._pids.add(pid)
            if self._thread is None:
                self._thread = threading.Thread(target=self._reap, name="phalanx-reaper", daemon=True)
                self._thread.start()

    def _reap(self) -> None:
        import time

        while True:
            time.sleep(1.0)
            with self._lock:
                pids = list(self._pids)
            for pid in pids:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid  # not ours to wait for (reaped elsewhere)
                if done:
                    with self._lock:
                        self._pids.discard(pid)


CHILDREN = _Children()


def routes(prefix: str) -> list[Route]:
    post = ["POST"]
    return [
        Route(f"{prefix}/objects/missing", missing, methods=post),
        Route(f"{prefix}/objects/{{sha}}", put_object, methods=["PUT"]),
        Route(f"{prefix}/jobs", run_job, methods=post),
        Route(f"{prefix}/plans", plan, methods=post),
        Route(f"{prefix}/sweeps", run_sweep, methods=post),
        Route(f"{prefix}/jobs/{{ref}}/resume", resume, methods=post),
        Route(f"{prefix}/state/clean", clean_state, methods=post),
    ]
