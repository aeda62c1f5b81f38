"""A project's monthly budget, in GPU-hours or money (the ``prices`` setting): what its jobs
used this calendar month (local time), what a new job is estimated to cost, and the check that
refuses a job whose estimate would cross the budget. Checked when a job or a sweep's trial is
submitted, never while a job runs: a budget lowered or spent meanwhile stops nothing.

The estimate is the job's GPUs (or CPUs) times its expected hours, priced as its usage would be
(``monitor/accounting.py``). Expected hours: its ``--max-duration`` when it has one (it cannot
run longer), else the mean wall time of the last jobs of the same name in the project that
succeeded, else the ``budget_estimate_hours`` setting. A job no price applies to
counts 0 toward a money budget (and says so).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from .. import config
from ..core.spec import JobSpec
from ..core.state import TERMINAL, JobState
from ..errors import OverBudget
from ..store import Store
from ..store import tx
from ..store.records import COLUMNS, from_row
from ..store.teams import ProjectRecord

GPU_HOURS = "gpu-h"
_RECENT = 20


def month_start(now: float | None = None) -> float:
    """The first moment of this calendar month, local time."""
    today = dt.datetime.fromtimestamp(time.time() if now is None else now)
    return today.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def spent(store: Store, project: ProjectRecord, now: float | None = None) -> dict[str, Any]:
    """What the project's jobs used this month: those that ended this month as recorded, those
    still running counted up to now."""
    from ..monitor.accounting import job_usage

    since = month_start(now)
    ended = [s.value for s in TERMINAL]
    row = tx.rows(store, f"SELECT COALESCE(SUM(gpu_hours), 0), COALESCE(SUM(cpu_hours), 0), SUM(cost) FROM jobs "
                  f"WHERE project = ? AND ended_at >= ? AND state IN ({', '.join('?' for _ in ended)})",
                  [project.name, since, *ended])[0]
    gpu_hours, cpu_hours, cost = float(row[0]), float(row[1]), row[2]
    active = [s.value for s in JobState if s not in TERMINAL]
    for found in tx.rows(store, f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE state IN ({', '.join('?' for _ in active)}) "
                         "AND project = ? AND started_at IS NOT NULL", [*active, project.name]):
        usage = job_usage(from_row(found))
        gpu_hours += usage.gpu_hours
        cpu_hours += usage.cpu_hours
        if usage.cost is not None:
            cost = (cost or 0.0) + usage.cost
    return {"since": since, "gpu_hours": gpu_hours, "cpu_hours": cpu_hours, "cost": cost}


def used_of(project: ProjectRecord, spending: dict[str, Any]) -> float:
    """This month's spending in the budget's unit."""
    if project.budget_unit == GPU_HOURS:
        return float(spending["gpu_hours"])
    return float(spending["cost"] or 0.0)


def expected_hours(store: Store, project: str, name: str) -> float:
    found = tx.rows(store, "SELECT started_at, ended_at FROM jobs WHERE project = ? AND name = ? AND state = ? "
                    "AND started_at IS NOT NULL AND ended_at IS NOT NULL ORDER BY created_at DESC LIMIT ?",
                    [project, name, JobState.SUCCEEDED.value, _RECENT])
    if not found:
        return float(config.get("budget_estimate_hours"))
    return sum(max(0.0, e - s) for s, e in found) / len(found) / 3600.0


def estimate(store: Store, spec: JobSpec, project: ProjectRecord, gpus: int, cpus: int) -> tuple[float | None, float]:
    """(estimated amount in the budget's unit, hours assumed); None: no price applies."""
    from ..monitor.accounting import Usage, price

    hours = spec.max_duration / 3600.0 if spec.max_duration else expected_hours(store, project.name, spec.name)
    if project.budget_unit == GPU_HOURS:
        return gpus * hours, hours
    usage = Usage(gpu_hours=gpus * hours, cpu_hours=cpus * hours, wall_hours=hours, gpu_model=_gpu_model(spec),
                  instance_type=(spec.backend_options or {}).get("instance_type"))
    cost, _ = price(usage, spec.resources.nnodes, dict(config.get("prices") or {}))
    return cost, hours


def _gpu_model(spec: JobSpec) -> str | None:
    """The GPU model the job will get, where phalanx can know it: SkyPilot's and SageMaker's from
    the options, this machine's for a local job."""
    from pathlib import Path

    from ..monitor.accounting import declared_gpus

    _, model = declared_gpus(spec.backend, dict(spec.backend_options or {}))
    if model or spec.backend != "local":
        return model
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    return None


def check(store: Store, spec: JobSpec, project: ProjectRecord, gpus: int, cpus: int, admins: list[str]) -> None:
    """Raise ``OverBudget`` (one line: the budget, what is left, who may raise it) when the job's
    estimate would cross its project's budget this month."""
    if project.budget is None:
        return
    amount, hours = estimate(store, spec, project, gpus, cpus)
    used = used_of(project, spent(store, project))
    unit = project.budget_unit or ""
    left = project.budget - used
    if (amount or 0.0) <= left and left > 0:
        return
    who = ", ".join(admins) if admins else "a server admin"
    guess = "no price applies to it" if amount is None else f"about {_num(amount)} {unit} ({hours:.3g} h)"
    raise OverBudget(f"project {project.name}'s budget is {_num(project.budget)} {unit} this month and "
                     f"{_num(max(left, 0.0))} {unit} is left; this job would cost {guess}",
                     f"{who} may raise it: phalanx server project set {project.name} --budget AMOUNT{unit}")


def _num(value: float) -> str:
    return f"{value:,.2f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value):,}"


def check_job(store: Store, spec: JobSpec) -> None:
    """``check`` for a job of ``spec`` in its (resolved) project: a sweep's next trial."""
    from ..core.identity import DEFAULT_PROJECT
    from .admission import needs

    project = store.projects.get(spec.project or DEFAULT_PROJECT)
    if project is None or project.budget is None:
        return
    gpus, cpus = needs(spec)
    check(store, spec, project, gpus, cpus, admins(store))


def admins(store: Store) -> list[str]:
    """The server admins (who may raise a budget), by name."""
    return [u.name for u in store.users.list() if u.admin and u.revoked_at is None]
