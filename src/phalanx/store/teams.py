"""Projects and their members (migration 8): rows only. What the roles mean and who may change
what is ``api/projects.py``'s and ``core/identity.py``'s business.

A project holds its quotas (concurrent GPUs, CPUs and jobs: None is no limit), its monthly
budget (``budget`` in ``budget_unit``: ``gpu-h`` or a currency code) and the cluster queues that
enforce it where a scheduler does (a Kueue LocalQueue, a SLURM account and QOS). ``version``
grows with every change, so a change reads the row it replaces in its own transaction and the
audit log can say what each of two concurrent changes replaced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from . import tx
from .tx import Tx

LIMITS = ("max_gpus", "max_cpus", "max_jobs", "budget", "budget_unit", "kueue_queue", "slurm_account", "slurm_qos")
_PROJECT = "name, created_at, " + ", ".join(LIMITS) + ", version"


@dataclass(frozen=True)
class ProjectRecord:
    name: str
    created_at: float
    max_gpus: int | None = None
    max_cpus: int | None = None
    max_jobs: int | None = None
    budget: float | None = None
    budget_unit: str | None = None  # "gpu-h" or a currency ("usd")
    kueue_queue: str | None = None
    slurm_account: str | None = None
    slurm_qos: str | None = None
    version: int = 0

    @property
    def has_quota(self) -> bool:
        return any(v is not None for v in (self.max_gpus, self.max_cpus, self.max_jobs))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemberRecord:
    project: str
    user_name: str
    role: str
    added_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _project(row: tuple[Any, ...]) -> ProjectRecord:
    return ProjectRecord(*row)


class ProjectTable:
    def __init__(self, store: Any) -> None:
        self._store = store

    # -- reads ----------------------------------------------------------------------------------

    def get(self, name: str) -> ProjectRecord | None:
        found = tx.rows(self._store, f"SELECT {_PROJECT} FROM projects WHERE name = ?", [name])
        return _project(found[0]) if found else None

    def all(self) -> list[ProjectRecord]:
        return [_project(r) for r in tx.rows(self._store, f"SELECT {_PROJECT} FROM projects ORDER BY name")]

    def members(self, project: str | None = None) -> list[MemberRecord]:
        if project is None:
            found = tx.rows(self._store, "SELECT project, user_name, role, added_at FROM members ORDER BY project, user_name")
        else:
            found = tx.rows(self._store, "SELECT project, user_name, role, added_at FROM members WHERE project = ? "
                            "ORDER BY user_name", [project])
        return [MemberRecord(*r) for r in found]

    def roles_of(self, user: str) -> dict[str, str]:
        """project -> role of ``user`` (the projects they are in)."""
        found = tx.rows(self._store, "SELECT project, role FROM members WHERE user_name = ?", [user])
        return {project: role for project, role in found}

    def count_members(self) -> dict[str, int]:
        return {p: int(n) for p, n in tx.rows(self._store, "SELECT project, COUNT(*) FROM members GROUP BY project")}

    # -- writes, each inside a unit of work (``tx.atomic``) --------------------------------------

    @staticmethod
    def read(t: Tx, name: str) -> ProjectRecord | None:
        found = t.row(f"SELECT {_PROJECT} FROM projects WHERE name = ?", [name])
        return _project(found) if found else None

    @staticmethod
    def add(t: Tx, name: str, at: float) -> bool:
        """False: the name is taken."""
        return t.execute("INSERT INTO projects (name, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", [name, at]) == 1

    @staticmethod
    def remove(t: Tx, name: str) -> bool:
        t.execute("DELETE FROM members WHERE project = ?", [name])
        t.execute("UPDATE users SET default_project = NULL WHERE default_project = ?", [name])
        return t.execute("DELETE FROM projects WHERE name = ?", [name]) == 1

    @staticmethod
    def change(t: Tx, name: str, changes: dict[str, Any]) -> tuple[ProjectRecord, ProjectRecord] | None:
        """Set some of ``LIMITS``; the row before and after (None: no such project)."""
        assert changes and set(changes) <= set(LIMITS)
        before = ProjectTable.read(t, name)
        if before is None:
            return None
        sets = ", ".join(f"{k} = ?" for k in changes)
        t.execute(f"UPDATE projects SET {sets}, version = version + 1 WHERE name = ?", [*changes.values(), name])
        after = ProjectTable.read(t, name)
        assert after is not None
        return before, after

    @staticmethod
    def member(t: Tx, project: str, user: str) -> MemberRecord | None:
        found = t.row("SELECT project, user_name, role, added_at FROM members WHERE project = ? AND user_name = ?",
                      [project, user])
        return MemberRecord(*found) if found else None

    @staticmethod
    def set_member(t: Tx, project: str, user: str, role: str, at: float) -> MemberRecord | None:
        """Add ``user`` to ``project`` with ``role``, or change their role; returns what was there."""
        before = ProjectTable.member(t, project, user)
        if before is None:
            t.execute("INSERT INTO members (project, user_name, role, added_at) VALUES (?, ?, ?, ?)",
                      [project, user, role, at])
        else:
            t.execute("UPDATE members SET role = ? WHERE project = ? AND user_name = ?", [role, project, user])
        return before

    @staticmethod
    def remove_member(t: Tx, project: str, user: str) -> MemberRecord | None:
        before = ProjectTable.member(t, project, user)
        if before is not None:
            t.execute("DELETE FROM members WHERE project = ? AND user_name = ?", [project, user])
            t.execute("UPDATE users SET default_project = NULL WHERE name = ? AND default_project = ?", [user, project])
        return before
