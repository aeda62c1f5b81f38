"""One unit of work on the store, for the teams' tables (``teams.py``, ``audit.py``, ``queue.py``):
several statements that commit together or not at all (``atomic``), and single reads (``rows``),
on either engine (``engine.py``).

``atomic(store, fn)`` runs ``fn(tx)`` in one write transaction: on SQLite ``BEGIN IMMEDIATE``
(one writer at a time), on PostgreSQL SERIALIZABLE, re-run from the start on a serialization
failure. So two processes' units behave as one after the other (what admission needs: the
usage it reads is still true when it admits). ``fn`` acts only through ``tx``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar

T = TypeVar("T")
Params = Sequence[Any]


class Store(Protocol):
    engine: Any


class Tx:
    """A transaction as ``atomic``'s function sees it (the engine's, with ``row``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; the rows it changed."""
        return int(self._inner.execute(sql, tuple(params)))

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._inner.rows(sql, tuple(params))]

    def row(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        found = self.rows(sql, params)
        return found[0] if found else None


def atomic(store: Store, fn: Callable[[Tx], T]) -> T:
    """``fn(tx)`` in one write transaction: committed when it returns, rolled back if it raises."""
    return store.engine.atomic(lambda inner: fn(Tx(inner)))  # type: ignore[no-any-return]


def rows(store: Store, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
    """One read (its own snapshot)."""
    return [tuple(r) for r in store.engine.rows(sql, tuple(params))]
