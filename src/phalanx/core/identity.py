"""Who acts: every call on the face (``phalanx.api``) carries a ``Principal``.

On this machine, on one's own store, the person at the terminal is the local principal: they see
every job of the store and may act on any of them (nobody else shares the store). Behind a team
server the principal is the logged-in user with their projects and roles, and the face's views
filter and its verbs check by it (``docs/teams.md`` has the whole table):

- a **viewer** of a project reads its jobs and sweeps;
- a **member** also runs jobs in it, and stops, resumes and removes their own;
- a project **admin** acts on every job of the project, manages its members and quotas, and reads
  its audit log;
- a server **admin** (``admin``) does everything, everywhere.

A project the principal is not in does not exist for them: its jobs answer as ids that do not
exist (``visible``: the projects a lookup may find anything in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

ROLES = ("viewer", "member", "admin")  # each may do what the one before it may, and more
DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class Principal:
    """A user acting through the face.

    ``local``: the owner of the store at hand (no server): sees and may act on everything.
    ``admin``: a server administrator: sees and may act on every job of every project.
    ``projects``: project name -> role (viewer, member, admin) of a user of a team server; None
    where every project is theirs (local, a server admin).
    ``address``: where the request came from (the audit log's "from"): a client address, or
    ``local`` for a command on the store's own machine.
    ``only``: a command's ``--project NAME``: it sees that project only (if it may see it at all).
    """

    user: str
    admin: bool = False
    local: bool = False
    projects: Mapping[str, str] | None = field(default=None, compare=False)
    address: str = field(default="local", compare=False)
    only: str | None = field(default=None, compare=False)  # narrowed to this project (``--project``)

    @classmethod
    def here(cls, user: str) -> Principal:
        """The person at this machine (``config.user()``), on their own store."""
        return cls(user=user, admin=True, local=True)

    @property
    def everywhere(self) -> bool:
        """Sees every project (local, a server admin, or a user of a server without projects)."""
        return self.local or self.admin or self.projects is None

    def visible(self) -> tuple[str, ...] | None:
        """The projects whose jobs this principal may see (None: all of them), sorted."""
        if self.only is not None:
            return (self.only,) if self.sees(self.only) else ()
        return None if self.everywhere else tuple(sorted(self.projects or {}))

    def narrowed(self, project: str | None) -> Principal:
        """The same principal seeing ``project`` only (None: unchanged)."""
        from dataclasses import replace

        return self if not project else replace(self, only=project)

    def sees(self, project: str | None) -> bool:
        return self.everywhere or (project or DEFAULT_PROJECT) in (self.projects or {})

    def role(self, project: str | None) -> str | None:
        """Their role in ``project`` (admin for whoever sees everything), None: not a member."""
        if self.local or self.admin:
            return "admin"
        if self.projects is None:
            return "member"  # one team without projects: everyone runs jobs, acts on their own
        return self.projects.get(project or DEFAULT_PROJECT)

    def at_least(self, project: str | None, role: str) -> bool:
        mine = self.role(project)
        return mine is not None and ROLES.index(mine) >= ROLES.index(role)

    def may_submit(self, project: str | None) -> bool:
        return self.at_least(project, "member")

    def may_manage(self, project: str | None) -> bool:
        """May change the project's members and quotas, and read its audit log."""
        return self.at_least(project, "admin")

    def may_act_on(self, owner: str | None, project: str | None = None) -> bool:
        """May stop, resume or remove a job submitted by ``owner`` in ``project`` (owner None:
        recorded before jobs had owners, which only the store's owner or an admin may touch)."""
        if self.at_least(project, "admin"):
            return True
        return self.at_least(project, "member") and owner is not None and owner == self.user
