"""The PostgreSQL engine: a team's store (``PHALANX_STORE=postgresql://USER@HOST:PORT/DATABASE``).

Driver: psycopg 3 with psycopg-pool (the ``postgres`` extra), imported here only, so
``phalanx --help`` and ``ps`` on a SQLite store never load them. Credentials are libpq's own:
the URL, ``PGPASSWORD``, a service (``PGSERVICE``, ``?service=``) or a passfile
(``PGPASSFILE``, ``~/.pgpass``). What phalanx shows of the URL (``where``, every message it
raises) has no password in it.

Connections: one pool per process and URL (every ``Store`` on it shares it), in autocommit: a
read or a ``write`` is one statement, committed at once (READ COMMITTED: a compare-and-set
``UPDATE`` re-checks its row after a concurrent update). ``atomic`` transactions are
SERIALIZABLE, as every SQLite transaction is.

Faults, so that no caller sees what a retry can mend:

- a serialization failure or deadlock (SQLSTATE 40001, 40P01): the transaction is run again
  after a short random pause, up to ``BUSY_TRIES`` times;
- a lost connection, a server starting or shutting down (class 08, 57P01-57P03, no connection
  free in time): run again with fresh connections for ``retry_for`` seconds (the
  ``store_retry`` setting), then ``StoreUnavailable`` naming the host and database. Those
  retries connect outside the pool, whose own reconnecting backs off (after 15 s away, a
  database back could wait 16 s more for the pool's next try);
- a refused login, an unknown database or host: ``StoreError`` at once, saying what to check.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, TypeVar
from urllib.parse import parse_qsl, urlsplit

from ..errors import MissingDependency, StoreError
from .engine import Params
from .sql import bindable
from .pgfaults import describe, kind_of as _kind, redact, secrets_of

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")
BUSY_TRIES = 50
CONNECT_TIMEOUT = 10  # seconds, unless the URL or PGCONNECT_TIMEOUT says otherwise
MIGRATE_LOCK = 0x7068616C616E78  # "phalanx": the advisory lock migrations take

_ENGINES: dict[tuple[int, str], "PgEngine"] = {}
_ENGINES_LOCK = threading.Lock()


def connect(url: str, retry_for: float | None = None, pool_size: int = 4) -> "PgEngine":
    """The engine for ``url`` in this process (shared: one pool per URL; ``close`` releases it
    when the last store using it closes, and exit closes them all). ``retry_for`` and
    ``pool_size`` are the first opener's: a server opens its store first."""
    key = (os.getpid(), url)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = PgEngine(url, retry_for, pool_size)
        engine.users += 1
        return engine


@atexit.register
def dispose_all(url: str | None = None) -> None:
    """Close this process's pools (those of ``url`` only, when given), whoever still uses them."""
    with _ENGINES_LOCK:
        gone = [key for key in _ENGINES if key[0] == os.getpid() and url in (None, key[1])]
        engines = [_ENGINES.pop(key) for key in gone]
    for engine in engines:
        engine.dispose()


