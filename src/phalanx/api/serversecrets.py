"""``phalanx secret set/list/rm`` for a user of a team server (``secrets/server.py`` keeps them):
each change recorded in the audit log by name only (``secret.set``, ``secret.rm``; a project's
secret under its project), whatever its outcome. A value goes in and never comes back out."""

from __future__ import annotations

from typing import Any

from ..core.identity import Principal
from ..secrets.base import SCOPED
from ..store import Store
from . import audit


def _project(name: str) -> str | None:
    return name.partition("/")[0] if SCOPED.match(name) else None


def secret_set(store: Store, who: Principal, name: str, value: str) -> dict[str, Any]:
    from ..secrets.server import ServerSecrets

    with audit.audited(store, who, "secret.set", name, _project(name)):
        kept = ServerSecrets(store, who)
        new = kept.set(name, value)
    return {"name": name, "new": new, "where": kept.where}


def secret_list(store: Store, who: Principal) -> list[dict[str, Any]]:
    from ..secrets.server import ServerSecrets

    return [info.to_dict() for info in ServerSecrets(store, who).list()]


def secret_rm(store: Store, who: Principal, name: str) -> dict[str, Any]:
    from ..secrets.server import ServerSecrets

    with audit.audited(store, who, "secret.rm", name, _project(name)):
        kept = ServerSecrets(store, who)
        if not kept.remove(name):
            raise kept.missing(name)
    return {"name": name, "removed": True}
