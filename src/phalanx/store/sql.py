"""What the store's tables share: the writer they go through (id prefixes are index ranges: ``keys``)."""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable, Protocol

from ..core.state import JobState


class Writer(Protocol):
    """The store as its tables see it (``db.Store``): one connection, one writer lock."""

    _conn: sqlite3.Connection

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int: ...

    def _transition(self, table: str, row_id: str, new: JobState, fields: dict[str, Any]) -> bool: ...

