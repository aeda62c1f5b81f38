"""Projects, their members and their limits (``phalanx server project ...``): the verbs, each
checked against the acting ``Principal`` and recorded in the audit log in the same transaction
as the change it makes.

- a server admin (or the store's owner) adds and removes projects and sets budgets;
- a project admin adds, removes and re-roles its members and sets its quotas and queues;
- everyone lists the projects they are in (a server admin: all of them).

A project someone is not in answers as one that does not exist. Bad input (an unknown project,
user or role, a quota that is not a number, a budget in an unknown unit) is one line, exit 2, and
changes nothing.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..core.identity import DEFAULT_PROJECT, ROLES, Principal
from ..core.state import JobState
from ..errors import NotAllowed, UsageError
from ..store import Store
from ..store import tx
from ..store.teams import LIMITS, ProjectRecord, ProjectTable
from . import audit

_NAME = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")
# ISO 4217 codes a money budget may be written in (the prices setting is in the same currency).
CURRENCIES = ("usd", "eur", "gbp", "chf", "jpy", "cny", "inr", "cad", "aud", "nzd", "sek", "nok", "dkk", "pln",
              "czk", "sgd", "hkd", "krw", "brl", "mxn", "zar", "ils", "try")
GPU_HOURS = "gpu-h"
_BUDGET = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z$€£-]+)\s*$")
_NONE = ("none", "off", "unlimited", "-")


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise UsageError(f"invalid project name '{name}'",
                         "use lower-case letters, digits, '.', '_' and '-', starting with a letter (at most 64)")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise UsageError(f"unknown role '{role}'", f"use one of: {', '.join(ROLES)}")
    return role


def parse_quota(flag: str, text: str | int | None) -> int | None | str:
    """A quota as given: a whole number >= 0, or none (no limit). ``...`` (the string) means
    "not given"."""
    if text is None:
        return "..."
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        raw = str(text).strip().lower()
        if raw in _NONE:
            return None
        if not raw.isdigit():
            what = {"--max-gpus": "GPUs", "--max-cpus": "CPUs"}.get(flag, "jobs")
            raise UsageError(f"{flag} '{text}' is not a number",
                             f"give a whole number of {what}, e.g. {flag} 8, or {flag} none to remove the limit")
        value = int(raw)
    if value < 0:
        raise UsageError(f"{flag} {value} is negative", f"give a whole number of at least 0, or {flag} none")
    return value


def parse_budget(text: str) -> tuple[float | None, str | None]:
    """``500usd``, ``2000gpu-h`` (per calendar month), or ``none``."""
    raw = text.strip().lower()
    if raw in _NONE:
        return None, None
    match = _BUDGET.match(raw)
    if match is None:
        raise UsageError(f"--budget '{text}' is not an amount with its unit",
                         f"e.g. --budget 500usd or --budget 2000{GPU_HOURS} (per calendar month), or --budget none")
    amount, unit = float(match.group(1)), match.group(2)
    unit = {"$": "usd", "€": "eur", "£": "gbp", "gpuh": GPU_HOURS, "gpu-hours": GPU_HOURS, "gpu-hour": GPU_HOURS}.get(unit, unit)
    if unit != GPU_HOURS and unit not in CURRENCIES:
        raise UsageError(f"--budget '{text}': unknown currency or unit '{match.group(2)}'",
                         f"use {GPU_HOURS} or a currency code: {', '.join(CURRENCIES[:6])}, ...")
    return amount, unit


# -- reads ----------------------------------------------------------------------------------------


def visible_project(store: Store, who: Principal, name: str) -> ProjectRecord:
    """The project ``name`` if it exists and ``who`` is in it; else the same 'no project' line."""
    found = store.projects.get(name)
    if found is None or not who.sees(name):
        raise UsageError(f"no project '{name}'" + ("" if who.everywhere else " that you are in"),
                         "list yours with: phalanx server project list")
    return found


def list_projects(store: Store, who: Principal) -> list[dict[str, Any]]:
    """The projects ``who`` is in (a server admin: all), with their role, members, limits, what
    is in use now, how many wait, and which engine enforces what."""
    from ..supervise import admission, budget

    counts = store.projects.count_members()
    out = []
    for project in store.projects.all():
        if not who.sees(project.name):
            continue
        use = admission.in_use(store, project.name)
        out.append({**project.to_dict(), "role": who.role(project.name), "members": counts.get(project.name, 0),
                    "in_use": use.to_dict(), "queued": admission.queued_count(store, project.name),
                    "spent": budget.spent(store, project), "enforced_by": admission.enforcement(project)})
    return out


def members(store: Store, who: Principal, project: str) -> list[dict[str, Any]]:
    visible_project(store, who, project)
    return [m.to_dict() for m in store.projects.members(project)]


# -- verbs ----------------------------------------------------------------------------------------


def _server_admin(who: Principal, what: str) -> None:
    if not (who.local or who.admin):
        raise NotAllowed(f"only a server admin may {what}", "ask one (phalanx server user list shows them)")


def add_project(store: Store, who: Principal, name: str) -> dict[str, Any]:
    with audit.audited(store, who, "project.add", name, name) as event:
        _server_admin(who, "add projects")
        check_name(name)

        def add(t: tx.Tx) -> None:
            if not ProjectTable.add(t, name, time.time()):
                raise UsageError(f"project '{name}' exists", "see it with: phalanx server project list")
            audit.record(store, who, "project.add", name, name, t=t)
            event.done = True

        tx.atomic(store, add)
    created = store.projects.get(name)
    assert created is not None
    return created.to_dict()


def remove_project(store: Store, who: Principal, name: str) -> dict[str, Any]:
    """Remove a project and its members. Its running jobs run on (nothing is killed); its queued
    jobs are CANCELLED, saying why; its ended jobs stay (a server admin still sees them)."""
    from ..supervise import admission

    with audit.audited(store, who, "project.rm", name, name) as event:
        _server_admin(who, "remove projects")
        if name == DEFAULT_PROJECT:
            raise UsageError(f"the project '{DEFAULT_PROJECT}' cannot be removed", "it is where jobs go that name none")
        visible_project(store, who, name)

        def remove(t: tx.Tx) -> None:
            if not ProjectTable.remove(t, name):
                raise UsageError(f"no project '{name}'", "list them with: phalanx server project list")
            audit.record(store, who, "project.rm", name, name, t=t)
            event.done = True

        tx.atomic(store, remove)
        cancelled = admission.cancel_queued(store, name, f"its project '{name}' was removed by {who.user}")
    return {"name": name, "cancelled": cancelled}


def set_limits(store: Store, who: Principal, name: str, max_gpus: Any = None, max_cpus: Any = None,
               max_jobs: Any = None, budget: str | None = None, kueue_queue: str | None = None,
               slurm_account: str | None = None, slurm_qos: str | None = None) -> dict[str, Any]:
    """Change some of a project's limits (None: leave as it is; ``none``: no limit). Quotas and
    queues: a project admin; the budget: a server admin. Every value is checked before anything
    changes; the old and new values go to the audit log with the change."""
    from ..supervise import admission

    with audit.audited(store, who, "project.set", name, name) as event:
        changes: dict[str, Any] = {}
        for key, flag, value in (("max_gpus", "--max-gpus", max_gpus), ("max_cpus", "--max-cpus", max_cpus),
                                 ("max_jobs", "--max-jobs", max_jobs)):
            parsed = parse_quota(flag, value)
            if parsed != "...":
                changes[key] = parsed
        if budget is not None:
            changes["budget"], changes["budget_unit"] = parse_budget(budget)
        for key, value in (("kueue_queue", kueue_queue), ("slurm_account", slurm_account), ("slurm_qos", slurm_qos)):
            if value is not None:
                changes[key] = None if value.strip().lower() in _NONE else value.strip()
        if not changes:
            raise UsageError("nothing to change", "give --max-gpus, --max-cpus, --max-jobs, --budget or a queue")
        visible_project(store, who, name)
        if not who.may_manage(name):
            raise NotAllowed(f"only an admin of project '{name}' may change its quotas", "ask one of its admins")
        if "budget" in changes:
            _server_admin(who, "set a project's budget")
        event.detail = {k: v for k, v in changes.items()}

        def change(t: tx.Tx) -> ProjectRecord:
            found = ProjectTable.change(t, name, changes)
            if found is None:
                raise UsageError(f"no project '{name}'", "list them with: phalanx server project list")
            before, after = found
            audit.record(store, who, "project.set", name, name, detail={
                "from": {k: getattr(before, k) for k in changes}, "to": {k: getattr(after, k) for k in changes},
                "version": after.version}, t=t)
            event.done = True
            return after

        after = tx.atomic(store, change)
    admission.advance(store, [name])  # a raised quota lets the queue move now
    return {**after.to_dict(), "enforced_by": admission.enforcement(after)}


def set_member(store: Store, who: Principal, project: str, user: str, role: str, new: bool = True) -> dict[str, Any]:
    """Add ``user`` to ``project`` with ``role`` (``new``), or change the role they have."""
    action = "member.add" if new else "member.role"
    with audit.audited(store, who, action, user, project) as event:
        check_role(role)
        visible_project(store, who, project)
        if not who.may_manage(project):
            raise NotAllowed(f"only an admin of project '{project}' may change its members", "ask one of its admins")
        found = store.users.get(user)
        if found is None or found.revoked_at is not None:
            raise UsageError(f"no user '{user}'", "list them with: phalanx server user list")

        def change(t: tx.Tx) -> None:
            before = ProjectTable.member(t, project, user)
            if new and before is not None:
                raise UsageError(f"{user} is already in project '{project}' (as {before.role})",
                                 f"change the role with: phalanx server project member role {project} {user} ROLE")
            if not new and before is None:
                raise UsageError(f"{user} is not in project '{project}'",
                                 f"add them with: phalanx server project member add {project} {user} --role {role}")
            ProjectTable.set_member(t, project, user, role, time.time())
            audit.record(store, who, action, user, project,
                         detail={"role": role, **({"was": before.role} if before else {})}, t=t)
            event.done = True

        tx.atomic(store, change)
    return {"project": project, "user": user, "role": role}


def remove_member(store: Store, who: Principal, project: str, user: str) -> dict[str, Any]:
    with audit.audited(store, who, "member.rm", user, project) as event:
        visible_project(store, who, project)
        if not who.may_manage(project):
            raise NotAllowed(f"only an admin of project '{project}' may change its members", "ask one of its admins")

        def change(t: tx.Tx) -> None:
            before = ProjectTable.remove_member(t, project, user)
            if before is None:
                raise UsageError(f"{user} is not in project '{project}'",
                                 f"see its members with: phalanx server project member list {project}")
            audit.record(store, who, "member.rm", user, project, detail={"was": before.role}, t=t)
            event.done = True

        tx.atomic(store, change)
    return {"project": project, "user": user, "removed": True}


def use_project(store: Store, who: Principal, name: str) -> dict[str, Any]:
    """The project ``who``'s jobs go to when they name none (a server user's default)."""
    if who.local:
        raise UsageError("on this machine's own store the default project is a setting",
                         f"set PHALANX_PROJECT={name} or 'project: {name}' in config.yaml")
    with audit.audited(store, who, "project.use", name, name):
        visible_project(store, who, name)
        store.users.set_default_project(who.user, name)
    return {"user": who.user, "default_project": name}


def project_for(store: Store, who: Principal, asked: str) -> str:
    """The project a job of ``who`` goes to: the one asked for, else the user's default, else
    'default'. It must exist, and ``who`` must be a member (or admin) of it."""
    name = asked
    if not name and not who.local:
        user = store.users.get(who.user)
        name = user.default_project if user is not None and user.default_project else ""
    name = name or DEFAULT_PROJECT
    visible_project(store, who, name)
    if not who.may_submit(name):
        raise NotAllowed(f"viewers of project '{name}' may not run jobs in it", "ask one of its admins to make you a member")
    return name


def in_project(store: Store, project: str, states: tuple[JobState, ...]) -> int:
    """How many jobs of ``project`` are in ``states`` (tests, the CLI's summary lines)."""
    marks = ", ".join("?" for _ in states)
    found = tx.rows(store, f"SELECT COUNT(*) FROM jobs WHERE project = ? AND state IN ({marks})",
                    [project, *(s.value for s in states)])
    return int(found[0][0])


__all__ = ["LIMITS", "add_project", "list_projects", "members", "project_for", "remove_project", "set_limits",
           "set_member", "remove_member", "use_project"]
