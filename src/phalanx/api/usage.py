"""``phalanx usage``: what jobs used (GPU-hours, CPU-hours, cost), grouped, for the projects the
asker may see; grouped by project, each row also has the project's quotas, what its jobs hold
now and its budget with this month's spending beside it. A view: it writes nothing."""

from __future__ import annotations

from typing import Any

from ..core.identity import Principal
from ..errors import UsageError
from ..store import Store


def usage(store: Store, who: Principal, by: str, since: str | None, projects: tuple[str, ...] | None) -> list[dict[str, Any]]:
    from ..monitor.logindex import parse_since
    from ..store.listing import GROUPS, usage_totals

    if by not in GROUPS:
        raise UsageError(f"unknown --by '{by}'", f"group by one of: {', '.join(GROUPS)}")
    rows = list(usage_totals(store, by, parse_since(since) if since else None, projects))
    if by != "project":
        return rows
    return [{**row, **limits(store, row["group"])} for row in rows]


def limits(store: Store, name: str) -> dict[str, Any]:
    """A project's quotas and budget beside what it holds now and spent this month."""
    from ..supervise import admission, budget

    project = store.projects.get(name)
    if project is None:  # removed since: its jobs' usage stays
        return {"quota": None, "in_use": None, "budget": None}
    spent = budget.spent(store, project)
    return {"quota": {"gpus": project.max_gpus, "cpus": project.max_cpus, "jobs": project.max_jobs},
            "in_use": admission.in_use(store, name).to_dict(), "queued": admission.queued_count(store, name),
            "budget": None if project.budget is None else {
                "amount": project.budget, "unit": project.budget_unit,
                "used": budget.used_of(project, spent), "since": spent["since"]}}
