"""The two engines of the store: the same schema after every migration, PostgreSQL's own
migrations, credentials, errors that never show a password, and the faults it rides out
(the database restarting under an open store). Against a private PostgreSQL (tests/pgserver.py)."""

from __future__ import annotations

import logging
import re
import sqlite3
import time

import pytest

from phalanx.core.state import JobState
from phalanx.errors import StoreError, StoreUnavailable
from phalanx.store import Store
from phalanx.store.migrations import MIGRATIONS
from phalanx.store.pgmigrations import PG_MIGRATIONS


def _insert(store, job_id, **more):
    store.insert_job(id=job_id, name="job", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                     job_dir="/tmp/x", spec_json="{}", **more)


# -- one schema ----------------------------------------------------------------------------


def _sqlite_schema(count: int) -> dict[str, object]:
    from phalanx.store.sqlite import statements

    conn = sqlite3.connect(":memory:")
    for script in MIGRATIONS[:count]:
        for statement in statements(script):
            conn.execute(statement)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    columns = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    indexes = {}
    for name, table, sql in conn.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"):
        cols = [r[2] for r in conn.execute(f"PRAGMA index_info({name})")]
        indexes[name] = (table, cols, "WHERE" in sql.upper())
    return {"columns": columns, "indexes": indexes}


