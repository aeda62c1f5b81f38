"""Which replica of a team server supervises the jobs this process starts (``server/replica.py``
sets it at start; nothing else does, so a CLI or a dashboard records no lease).

A job a server starts is recorded with a lease in its row (``store/leases.py``): the replica's
id and an expiry the replica keeps pushing forward while it lives. A replica's id names its
machine (``host_of``): a supervisor's pid means something only there.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from ..store import Store


@dataclass(frozen=True)
class Holder:
    id: str  # HOST/PID/RANDOM: unique per server process, its machine first
    ttl: float  # seconds a lease lasts unless renewed


_HOLDER: Holder | None = None


def new_holder(ttl: float) -> Holder:
    return Holder(f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}", ttl)


def hold_as(holder: Holder | None) -> None:
    global _HOLDER
    _HOLDER = holder


def holder() -> Holder | None:
    return _HOLDER


def host_of(holder_id: str) -> str:
    return holder_id.split("/", 1)[0]


def columns() -> dict[str, Any]:
    """The lease columns of a job this process records (none outside a server)."""
    if _HOLDER is None:
        return {}
    return {"lease_holder": _HOLDER.id, "lease_expires": time.time() + _HOLDER.ttl}


def claim(store: Store, job_id: str) -> None:
    """This replica supervises ``job_id`` from now on (it started its supervisor again)."""
    if _HOLDER is not None:
        store.leases.hold(job_id, _HOLDER.id, _HOLDER.ttl)
