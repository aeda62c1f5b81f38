"""Filtered, sorted listings of jobs and sweeps, and the control room's own rows: tags, metric
summaries, usage sums, deletion. The SQL of ``phalanx ps`` (with filters), the dashboard's
lists, ``rm``/``prune`` and ``usage``; the meaning of filters and columns is ``api/lists.py``'s.

Every listing pages by key (``(sort key, id)`` after the cursor, never OFFSET), so page 2,000
of 100,000 jobs costs what page 1 does. The default order (newest first) walks the
``jobs_top`` index; a sort by a metric walks ``job_metrics_<agg>`` (jobs without that metric
are not in such a listing); other sorts read the matching rows once and sort them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..core.state import JobState
from .db import Store
from .engine import Engine, Tx
from .records import COLUMNS, JobRecord, from_row
from .keys import ACTIVE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .sweeps import SweepRecord

SORTS = ("created", "name", "state", "backend", "gpu_hours", "cost")  # besides metric:NAME:AGG
SWEEP_SORTS = ("created", "name", "state", "best")
AGGS = ("last", "min", "max")
_SORT_SQL = {"created": "j.created_at", "name": "j.name", "state": "j.state", "backend": "j.backend",
             "gpu_hours": "COALESCE(j.gpu_hours, -1)", "cost": "COALESCE(j.cost, -1)"}
_SWEEP_SORT_SQL = {"created": "s.created_at", "name": "s.name", "state": "s.state", "best": "COALESCE(s.best_value, 1e308)"}


@dataclass(frozen=True)
class Filter:
    """Which rows: every term given must hold. ``name`` is a glob (``resnet*``) or an exact
    name; ``search`` a case-insensitive substring of the id, name or command; ``tags`` pairs of
    key and value (None: any value); ``since`` a time (created at or after); ``user`` who
    submitted them; ``projects`` the projects they may be in (any of them)."""

    states: tuple[str, ...] = ()
    name: str | None = None
    backend: str | None = None
    tags: tuple[tuple[str, str | None], ...] = ()
    since: float | None = None
    search: str | None = None
    sweep: str | None = None  # the trials of this sweep instead of the top-level jobs
    user: str | None = None
    projects: tuple[str, ...] | None = None  # None: any project; (): none at all


@dataclass(frozen=True)
class Sort:
    key: str = "created"  # one of SORTS, or "metric"
    descending: bool = True
    metric: str | None = None
    agg: str = "last"


@dataclass
class Listing:
    rows: list[Any]
    next: str | None
    extra: dict[str, Any] = field(default_factory=dict)


def _terms(db: Engine, f: Filter, alias: str = "j", sweeps: bool = False) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if not sweeps:
        if f.sweep is None:
            where.append(f"{alias}.sweep_id IS NULL")
        else:
            where.append(f"{alias}.sweep_id = ?")
            params.append(f.sweep)
    if f.states:
        # Active states are few rows: let the state index find them. Finished ones are most of
        # the table: walk the order's index and test each row (a unary + keeps the planner off
        # the state index, which would fetch and sort almost every row).
        few = all(s in ACTIVE for s in f.states)
        state = f"{alias}.state" if few else db.noindex(f"{alias}.state")
        where.append(f"{state} IN ({', '.join('?' for _ in f.states)})")
        params.extend(f.states)
    if f.name:
        if any(c in f.name for c in "*?["):
            term, param = db.glob(f"{alias}.name", f.name)
            where.append(term)
            params.append(param)
        else:
            where.append(f"{alias}.name = ?")
            params.append(f.name)
    if f.backend and not sweeps:
        where.append(f"{alias}.backend = ?")
        params.append(f.backend)
    for key, value in f.tags:
        if value is None:
            where.append(f"{alias}.id IN (SELECT id FROM tags WHERE key = ?)")
            params.append(key)
        else:
            where.append(f"{alias}.id IN (SELECT id FROM tags WHERE key = ? AND value = ?)")
            params.extend([key, value])
    if f.user is not None:
        where.append(f"{alias}.user_name = ?")
        params.append(f.user)
    if f.projects is not None:
        where.append(f"{alias}.project IN ({', '.join('?' for _ in f.projects)})" if f.projects else "0 = 1")
        params.extend(f.projects)
    if f.since is not None:
        where.append(f"{alias}.created_at >= ?")
        params.append(f.since)
    if f.search:
        needle = f.search.lower()
        at = db.instr
        where.append(f"({at}({alias}.id, ?) > 0 OR {at}(lower({alias}.name), ?) > 0 OR {at}(lower({alias}.command), ?) > 0)")
        params.extend([needle, needle, needle])
    return where, params


def _encode(key: Any, created: float, row_id: str) -> str:
    return json.dumps([key, created, row_id], separators=(",", ":"))


def _decode(cursor: str) -> list[Any]:
    from ..errors import UsageError

    try:
        value = json.loads(cursor)
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], str):
            return value
    except ValueError:
        pass
    raise UsageError(f"invalid page cursor '{cursor[:40]}'", "pass the cursor of the previous page (X-Next-Page)")


def page_jobs(store: Store, f: Filter, sort: Sort = Sort(), limit: int = 50, after: str | None = None) -> Listing:
    """A page of jobs matching ``f`` in ``sort`` order, and the cursor of the next page."""
    where, params = _terms(store.engine, f)
    cols = ", ".join(f"j.{c}" for c in COLUMNS)
    if sort.key == "metric":
        assert sort.metric and sort.agg in AGGS
        key_sql = f"m.{sort.agg}"
        source = "job_metrics m JOIN jobs j ON j.id = m.id"
        where = ["m.name = ?", *where]
        params = [sort.metric, *params]
        select = f"SELECT {cols}, {key_sql} FROM {source}"
    else:
        key_sql = _SORT_SQL[sort.key]
        select = f"SELECT {cols}, {key_sql} FROM jobs j"
    direction = "DESC" if sort.descending else "ASC"
    if sort.key == "created":
        order = f"j.created_at {direction}, j.id {direction}"
        if after is not None:
            _, created, row_id = _decode(after)
            where.append(f"(j.created_at, j.id) {'<' if sort.descending else '>'} (?, ?)")
            params.extend([created, row_id])
    else:
        order = f"{key_sql} {direction}, j.id {direction}"
        if after is not None:
            key, _, row_id = _decode(after)
            where.append(f"({key_sql}, j.id) {'<' if sort.descending else '>'} (?, ?)")
            params.extend([key, row_id])
    sql = f"{select} {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY {order} LIMIT ?"
    rows = store.engine.rows(sql, [*params, limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    records = [from_row(tuple(r[:-1])) for r in rows]
    nxt = _encode(rows[-1][-1], records[-1].created_at, records[-1].id) if more else None
    return Listing(records, nxt)


def count_jobs(store: Store, f: Filter) -> int:
    where, params = _terms(store.engine, f)
    sql = f"SELECT COUNT(*) FROM jobs j {'WHERE ' + ' AND '.join(where) if where else ''}"
    row = store.engine.row(sql, params)
    return int(row[0]) if row else 0


def count_by_state(store: Store) -> dict[str, int]:
    """Every job (trials too) by state: one pass over the state index, not the rows."""
    return {str(state): int(n) for state, n in store.engine.rows("SELECT state, COUNT(*) FROM jobs GROUP BY state")}


def page_sweeps(store: Store, f: Filter, sort: Sort = Sort(), limit: int = 50, after: str | None = None) -> Listing:
    """A page of sweeps matching ``f`` (states, name, tags, since, search)."""
    from .sweeps import _COLUMNS as SWEEP_COLUMNS
    from .sweeps import SweepRecord

    where, params = _terms(store.engine, f, "s", sweeps=True)
    key_sql = _SWEEP_SORT_SQL[sort.key]
    direction = "DESC" if sort.descending else "ASC"
    if after is not None:
        key, created, row_id = _decode(after)
        if sort.key == "created":
            where.append(f"(s.created_at, s.id) {'<' if sort.descending else '>'} (?, ?)")
            params.extend([created, row_id])
        else:
            where.append(f"({key_sql}, s.id) {'<' if sort.descending else '>'} (?, ?)")
            params.extend([key, row_id])
    cols = ", ".join(f"s.{c}" for c in SWEEP_COLUMNS)
    sql = (f"SELECT {cols}, {key_sql} FROM sweeps s {'WHERE ' + ' AND '.join(where) if where else ''} "
           f"ORDER BY {key_sql} {direction}, s.id {direction} LIMIT ?")
    rows = store.engine.rows(sql, [*params, limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    out = []
    for row in rows:
        data = dict(zip(SWEEP_COLUMNS, row[:-1]))
        data["state"] = JobState(data["state"])
        out.append(SweepRecord(**data))
    nxt = _encode(rows[-1][-1], out[-1].created_at, out[-1].id) if more else None
    return Listing(out, nxt)


# -- tags ------------------------------------------------------------------------------------


def set_tags(store: Store, row_id: str, tags: dict[str, str]) -> None:
    """The tags of a job or sweep (replacing any it had)."""
    rows = [(row_id, k, v) for k, v in tags.items()]

    def replace(tx: Tx) -> None:
        tx.execute("DELETE FROM tags WHERE id = ?", (row_id,))
        tx.executemany("INSERT INTO tags (id, key, value) VALUES (?, ?, ?)", rows)

    store.engine.atomic(replace)


def tags_of(store: Store, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for chunk in _chunks(ids):
        marks = ", ".join("?" for _ in chunk)
        for row_id, key, value in store.engine.rows(f"SELECT id, key, value FROM tags WHERE id IN ({marks})", chunk):
            out.setdefault(row_id, {})[key] = value
    return out


def tag_keys(store: Store, limit: int = 200) -> list[str]:
    """Distinct tag keys, by index seeks (one per key: cheap however many rows carry each)."""
    return _distinct(store, "tags", "key", limit)


# -- metric summaries ------------------------------------------------------------------------


def save_metrics(store: Store, job_id: str, summary: dict[str, dict[str, Any]]) -> None:
    """A job's metric summary (name -> last, min, max, count, step), replacing the old one."""
    rows = [(job_id, name, float(m["last"]), float(m["min"]), float(m["max"]), int(m["count"]), m.get("last_step"))
            for name, m in summary.items()]

    def replace(tx: Tx) -> None:
        tx.execute("DELETE FROM job_metrics WHERE id = ?", (job_id,))
        tx.executemany("INSERT INTO job_metrics (id, name, last, min, max, count, step) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       rows)

    store.engine.atomic(replace)


def metrics_of(store: Store, ids: Sequence[str], names: Iterable[str] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Recorded summaries: job id -> metric name -> {last, min, max, count, last_step}."""
    wanted = list(names) if names is not None else None
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for chunk in _chunks(ids):
        marks = ", ".join("?" for _ in chunk)
        sql = f"SELECT id, name, last, min, max, count, step FROM job_metrics WHERE id IN ({marks})"
        args: list[Any] = list(chunk)
        if wanted is not None:
            if not wanted:
                return {}
            sql += f" AND name IN ({', '.join('?' for _ in wanted)})"
            args.extend(wanted)
        for row_id, name, last, lo, hi, count, step in store.engine.rows(sql, args):
            out.setdefault(row_id, {})[name] = {"last": last, "min": lo, "max": hi, "count": count, "last_step": step}
    return out


def metric_names(store: Store, limit: int = 500) -> list[str]:
    """Every metric name some finished job has (index seeks, one per name)."""
    return _distinct(store, "job_metrics", "name", limit)


def has_metric(store: Store, name: str) -> bool:
    return store.engine.row("SELECT 1 FROM job_metrics WHERE name = ? LIMIT 1", (name,)) is not None


def metric_only_on_trials(store: Store, name: str, limit: int = 3) -> list[str]:
    """When no job outside a sweep has the metric ``name``: the sweeps (ids) whose trials do."""
    top = store._conn.execute("SELECT 1 FROM job_metrics m JOIN jobs j ON j.id = m.id "
                              "WHERE m.name = ? AND j.sweep_id IS NULL LIMIT 1", (name,)).fetchone()
    if top is not None:
        return []
    rows = store._conn.execute("SELECT DISTINCT j.sweep_id FROM job_metrics m JOIN jobs j ON j.id = m.id "
                               "WHERE m.name = ? AND j.sweep_id IS NOT NULL LIMIT ?", (name, limit))
    return [r[0] for r in rows]


def _distinct(store: Store, table: str, column: str, limit: int) -> list[str]:
    out: list[str] = []
    row = store.engine.row(f"SELECT {column} FROM {table} ORDER BY {column} LIMIT 1")
    while row is not None and len(out) < limit:
        out.append(row[0])
        row = store.engine.row(f"SELECT {column} FROM {table} WHERE {column} > ? ORDER BY {column} LIMIT 1", (row[0],))
    return out


# -- sweeps: trial counts and sums -----------------------------------------------------------


def trial_states(store: Store, sweep_id: str) -> dict[str, int]:
    """How many of a sweep's trials are in each state (the trial index: one sweep's rows)."""
    rows = store.engine.rows("SELECT state, COUNT(*) FROM jobs WHERE sweep_id = ? GROUP BY state", (sweep_id,))
    return {state: int(n) for state, n in rows}


def usage_sum(store: Store, sweep_id: str | None = None, name: str | None = None) -> dict[str, float | None]:
    """GPU-hours, CPU-hours and cost summed over a sweep's trials, or over every job of a name."""
    where, arg = ("sweep_id = ?", sweep_id) if sweep_id is not None else ("name = ?", name)
    row = store.engine.row(f"SELECT SUM(gpu_hours), SUM(cpu_hours), SUM(cost), COUNT(*) FROM jobs WHERE {where}", (arg,))
    assert row is not None  # an aggregate always has its one row
    return {"gpu_hours": row[0], "cpu_hours": row[1], "cost": row[2], "jobs": row[3]}


GROUPS = ("name", "backend", "sweep", "state", "day", "user", "project")
_GROUP_SQL = {"name": "COALESCE((SELECT s.name FROM sweeps s WHERE s.id = j.sweep_id), j.name)", "backend": "j.backend",
              "sweep": "COALESCE(j.sweep_id, '-')", "state": "j.state", "user": "COALESCE(j.user_name, '-')",
              "project": "j.project"}


def usage_totals(store: Store, by: str, since: float | None = None,
                 projects: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Recorded usage grouped by ``by`` (one of GROUPS; ``name`` counts a sweep's trials under
    the sweep's name), biggest GPU-hours first. One pass over the jobs (``projects``: of these)."""
    group = store.engine.day("j.created_at") if by == "day" else _GROUP_SQL[by]
    terms: list[str] = []
    params: list[Any] = []
    if since is not None:
        terms.append("j.created_at >= ?")
        params.append(since)
    if projects is not None:
        terms.append(f"j.project IN ({', '.join('?' for _ in projects)})" if projects else "0 = 1")
        params.extend(projects)
    where = f"WHERE {' AND '.join(terms)}" if terms else ""
    rows = store.engine.rows(
        f"SELECT {group} AS g, COUNT(*), SUM(j.gpu_hours), SUM(j.cpu_hours), SUM(j.cost) FROM jobs j {where} "
        "GROUP BY g ORDER BY SUM(j.gpu_hours) DESC NULLS LAST, SUM(j.cpu_hours) DESC NULLS LAST, g", params)
    return [{"group": g, "jobs": n, "gpu_hours": gpu or 0.0, "cpu_hours": cpu or 0.0, "cost": cost} for g, n, gpu, cpu, cost in rows]


# -- deletion --------------------------------------------------------------------------------


def delete_jobs(store: Store, ids: Sequence[str]) -> int:
    """Remove jobs' rows (and their tags and metric summaries). Their ids stay taken."""
    chunks = list(_chunks(sorted(ids)))  # one order for every remover: no two wait on each other in a circle

    def delete(tx: Tx) -> int:
        removed = 0
        for chunk in chunks:
            marks = ", ".join("?" for _ in chunk)
            removed += tx.execute(f"DELETE FROM jobs WHERE id IN ({marks})", chunk)
            tx.execute(f"DELETE FROM tags WHERE id IN ({marks})", chunk)
            tx.execute(f"DELETE FROM job_metrics WHERE id IN ({marks})", chunk)
        return removed

    return store.engine.atomic(delete)


def delete_sweep(store: Store, sweep_id: str) -> None:
    def delete(tx: Tx) -> None:
        tx.execute("DELETE FROM sweeps WHERE id = ?", (sweep_id,))
        tx.execute("DELETE FROM tags WHERE id = ?", (sweep_id,))

    store.engine.atomic(delete)


def old_jobs(store: Store, before: float, states: Sequence[str], limit: int = 10_000) -> list[JobRecord]:
    """Finished top-level jobs created before ``before`` (in ``states``), oldest first."""
    marks = ", ".join("?" for _ in states)
    sql = (f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE sweep_id IS NULL AND created_at < ? "
           f"AND {store.engine.noindex('state')} IN ({marks}) ORDER BY created_at, id LIMIT ?")
    return [from_row(r) for r in store.engine.rows(sql, [before, *states, limit])]


def old_sweeps(store: Store, before: float, states: Sequence[str]) -> list[Any]:
    marks = ", ".join("?" for _ in states)
    return store.sweeps._rows(f"WHERE created_at < ? AND state IN ({marks}) ORDER BY created_at", [before, *states])


def jobs_named(store: Store, name: str, trials: bool = True) -> list[JobRecord]:
    """Every job (trials included unless ``trials`` is False) with this name, newest first: the
    ones that can share its state directory."""
    return store._rows("WHERE name = ?" + ("" if trials else " AND sweep_id IS NULL") + " ORDER BY created_at DESC", [name])


def sweeps_named(store: Store, name: str) -> list[SweepRecord]:
    """Every sweep with this name, newest first."""
    return store.sweeps._rows("WHERE name = ? ORDER BY created_at DESC", [name])


def _chunks(ids: Sequence[str], size: int = 500) -> Iterable[list[str]]:
    ids = list(ids)
    for i in range(0, len(ids), size):
        yield ids[i:i + size]
