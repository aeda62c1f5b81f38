import sqlite3
import time

import pytest

from phalanx.core.state import JobState, is_terminal
from phalanx.errors import JobNotFound, StoreError
from phalanx.store import Store
from phalanx.store.engine import StoreConflict
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


def test_transition_is_compare_and_set(store_at):
    store = Store(store_at)
    _insert(store, "a1")
    assert store.transition("a1", JobState.RUNNING)
    assert store.get("a1").started_at is not None
    assert store.transition("a1", JobState.SUCCEEDED, exit_code=0)
    # terminal states never change again
    assert not store.transition("a1", JobState.CANCELLED)
    assert not store.transition("a1", JobState.RUNNING)
    rec = store.get("a1")
    assert rec.state is JobState.SUCCEEDED and is_terminal(rec.state) and rec.ended_at is not None


def test_find_by_id_prefix_and_name(store_at):
    store = Store(store_at)
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


def test_list_active_and_limit(store_at):
    store = Store(store_at)
    for i in range(5):
        _insert(store, f"j{i}", created=float(i), state="SUCCEEDED" if i % 2 else "RUNNING")
    assert [r.id for r in store.list(active_only=True)] == ["j4", "j2", "j0"]
    assert [r.id for r in store.list(limit=2)] == ["j4", "j3"]
    assert store.count() == 5


def test_new_ids_are_checked_against_every_id_ever_handed_out(store_at, monkeypatch):
    import phalanx.store.db as db

    store = Store(store_at)
    _insert(store, "0badc0de")
    store.sweeps.insert(id="5eed5eed", name="s", strategy="grid", command="t.py", topology="1x1", spec_json="{}",
                        settings_json="{}", sweep_dir="/tmp/s")
    reserved = store.new_id()
    draws = iter(["0badc0de", "5eed5eed", reserved, "f00df00d"])
    monkeypatch.setattr(db.secrets, "token_hex", lambda n: next(draws))
    assert store.new_id() == "f00df00d", "a job's, a sweep's and a reserved id are all drawn again"
    monkeypatch.undo()
    ids = {store.new_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) == 8 and int(i, 16) >= 0 for i in ids)
    _insert(store, reserved)  # the id it was handed is the job's to use


