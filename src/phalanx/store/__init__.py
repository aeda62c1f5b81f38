"""The job store: SQLite in WAL mode (a file in the home), or a team's PostgreSQL. No SQL
outside this package."""

from __future__ import annotations

from pathlib import Path

from .db import JobRecord, Store

__all__ = ["JobRecord", "Store", "open_store"]


def open_store(default: Path) -> Store:
    """The store the settings name (``store``, ``PHALANX_STORE``): a ``postgresql://`` URL, a
    path, or, when empty, the SQLite file ``default`` (the home's ``phalanx.db``)."""
    from .. import config

    where = str(config.get("store") or "").strip()
    return Store(where or default)
