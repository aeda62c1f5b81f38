"""Which face the commands talk to: a team server's (``RemoteFace``) when this machine is logged
in to one (``phalanx login URL``, or ``PHALANX_SERVER``), else this machine's store
(``LocalFace``); ``--local`` (before the command) picks this machine's store either way. Every
command makes its one call on ``face()`` and renders the result, so the commands do not know
which one they have."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..api.face import Face

LOCAL = False  # --local: this machine's own store, whatever the login says
PROJECT: str | None = None  # a command's --project NAME: it sees that project only


@functools.lru_cache(maxsize=1)
def face() -> "Face":
    if not LOCAL:
        from ..remote.login import current

        login = current()
        if login is not None:
            from ..remote.face import RemoteFace

            return RemoteFace(login, PROJECT)
    from .. import config
    from ..api.face import LocalFace
    from ..core.identity import Principal

    return LocalFace(Principal.here(config.user()).narrowed(PROJECT))


def narrow(project: str | None) -> str | None:
    """A command's ``--project NAME`` (a typer callback): what it shows and finds is that project's."""
    global PROJECT
    if project is not None and project != PROJECT:
        from ..core.grammar import project_name
        from ..core.optiontypes import BadValue
        from ..errors import UsageError

        try:
            project_name(project)
        except BadValue as exc:
            raise UsageError(f"invalid --project '{project}'", f"give {exc.expected}") from None
        PROJECT = project
        face.cache_clear()
    return project


def is_remote() -> bool:
    """Whether the commands go to a team server (its store names the jobs, not this machine's)."""
    from ..api.face import LocalFace

    return not isinstance(face(), LocalFace)
