"""Who acts: every call on the face (``phalanx.api``) carries a ``Principal``.

On this machine, on one's own store, the person at the terminal is the local principal: they see
every job of the store and may act on any of them (nobody else shares the store). Behind a team
server the principal is the logged-in user, and the face's views filter and its verbs check by
it; ``docs/server.md`` says who may do what.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Principal:
    """A user acting through the face.

    ``local``: the owner of the store at hand (no server): sees and may act on everything.
    ``admin``: a server administrator: sees and may act on every job.
    ``projects``: project name -> role (viewer, member, admin) for a user of a server with
    projects; None where there are none (one team: everyone sees every job).
    """

    user: str
    admin: bool = False
    local: bool = False
    projects: Mapping[str, str] | None = field(default=None, compare=False)

    @classmethod
    def here(cls, user: str) -> Principal:
        """The person at this machine (``config.user()``), on their own store."""
        return cls(user=user, admin=True, local=True)

    def may_act_on(self, owner: str | None) -> bool:
        """May stop, resume or remove a job submitted by ``owner`` (None: recorded before
        jobs had owners, which only the store's owner or an admin may touch)."""
        return self.local or self.admin or (owner is not None and owner == self.user)
