"""The audit log: every write anyone makes through the face (submit, stop, resume, rm, prune),
every login and failed login, every change of users, tokens, projects, members, quotas and
budgets, with who, when, from which address, what and the outcome (``ok``, ``denied``: not
theirs to do, ``error``: refused or failed, with the message). Rows are append-only
(``store/audit.py``); events older than ``audit_retention_days`` are removed as new ones come.

Who may read it (``events``): a server admin (or the store's owner) everything; a project admin
the events of their projects; nobody else.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from .. import config
from ..core.identity import Principal
from ..errors import NotAllowed, PhalanxError
from ..store import Store
from ..store import audit as rows
from ..store import tx

EXPIRE_EVERY = 500  # events between two removals of the expired ones


def record(store: Store, who: Principal, action: str, target: str | None = None, project: str | None = None,
           outcome: str = "ok", detail: dict[str, Any] | None = None, t: tx.Tx | None = None) -> None:
    """One event; ``t``: inside that unit of work (the change it records commits with it)."""
    def write(unit: tx.Tx) -> None:
        rows.append(unit, time.time(), who.user, who.address, action, target, project, outcome, detail)

    if t is not None:
        write(t)
        return
    tx.atomic(store, write)
    _expire_now_and_then(store)


def _expire_now_and_then(store: Store) -> None:
    found = tx.rows(store, "SELECT MAX(id) FROM events")
    newest = found[0][0] if found else None
    if not newest or newest % EXPIRE_EVERY:
        return
    days = float(config.get("audit_retention_days") or 0)
    if days > 0:
        tx.atomic(store, lambda unit: rows.expire(unit, time.time() - days * 86400))


def outcome_of(exc: BaseException) -> tuple[str, dict[str, Any]]:
    """How a verb that raised ended, for its event."""
    if isinstance(exc, NotAllowed):
        return "denied", {"message": str(exc)}
    if isinstance(exc, PhalanxError):
        return "error", {"message": str(exc)}
    if isinstance(exc, KeyboardInterrupt):
        return "error", {"message": "interrupted"}
    return "error", {"message": f"{type(exc).__name__}: {exc}"}


class Pending:
    """What a verb learns as it goes (its target's id, its project, more detail), for its event."""

    def __init__(self, target: str | None, project: str | None) -> None:
        self.target = target
        self.project = project
        self.detail: dict[str, Any] = {}
        self.done = False  # recorded already (a foreground run records when its job exists)


@contextmanager
def audited(store: Store, who: Principal, action: str, target: str | None = None,
            project: str | None = None) -> Iterator[Pending]:
    """Record ``action`` once the block ends: ``ok``, or how it failed (the error still raises)."""
    pending = Pending(target, project)
    try:
        yield pending
    except BaseException as exc:
        if not pending.done:
            outcome, detail = outcome_of(exc)
            try:
                record(store, who, action, pending.target, pending.project, outcome, {**pending.detail, **detail})
            except Exception:  # noqa: BLE001 - the verb's own error is the one to raise
                pass
        raise
    if not pending.done:
        record(store, who, action, pending.target, pending.project, "ok", pending.detail or None)


def events(store: Store, who: Principal, since: float | None = None, user: str | None = None,
           project: str | None = None, before: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The events ``who`` may read, newest first (see the module docstring)."""
    if who.local or who.admin:
        scope = None
    else:
        scope = tuple(sorted(p for p in (who.projects or {}) if who.may_manage(p)))
        if not scope:
            raise NotAllowed("only project admins and server admins may read the audit log",
                             "ask an admin of your project")
        if project is not None and project not in scope:
            # the same answer for a project they are not in and one that does not exist
            raise NotAllowed(f"you are not an admin of a project '{project}'", "read the events of your own projects")
    return [e.to_dict() for e in rows.read(store, since, user, scope, project, before, max(1, min(limit, 10_000)))]
