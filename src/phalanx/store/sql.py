"""What the store's tables share: the store as they see it (id prefixes are index ranges: ``keys``)."""

from __future__ import annotations

from typing import Any, Iterable, Protocol

from ..core.state import JobState
from .engine import Engine


class Writer(Protocol):
    """The store as its tables see it (``db.Store``): its engine, and the writes they share."""

    engine: Engine

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int: ...

    def _transition(self, table: str, row_id: str, new: JobState, fields: dict[str, Any]) -> bool: ...
