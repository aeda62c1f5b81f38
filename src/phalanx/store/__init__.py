"""The job store: SQLite in WAL mode (a file in the home), or a team's PostgreSQL. No SQL
outside this package."""

from __future__ import annotations

import os
from pathlib import Path

from .db import JobRecord, Store

__all__ = ["JobRecord", "Store", "open_store"]


def open_store(default: Path) -> Store:
    """The store the settings name (``store``, ``PHALANX_STORE``): a ``postgresql://`` URL, a
    path, or, when empty, the SQLite file ``default`` (the home's ``phalanx.db``)."""
    # The environment first, and the config file only when there is one: opening the default
    # store costs what it did before there was a choice (``bench/bench_store.py``).
    where = os.environ.get("PHALANX_STORE")
    if where is None and os.path.exists(os.path.join(os.path.dirname(default), "config.yaml")):
        from .. import config

        where = str(config.get("store") or "")
    where = (where or "").strip()
    return Store(where or default)
