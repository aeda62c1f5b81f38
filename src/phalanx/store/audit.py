"""The audit log (migration 8): one row per write anyone made: who, when, from which address,
what (an action and its target), in which project, and the outcome. Append-only: the table's
trigger refuses every UPDATE, and rows go only when they are older than the retention
(``expire``). Rows only; what is recorded when is ``api/audit.py``'s business."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import tx
from .tx import Tx

_COLUMNS = "id, at, user_name, address, action, target, project, outcome, detail"


@dataclass(frozen=True)
class Event:
    id: int
    at: float
    user_name: str
    address: str | None
    action: str
    target: str | None
    project: str | None
    outcome: str
    detail: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "user": self.user_name, "address": self.address, "action": self.action,
                "target": self.target, "project": self.project, "outcome": self.outcome,
                "detail": json.loads(self.detail) if self.detail else None}


def append(t: Tx, at: float, user: str, address: str | None, action: str, target: str | None, project: str | None,
           outcome: str, detail: dict[str, Any] | None = None) -> None:
    t.execute("INSERT INTO events (at, user_name, address, action, target, project, outcome, detail) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
              [at, user, address, action, target, project, outcome,
               json.dumps(detail, sort_keys=True) if detail else None])


def read(store: Any, since: float | None = None, user: str | None = None, projects: tuple[str, ...] | None = None,
         project: str | None = None, before: int | None = None, limit: int = 100) -> list[Event]:
    """Events newest first, ``limit`` at a time (``before``: the id where the previous page
    stopped). ``projects``: only events of these projects (None: every event, those of no
    project too)."""
    where: list[str] = []
    params: list[Any] = []
    if since is not None:
        where.append("at >= ?")
        params.append(since)
    if user is not None:
        where.append("user_name = ?")
        params.append(user)
    if project is not None:
        where.append("project = ?")
        params.append(project)
    if projects is not None:
        if not projects:
            return []
        where.append(f"project IN ({', '.join('?' for _ in projects)})")
        params.extend(projects)
    if before is not None:
        where.append("id < ?")
        params.append(before)
    sql = f"SELECT {_COLUMNS} FROM events {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id DESC LIMIT ?"
    return [Event(*row) for row in tx.rows(store, sql, [*params, limit])]


def expire(t: Tx, before: float) -> int:
    """Remove the events older than ``before`` (the retention); how many went."""
    return t.execute("DELETE FROM events WHERE at < ?", [before])
