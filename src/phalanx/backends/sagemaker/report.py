"""What ``ps`` and ``status`` show of a SageMaker job, read from the attempts' ``scheduler.json``
(written by ``watch``). Standard library only: ``ps`` and ``status`` never import boto3."""

from __future__ import annotations

from typing import Any

from ...core.contracts import read_scheduler
from ...core.paths import JobPaths
from ...errors import ContractError


def described(paths: JobPaths, attempt: int) -> dict[str, Any]:
    """What SageMaker last said of the attempt's training job (empty before it was asked, and
    for a ``scheduler.json`` this phalanx cannot read: ``ps`` shows the rest)."""
    try:
        record = read_scheduler(paths.scheduler_job(attempt))
    except ContractError:
        return {}
    return record.to_dict() if record is not None and record.scheduler == "sagemaker" else {}


def usage(paths: JobPaths) -> dict[str, float]:
    """Billable seconds and instance hours over every attempt of a job (BillableTimeInSeconds is
    per instance: SageMaker bills it once for each of InstanceCount instances)."""
    billable = instance_seconds = 0.0
    for attempt in paths.attempts():
        record = described(paths, attempt)
        if record.get("billable_seconds"):
            billable += float(record["billable_seconds"])
            instance_seconds += float(record["billable_seconds"]) * int(record.get("instance_count") or 1)
    return {"billable_seconds": billable, "instance_hours": instance_seconds / 3600.0}


def ps_state(paths: JobPaths, attempt: int) -> str | None:
    """SageMaker's secondary status of a running job (Starting, Training, Interrupted...)."""
    return described(paths, attempt).get("secondary") or None


def status_lines(paths: JobPaths, attempt: int) -> list[str]:
    record = described(paths, attempt)
    if not record:
        return []
    lines = [f"sagemaker {record.get('job_id')}  {record.get('status') or 'submitted'}"
             f" ({record.get('secondary') or '-'})  {record.get('instance_count') or '?'} x {record.get('instance_type') or '?'}"
             f"  region {record.get('region') or '?'}"]
    if record.get("failure_reason"):
        lines.append(f"          failure reason: {record['failure_reason']}")
    used = usage(paths)
    if used["billable_seconds"]:
        lines.append(f"          billable {used['billable_seconds']:.0f} s per instance, "
                     f"{used['instance_hours']:.3f} instance-hours over all attempts")
    return lines
