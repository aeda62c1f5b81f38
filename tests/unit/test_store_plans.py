"""The store's hot reads go through an index: the plans SQLite picks are pinned here, so an
index that goes missing, or a query the planner can no longer serve from one, fails a test
(no timing involved). ``bench/bench_store.py`` measures what the plans buy."""

from __future__ import annotations

import sqlite3
import time
from typing import Callable

import pytest

from phalanx.core.state import JobState
from phalanx.errors import JobNotFound
from phalanx.store import Store


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "p.db")
    now = time.time()
    rows = [dict(id=f"{i:08x}", name=f"train-{i % 7}", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                 job_dir="/tmp/x", spec_json="{}", created_at=now + i, state="RUNNING" if i % 50 == 0 else "SUCCEEDED",
                 sweep_id="s1" if i % 10 == 3 else None, trial=i if i % 10 == 3 else None) for i in range(300)]
    store.insert_jobs(rows)
    store.sweeps.insert(id="5eed0001", name="sw", strategy="grid", command="t.py", topology="1x1", spec_json="{}",
                        settings_json="{}", sweep_dir="/tmp/s")
    return store


def plans(store: Store, call: Callable[[], object]) -> list[str]:
    """The plan of every SELECT that ``call`` makes through the store's connection."""
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    try:
        result = call()
        if hasattr(result, "__next__"):
            list(result)  # type: ignore[call-overload]
    except JobNotFound:
        pass  # not found, or ambiguous: the queries ran all the same
    finally:
        store._conn.set_trace_callback(None)
    selects = [sql for sql in seen if sql.lstrip().upper().startswith("SELECT")]
    assert selects, "the call made no query"
    return [" / ".join(store.explain(sql)) for sql in selects]


def only(found: list[str], index: str, sort: bool = False) -> None:
    """Every query used ``index``; none read the whole table; no sort unless allowed."""
    for plan in found:
        assert f"INDEX {index}" in plan, (index, found)
        assert not plan.startswith("SCAN jobs /") and plan != "SCAN jobs", found
        if not sort:
            assert "TEMP B-TREE" not in plan, ("sorts every row it reads", found)


def test_ps_all_reads_the_newest_rows_in_order_from_the_listing_index(store):
    only(plans(store, lambda: store.list(limit=50)), "jobs_top")
    page = store.page(10)
    only(plans(store, lambda: store.page(10, after=page.next)), "jobs_top")  # a deep page: a seek, no OFFSET
    only(plans(store, lambda: store.iter(limit=120)), "jobs_top")


def test_ps_reads_only_the_active_jobs(store):
    # The few active rows are found in the state index, then sorted: that sort is of a handful.
    only(plans(store, lambda: store.list(active_only=True)), "jobs_state", sort=True)


def test_status_by_id_prefix_and_name_are_index_seeks(store):
    only(plans(store, lambda: store.find("0000012b")), "sqlite_autoindex_jobs_1")  # exact id
    found = plans(store, lambda: store.find("0000012"))  # exact (none), then the prefix range (ambiguous)
    assert "id>? AND id<?" in found[1], found
    only(found, "sqlite_autoindex_jobs_1")
    found = plans(store, lambda: store.find("train-3"))  # exact, prefix, then name
    only(found[:2], "sqlite_autoindex_jobs_1")
    only(found[2:], "jobs_name")
    only(plans(store, lambda: store.latest("train-3", JobState.SUCCEEDED)), "jobs_name")


def test_a_sweeps_trials_come_from_the_trial_index(store):
    only(plans(store, lambda: store.trials("s1")), "jobs_trials", sort=True)  # sorts one sweep's trials


def test_sweeps_by_prefix_and_name_are_index_seeks(store):
    found = plans(store, lambda: store.sweeps.find("5eed"))
    assert all("INDEX" in p for p in found), found
    assert "id>? AND id<?" in found[1], found
    found = plans(store, lambda: store.sweeps.find("sw"))
    assert "INDEX sweeps_name" in found[-1], found
    assert all("INDEX sweeps_state" in p for p in plans(store, lambda: store.sweeps.list(active_only=True)))


def test_the_plans_hold_in_a_store_migrated_from_schema_3(tmp_path):
    from phalanx.store.migrations import MIGRATIONS

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for number in range(3):
        conn.executescript(MIGRATIONS[number])
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    store = Store(path)
    only(plans(store, lambda: store.list(limit=50)), "jobs_top")
    found = plans(store, lambda: store.find("abc"))
    only(found[:2], "sqlite_autoindex_jobs_1")
    only(found[2:], "jobs_name")


# -- PostgreSQL: the same reads, the plans its planner picks at 50,000 jobs --------------------
#
# PostgreSQL's planner weighs indexes by statistics, so the table holds enough rows (and is
# ANALYZEd) for a sequential scan to lose wherever an index can serve: the plans pinned here are
# the ones a team's store gets (bench/bench_store_pg.py measures them at a million jobs).

PG_JOBS = 50_000


