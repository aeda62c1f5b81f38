"""A job's row in the store, as the readers see it (``JobRecord``), and a page of a listing."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.state import JobState

if TYPE_CHECKING:  # imported where used: `phalanx --help` and `ps` need neither
    from ..core.paths import JobPaths
    from ..core.spec import JobSpec

COLUMNS = (
    "id name state backend nnodes nproc_per_node command job_dir spec_json created_at "
    "started_at ended_at exit_code attempt supervisor_pid supervisor_started root_cause state_synced_at retries "
    "sweep_id trial params_json objective gpu_hours cpu_hours cost user_name project priority gpus cpus admitted_at "
    "supervisor_host lease_holder lease_expires"
).split()


# Columns that are the server's business, not a reader's (left out of ``to_dict``).
_INTERNAL = ("lease_holder", "lease_expires")


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    state: JobState
    backend: str
    nnodes: int
    nproc_per_node: int
    command: str
    job_dir: str
    spec_json: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    attempt: int
    supervisor_pid: int | None
    supervisor_started: float | None
    root_cause: str | None
    state_synced_at: float | None = None
    retries: int = 0
    sweep_id: str | None = None
    trial: int | None = None
    params_json: str | None = None
    objective: float | None = None
    gpu_hours: float | None = None  # recorded when the job ends (monitor/accounting.py)
    cpu_hours: float | None = None
    cost: float | None = None
    user_name: str | None = None  # who submitted it (None: a job from before users were recorded)
    project: str = "default"
    priority: int = 0  # --priority: a project's queue admits higher first, then by submission
    gpus: int = 0  # what it asks for, counted against its project's quota (supervise/admission.py)
    cpus: int = 0
    admitted_at: float | None = None  # when admission let it start (it holds its share until it ends)
    # The machine its supervisor runs on (None: this one, or a row from before), and the lease of
    # the team server's replica answering for it (``store/leases.py``; None outside a server).
    supervisor_host: str | None = None
    lease_holder: str | None = None
    lease_expires: float | None = None

    @property
    def topology(self) -> str:
        return f"{self.nnodes}x{self.nproc_per_node}"

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def root_cause_dict(self) -> dict[str, Any] | None:
        return json.loads(self.root_cause) if self.root_cause else None

    @cached_property
    def spec(self) -> "JobSpec":
        """The job's spec, parsed once per record (the one way to get it from a record)."""
        from ..core.spec import JobSpec

        return JobSpec.from_dict(json.loads(self.spec_json))

    @property
    def paths(self) -> "JobPaths":
        from ..core.paths import JobPaths

        return JobPaths(Path(self.job_dir))

    def to_dict(self) -> dict[str, Any]:
        data = {c: getattr(self, c) for c in COLUMNS if c not in ("spec_json", "root_cause", *_INTERNAL)}
        data["state"] = self.state.value
        data["topology"] = self.topology
        data["root_cause"] = self.root_cause_dict()
        data["params"] = json.loads(self.params_json) if self.params_json else None
        del data["params_json"]
        return data


@dataclass(frozen=True)
class Page:
    """One page of a listing, newest first; ``next`` is the cursor of the following page
    (None on the last one)."""

    records: list[JobRecord]
    next: str | None


def from_row(row: tuple[Any, ...]) -> JobRecord:
    data = dict(zip(COLUMNS, row))
    data["state"] = JobState(data["state"])
    return JobRecord(**data)