def test_new_ids_from_concurrent_processes_never_collide(store_at):
    """Two processes drawing from a tiny id space at once: every id is handed out once."""
    import subprocess
    import sys

    Store(store_at).close()
    program = (
        "import sys, secrets; from pathlib import Path; from phalanx.store import Store; import phalanx.store.db as db\n"
        "db.secrets.token_hex = lambda n: '%08x' % secrets.randbelow(300)\n"
        "s = Store(sys.argv[1]); print(' '.join(s.new_id() for _ in range(100)))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", program, str(store_at)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    got = [i for p in procs for i in p.communicate(timeout=120)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert len(got) == 200 and len(set(got)) == 200


def test_an_existing_store_migrates_and_keeps_its_jobs(tmp_path, monkeypatch):
    import phalanx.store.db as db

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for number in range(3):  # a store as phalanx left it before migration 4
        conn.executescript(MIGRATIONS[number])
    conn.execute("PRAGMA user_version = 3")
    conn.execute("INSERT INTO jobs (id, name, state, backend, nnodes, nproc_per_node, command, job_dir, spec_json, created_at)"
                 " VALUES ('3f2a0001', 'old', 'SUCCEEDED', 'local', 1, 1, 't.py', '/tmp/x', '{}', 1.0)")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.find("3f2a").name == "old" and store.find("3F2A").id == "3f2a0001"
    draws = iter(["3f2a0001", "00000001"])
    monkeypatch.setattr(db.secrets, "token_hex", lambda n: next(draws))
    assert store.new_id() == "00000001", "the ids of jobs from before the migration are taken"
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_pages_cover_every_job_once_newest_first(store_at):
    from phalanx.errors import UsageError

    store = Store(store_at)
    # created_at ties (same second) must neither repeat nor drop a job across page edges
    store.insert_jobs(dict(id=f"j{i:03d}", name="n", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                           job_dir="/tmp/x", spec_json="{}", created_at=float(i // 3), state="SUCCEEDED")
                      for i in range(100))
    seen, after = [], None
    while True:
        page = store.page(7, after)
        seen += [r.id for r in page.records]
        if page.next is None:
            break
        after = page.next
    expected = [r.id for r in sorted(store.list(), key=lambda r: (r.created_at, r.id), reverse=True)]
    assert seen == expected and len(set(seen)) == 100
    assert [r.id for r in store.iter(limit=12)] == expected[:12]
    assert store.list() == list(store.iter())
    with pytest.raises(UsageError, match="cursor"):
        store.page(5, after="junk")


def test_latest_by_name_and_state(store_at):
    store = Store(store_at)
    _insert(store, "a1", name="r", created=1.0, state="SUCCEEDED")
    _insert(store, "a2", name="r", created=2.0, state="FAILED")
    store.insert_job(id="t1", name="r", backend="local", nnodes=1, nproc_per_node=1, command="t.py", job_dir="/tmp/x",
                     spec_json="{}", created_at=3.0, state="SUCCEEDED", sweep_id="s", trial=0)
    assert store.latest("r").id == "a2"
    assert store.latest("r", JobState.SUCCEEDED).id == "a1"
    assert store.latest("r", trials=True).id == "t1"
    assert store.latest("nope") is None


def test_bulk_insert_is_all_or_nothing(store_at):
    store = Store(store_at)
    _insert(store, "dup")
    rows = [dict(id=i, name="n", backend="local", nnodes=1, nproc_per_node=1, command="t.py", job_dir="/x",
                 spec_json="{}", created_at=1.0, state="SUCCEEDED") for i in ("new1", "dup")]
    with pytest.raises(StoreConflict):
        store.insert_jobs(rows)
    assert store.count() == 1


def test_json_listing_streams_the_same_text_as_one_dump():
    import io

    from phalanx.cli.render import dump_json, dump_json_stream

    class Odd:
        def __str__(self) -> str:
            return "odd"

    items = [{"a": 1, "b": {"y": [1, 2], "x": None}, "c": "line\nbreak é \u2603", "d": 1.5}, {"z": {}}, {"k": []},
             {"t": True, "f": False, "n": float("nan"), "i": float("-inf"), "big": 10**30, "o": Odd(), "l": [{"x": 1}]},
             [1, {"a": 2}], "text", 3, {}, {1: "int key"}]
    for case in (items, items[:1], [], [items[3]] * 3):
        one, streamed = io.StringIO(), io.StringIO()
        dump_json(case, one)
        dump_json_stream(iter(case), streamed)
        assert streamed.getvalue() == one.getvalue()


def test_job_ids_skip_directories_a_moved_store_left(tmp_path, monkeypatch):
    import phalanx.store.db as db
    from phalanx.api import query
    from phalanx.supervise.submit import new_job_id

    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "jobs" / "0000aaaa").mkdir(parents=True)  # the store was moved aside, its jobs stayed
    (tmp_path / "home" / "sweeps" / "0000bbbb").mkdir(parents=True)
    draws = iter(["0000aaaa", "0000bbbb", "0000cccc"])
    monkeypatch.setattr(db.secrets, "token_hex", lambda n: next(draws))
    assert new_job_id(query.home()) == "0000cccc"


def test_a_store_from_before_the_control_room_upgrades_in_place(tmp_path):
    """A store phalanx left at schema 4 (main before issue 16: jobs, sweeps and their trials)
    gains migration 5 (tags, metric summaries, usage columns) when opened, keeping every row;
    the listings of ps and the dashboard then work on the old jobs."""
    from phalanx.store.listing import Filter, Sort, metrics_of, page_jobs, save_metrics, set_tags, tags_of

    path = tmp_path / "v4.db"
    conn = sqlite3.connect(path)
    for number in range(4):
        conn.executescript(MIGRATIONS[number])
    conn.execute("PRAGMA user_version = 4")
    columns = "id, name, state, backend, nnodes, nproc_per_node, command, job_dir, spec_json, created_at"
    conn.execute(f"INSERT INTO jobs ({columns}) VALUES ('aa000001', 'old', 'SUCCEEDED', 'local', 1, 2, 't.py', '/tmp/a', '{{}}', 1.0)")
    conn.execute("INSERT INTO sweeps (id, name, state, strategy, command, topology, spec_json, settings_json, sweep_dir, created_at)"
                 " VALUES ('bb000001', 'sw', 'SUCCEEDED', 'grid', 't.py', '1x1', '{}', '{}', '/tmp/s', 2.0)")
    conn.execute(f"INSERT INTO jobs ({columns}, sweep_id, trial, params_json) VALUES "
                 "('cc000001', 'sw', 'SUCCEEDED', 'local', 1, 1, 't.py', '/tmp/c', '{}', 3.0, 'bb000001', 0, '{\"lr\": 0.1}')")
    conn.commit()
    conn.close()

    store = Store(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 11
    old = store.get("aa000001")
    assert (old.name, old.state, old.nproc_per_node) == ("old", JobState.SUCCEEDED, 2)
    assert (old.gpu_hours, old.cpu_hours, old.cost) == (None, None, None), "usage of old jobs is unknown, not zero"
    assert [t.id for t in store.trials("bb000001")] == ["cc000001"]
    assert store.sweeps.get("bb000001").name == "sw"
    listed = page_jobs(store, Filter(), Sort(), 10)
    assert [r.id for r in listed.rows] == ["aa000001"], "trials stay under their sweep"
    set_tags(store, "aa000001", {"team": "vision"})
    save_metrics(store, "aa000001", {"loss": {"last": 0.5, "min": 0.25, "max": 1.0, "count": 3, "step": 2}})
    assert tags_of(store, ["aa000001"]) == {"aa000001": {"team": "vision"}}
    assert metrics_of(store, ["aa000001"])["aa000001"]["loss"]["min"] == 0.25
    assert [r.id for r in page_jobs(store, Filter(tags=(("team", "vision"),)), Sort(), 10).rows] == ["aa000001"]
    Store(path)  # opening again migrates nothing
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