def _pg_schema(pg, count: int) -> dict[str, object]:
    import psycopg

    url = pg.create_schema(pg.db)
    schema = re.search(r"search_path%3D(\w+)", url).group(1)
    with psycopg.connect(url, autocommit=True) as conn:
        for script in PG_MIGRATIONS[:count]:
            conn.execute(script.encode())
        tables = [r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                                             "ORDER BY table_name", [schema])]
        columns = {t: [r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE "
                                                  "table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                                                  [schema, t])] for t in tables}
        indexes = {}
        for name, table, sql in conn.execute("SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = %s",
                                             [schema]):
            if name.endswith("_pkey"):
                continue
            cols = [c.strip().split()[0] for c in re.search(r"\((.*?)\)", sql).group(1).split(",")]
            indexes[name] = (table, cols, " WHERE " in sql)
    return {"columns": columns, "indexes": indexes}


def test_every_migration_makes_the_same_tables_columns_and_indexes_on_both_engines(pg):
    assert len(PG_MIGRATIONS) == len(MIGRATIONS), "add a migration to both engines, or to neither"
    for count in range(1, len(MIGRATIONS) + 1):
        assert _pg_schema(pg, count) == _sqlite_schema(count), f"after migration {count}"


# -- PostgreSQL's migrations ----------------------------------------------------------------------


def test_a_postgres_store_from_an_older_phalanx_migrates_and_keeps_its_jobs(pg, monkeypatch):
    import psycopg

    import phalanx.store.db as db

    url = pg.create_schema(pg.db)
    with psycopg.connect(url, autocommit=True) as conn:  # as phalanx left it at schema 3
        for script in PG_MIGRATIONS[:3]:
            conn.execute(script.encode())
        conn.execute("CREATE TABLE phalanx_schema (version BIGINT NOT NULL); INSERT INTO phalanx_schema VALUES (3)")
        conn.execute("INSERT INTO jobs (id, name, state, backend, nnodes, nproc_per_node, command, job_dir, spec_json, "
                     "created_at) VALUES ('3f2a0001', 'old', 'SUCCEEDED', 'local', 1, 1, 't.py', '/tmp/x', '{}', 1.0)")
    store = Store(url)
    old = store.find("3F2A")
    assert (old.id, old.name, old.user_name, old.project) == ("3f2a0001", "old", None, "default")
    draws = iter(["3f2a0001", "00000001"])
    monkeypatch.setattr(db.secrets, "token_hex", lambda n: next(draws))
    assert store.new_id() == "00000001", "the ids of jobs from before the migration are taken"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM phalanx_schema").fetchone()[0] == len(PG_MIGRATIONS)


def test_a_postgres_store_of_a_newer_phalanx_is_refused(pg):
    import psycopg

    url = pg.create_schema(pg.db)
    Store(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE phalanx_schema SET version = version + 3")
    from phalanx.store import postgres

    postgres.dispose_all(url)  # a new process's view: the engine checks the schema when it opens
    with pytest.raises(StoreError, match="upgrade phalanx"):
        Store(url)


# -- credentials, and a password in no message ---------------------------------------------------


def test_credentials_from_the_url_pgpassword_a_passfile_and_a_service(pg, tmp_path, monkeypatch):
    from phalanx.store import postgres

    db = pg.create_database()
    _insert(Store(pg.tcp_url(db)), "a0000001")  # the password in the URL
    bare = pg.tcp_url(db, password=False)
    for name in ("PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    postgres.dispose_all()
    with pytest.raises(StoreError, match="refused the login"):
        Store(bare)
    monkeypatch.setenv("PGPASSWORD", pg.password)
    assert Store(bare).get("a0000001").name == "job"
    postgres.dispose_all()
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{pg.port}:{db}:phx:{pg.password}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    assert Store(bare).get("a0000001").name == "job"
    postgres.dispose_all()
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[team]\nhost=127.0.0.1\nport={pg.port}\ndbname={db}\nuser=phx\npassword={pg.password}\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    store = Store("postgresql://?service=team")
    assert store.get("a0000001").name == "job" and store.where == "postgresql://?service=team"
    monkeypatch.setenv("PGSERVICE", "team")
    assert Store("postgresql://").get("a0000001").name == "job"
    postgres.dispose_all()


def test_a_wrong_password_or_host_is_named_without_the_password(pg, caplog, monkeypatch):
    from phalanx.store import postgres

    caplog.set_level(logging.DEBUG)
    db = pg.create_database()
    secret = "s3cret-Hunter2"
    wrong = pg.tcp_url(db).replace(pg.password, secret)
    with pytest.raises(StoreError) as refused:
        Store(wrong)
    said = str(refused.value)
    assert "refused the login" in said and f"127.0.0.1:{pg.port}/{db}" in said and "phx@" in said, said
    assert "PGPASSWORD" in said and secret not in said
    assert not isinstance(refused.value, StoreUnavailable), "a wrong password is not an outage: it is not retried"

    monkeypatch.setenv("PHALANX_STORE_RETRY", "1")
    closed = f"postgresql://phx:{secret}@127.0.0.1:1/{db}"  # nothing listens on port 1
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as unreachable:
        Store(closed)
    said = str(unreachable.value)
    assert "cannot reach the job store" in said and f"127.0.0.1:1/{db}" in said and secret not in said, said
    assert time.monotonic() - began >= 1.0, "retried for store_retry seconds first"

    with pytest.raises(StoreError, match="does not exist") as missing:
        Store(pg.tcp_url("no_such_db"))
    with pytest.raises(StoreError, match="host name") as unknown:
        Store(f"postgresql://phx:{secret}@no-such-host.invalid/{db}")
    assert pg.password not in str(missing.value) and secret not in str(unknown.value)
    assert secret not in caplog.text
    assert postgres.redact(f"postgresql://phx:{secret}@h:5/d?password={secret}&sslmode=require") == \
        "postgresql://phx@h:5/d?sslmode=require"


# -- faults: the database restarts under an open store ------------------------------------------


@pytest.fixture
def own_pg():
    """A PostgreSQL of this test's own: it is stopped and restarted under open stores."""
    from tests.pgserver import PgServer, need_pg, unavailable

    why = unavailable()
    if why:
        need_pg(why)  # skips, or fails where CI says PostgreSQL must run
    server = PgServer()
    yield server
    from phalanx.store import postgres

    postgres.dispose_all()
    server.stop()


def test_a_restarted_database_is_ridden_out_and_one_that_stays_away_is_named(own_pg, monkeypatch):
    db = own_pg.create_database()
    store = Store(own_pg.tcp_url(db), retry_for=60)
    _insert(store, "b0000001")
    own_pg.restart()  # every connection of the pool is cut
    assert store.get("b0000001").state is JobState.PENDING, "a read after the restart is answered"
    assert store.transition("b0000001", JobState.RUNNING)
    own_pg.restart()
    _insert(store, "b0000002", then=lambda: None, undo=lambda: None)
    assert {r.id for r in store.list()} == {"b0000001", "b0000002"}

    import threading

    outage = threading.Thread(target=own_pg.stop_for, args=(3.0,))
    outage.start()
    while own_pg.pid() is not None:  # down now: the next calls wait for it to come back
        time.sleep(0.05)
    assert store.transition("b0000002", JobState.RUNNING), "a write during a 3 s outage waits and is made"
    assert store.get("b0000002").state is JobState.RUNNING
    outage.join()

    store.engine.retry_for = 1.0
    own_pg._run("pg_ctl", "-D", str(own_pg.data), "-m", "fast", "-w", "stop")
    with pytest.raises(StoreUnavailable, match=f"cannot reach the job store postgresql://phx@127.0.0.1:{own_pg.port}/{db}"):
        store.count()
    assert own_pg._start()
    store.engine.retry_for = 60.0
    assert store.count() == 2, "back when the database is"


def test_help_and_ps_on_sqlite_never_import_the_postgres_driver(tmp_path):
    import subprocess
    import sys

    code = ("import sys\nfrom phalanx.cli.main import main\n"
            "for argv in (['phalanx', '--help'], ['phalanx', 'ps'], ['phalanx', 'ps', '--all', '--mine']):\n"
            "    sys.argv = argv\n"
            "    try:\n        main()\n    except SystemExit as exc:\n        assert not exc.code, (argv, exc.code)\n"
            "loaded = [m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool', 'phalanx.store.postgres')]\n"
            "assert not loaded and 'phalanx.store.postgres' not in sys.modules, loaded\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PHALANX_STORE"}
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env={**env, "PHALANX_HOME": str(tmp_path)})


def test_the_store_setting_picks_the_store_from_the_environment_or_the_config_file(tmp_path, monkeypatch):
    from phalanx.store import open_store

    home = tmp_path / "home"
    monkeypatch.setenv("PHALANX_HOME", str(home))
    monkeypatch.delenv("PHALANX_STORE", raising=False)
    assert open_store(home / "phalanx.db").where == str(home / "phalanx.db"), "unset: the home's file"
    (home / "config.yaml").write_text(f"store: {tmp_path / 'team.db'}\n")
    _insert(open_store(home / "phalanx.db"), "c0000001")
    assert Store(tmp_path / "team.db").get("c0000001").id == "c0000001"
    monkeypatch.setenv("PHALANX_STORE", f"sqlite://{tmp_path / 'env.db'}")
    assert open_store(home / "phalanx.db").where == str(tmp_path / "env.db"), "the environment beats the file"
    monkeypatch.setenv("PHALANX_STORE", "mysql://x@y/z")
    with pytest.raises(StoreError, match="unknown job store 'mysql://...'"):
        open_store(home / "phalanx.db")


def test_a_submit_whose_connection_is_cut_before_its_commit_is_made_once_with_its_directory(pg, tmp_path):
    """The job's directory moves into place inside the row's transaction (``insert_job(then=)``);
    when the connection dies before the commit, the move is undone and the whole is tried again."""
    import os

    url = pg.create_schema(pg.db)
    store = Store(url)
    staged, final = tmp_path / "staging" / "d0000001", tmp_path / "jobs" / "d0000001"
    staged.mkdir(parents=True)
    final.parent.mkdir()
    moves = []

    def then():
        os.rename(staged, final)
        moves.append(final.exists())
        if len(moves) == 1:  # cut this transaction's connection: its commit cannot be made
            cut = pg.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE state = 'idle in transaction' AND query LIKE 'INSERT INTO jobs%'", pg.db)
            assert cut == [(True,)], cut

    _insert(store, "d0000001", then=then, undo=lambda: os.rename(final, staged))
    assert moves == [True, True], "moved, moved back when the commit failed, moved again"
    assert final.is_dir() and not staged.exists()
    assert store.get("d0000001").state is JobState.PENDING and store.count() == 1
