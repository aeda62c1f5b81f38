"""A job's data around its attempts: inputs staged before the first, the state directory
pulled before it and pushed while and after it runs, outputs uploaded at the end."""

from __future__ import annotations

from typing import Any, Callable

from ..core.contracts import OutcomeKind
from ..core.paths import HomePaths, JobPaths
from ..core.spec import JobSpec
from ..errors import PhalanxError
from ..store import JobRecord, Store
from .outcome import Outcome, failed

Events = Callable[[str], None]


def stage_inputs(home: HomePaths, spec: JobSpec, say: Events) -> Outcome | None:
    """Stage the input channels before the first attempt; a failed Outcome if one cannot be."""
    if not spec.channels:
        return None
    from ..storage.channels import stage

    try:
        stage(home, spec, say)
    except (PhalanxError, OSError) as exc:
        return failed(f"could not stage the inputs: {exc}")
    return None


def state_sync(store: Store, home: HomePaths, record: JobRecord, spec: JobSpec, say: Events, pull: bool = True) -> Any:
    """Pull the remote state before the first attempt (unless ``pull`` is False: the job already
    runs and writes it); returns the running sync (``storage.state.StateSync``), None, or a failed Outcome."""
    if not spec.state_uri:
        return None
    from .. import config
    from ..storage.state import StateSync

    sync = StateSync(
        home.state_dir(spec.state_key), spec.state_uri,
        on_pushed=lambda ts: store.update(record.id, state_synced_at=ts),
        on_error=lambda msg: say(f"warning: {msg}"),
    )
    try:
        pulled = sync.pull() if pull else 0
    except PhalanxError as exc:
        return failed(f"could not restore the state directory: {exc}")
    if pulled:
        say(f"restored {pulled} file(s) of state from {spec.state_uri}")
    sync.start(float(config.get("state_sync_interval")))
    return sync


def upload_outputs(spec: JobSpec, paths: JobPaths, job_id: str, outcome: Outcome, say: Events) -> Outcome:
    """Upload outputs and logs at the end, whatever the outcome (a failed job uploads what it
    has). A job that succeeded but whose outputs could not be uploaded has failed."""
    if not spec.output_uri:
        return outcome
    from ..storage.outputs import upload_job

    problem = upload_job(spec, paths, job_id, say)
    if problem is None:
        return outcome
    say(f"warning: {problem}")
    if outcome.kind is not OutcomeKind.SUCCEEDED:
        return outcome
    return failed(f"{problem}; the outputs are in {paths.output_dir}")