@pytest.fixture(scope="module")
def pg_store(pg_server):
    from tests.pgserver import need_pg

    server = need_pg(pg_server)
    url = server.create_schema(server.db)
    store = Store(url)
    now = time.time()
    store.insert_jobs(dict(id=f"{i * 2654435761 % 2**32:08x}", name=f"train-{i % 700}", backend="local", nnodes=1,
                           nproc_per_node=1, command="t.py", job_dir="/tmp/x", spec_json="{}", created_at=now + i,
                           state="RUNNING" if i % 5000 == 0 else ("FAILED" if i % 3 == 0 else "SUCCEEDED"),
                           sweep_id=f"5eed{i // 500:04x}" if i % 10 == 3 else None, trial=i if i % 10 == 3 else None,
                           user_name="alice" if i % 1000 == 7 else f"user{i % 20}")
                      for i in range(PG_JOBS))
    cols = ("id", "name", "strategy", "command", "topology", "spec_json", "settings_json", "sweep_dir", "created_at",
            "state")
    store.engine.insert_many("sweeps", cols, [(f"5eed{i:04x}", f"sw-{i % 400}", "grid", "t.py", "1x1", "{}", "{}", "/tmp/s",
                                               now + i, "RUNNING" if i % 1000 == 0 else "SUCCEEDED") for i in range(5000)])
    store.engine.write("ANALYZE")
    yield store
    from phalanx.store import postgres

    postgres.dispose_all(url)


def pg_plans(store: Store, call: Callable[[], object]) -> list[str]:
    """PostgreSQL's plan (EXPLAIN, one line) of every read ``call`` makes through the store."""
    seen: list[tuple[str, object]] = []
    engine = store.engine
    rows, row = engine.rows, engine.row
    engine.rows = lambda sql, params=(): (seen.append((sql, params)), rows(sql, params))[1]  # type: ignore[method-assign]
    engine.row = lambda sql, params=(): (seen.append((sql, params)), row(sql, params))[1]  # type: ignore[method-assign]
    try:
        result = call()
        if hasattr(result, "__next__"):
            list(result)  # type: ignore[call-overload]
    except JobNotFound:
        pass
    finally:
        del engine.rows, engine.row
    assert seen, "the call made no query"
    return [" / ".join(line.strip() for line in engine.explain(sql, params)) for sql, params in seen]  # type: ignore[arg-type]


def pg_only(found: list[str], *indexes: str, sort: bool = False) -> None:
    """Every read went through one of ``indexes``, none read a table whole, none sorted what
    it read unless allowed (a handful of rows found by an index)."""
    for plan in found:
        assert any(f"using {index} on" in plan or f"Scan on {index}" in plan for index in indexes), (indexes, found)
        assert "Seq Scan" not in plan, found
        if not sort:
            assert "Sort" not in plan, ("sorts every row it reads", found)


def test_pg_ps_all_reads_the_newest_rows_in_order_from_the_listing_index(pg_store):
    pg_only(pg_plans(pg_store, lambda: pg_store.list(limit=50)), "jobs_top")
    page = pg_store.page(10)
    deep = pg_plans(pg_store, lambda: pg_store.page(10, after=page.next))
    pg_only(deep, "jobs_top")
    assert "Index Cond: (ROW(created_at, id) <" in deep[0], "a deep page is a seek, not an OFFSET"


def test_pg_ps_reads_only_the_active_jobs(pg_store):
    pg_only(pg_plans(pg_store, lambda: pg_store.list(active_only=True)), "jobs_state", sort=True)
    from phalanx.store.listing import Filter, count_jobs

    pg_only(pg_plans(pg_store, lambda: count_jobs(pg_store, Filter(states=("RUNNING", "PENDING")))), "jobs_state")


def test_pg_status_by_id_prefix_and_name_are_index_seeks(pg_store):
    some = pg_store.list(limit=1)[0].id
    pg_only(pg_plans(pg_store, lambda: pg_store.find(some)), "jobs_pkey")
    found = pg_plans(pg_store, lambda: pg_store.find(some[:5]))
    assert "id >=" in found[1] and "id <" in found[1], found  # the prefix as a range of the id index
    pg_only(found, "jobs_pkey")
    found = pg_plans(pg_store, lambda: pg_store.find("train-3"))
    pg_only(found[:2], "jobs_pkey")
    pg_only(found[2:], "jobs_name")
    pg_only(pg_plans(pg_store, lambda: pg_store.latest("train-3", JobState.SUCCEEDED)), "jobs_name")


def test_pg_filtered_listings_walk_an_index(pg_store):
    from phalanx.store.listing import Filter, Sort, page_jobs

    def listing(**terms: object) -> Callable[[], object]:
        return lambda: page_jobs(pg_store, Filter(**terms), Sort(), 50)  # type: ignore[arg-type]

    pg_only(pg_plans(pg_store, listing(user="alice")), "jobs_user", "jobs_top", sort=True)  # alice's 50 rows
    pg_only(pg_plans(pg_store, listing(states=("FAILED",))), "jobs_top")  # most rows: the order's index, filtered
    pg_only(pg_plans(pg_store, listing(name="train-4*")), "jobs_top")
    pg_only(pg_plans(pg_store, listing(name="train-42")), "jobs_name", "jobs_top", sort=True)  # one name's rows


def test_pg_a_sweeps_trials_and_sweeps_by_prefix_and_name(pg_store):
    pg_only(pg_plans(pg_store, lambda: pg_store.trials("5eed0003")), "jobs_trials", sort=True)
    found = pg_plans(pg_store, lambda: pg_store.sweeps.find("5eed00a"))
    assert all("sweeps_pkey" in p and "Seq Scan" not in p for p in found[:2]), found
    found = pg_plans(pg_store, lambda: pg_store.sweeps.find("sw-3"))
    assert "sweeps_name" in found[-1] and "Seq Scan" not in found[-1], found
    assert all("sweeps_state" in p for p in pg_plans(pg_store, lambda: pg_store.sweeps.list(active_only=True)))
