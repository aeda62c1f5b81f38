"""The face's verbs (``LocalFace`` has them): what acts on jobs and sweeps — run, submit, a sweep,
attach, interrupt, wait, stop, resume, remove, prune, download, the doctor. Each checks who asks
(``check_may_act``: the submitter, a project's member or admin, by ``core/identity.py``'s rules)
and is recorded in the audit log with its outcome (``audit.audited``); the lookups they use
(``_job``, ``find_sweep``: only what the principal may see) are the face's (``face.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO

from ..core.identity import Principal
from ..core.spec import JobSpec
from ..store import JobRecord
from ..store.sweeps import SweepRecord
from .audit import audited

if TYPE_CHECKING:
    from ..store import Store
    from ..sweeps.settings import SweepSettings

Events = Callable[[str], None]


class JobVerbs:
    """The verbs, given the face's principal and lookups (``LocalFace`` defines them)."""

    principal: Principal

    def _store(self) -> Store:
        raise NotImplementedError

    @property
    def _submitter(self) -> str | None:
        raise NotImplementedError

    @property
    def _scope(self) -> tuple[str, ...] | None:
        raise NotImplementedError

    def _job(self, ref: str) -> JobRecord:
        raise NotImplementedError

    def find_sweep(self, ref: str) -> SweepRecord | None:
        raise NotImplementedError

    def _sweep_named(self, ref: str) -> SweepRecord | None:
        raise NotImplementedError

    def _admit_spec(self, spec: JobSpec) -> JobSpec:
        raise NotImplementedError

    def check_may_act(self, kind: str, ref_id: str, owner: str | None, verb: str, project: str | None = None) -> None:
        raise NotImplementedError

    def dry_run(self, spec: JobSpec) -> dict[str, Any]:
        from . import jobs

        jobs.check_storage(spec)  # the stores a real run checks first (offline: not the backend's cluster)
        plan = jobs.plan_job(spec)
        return {"text": plan.render(), "plan": plan.to_dict()}

    def clean_state(self, spec: JobSpec) -> str | None:
        from . import jobs

        moved = jobs.clean_state(spec)
        return None if moved is None else str(moved)

    def run(self, spec: JobSpec, out: TextIO | None, ranks: set[int] | None = None, events: Events | None = None,
            started: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], int]:
        from . import jobs

        with audited(self._store(), self.principal, "submit", spec.name, spec.project or None) as event:
            spec = self._admit_spec(spec)
            event.project = spec.project

            def begun(record: Any) -> None:  # recorded once the job exists: a foreground run lasts
                from .audit import record as log

                event.target, event.done = record.id, True
                log(self._store(), self.principal, "submit", record.id, spec.project, detail={"name": spec.name})
                if started is not None:
                    started(_job_dict(record))

            record, code = jobs.run(spec, out=out, ranks=ranks, events=events, user=self._submitter, started=begun)
        return _job_dict(record), code

    def submit(self, spec: JobSpec, events: Events | None = None, job_id: str | None = None) -> dict[str, Any]:
        """``run -d``; ``job_id``: an id drawn already (a server lays the shipped code out under it)."""
        from . import jobs

        with audited(self._store(), self.principal, "submit", job_id or spec.name, spec.project or None) as event:
            spec = self._admit_spec(spec)
            event.project = spec.project
            record = jobs.submit_detached(spec, events=events, user=self._submitter, job_id=job_id)
            event.target, event.detail = record.id, {"name": spec.name}
        return _job_dict(record)

    def doctor(self, spec: JobSpec, events: Events | None = None, burn: float = 2.0) -> dict[str, Any]:
        """The nodes' check (``supervise/doctor.py``), blocking: its verdict as data, and as the
        table ``phalanx doctor`` prints (``text``)."""
        from . import jobs

        found = jobs.doctor(spec, events=events, burn=burn)
        return {**found.to_dict(), "text": found.render()}

    def run_sweep(self, spec: JobSpec, settings: SweepSettings, detach: bool = False, events: Events | None = None,
                  sweep_id: str | None = None) -> tuple[dict[str, Any], int | None]:
        from . import sweepjobs
        from .lists import sweep_reason

        with audited(self._store(), self.principal, "sweep", sweep_id or spec.name, spec.project or None) as event:
            spec = self._admit_spec(spec)
            event.project = spec.project

            def created(sweep: SweepRecord) -> None:
                from .audit import record as log

                event.target, event.done = sweep.id, True
                log(self._store(), self.principal, "sweep", sweep.id, spec.project, detail={"name": spec.name})

            sweep, code = sweepjobs.run_sweep(spec, settings, detach=detach, events=events, user=self._submitter,
                                              sweep_id=sweep_id, created=created)
        return {**sweep.to_dict(), "reason": sweep_reason(sweep)}, code

    def attach(self, ref: str, out: TextIO, ranks: set[int] | None = None, events: Events | None = None,
               log_from: int = 0) -> tuple[dict[str, Any], int]:
        """Follow a detached job as its foreground run would show it, until it ends (``api/attach.py``);
        the final record and the job's exit code."""
        from .attach import follow_run

        record = follow_run(self._store(), self._job(ref), out, ranks, events or (lambda text: None), log_from)
        return _job_dict(record), record.exit_code if record.exit_code is not None else 1

    def interrupt(self, ref: str) -> dict[str, Any]:
        """Ctrl-C of a foreground run whose supervisor runs elsewhere (a server's): SIGINT to it."""
        from . import jobs

        with audited(self._store(), self.principal, "interrupt", ref) as event:
            record = self._job(ref)
            event.target, event.project = record.id, record.project
            self.check_may_act("job", record.id, record.user_name, "interrupt", record.project)
            return _job_dict(jobs.interrupt(record))

    def wait(self, ref: str, timeout: float | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Block until the job (or sweep) ends. ``progress`` hears the job's id, state and health
        (``query.health``) at every look (``wait --progress``)."""
        from . import jobs, sweepjobs
        from .query import health
        from .sweepview import sweep_exit_code

        sweep = self._sweep_named(ref)
        if sweep is not None:
            from .lists import sweep_reason

            done = sweepjobs.wait_sweep(sweep.id, timeout)
            return {"kind": "sweep", **done.to_dict(), "reason": sweep_reason(done), "wait_code": sweep_exit_code(done)}
        watch = None if progress is None else (
            lambda r: progress({"id": r.id, "state": r.state.value, "health": health(r)}))
        record = jobs.wait(self._job(ref).id, timeout=timeout, watch=watch)
        return {"kind": "job", **_job_dict(record),
                "wait_code": record.exit_code if record.exit_code is not None else 1}

    def stop(self, ref: str, timeout: float | None = None, events: Events | None = None,
             now: bool = False) -> dict[str, Any]:
        """Stop a job (SIGTERM, its grace period, SIGKILL) or a sweep; a second stop of a job that
        is stopping already keeps its grace period unless ``now``."""
        from . import jobs, sweepjobs

        with audited(self._store(), self.principal, "stop", ref) as event:
            sweep = self.find_sweep(ref)
            if sweep is not None:
                event.target, event.project = sweep.id, sweep.project
                self.check_may_act("sweep", sweep.id, sweep.user_name, "stop", sweep.project)
                return {"kind": "sweep", **sweepjobs.stop_sweep(sweep, timeout=timeout).to_dict()}
            record = self._job(ref)
            event.target, event.project = record.id, record.project
            self.check_may_act("job", record.id, record.user_name, "stop", record.project)
            done = jobs.stop(record.id, timeout=timeout, events=events, now=now, by=self.principal.user)
            return {"kind": "job", **_job_dict(done)}

    def resume(self, ref: str, detach: bool | None = None, out: TextIO | None = None, ranks: set[int] | None = None,
               events: Events | None = None) -> tuple[dict[str, Any], int | None]:
        """``detach`` None: the way ``phalanx run`` started it. The result's ``detached`` says
        which way it went (then the code is None)."""
        from . import jobs, sweepjobs

        with audited(self._store(), self.principal, "resume", ref) as event:
            sweep = self.find_sweep(ref)
            if sweep is not None:
                event.target, event.project = sweep.id, sweep.project
                self.check_may_act("sweep", sweep.id, sweep.user_name, "resume", sweep.project)
                event.done = self._log_now("resume", sweep.id, sweep.project)
                done, code = sweepjobs.resume_sweep(sweep, detach=detach, events=events)
                return {"kind": "sweep", **done.to_dict(), "detached": code is None}, code
            found = self._job(ref)
            event.target, event.project = found.id, found.project
            self.check_may_act("job", found.id, found.user_name, "resume", found.project)
            if not detach:  # a foreground resume lasts: recorded once it is under way
                event.done = self._log_now("resume", found.id, found.project)
            record, code = jobs.resume(found.id, detach=detach, out=out, ranks=ranks, events=events)
            return {"kind": "job", **_job_dict(record), "detached": code is None}, code

    def _log_now(self, action: str, target: str, project: str | None) -> bool:
        from .audit import record

        record(self._store(), self.principal, action, target, project)
        return True

    def rm(self, refs: Sequence[str], dry_run: bool = False, all_named: bool = False) -> dict[str, Any]:
        """A name several jobs carry raises ``Ambiguous`` (with them as its choices) unless
        ``all_named``."""
        from .cleanup import remove, resolve
        from .query import home

        store = self._store()
        with audited(store, self.principal, "rm", " ".join(refs)) as event:
            targets = resolve(store, refs, all_named, self._scope)  # every one checked before anything goes
            event.target = " ".join(t.id for t in targets)
            event.project = ",".join(sorted({t.project for t in targets})) or None
            for target in targets:
                self.check_may_act(target.kind, target.id, target.owner, "remove", target.project)
            event.detail = {"dry_run": dry_run, "all_named": all_named}
            return {**remove(store, home(), targets, dry_run).to_dict(), "dry_run": dry_run}

    def prune(self, older_than: str, states: Sequence[str] = (), dry_run: bool = False) -> dict[str, Any]:
        import time

        from ..core.state import TERMINAL
        from ..errors import UsageError
        from ..monitor.logindex import parse_duration
        from .cleanup import prune_targets, remove
        from .lists import parse_states
        from .query import home

        store = self._store()
        with audited(store, self.principal, "prune", f"older than {older_than}") as event:
            mine = self._admin_projects()
            if mine is not None and not mine:
                from ..errors import NotAllowed

                raise NotAllowed("prune removes every user's old jobs: only an admin may prune",
                                 "remove your own with: phalanx rm JOB...")
            age = parse_duration(older_than, "--older-than")
            wanted = parse_states(states)
            ended = {s.value for s in TERMINAL}
            running = [s for s in wanted if s not in ended]
            if running:
                raise UsageError(f"--state {running[0].lower()} is not an end state: prune removes only what ended",
                                 f"use one of: {', '.join(sorted(s.lower() for s in ended))}")
            targets = prune_targets(store, age, wanted, time.time(), mine)
            event.project = ",".join(mine) if mine is not None else None
            removed = remove(store, home(), targets, dry_run).to_dict()
            event.detail = {"dry_run": dry_run, "jobs": removed.get("jobs"), "sweeps": removed.get("sweeps")}
            return {**removed, "dry_run": dry_run}

    def _admin_projects(self) -> tuple[str, ...] | None:
        """The projects the principal administers (None: all of them)."""
        p = self.principal
        if p.only is not None:
            return (p.only,) if p.may_manage(p.only) and self._scope else ()
        if p.local or p.admin:
            return None
        if p.projects is None:
            return ()
        return tuple(sorted(name for name in p.projects if p.may_manage(name)))

    def download(self, ref: str, dest: Path | None = None, logs: bool = False, state: bool = False,
                 events: Events | None = None) -> tuple[str, dict[str, int]]:
        from . import jobs

        where, counts = jobs.download(self._job(ref), dest, logs=logs, state=state, events=events)
        return str(where), counts


def _job_dict(record: JobRecord) -> dict[str, Any]:
    """A job's record as the face returns it: ``to_dict`` with its duration (computed now)."""
    return {**record.to_dict(), "duration": record.duration}
