import sqlite3
import time

import pytest

from phalanx.core.state import JobState, is_terminal
from phalanx.errors import JobNotFound, StoreError
from phalanx.store import Store
from phalanx.store.migrations import MIGRATIONS


def _insert(store, job_id, name="job", created=None, state="PENDING"):
    store.insert_job(
        id=job_id, name=name, backend="local", nnodes=1, nproc_per_node=1, command="t.py",
        job_dir="/tmp/x", spec_json="{}", created_at=time.time() if created is None else created, state=state,
    )


def test_migrations_set_user_version_and_wal(tmp_path):
    store = Store(tmp_path / "p.db")
    conn = sqlite3.connect(tmp_path / "p.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    Store(tmp_path / "p.db").close()  # reopening does not re-run migrations


def test_newer_schema_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "p.db")
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    conn.close()
    with pytest.raises(StoreError, match="upgrade phalanx"):
        Store(tmp_path / "p.db")


def test_transition_is_compare_and_set(tmp_path):
    store = Store(tmp_path / "p.db")
    _insert(store, "a1")
    assert store.transition("a1", JobState.RUNNING)
    assert store.get("a1").started_at is not None
    assert store.transition("a1", JobState.SUCCEEDED, exit_code=0)
    # terminal states never change again
    assert not store.transition("a1", JobState.CANCELLED)
    assert not store.transition("a1", JobState.RUNNING)
    rec = store.get("a1")
    assert rec.state is JobState.SUCCEEDED and is_terminal(rec.state) and rec.ended_at is not None


def test_find_by_id_prefix_and_name(tmp_path):
    store = Store(tmp_path / "p.db")
    _insert(store, "abcd1111", name="resnet", created=1.0)
    _insert(store, "abcd2222", name="resnet", created=2.0)
    _insert(store, "ef001122", name="bert", created=3.0)
    assert store.find("ef00").id == "ef001122"
    assert store.find("resnet").id == "abcd2222"  # latest with that name
    with pytest.raises(JobNotFound, match="ambiguous"):
        store.find("abcd")
    with pytest.raises(JobNotFound, match="phalanx ps --all"):
        store.find("zzz")
    # LIKE wildcards in user input are literal
    with pytest.raises(JobNotFound):
        store.find("%")


def test_list_active_and_limit(tmp_path):
    store = Store(tmp_path / "p.db")
    for i in range(5):
        _insert(store, f"j{i}", created=float(i), state="SUCCEEDED" if i % 2 else "RUNNING")
    assert [r.id for r in store.list(active_only=True)] == ["j4", "j2", "j0"]
    assert [r.id for r in store.list(limit=2)] == ["j4", "j3"]
    assert store.count() == 5
