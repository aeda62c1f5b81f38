"""The SQLite engine: one file in the home, WAL mode, no server (the default store).

Every process that writes (CLI, supervisors) opens its own connection; WAL gives readers a
consistent snapshot while one writer commits, and ``busy_timeout`` serialises writers across
processes; within a process one lock serialises this connection's writes and transactions.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from ..errors import StoreError
from .engine import Params, StoreConflict
from .migrations import MIGRATIONS
from .sql import TextConnection

T = TypeVar("T")


class SqliteEngine:
    kind = "sqlite"
    instr = "instr"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = self._open_writable()
        except sqlite3.DatabaseError as exc:
            self.conn = self._read_only(exc)
        self.lock = threading.Lock()

    def _open_writable(self) -> sqlite3.Connection:
        """A connection in WAL mode. Setting the journal mode does not wait on SQLite's busy
        handler while another connection creates the store or switches it to WAL (two processes, or
        a supervisor thread and a reader, opening a new home at once): "database is locked" then
        means "try again shortly", for as long as a write would wait."""
        deadline = time.monotonic() + 30
        while True:
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False,
                                   factory=TextConnection)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=30000")
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
            except BaseException:
                conn.close()
                raise

    def _read_only(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """A store on a read-only filesystem or directory (a shared, mounted home), or on a full
        disk: SQLite cannot create the WAL's ``-shm`` beside it (no connection has it open, so
        nobody writes), so it is opened ``immutable`` (SQLite's URI option for read-only media):
        reads work, every write is refused in words (``write_error``)."""
        from ..core.disk import free_bytes

        full = (free_bytes(self.path.parent) or 0) < 64 * 1024
        self._full_at_open = full
        if not self.path.exists() or (os.access(self.path.parent, os.W_OK) and not full):
            raise StoreError(f"cannot open the job store {self.path}: {exc}", "move the file aside to start a new store") from None
        try:
            return sqlite3.connect(f"{self.path.resolve().as_uri()}?immutable=1", uri=True, isolation_level=None,
                                   check_same_thread=False, factory=TextConnection)
        except sqlite3.DatabaseError as again:
            raise StoreError(f"cannot open the read-only job store {self.path}: {again}",
                             "check the file, or set PHALANX_HOME to another store") from None

    def close(self) -> None:
        self.conn.close()

    # -- the face (engine.Engine) ------------------------------------------------------------

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def row(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        return self.conn.execute(sql, params).fetchone()  # type: ignore[no-any-return]

    def write(self, sql: str, params: Params = ()) -> int:
        with self.lock:
            try:
                return self.conn.execute(sql, params).rowcount
            except sqlite3.IntegrityError as exc:
                raise StoreConflict(f"{exc} in the job store {self.path}", "this id is taken") from exc
            except sqlite3.OperationalError as exc:
                raise self.write_error(exc) from exc

    def atomic(self, fn: Callable[["SqliteEngine"], T], retry: bool = True, undo: Callable[[], None] | None = None,
               committed: Callable[["SqliteEngine"], bool] | None = None) -> T:
        """``fn(self)`` in one transaction (``BEGIN IMMEDIATE``: the write lock from the start,
        so it never has to be upgraded, which could fail with "locked"). Runs once: SQLite has
        one writer at a time, so there is nothing to retry, and a commit's outcome is known
        (``undo`` runs when ``fn`` returned but the commit failed)."""
        with self.lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                ran = False
                try:
                    result = fn(self)
                    ran = True
                    self.conn.execute("COMMIT")
                    return result
                except BaseException:
                    if self.conn.in_transaction:  # SQLite may have rolled back itself (disk full)
                        self.conn.execute("ROLLBACK")
                    if ran and undo is not None:
                        undo()
                    raise
            except sqlite3.IntegrityError as exc:
                raise StoreConflict(f"{exc} in the job store {self.path}", "this id is taken") from exc
            except sqlite3.OperationalError as exc:
                raise self.write_error(exc) from exc

    # Inside ``atomic`` (the lock is held): statements straight on the connection.
    def execute(self, sql: str, params: Params = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    def executemany(self, sql: str, rows: Iterable[Params]) -> int:
        return self.conn.executemany(sql, rows).rowcount

    def insert_many(self, table: str, cols: Sequence[str], rows: Iterable[Params]) -> int:
        sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        return self.atomic(lambda tx: tx.executemany(sql, rows))

    def explain(self, sql: str, params: Params = ()) -> list[str]:
        """SQLite's plan for a read of this store (what tests pin)."""
        return [row[3] for row in self.conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    def glob(self, expr: str, pattern: str) -> tuple[str, Any]:
        return f"{expr} GLOB ?", pattern

    def noindex(self, expr: str) -> str:
        return f"+{expr}"  # SQLite's documented way to keep an index off a term

    def day(self, expr: str) -> str:
        return f"date({expr}, 'unixepoch', 'localtime')"

    # -- errors ------------------------------------------------------------------------------

    def write_error(self, exc: sqlite3.OperationalError) -> Exception:
        """A refused write in words: the disk is full, or the store is read-only (a shared,
        mounted store: reads work, writes need a home of one's own). Anything else as it was."""
        from ..core.disk import as_disk_full, is_full

        if is_full(exc) or getattr(self, "_full_at_open", False):
            return as_disk_full(exc, f"the job store ({self.path.name})", self.path.parent)
        if "readonly" in str(exc) or "read-only" in str(exc):
            return StoreError(f"the job store {self.path} is read-only, so this command cannot record anything "
                              "(ps, status and logs work)",
                              "run it where the store is writable, or set PHALANX_HOME to a writable directory")
        return exc

    # -- migrations --------------------------------------------------------------------------

    def answer_within(self, seconds: float) -> None:
        """Nothing to do: a file has no connection to lose."""

    def migrate(self) -> None:
        """Run the migrations this file has not had; ``PRAGMA user_version`` counts them."""
        migrations = MIGRATIONS
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(migrations):
            raise StoreError(
                f"the job store {self.path} has schema {version}, newer than this phalanx knows ({len(migrations)})",
                "upgrade phalanx",
            )
        if version == len(migrations):
            return
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read inside the write lock: another process may have migrated meanwhile.
                version = self.conn.execute("PRAGMA user_version").fetchone()[0]
                for number in range(version, len(migrations)):
                    for statement in statements(migrations[number]):
                        self.conn.execute(statement)
                    self.conn.execute(f"PRAGMA user_version = {number + 1}")
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise


def statements(script: str) -> Iterator[str]:
    """The statements of a migration script; ``;`` inside a trigger's body does not end one."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.replace(";", "").strip():
                yield pending
            pending = ""
    if pending.replace(";", "").strip():
        raise StoreError("a store migration ends inside a statement", "this is a bug in phalanx: report it")
