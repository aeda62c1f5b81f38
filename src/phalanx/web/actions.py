"""What the dashboard's buttons do: stop, resume, retry and delete a job; stop, resume and
delete a sweep. Each is the call on the face the CLI makes (``phalanx stop|resume|rm``), as the
person logged in (the face checks that they may: their own jobs, or any for an admin); a verb
that waits (stop waits for the ranks to end) runs in a thread, and the request returns once
the change is under way. No web imports here.

An action that no longer applies (stopping a job that has ended, resuming one that
succeeded) is a :class:`Conflict`, answered 409 with a line the page shows.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..api.face import LocalFace
from ..core.state import RESUMABLE, JobState, is_terminal
from ..errors import PhalanxError, UsageError
from ..store import JobRecord
from ..store.sweeps import SweepRecord

JOB_ACTIONS = ("stop", "resume", "retry", "delete")
SWEEP_ACTIONS = ("stop", "resume", "delete")
AUDITED_AS = {"delete": "rm", "retry": "submit"}  # a refused button's event, as the face's verb names it
_running: list[threading.Thread] = []


class Conflict(UsageError):
    """The action does not apply to the job as it is now."""


def _background(name: str, work: Callable[[], Any], log: Callable[[str], None]) -> None:
    def run() -> None:
        try:
            work()
        except PhalanxError as exc:
            log(f"{name}: {exc}")

    thread = threading.Thread(target=run, name=f"phalanx-ui-{name}", daemon=True)
    thread.start()
    _running[:] = [t for t in _running if t.is_alive()] + [thread]


def _until(check: Callable[[], bool], seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)


def job_action(face: LocalFace, ref: str, action: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``action`` on the job ``ref`` as ``face``'s principal; returns what the page shows next."""
    from ..api import query

    if action not in JOB_ACTIONS:
        raise UsageError(f"unknown action '{action}'", f"actions: {', '.join(JOB_ACTIONS)}")
    record = face.record(ref)
    face.check_audited(AUDITED_AS.get(action, action), "job", record.id, record.user_name, action, record.project)
    if action == "stop":
        if is_terminal(record.state):
            raise Conflict(f"job {record.id} already ended ({record.state.value}): there is nothing to stop",
                           "reload the page to see its final state")
        _background("stop", lambda: face.stop(record.id), log)
        _until(lambda: query.get_job(record.id).state is not JobState.RUNNING)
        return {"id": record.id, "state": query.get_job(record.id).state.value, "message": f"stopping job {record.id}"}
    if action == "resume":
        if record.state not in RESUMABLE:
            why = "it succeeded" if record.state is JobState.SUCCEEDED else f"it is {record.state.value}"
            raise Conflict(f"job {record.id} cannot be resumed: {why}", "retry runs it again as a new job")
        resumed, _ = face.resume(record.id, detach=True)
        return {"id": resumed["id"], "state": resumed["state"],
                "message": f"job {record.id} resumes as attempt {resumed['attempt']}"}
    if action == "retry":
        return _retry(face, record)
    return _delete(face, [record.id])


def _retry(face: LocalFace, record: JobRecord) -> dict[str, Any]:
    """A new job running the same command with the same settings (its code snapshot taken
    now from the working directory, as ``phalanx run`` would), its own state directory unless
    the job shared a named one."""
    from ..api import query

    if not is_terminal(record.state):
        raise Conflict(f"job {record.id} is still {record.state.value}", "stop it first, or wait for it to end")
    if record.sweep_id is not None:
        raise Conflict(f"job {record.id} is a trial of sweep {record.sweep_id}", "resume the sweep instead")
    spec = query.read_spec(record)
    own = spec.state_name == f"{spec.name}-{record.id}"
    spec = spec.with_(state_name="" if own else spec.state_name, code_dir="")
    job_id = None
    if query.home().shipped(record.id) == Path(spec.workdir):  # sent to a team server: a copy of its own
        from ..api.jobs import reship

        spec, job_id = reship(spec, record.id)
    try:
        new = face.submit(spec, job_id=job_id)
    except BaseException:
        if job_id is not None:
            import shutil

            shutil.rmtree(query.home().shipped(job_id), ignore_errors=True)
        raise
    return {"id": new["id"], "state": new["state"], "message": f"job {record.id} runs again as job {new['id']}",
            "redirect": f"/jobs/{new['id']}"}


def _delete(face: LocalFace, refs: list[str]) -> dict[str, Any]:
    from ..errors import NotAllowed

    try:
        removed = face.rm(refs)
    except NotAllowed:
        raise
    except UsageError as exc:
        raise Conflict(exc.message, exc.hint) from None
    return {"removed": removed["ids"], "bytes": removed["bytes"], "message": f"removed {', '.join(removed['ids'])}",
            "redirect": "/"}


def sweep_action(face: LocalFace, ref: str, action: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    from ..api import query
    from ..errors import JobNotFound

    if action not in SWEEP_ACTIONS:
        raise UsageError(f"unknown action '{action}'", f"actions: {', '.join(SWEEP_ACTIONS)}")
    sweep = face.find_sweep(ref)
    if sweep is None:
        raise JobNotFound(f"no sweep '{ref}'", "list sweeps with: phalanx ps --all")
    face.check_audited(AUDITED_AS.get(action, action), "sweep", sweep.id, sweep.user_name, action, sweep.project)
    if action == "stop":
        if is_terminal(sweep.state):
            raise Conflict(f"sweep {sweep.id} already ended ({sweep.state.value}): there is nothing to stop",
                           "reload the page to see its final state")
        _background("stop", lambda: face.stop(sweep.id), log)
        def state() -> JobState:
            return (query.find_sweep(sweep.id) or sweep).state

        _until(lambda: state() is not JobState.RUNNING)
        return {"id": sweep.id, "state": state().value, "message": f"stopping sweep {sweep.id}"}
    if action == "resume":
        if sweep.state not in RESUMABLE:
            raise Conflict(f"sweep {sweep.id} cannot be resumed: it is {sweep.state.value}", "start a new sweep")
        resumed, _ = face.resume(sweep.id, detach=True)
        return {"id": resumed["id"], "state": resumed["state"], "message": f"sweep {sweep.id} resumes"}
    return _delete(face, [sweep.id])


def sweep_detail(sweep: SweepRecord, face: LocalFace | None = None) -> dict[str, Any]:
    """The sweep page's data: the sweep's row, its settings, its trial table, its actions."""
    import json

    from ..api import query
    from ..api.lists import sweep_row
    from ..api.sweepview import trial_table

    store = query.open_store()
    data = sweep_row(store, sweep)
    data["settings"] = json.loads(sweep.settings_json)
    data["table"] = trial_table(store, sweep)
    data["terminal"] = is_terminal(sweep.state)
    data["actions"] = ["stop"] if not is_terminal(sweep.state) else (
        ["resume", "delete"] if sweep.state in RESUMABLE else ["delete"])
    if face is not None and not face.principal.may_act_on(sweep.user_name, sweep.project):
        data["actions"] = []
    return data
