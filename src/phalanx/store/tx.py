"""One unit of work on the store: several statements that commit together or not at all, and
reads of one snapshot (the teams' tables: ``teams.py``, ``audit.py``, ``queue.py``).

``atomic(store, fn)`` runs ``fn(tx)`` in one write transaction: on SQLite ``BEGIN IMMEDIATE``
under the store's writer lock, so two processes' units run one after the other (what admission
needs: the usage it reads is still true when it admits). ``fn`` acts only through ``tx``.
``rows(store, sql, params)`` is one read.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any, Callable, Protocol, Sequence, TypeVar

T = TypeVar("T")
Params = Sequence[Any]


class Store(Protocol):
    """The store as a unit of work needs it (``db.Store``): its connection, its writer lock, and
    how a refused write is said."""

    _conn: sqlite3.Connection
    _lock: threading.Lock

    def write_error(self, exc: sqlite3.OperationalError) -> Exception: ...


class Tx:
    """A transaction as ``atomic``'s function sees it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; the rows it changed."""
        return int(self._conn.execute(sql, tuple(params)).rowcount)

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql, tuple(params)).fetchall())

    def row(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        found = self._conn.execute(sql, tuple(params)).fetchone()
        return None if found is None else tuple(found)


def atomic(store: Store, fn: Callable[[Tx], T]) -> T:
    """``fn(tx)`` in one write transaction: committed when it returns, rolled back if it raises.
    A refused write (full disk, read-only store) is raised in words (``Store.write_error``)."""
    conn = store._conn
    with store._lock:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise store.write_error(exc) from exc
        try:
            result = fn(Tx(conn))
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                raise store.write_error(exc) from exc
            raise


def rows(store: Store, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
    """One read (its own snapshot)."""
    return list(store._conn.execute(sql, tuple(params)).fetchall())
