"""The store's engines behind one face: SQLite (a file in the home; the default, no server)
and PostgreSQL (a team's database: ``PHALANX_STORE=postgresql://...``; ``postgres.py``).

The tables (``db``, ``sweeps``, ``listing``) write their SQL once, with ``?`` placeholders and
the standard SQL both engines share; the few spellings that differ come from the engine
(``glob``, ``instr``, ``day``, ``noindex``). Migrations are numbered alike on both
(``migrations.py``, ``pgmigrations.py``): migration N makes the same tables, columns and index
names on each.

Every call is one short unit of work: a read sees one snapshot and keeps no transaction open;
a write is committed when the call returns. What the engines guarantee alike:

- ``write`` is one statement, atomic: ``UPDATE ... WHERE state IN (...)`` is a compare-and-set on
  both (SQLite has one writer at a time; PostgreSQL re-checks the row after a concurrent update).
- ``atomic(fn)`` runs ``fn(tx)`` in one transaction that commits when it returns, or leaves
  nothing. On PostgreSQL it runs serializable, and a serialization failure, a deadlock or a
  lost connection re-runs ``fn`` from the start (so ``fn`` acts only through ``tx``, or says
  how to undo what else it did; ``retry=False`` raises instead).
- a broken connection (the database restarted) is retried for a bounded time, then raises
  ``StoreUnavailable`` (PostgreSQL; a SQLite file has no connection to lose).
- a duplicate key raises ``StoreConflict``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, Sequence, TypeVar

from ..errors import StoreError

T = TypeVar("T")
Params = Sequence[Any]


class StoreConflict(StoreError):
    """A row with this key exists already (a duplicate id in a bulk insert)."""


class Tx(Protocol):
    """One transaction, as ``atomic``'s function sees it."""

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; the rows it changed."""

    def executemany(self, sql: str, rows: Iterable[Params]) -> int: ...

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]: ...


class Engine(Protocol):
    kind: str  # "sqlite" | "postgresql"
    where: str  # what messages name: the file, or the URL without its password
    instr: str  # the position of a substring, 0 when absent: instr(haystack, needle) / strpos

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]: ...

    def row(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None: ...

    def write(self, sql: str, params: Params = ()) -> int: ...

    def atomic(self, fn: Callable[[Any], T], retry: bool = True, undo: Callable[[], None] | None = None,
               committed: Callable[[Any], bool] | None = None) -> T:
        """``fn(tx)`` in one transaction. ``undo`` reverses what ``fn`` did outside the store
        when it returned but its transaction did not commit; ``committed(tx)`` tells, after a
        connection broke during the commit, whether it happened."""

    def insert_many(self, table: str, cols: Sequence[str], rows: Iterable[Params]) -> int: ...

    def explain(self, sql: str, params: Params = ()) -> list[str]: ...

    def glob(self, expr: str, pattern: str) -> tuple[str, Any]:
        """A term matching ``expr`` against a shell glob (``*``, ``?``, ``[...]``, case
        sensitive) and its parameter."""

    def noindex(self, expr: str) -> str:
        """``expr``, written so the planner does not pick an index on it."""

    def day(self, expr: str) -> str:
        """The calendar day (YYYY-MM-DD) of a unix time."""

    def migrate(self) -> None:
        """Bring the schema up to this phalanx's migrations (once per engine)."""

    def answer_within(self, seconds: float) -> None:
        """Retry a lost connection for ``seconds`` at most from now on, then raise
        ``StoreUnavailable`` (a server answering requests: 503 rather than a long wait)."""

    def close(self) -> None: ...