@lru_cache(maxsize=1024)
def _q(sql: str) -> str:
    """The store's ``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` kept literal)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _glob(pattern: str) -> str:
    """A shell glob (SQLite's GLOB: ``*``, ``?``, ``[...]``, ``[^...]``) as an anchored
    POSIX regular expression for PostgreSQL's ``~``."""
    out, i = ["^"], 0
    while i < len(pattern):
        c = pattern[i]
        end = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("^", "]") else i + 1) if c == "[" else -1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[" and end > 0:
            body = pattern[i + 1:end]
            negate = body.startswith("^")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(c if c.isalnum() or c == "_" else "\\" + c)
        i += 1
    return "".join(out) + "$"


class _Tx:
    """One transaction on one connection (what ``atomic``'s function gets)."""

    __slots__ = ("conn",)

    def __init__(self, conn: "psycopg.Connection[Any]") -> None:
        self.conn = conn

    def execute(self, sql: str, params: Params = ()) -> int:
        return self.conn.execute(_q(sql), bindable(params)).rowcount

    def executemany(self, sql: str, rows: Iterable[Params]) -> int:
        """An ``INSERT ... VALUES (?, ...)`` of many rows as one statement (one round trip,
        and no pipeline whose aborted state psycopg would log when a retry mends it)."""
        data = list(rows)
        head, values, marks = sql.rpartition(" VALUES ")
        if not data:
            return 0
        if not values or not marks.startswith("(") or not head.lstrip().upper().startswith("INSERT"):
            return sum(self.execute(sql, row) for row in data)
        done = 0
        for first in range(0, len(data), 1000):
            chunk = data[first:first + 1000]
            statement = f"{head} VALUES {', '.join(marks for _ in chunk)}"
            done += self.execute(statement, [value for row in chunk for value in row])
        return done

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(_q(sql), bindable(params)).fetchall()


class PgEngine:
    kind = "postgresql"
    instr = "strpos"

    def __init__(self, url: str, retry_for: float | None, pool_size: int) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise MissingDependency("psycopg", "postgres") from None
        from .. import config

        self.url = url
        self.where = redact(url)
        self._secrets = secrets_of(url)
        self.retry_for = float(config.get("store_retry") if retry_for is None else retry_for)
        self.users = 0
        self.retries = 0  # transactions and statements run again (a team server's metrics may show it)
        self._migrated = False
        options = {k.lower() for k, _ in parse_qsl(urlsplit(url).query)}
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in options and "PGCONNECT_TIMEOUT" not in os.environ:
            self._kwargs["connect_timeout"] = CONNECT_TIMEOUT
        if "application_name" not in options and "PGAPPNAME" not in os.environ:
            self._kwargs["application_name"] = "phalanx"
        # The pool says what went wrong in its log; phalanx says it in its errors (the server
        # may still send that log somewhere): no "error connecting" lines on a CLI's stderr.
        logging.getLogger("psycopg").addHandler(logging.NullHandler())
        first = self._first_contact(psycopg)
        try:
            self._migrate(first)
        finally:
            first.close()
        self.pool = ConnectionPool(url, kwargs=self._kwargs, min_size=1, max_size=max(1, pool_size), open=True,
                                   configure=_serializable, name="phalanx-store",
                                   reconnect_timeout=max(self.retry_for, 60.0))

    def _first_contact(self, psycopg: Any) -> "psycopg.Connection[Any]":
        """A connection of its own, so that a wrong password, database or host is told in
        libpq's words at once (a pool would only time out); one restarting is waited for."""
        since = time.monotonic()
        while True:
            try:
                return psycopg.connect(self.url, **self._kwargs)  # type: ignore[no-any-return]
            except psycopg.Error as exc:
                kind = _kind(exc)
                if kind != "gone":
                    raise self._error(exc, kind) from None
                if time.monotonic() - since >= self.retry_for:
                    raise self._error(exc, kind) from None
                time.sleep(min(1.0, 0.1 + random.random() * 0.4))

    # -- running statements ------------------------------------------------------------------

    def _run(self, fn: Callable[["psycopg.Connection[Any]"], T], retry: bool = True) -> T:
        return self.atomic(fn, retry, transaction=False)

    def atomic(self, fn: Callable[[Any], T], retry: bool = True, undo: Callable[[], None] | None = None,
               committed: Callable[[Any], bool] | None = None, transaction: bool = True) -> T:
        """``fn`` in a SERIALIZABLE transaction (``transaction=False``: on a connection in
        autocommit), run again on the faults a retry mends (module docstring)."""
        import psycopg

        busy, since, checked = 0, None, False
        while True:
            ran = False
            try:
                # Once the database went away, retries connect afresh: the pool refills itself with
                # a growing backoff and would keep a database that is back unused for a while.
                source = self._direct() if since is not None else self.pool.connection(timeout=self._wait(since))
                with source as conn:
                    if since is not None:
                        self._check()  # it answers again: the pool replaces its dead connections now
                    if not transaction:
                        return fn(conn)
                    with conn.transaction():  # BEGIN ISOLATION LEVEL SERIALIZABLE (``_serializable``)
                        result = fn(_Tx(conn))
                        ran = True
                    return result
            except psycopg.Error as exc:
                kind = _kind(exc)
                if ran and kind == "gone" and committed is not None:
                    # The commit was sent and its answer lost: look whether it happened.
                    if self._run(lambda c: committed(_Tx(c))):
                        return result
                if ran and undo is not None:
                    undo()
                if retry and kind == "busy" and busy < BUSY_TRIES:
                    busy += 1
                    self.retries += 1
                    time.sleep(random.uniform(0, min(0.2, 0.002 * 2 ** min(busy, 7))))
                    continue
                if retry and kind == "gone":
                    since = since or time.monotonic()
                    if time.monotonic() - since < self.retry_for:
                        self.retries += 1
                        if not checked:  # the other idle connections died with this one: replace them
                            self._check()
                            checked = True
                        time.sleep(min(1.0, 0.05 + random.random() * 0.25))
                        continue
                if kind == "other":
                    raise
                raise self._error(exc, kind) from None

    @contextmanager
    def _direct(self) -> Iterator["psycopg.Connection[Any]"]:
        """A connection of its own, outside the pool (retries after the database went away)."""
        import psycopg

        conn = psycopg.connect(self.url, **self._kwargs)
        try:
            _serializable(conn)
            yield conn
        finally:
            conn.close()

    def _wait(self, since: float | None) -> float:
        """How long to wait for a pooled connection: what is left of the retry time."""
        left = self.retry_for - (time.monotonic() - since if since is not None else 0.0)
        return max(1.0, left)

    def _check(self) -> None:
        try:
            self.pool.check()
        except Exception:  # noqa: BLE001 - the retry that follows says what is wrong
            pass

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        query, bound = _q(sql), bindable(params)
        return self._run(lambda conn: conn.execute(query, bound).fetchall())

    def row(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        query, bound = _q(sql), bindable(params)
        return self._run(lambda conn: conn.execute(query, bound).fetchone())

    def write(self, sql: str, params: Params = ()) -> int:
        query, bound = _q(sql), bindable(params)
        return self._run(lambda conn: conn.execute(query, bound).rowcount)

    def insert_many(self, table: str, cols: Sequence[str], rows: Iterable[Params]) -> int:
        """One ``COPY``, all or nothing (kept in memory, so a retry can send it again)."""
        data = list(rows)

        def copy(tx: _Tx) -> int:
            with tx.conn.cursor() as cur:
                with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as sink:
                    for row in data:
                        sink.write_row(bindable(row))
                return cur.rowcount

        return self.atomic(copy)

    def explain(self, sql: str, params: Params = ()) -> list[str]:
        query = _q(f"EXPLAIN (COSTS OFF) {sql}")
        return [r[0] for r in self._run(lambda conn: conn.execute(query, params).fetchall())]

    def glob(self, expr: str, pattern: str) -> tuple[str, Any]:
        return f"{expr} ~ ?", _glob(pattern)

    def noindex(self, expr: str) -> str:
        return expr  # the planner weighs the index by its statistics: nothing to steer

    def day(self, expr: str) -> str:
        return f"to_char(to_timestamp({expr}), 'YYYY-MM-DD')"  # in the session's TimeZone

    def answer_within(self, seconds: float) -> None:
        self.retry_for = float(seconds)

    # -- schema ------------------------------------------------------------------------------

    def migrate(self) -> None:
        if not self._migrated:
            self._run(self._migrate)

    def _migrate(self, conn: "psycopg.Connection[Any]") -> None:
        """Run the migrations this database has not had, under an advisory lock (two
        processes opening a new database at once: one migrates, the other waits and finds it
        done). DDL is transactional here: a migration happens whole or not at all."""
        from .pgmigrations import PG_MIGRATIONS

        if self._version(conn) == len(PG_MIGRATIONS):
            self._migrated = True
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATE_LOCK])
            conn.execute("CREATE TABLE IF NOT EXISTS phalanx_schema (version BIGINT NOT NULL)")
            version = self._version(conn)
            if version is None:
                conn.execute("INSERT INTO phalanx_schema (version) VALUES (0)")
                version = 0
            if version > len(PG_MIGRATIONS):
                raise StoreError(f"the job store {self.where} has schema {version}, newer than this phalanx knows "
                                 f"({len(PG_MIGRATIONS)})", "upgrade phalanx")
            for number in range(version, len(PG_MIGRATIONS)):
                conn.execute(PG_MIGRATIONS[number].encode())  # several statements: no parameters
            conn.execute("UPDATE phalanx_schema SET version = %s", [len(PG_MIGRATIONS)])
        self._migrated = True

    @staticmethod
    def _version(conn: "psycopg.Connection[Any]") -> int | None:
        if conn.execute("SELECT to_regclass('phalanx_schema')").fetchone() == (None,):
            return None
        row = conn.execute("SELECT version FROM phalanx_schema").fetchone()
        return None if row is None else int(row[0])

    # -- errors and closing --------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _error(self, exc: Exception, kind: str) -> Exception:
        return describe(exc, kind, self.where, self.retry_for, self.scrub)

    def close(self) -> None:
        """Release this store's share of the pool; the last one closes it."""
        with _ENGINES_LOCK:
            self.users -= 1
            if self.users > 0:
                return
            _ENGINES.pop((os.getpid(), self.url), None)
        self.dispose()

    def dispose(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None and not pool.closed:
            pool.close(timeout=2.0)


def _serializable(conn: "psycopg.Connection[Any]") -> None:
    """A new pooled connection: its transactions (``atomic``) begin SERIALIZABLE; its
    autocommit statements stay READ COMMITTED (a compare-and-set re-checks, never fails)."""
    import psycopg

    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
