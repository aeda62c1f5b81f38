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
