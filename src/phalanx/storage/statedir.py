"""Which state directory a job gets: shared only on purpose, and never silently.

``PHALANX_STATE_DIR`` is ``$PHALANX_HOME/state/<key>``. The key (``JobSpec.state_name``):

- ``--name NAME`` (or a job file's ``name:``): ``NAME``. Every run of that name shares it: a
  second run continues from the first one's checkpoints, which is what naming a run asks for;
- ``--state URI`` without a name: ``<name>-<hash of URI>``: the local copy of that URI's state;
- otherwise the job's own, ``<name>-<job id>``: two projects that both have a ``train.py``, or a
  second plain run of the same script, start from an empty directory (a finished run is not
  "resumed" into training nothing). Retries and ``phalanx resume JOB`` keep the job's own.

A run that starts with files already in its state directory says so in one line
(``pickup_line``): which job wrote them, when, and how to start over.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Iterable

from ..core.paths import HomePaths
from ..core.spec import JobSpec


def state_name(name: str, named: bool, state_uri: str | None) -> str:
    """The key known when the spec is built; ``""`` means the job's own (see ``for_job``)."""
    if named:
        return name
    if state_uri:
        return f"{name}-{hashlib.sha256(state_uri.encode()).hexdigest()[:8]}"
    return ""


def for_job(spec: JobSpec, job_id: str) -> JobSpec:
    """``spec`` with its state key fixed: the job's own directory unless it names a shared one.
    Deterministic, so the plan and the recorded spec agree."""
    return spec if spec.state_name else spec.with_(state_name=f"{spec.name}-{job_id}")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def pickup_line(home: HomePaths, spec: JobSpec, records: Callable[[], Iterable[Any]], job_id: str,
                resuming: bool = False) -> str | None:
    """One line when ``spec``'s state directory already holds files, else None. ``records()``
    gives job records, newest first (asked only then): the newest other job with the same
    state key is named as the writer."""
    state = home.state_dir(spec.state_key)
    try:
        files = [p for p in state.rglob("*") if p.is_file()]
    except OSError:
        return None
    if not files:
        return None
    newest = max(f.stat().st_mtime for f in files)
    size = sum(f.stat().st_size for f in files)
    what = f"{state} ({len(files)} file(s), {size / 1e6:.1f} MB, last written {_age(time.time() - newest)} ago"
    if resuming:
        return f"state: job {job_id} continues from {what})"
    writer = _writer(records(), spec.state_key, job_id)
    by = f" by job {writer.id} '{writer.name}'" if writer is not None else ""
    return (f"state: picking up {what}{by}); the script sees it in PHALANX_STATE_DIR; "
            "to start over: --clean-state (the old state is moved aside)")


def _writer(records: Iterable[Any], key: str, job_id: str) -> Any:
    for record in records:
        if record.id == job_id:
            continue
        try:
            spec = json.loads(record.spec_json)
        except (TypeError, ValueError):
            continue
        if isinstance(spec, dict) and (spec.get("state_name") or spec.get("name")) == key:
            return record
    return None
