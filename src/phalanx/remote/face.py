"""``RemoteFace``: the face (``api/face.py``) served by a team server over HTTP (``server/``).
Every call answers what ``LocalFace``'s does, so every command prints what it prints locally;
what streams (a foreground run, ``logs -f``, ``stop``) arrives as it happens over one long
HTTP answer (``server/stream.py``), never by asking again and again.

A foreground ``run`` ships the code and local inputs (only what the server lacks,
``ship.py``), streams every rank's output, and passes Ctrl-C on as the job's Ctrl-C: the
first reaches the ranks as SIGINT, a second escalates, as locally. The job runs detached on the
server: if this process goes away, the job runs on (``phalanx logs -f`` picks it up again).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

from ..api.ps import PsListing, PsRequest
from ..api.wire import ps_params
from ..core.identity import Principal
from ..core.spec import JobSpec
from ..errors import PhalanxError, UsageError
from urllib.parse import quote

from .client import Client, ref_path
from .login import Login
from .ship import Shipped, manifests, upload

Events = Callable[[str], None]
# A submit whose answer was cut off (the server killed): it may have been recorded, and then runs.
SUBMIT_CUT = "the job may have been recorded before the answer was cut: see phalanx ps before submitting again"


class RemoteFace:
    def __init__(self, login: Login, project: str | None = None) -> None:
        self.login = login
        self.client = Client(login.url, login.token, login.ca, project=project)
        self.shipped: Shipped | None = None  # what the last submit sent (benchmarks read it)
        self._principal: Principal | None = None

    @property
    def principal(self) -> Principal:
        if self._principal is None:
            me = self.whoami()
            self._principal = Principal(user=me["user"], admin=bool(me["admin"]), projects=me.get("projects"))
        return self._principal

    def _job(self, ref: str, tail: str = "") -> str:
        return ref_path("jobs", ref, tail)

    def _streamed(self, method: str, path: str, params: Sequence[tuple[str, str]] = (), body: Any = None,
                  emit: Callable[[str], None] | None = None, events: Events | None = None,
                  started: Callable[[dict[str, Any]], None] | None = None,
                  progress: Callable[[dict[str, Any]], None] | None = None, cut_hint: str | None = None) -> Any:
        lines = self.client.lines(method, path, params, body, **({"cut_hint": cut_hint} if cut_hint else {}))
        for item in lines:
            if "progress" in item and progress is not None:
                progress(item["progress"])
            elif "out" in item and emit is not None:
                emit(item["out"])
            elif "event" in item and events is not None:
                events(item["event"])
            elif "started" in item and started is not None:
                started(item["started"])
            elif "result" in item:
                return item["result"]
        return None

    # -- views -------------------------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        return self.client.call("GET", "/whoami")  # type: ignore[no-any-return]

    def ps(self, request: PsRequest) -> PsListing:
        lines = self.client.lines("GET", "/jobs", ps_params(request))
        head = next(lines)["listing"]

        def rows() -> Iterator[dict[str, Any]]:
            for item in lines:
                if "row" in item:
                    yield item["row"]

        return PsListing(rows(), bool(head["everything"]), list(head["columns"]), bool(head["wide"]))

    def trials(self, ref: str, sort: str | None = None, columns: Sequence[str] = ()) -> dict[str, Any]:
        params = ([("sort", sort)] if sort else []) + [("column", c) for c in columns]
        return self.client.call("GET", ref_path("sweeps", ref, "/trials"), params)  # type: ignore[no-any-return]

    def status(self, ref: str) -> dict[str, Any]:
        return self.client.call("GET", self._job(ref))  # type: ignore[no-any-return]

    def sweep(self, ref: str) -> dict[str, Any]:
        return self.client.call("GET", ref_path("sweeps", ref))  # type: ignore[no-any-return]

    def logs(self, ref: str, emit: Callable[[str], None], follow: bool = False, rank: int | None = None,
             attempt: int | None = None, tail: int | None = None, since: str | None = None, trial: int | None = None,
             events: Events | None = None) -> None:
        params = [(k, str(v)) for k, v in (("rank", rank), ("attempt", attempt), ("tail", tail), ("since", since),
                                           ("trial", trial)) if v is not None]
        self._streamed("GET", self._job(ref, "/logs"), [*params, ("follow", "1" if follow else "0")], emit=emit,
                       events=events)

    def metrics(self, ref: str, attempt: int | None = None, rank: int | None = None) -> dict[str, Any]:
        return self.client.call("GET", self._job(ref, "/metrics"), _given(attempt=attempt, rank=rank))  # type: ignore[no-any-return]

    def metric_records(self, ref: str, emit: Callable[[str], None], attempt: int | None = None, rank: int | None = None) -> int:
        return int(self._streamed("GET", self._job(ref, "/metrics/records"), _given(attempt=attempt, rank=rank), emit=emit) or 0)

    def top(self, ref: str) -> dict[str, Any]:
        return self.client.call("GET", self._job(ref, "/top"))  # type: ignore[no-any-return]

    def artifacts(self, ref: str) -> dict[str, Any]:
        return self.client.call("GET", self._job(ref, "/artifacts"))  # type: ignore[no-any-return]

    def usage(self, by: str, since: str | None = None, project: str | None = None) -> list[dict[str, Any]]:
        return self.client.call("GET", "/usage", _given(by=by, since=since, project=project))  # type: ignore[no-any-return]

    # -- teams -------------------------------------------------------------------------------------

    def projects(self) -> list[dict[str, Any]]:
        return self.client.call("GET", "/projects")  # type: ignore[no-any-return]

    def members(self, project: str) -> list[dict[str, Any]]:
        return self.client.call("GET", ref_path("projects", project, "/members"))  # type: ignore[no-any-return]

    def project_add(self, name: str) -> dict[str, Any]:
        return self.client.call("POST", "/projects", body={"name": name})  # type: ignore[no-any-return]

    def project_rm(self, name: str) -> dict[str, Any]:
        return self.client.call("DELETE", ref_path("projects", name))  # type: ignore[no-any-return]

    def project_set(self, name: str, limits: dict[str, Any]) -> dict[str, Any]:
        return self.client.call("PATCH", ref_path("projects", name), body=limits)  # type: ignore[no-any-return]

    def member_set(self, project: str, user: str, role: str, new: bool = True) -> dict[str, Any]:
        path = ref_path("projects", project, "/members/" + quote(user, safe=""))
        return self.client.call("PUT", path, body={"role": role, "new": new})  # type: ignore[no-any-return]

    def member_rm(self, project: str, user: str) -> dict[str, Any]:
        return self.client.call("DELETE", ref_path("projects", project, "/members/" + quote(user, safe="")))  # type: ignore[no-any-return]

    def project_use(self, name: str) -> dict[str, Any]:
        return self.client.call("POST", ref_path("projects", name, "/use"))  # type: ignore[no-any-return]

    def events(self, since: str | None = None, user: str | None = None, project: str | None = None,
               before: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self.client.call("GET", "/events", _given(since=since, user=user, project=project, before=before,  # type: ignore[no-any-return]
                                                          limit=limit))

    # -- verbs -------------------------------------------------------------------------------------

    def _ship(self, spec: JobSpec, send: bool = True) -> dict[str, Any]:
        from .. import config

        code, inputs, shipped = manifests(spec, config.home())
        if send:
            upload(self.client, shipped)
        self.shipped = shipped
        return {"spec": spec.to_dict(), "code": code, "inputs": inputs}

    def dry_run(self, spec: JobSpec) -> dict[str, Any]:
        return self.client.call("POST", "/plans", body=self._ship(spec, send=False))  # type: ignore[no-any-return]

    def clean_state(self, spec: JobSpec) -> str | None:
        return self.client.call("POST", "/state/clean", body={"spec": spec.to_dict()})  # type: ignore[no-any-return]

    def run(self, spec: JobSpec, out: TextIO | None, ranks: set[int] | None = None, events: Events | None = None,
            started: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], int]:
        body = {**self._ship(spec), "detach": False, "ranks": sorted(ranks) if ranks is not None else None}
        result = self._foreground("POST", "/jobs", body, out, events, started)
        return result["job"], int(result["code"])

    def submit(self, spec: JobSpec, events: Events | None = None, job_id: str | None = None) -> dict[str, Any]:
        result = self._streamed("POST", "/jobs", body={**self._ship(spec), "detach": True}, events=events,
                                cut_hint=SUBMIT_CUT)
        return result["job"]  # type: ignore[no-any-return]

    def run_sweep(self, spec: JobSpec, settings: Any, detach: bool = False, events: Events | None = None,
                  sweep_id: str | None = None) -> tuple[dict[str, Any], int | None]:
        body = {**self._ship(spec), "detach": detach, "settings": asdict(settings)}
        result = self._streamed("POST", "/sweeps", body=body, events=events, cut_hint=SUBMIT_CUT)
        return result["sweep"], result["code"]

    def doctor(self, spec: JobSpec, events: Events | None = None, burn: float = 2.0) -> dict[str, Any]:
        # The check runs on the nodes these options name, started from where they are reachable;
        # a server would check its own nodes, not the ones this command names.
        raise UsageError(f"the team server {self.login.url} runs no doctor yet",
                         "check the nodes from this machine: phalanx --local doctor ...")

    def attach(self, ref: str, out: TextIO, ranks: set[int] | None = None, events: Events | None = None,
               log_from: int = 0) -> tuple[dict[str, Any], int]:
        raise PhalanxError("following a job as its foreground run is the server's own step", "use: phalanx logs -f JOB")

    def interrupt(self, ref: str) -> dict[str, Any]:
        return self.client.call("POST", self._job(ref, "/interrupt"))  # type: ignore[no-any-return]

    def wait(self, ref: str, timeout: float | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        body = {"timeout": timeout, "progress": progress is not None}
        for item in self.client.lines("POST", self._job(ref, "/wait"), body=body):
            if "progress" in item and progress is not None:
                progress(item["progress"])
            elif "result" in item:
                return item["result"]  # type: ignore[no-any-return]
        raise PhalanxError(f"the server's answer to wait {ref} ended without one", "try again")

    def stop(self, ref: str, timeout: float | None = None, events: Events | None = None,
             now: bool = False) -> dict[str, Any]:
        return self._streamed("POST", self._job(ref, "/stop"), body={"timeout": timeout, "now": now},
                              events=events)  # type: ignore[no-any-return]

    def resume(self, ref: str, detach: bool | None = None, out: TextIO | None = None, ranks: set[int] | None = None,
               events: Events | None = None) -> tuple[dict[str, Any], int | None]:
        """``detach`` None: here, attached (the server runs every job in the background, so how it
        was first started says nothing; -d sends it there)."""
        body = {"detach": bool(detach), "ranks": sorted(ranks) if ranks is not None else None}
        result = self._foreground("POST", self._job(ref, "/resume"), body, out, events, None)
        return {**result["job"], "detached": result["code"] is None}, result["code"]

    def _foreground(self, method: str, path: str, body: Any, out: TextIO | None, events: Events | None,
                    started: Callable[[dict[str, Any]], None] | None) -> Any:
        job: list[str] = []

        def begun(record: dict[str, Any]) -> None:
            job.append(record["id"])
            if started is not None:
                started(record)

        def emit(text: str) -> None:
            if out is not None:
                out.write(text)
                out.flush()

        with self._ctrl_c(job):
            return self._streamed(method, path, body=body, emit=emit, events=events, started=begun)

    @contextmanager
    def _ctrl_c(self, job: list[str]) -> Iterator[None]:
        """While a foreground run streams: Ctrl-C is the job's (SIGINT to its ranks through the
        server; a second escalates), not this process's. Before the job exists, it is this one's."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if not job:
                raise KeyboardInterrupt
            Client(self.login.url, self.login.token, self.login.ca).call("POST", self._job(job[0], "/interrupt"))

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def rm(self, refs: Sequence[str], dry_run: bool = False, all_named: bool = False) -> dict[str, Any]:
        params = ([("ref", r) for r in refs] + ([("dry_run", "1")] if dry_run else [])
                  + ([("all_named", "1")] if all_named else []))
        return self.client.call("DELETE", "/jobs", params)  # type: ignore[no-any-return]

    def prune(self, older_than: str, states: Sequence[str] = (), dry_run: bool = False) -> dict[str, Any]:
        return self.client.call("POST", "/prune", body={"older_than": older_than, "states": list(states),  # type: ignore[no-any-return]
                                                        "dry_run": dry_run})

    def download(self, ref: str, dest: Path | None = None, logs: bool = False, state: bool = False,
                 events: Events | None = None) -> tuple[str, dict[str, int]]:
        import json
        import tarfile

        response = self.client.raw(self._job(ref, "/files"), [("logs", "1" if logs else "0"), ("state", "1" if state else "0")])
        top = response.getheader("X-Phalanx-Dir") or "download"
        where = (dest or Path.cwd() / top).resolve()
        where.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=response, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                parts = member.name.split("/", 1)
                if parts[0] != top or len(parts) < 2:
                    continue
                member.name = parts[1]
                tar.extract(member, where, filter="data")
        return str(where), json.loads(response.getheader("X-Phalanx-Counts") or "{}")

    # -- secrets: kept by the server, per user and per project (docs/secrets.md, "On a team server")

    def secret_set(self, name: str, value: str) -> dict[str, Any]:
        return self.client.call("PUT", _secret_path(name), body={"value": value})  # type: ignore[no-any-return]

    def secret_list(self) -> list[dict[str, Any]]:
        return self.client.call("GET", "/secrets")  # type: ignore[no-any-return]

    def secret_rm(self, name: str) -> dict[str, Any]:
        return self.client.call("DELETE", _secret_path(name))  # type: ignore[no-any-return]


def _given(**values: Any) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in values.items() if v is not None]


def _secret_path(name: str) -> str:
    """``/secrets/NAME`` or ``/secrets/PROJECT/NAME`` (checked before it travels)."""
    from ..secrets.base import check_name

    return "/secrets/" + quote(check_name(name), safe="/")
