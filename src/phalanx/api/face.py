"""The face: one object with every verb and view of phalanx, the only thing the CLI, the dashboard
and the server call. ``Face`` is the contract; ``LocalFace`` serves it from this machine's store
and job directories (its verbs are in ``faceverbs.py``, its team calls in ``teamface.py``);
``remote.RemoteFace`` serves the same calls from a team server.

Every call acts as the face's ``Principal`` (who asks). Every result is JSON data (dicts, lists,
numbers, strings), so a server can send it as it is and a remote client gets what a local one
does; output that streams (a foreground run, ``logs -f``) goes to the ``out``/``emit`` given.
A follower also writes an empty string now and then while nothing comes (a heartbeat): an
``out``/``emit`` whose reader went away (a server's client) raises there, and the call ends.

A job or a sweep is named by ``ref``: an id, a unique id prefix, or a name (the newest of that
name; a name both carry means the newer of the two). Only jobs and sweeps of the projects the
principal is in exist for it: every lookup carries them (``Principal.visible``), so one of
another project answers exactly as one that does not exist. Every verb is recorded in the audit
log (``audit.py``) with its outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, TextIO

from ..core.identity import Principal
from ..core.spec import JobSpec
from ..errors import JobNotFound
from ..store import JobRecord
from ..store.sweeps import SweepRecord
from .faceverbs import JobVerbs
from .ps import PsListing, PsRequest
from .teamface import TeamVerbs

if TYPE_CHECKING:
    from ..store import Store
    from ..sweeps.settings import SweepSettings

Events = Callable[[str], None]
Emit = Callable[[str], None]


class Face(Protocol):
    """What every caller may ask. Blocking unless said otherwise; errors are ``PhalanxError``s
    (``JobNotFound`` for a ref that names nothing the principal may see)."""

    @property
    def principal(self) -> Principal: ...

    # -- views: read, never act ---------------------------------------------------------------
    def whoami(self) -> dict[str, Any]: ...
    def ps(self, request: PsRequest) -> PsListing: ...
    def trials(self, ref: str, sort: str | None = None, columns: Sequence[str] = ()) -> dict[str, Any]: ...
    def status(self, ref: str) -> dict[str, Any]: ...
    def sweep(self, ref: str) -> dict[str, Any]: ...
    def logs(self, ref: str, emit: Emit, follow: bool = False, rank: int | None = None, attempt: int | None = None,
             tail: int | None = None, since: str | None = None, trial: int | None = None, events: Events | None = None) -> None: ...
    def metrics(self, ref: str, attempt: int | None = None, rank: int | None = None) -> dict[str, Any]: ...
    def metric_records(self, ref: str, emit: Emit, attempt: int | None = None, rank: int | None = None) -> int: ...
    def top(self, ref: str) -> dict[str, Any]: ...
    def artifacts(self, ref: str) -> dict[str, Any]: ...
    def usage(self, by: str, since: str | None = None, project: str | None = None) -> list[dict[str, Any]]: ...

    # -- verbs: act ----------------------------------------------------------------------------
    def dry_run(self, spec: JobSpec) -> dict[str, Any]: ...
    def clean_state(self, spec: JobSpec) -> str | None: ...
    def run(self, spec: JobSpec, out: TextIO | None, ranks: set[int] | None = None, events: Events | None = None,
            started: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], int]: ...
    def submit(self, spec: JobSpec, events: Events | None = None, job_id: str | None = None) -> dict[str, Any]: ...
    def run_sweep(self, spec: JobSpec, settings: SweepSettings, detach: bool = False, events: Events | None = None,
                  sweep_id: str | None = None) -> tuple[dict[str, Any], int | None]: ...
    def attach(self, ref: str, out: TextIO, ranks: set[int] | None = None, events: Events | None = None,
               log_from: int = 0) -> tuple[dict[str, Any], int]: ...
    def interrupt(self, ref: str) -> dict[str, Any]: ...
    def doctor(self, spec: JobSpec, events: Events | None = None, burn: float = 2.0) -> dict[str, Any]: ...
    def wait(self, ref: str, timeout: float | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]: ...
    def stop(self, ref: str, timeout: float | None = None, events: Events | None = None,
             now: bool = False) -> dict[str, Any]: ...
    def resume(self, ref: str, detach: bool | None = None, out: TextIO | None = None, ranks: set[int] | None = None,
               events: Events | None = None) -> tuple[dict[str, Any], int | None]: ...
    def rm(self, refs: Sequence[str], dry_run: bool = False, all_named: bool = False) -> dict[str, Any]: ...
    def prune(self, older_than: str, states: Sequence[str] = (), dry_run: bool = False) -> dict[str, Any]: ...
    def download(self, ref: str, dest: Path | None = None, logs: bool = False, state: bool = False,
                 events: Events | None = None) -> tuple[str, dict[str, int]]: ...

    # -- teams: projects, members, limits, the audit log (``teamface.py``) --------------------
    def projects(self) -> list[dict[str, Any]]: ...
    def members(self, project: str) -> list[dict[str, Any]]: ...
    def project_add(self, name: str) -> dict[str, Any]: ...
    def project_rm(self, name: str) -> dict[str, Any]: ...
    def project_set(self, name: str, limits: dict[str, Any]) -> dict[str, Any]: ...
    def member_set(self, project: str, user: str, role: str, new: bool = True) -> dict[str, Any]: ...
    def member_rm(self, project: str, user: str) -> dict[str, Any]: ...
    def project_use(self, name: str) -> dict[str, Any]: ...
    def events(self, since: str | None = None, user: str | None = None, project: str | None = None,
               before: int | None = None, limit: int = 100) -> list[dict[str, Any]]: ...

    # -- secrets: names, owners and dates come back; a value only goes in ------------------------
    def secret_set(self, name: str, value: str) -> dict[str, Any]: ...
    def secret_list(self) -> list[dict[str, Any]]: ...
    def secret_rm(self, name: str) -> dict[str, Any]: ...


class LocalFace(TeamVerbs, JobVerbs):
    """The face on this machine's store (``$PHALANX_HOME``, or the store ``PHALANX_STORE`` names)."""

    def __init__(self, principal: Principal | None = None) -> None:
        from .. import config

        self.principal = principal or Principal.here(config.user())

    @property
    def _submitter(self) -> str | None:
        """Who a job submitted through this face belongs to (None: this process's user)."""
        return None if self.principal.local else self.principal.user

    def check_may_act(self, kind: str, ref_id: str, owner: str | None, verb: str, project: str | None = None) -> None:
        """Raise ``NotAllowed`` unless the principal may ``verb`` what ``owner`` submitted in ``project``."""
        if not self.principal.may_act_on(owner, project):
            from ..errors import NotAllowed

            if self.principal.role(project) == "viewer":
                raise NotAllowed(f"{kind} {ref_id} is in project {project}, where you are a viewer: viewers may only "
                                 f"look, not {verb}", f"ask an admin of {project} to make you a member")
            whose = f"belongs to {owner}; only {owner}" if owner else "has no recorded owner; only"
            raise NotAllowed(f"{kind} {ref_id} {whose} or an admin may {verb} it")

    def check_audited(self, action: str, kind: str, ref_id: str, owner: str | None, verb: str,
                      project: str | None = None) -> None:
        """``check_may_act``, a refusal recorded in the audit log as ``action`` (the dashboard's
        buttons check before their verb runs, which records the rest)."""
        from ..errors import NotAllowed

        try:
            self.check_may_act(kind, ref_id, owner, verb, project)
        except NotAllowed as exc:
            from .audit import outcome_of, record

            outcome, detail = outcome_of(exc)
            record(self._store(), self.principal, action, ref_id, project, outcome, detail)
            raise

    # -- lookups -------------------------------------------------------------------------------

    def _store(self) -> Store:
        from .query import open_store

        return open_store()

    @property
    def _scope(self) -> tuple[str, ...] | None:
        """The projects whose jobs exist for this principal (None: all). Narrowed to a project
        (``--project``), that one, which must exist and be theirs (else the one 'no project' line)."""
        if self.principal.only is not None:
            from .projects import visible_project

            visible_project(self._store(), self.principal, self.principal.only)
        return self.principal.visible()

    def _sweep_named(self, ref: str) -> SweepRecord | None:
        """The sweep ``ref`` names, or None when it names a job (the newer of the two on a name)."""
        from .query import find_sweep

        store = self._store()
        sweep = store.sweeps.find(ref, self._scope)
        if sweep is None:
            return None
        try:
            job = store.find(ref, self._scope)
        except JobNotFound:
            job = None
        if job is not None and job.sweep_id != sweep.id:
            by_id = sweep.id.startswith(ref) or sweep.id.startswith(ref.lower())
            if by_id and (job.id.startswith(ref) or job.id.startswith(ref.lower())):
                raise JobNotFound(f"'{ref}' is the start of both job {job.id} and sweep {sweep.id}",
                                  "type more characters of the id")
            if not by_id and job.name == ref and job.created_at > sweep.created_at:
                return None
        return find_sweep(sweep.id, store)

    def _job(self, ref: str) -> JobRecord:
        from .query import get_job

        return get_job(ref, projects=self._scope)

    def record(self, ref: str) -> Any:
        """The job ``ref`` names, as the principal may see it (the dashboard's pages)."""
        return self._job(ref)

    def find_sweep(self, ref: str) -> Any:
        """The sweep ``ref`` names as the principal may see it, or None."""
        from .query import find_sweep

        return find_sweep(ref, projects=self._scope)

    def _any_sweep(self, ref: str) -> Any:
        sweep = self.find_sweep(ref)
        if sweep is None:
            raise JobNotFound(f"no sweep with id or name '{ref}'", "list sweeps with: phalanx ps --all")
        return sweep

    # -- views ---------------------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        from importlib.metadata import version

        p = self.principal
        return {"user": p.user, "admin": p.admin, "local": p.local, "version": version("phalanx"),
                "projects": dict(p.projects) if p.projects is not None else None}

    def ps(self, request: PsRequest) -> PsListing:
        from .. import config
        from .ps import ps

        return ps(self._store(), request, int(config.get("ps_limit")), self.principal.user,
                  projects=self._projects_asked(request.project))

    def _projects_asked(self, project: str | None) -> tuple[str, ...] | None:
        """What a listing may show: the principal's projects, or the one asked for (checked)."""
        scope = self._scope
        if not project:
            return scope
        from .projects import visible_project

        visible_project(self._store(), self.principal, project)
        return (project,) if scope is None or project in scope else ()

    def trials(self, ref: str, sort: str | None = None, columns: Sequence[str] = ()) -> dict[str, Any]:
        from .sweepview import trial_list

        return trial_list(self._store(), self._any_sweep(ref), sort, columns)

    def status(self, ref: str) -> dict[str, Any]:
        from .jobview import job_view

        sweep = self._sweep_named(ref)
        if sweep is not None:
            return self._sweep_view(sweep)
        return {"kind": "job", **job_view(self._job(ref), self.principal)}

    def sweep(self, ref: str) -> dict[str, Any]:
        return self._sweep_view(self._any_sweep(ref))

    def _sweep_view(self, sweep: SweepRecord) -> dict[str, Any]:
        from .sweepview import sweep_view

        return {"kind": "sweep", **sweep_view(self._store(), sweep)}

    def logs(self, ref: str, emit: Emit, follow: bool = False, rank: int | None = None, attempt: int | None = None,
             tail: int | None = None, since: str | None = None, trial: int | None = None, events: Events | None = None) -> None:
        from . import query
        from .sweepview import follow_sweep_logs

        if tail is not None and tail < 0:
            from ..errors import UsageError

            raise UsageError(f"invalid --tail {tail}", "give a number of lines, e.g. --tail 20")
        sweep = self._sweep_named(ref)
        if sweep is not None:
            store = self._store()
            follow_sweep_logs(store, sweep.id, emit, follow, rank=0 if rank is None else rank, trial=trial, tail=tail,
                              refresh=lambda sweep_id: query.find_sweep(sweep_id, store))
            return
        record = self._job(ref)
        say = events or (lambda text: None)
        offsets = query.log_offsets(record, attempt, rank, tail, since, say) if (tail is not None or since) else None
        failed = None
        if rank is None and record.nnodes * record.nproc_per_node > 1:  # one rank: nothing to put first or fold
            from .failure import failure

            query.log_paths(record, attempt)  # an attempt that does not exist: its own error first
            failed = failure(record, attempt)
            if failed is not None:
                say(f"job {record.id}: {failed.headline()}")
        query.follow_logs(record, emit, attempt=attempt, rank=rank, follow=follow, offsets=offsets, failed=failed)

    def metrics(self, ref: str, attempt: int | None = None, rank: int | None = None) -> dict[str, Any]:
        from ..monitor.report import metrics_report

        sweep = self._sweep_named(ref)
        if sweep is not None:
            from .sweepview import trial_table

            return {"kind": "sweep", "id": sweep.id, **trial_table(self._store(), sweep)}
        from ..core.state import is_terminal

        record = self._job(ref)
        return {"kind": "job", **metrics_report(record, attempt=attempt, rank=rank), "ended": is_terminal(record.state)}

    def metric_records(self, ref: str, emit: Emit, attempt: int | None = None, rank: int | None = None) -> int:
        from ..monitor.report import export_metrics

        class _Out:  # export_metrics writes to a file-like object
            write = staticmethod(emit)

        return export_metrics(self._job(ref), _Out(), attempt=attempt, rank=rank)

    def top(self, ref: str) -> dict[str, Any]:
        from ..core.state import is_terminal
        from ..monitor.report import top_frame

        record = self._job(ref)
        return {**top_frame(record), "id": record.id, "terminal": is_terminal(record.state)}

    def artifacts(self, ref: str) -> dict[str, Any]:
        from .query import artifacts

        record = self._job(ref)
        found = artifacts(record)
        return {"id": record.id, "name": record.name, **found.to_dict()}

    def usage(self, by: str, since: str | None = None, project: str | None = None) -> list[dict[str, Any]]:
        from .usage import usage

        return usage(self._store(), self.principal, by, since, self._projects_asked(project))

    # -- secrets -------------------------------------------------------------------------------

    # A user of a team server: the server's table (``serversecrets.py``); else this user's own store.

    def secret_set(self, name: str, value: str) -> dict[str, Any]:
        if not self.principal.local:
            from . import serversecrets

            return serversecrets.secret_set(self._store(), self.principal, name, value)
        from ..secrets.local import open_store

        store = open_store()
        new = store.set(name, value, owner=self.principal.user)
        return {"name": name, "new": new, "where": store.where}

    def secret_list(self) -> list[dict[str, Any]]:
        if not self.principal.local:
            from . import serversecrets

            return serversecrets.secret_list(self._store(), self.principal)
        from ..secrets.local import open_store

        return [info.to_dict() for info in open_store().list()]

    def secret_rm(self, name: str) -> dict[str, Any]:
        if not self.principal.local:
            from . import serversecrets

            return serversecrets.secret_rm(self._store(), self.principal, name)
        from ..secrets.local import open_store

        store = open_store()
        if not store.remove(name):
            raise store.missing(name)
        return {"name": name, "removed": True}


def rows_json(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A listing's rows as ``--json`` prints them (what is only for people left out)."""
    for row in rows:
        yield {k: v for k, v in row.items() if not k.startswith("_")}
