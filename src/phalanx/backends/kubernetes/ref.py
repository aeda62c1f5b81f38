"""Where an attempt lives in the cluster, and how its ``scheduler.json`` says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...core.contracts import SchedulerRecord


@dataclass(frozen=True)
class Ref:
    """Where an attempt lives; written to the attempt's ``scheduler.json`` (its details)."""

    namespace: str
    context: str
    kind: str  # job | pytorchjob | trainjob | jobset
    api_kind: str  # Job | PyTorchJob | TrainJob | JobSet
    name: str
    job_id: str
    attempt: int
    container: str

    def record(self, submitted: float | None = None, found_by: str | None = None, **extra: Any) -> SchedulerRecord:
        # The scheduler's id is the workload's name: what `status` names the attempt by
        # ("K8S job phx-..."); the rest is the backend's own (``details``).
        where = {k: v for k, v in asdict(self).items() if k != "job_id"}
        return SchedulerRecord("k8s", self.name, submitted, found_by,
                               details={**where, "phalanx_job": self.job_id, **extra})
