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


@functools.lru_cache(maxsize=1)
def face() -> "Face":
    if not LOCAL:
        from ..remote.login import current

        login = current()
        if login is not None:
            from ..remote.face import RemoteFace

            return RemoteFace(login)
    from ..api.face import LocalFace

    return LocalFace()


def is_remote() -> bool:
    """Whether the commands go to a team server (its store names the jobs, not this machine's)."""
    from ..api.face import LocalFace

    return not isinstance(face(), LocalFace)
