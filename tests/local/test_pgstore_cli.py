"""A real run on a PostgreSQL store: ``PHALANX_STORE=postgresql://...`` and then the commands
a user types (real CLI processes, a detached supervisor), against the private PostgreSQL of
tests/pgserver.py. Nothing is written to a SQLite file, and the password in the URL appears in
no output, no file of the home and no row of the database."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, phalanx

pytestmark = pytest.mark.local


@pytest.fixture
def pg_home(phx_home, pg):
    db = pg.create_database()
    return phx_home, pg, db, {"PHALANX_STORE": pg.tcp_url(db), "PHALANX_WARM": "0"}


def _everything_under(root: Path) -> bytes:
    out = b""
    for path in root.rglob("*"):
        if path.is_file():
            out += path.read_bytes()
    return out


def test_run_ps_status_logs_rm_on_postgres(pg_home):
    home, pg, db, env = pg_home
    said: list[subprocess.CompletedProcess[str]] = []

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = phalanx(*args, env=env, check=check)
        said.append(proc)
        return proc

    run = cli("run", "--name", "hello-pg", str(EXAMPLES / "hello.py"))
    assert "hello from rank 0 of 1" in run.stdout + run.stderr
    jobs = json.loads(cli("ps", "--all", "--json").stdout)
    assert [(j["name"], j["state"]) for j in jobs] == [("hello-pg", "SUCCEEDED")]
    first = jobs[0]
    assert first["user_name"] and first["project"] == "default"
    mine = json.loads(cli("ps", "--mine", "--json").stdout)
    assert [j["id"] for j in mine] == [first["id"]]
    assert json.loads(cli("ps", "--user", "nobody-else", "--json").stdout) == []

    detached = cli("run", "-d", "--name", "hello-pg-d", str(EXAMPLES / "hello.py"))
    second = json.loads(cli("ps", "--all", "--json").stdout)[0]["id"]
    assert second in detached.stdout + detached.stderr
    cli("wait", second)
    status = json.loads(cli("status", second[:6], "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["name"] == "hello-pg-d"
    assert "hello from rank 0 of 1" in cli("logs", second).stdout
    assert "hello-pg" in cli("status", "hello-pg").stdout

    cli("rm", first["id"])
    assert [j["id"] for j in json.loads(cli("ps", "--all", "--json").stdout)] == [second]
    assert not (home / "jobs" / first["id"]).exists()
    assert not (home / "phalanx.db").exists(), "the store is PostgreSQL: no SQLite file in the home"
    rows = pg.admin("SELECT id, name, state, user_name FROM jobs", db)
    assert [(r[0], r[2]) for r in rows] == [(second, "SUCCEEDED")]

    # The password was in PHALANX_STORE all along: in no output, file or row.
    dump = subprocess.run([str(pg.bin / "pg_dump"), "-h", str(pg.dir), "-p", str(pg.port), "-U", "postgres", db],
                          capture_output=True, text=True, check=True, env={**os.environ, "PGPASSWORD": ""}).stdout
    assert "hello-pg-d" in dump
    text = "".join(p.stdout + p.stderr for p in said)
    assert pg.password not in text and pg.password not in dump
    assert pg.password.encode() not in _everything_under(home)


def test_a_wrong_password_is_one_line_naming_host_and_database(pg_home):
    home, pg, db, env = pg_home
    wrong = {**env, "PHALANX_STORE": pg.tcp_url(db).replace(pg.password, "not-the-Password-42")}
    proc = phalanx("ps", env=wrong)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"phx@127.0.0.1:{pg.port}/{db}" in lines[0] and "refused the login" in lines[0]
    assert "not-the-Password-42" not in proc.stdout + proc.stderr
    down = {**env, "PHALANX_STORE": f"postgresql://phx:not-the-Password-42@127.0.0.1:1/{db}",
            "PHALANX_STORE_RETRY": "0.5"}
    proc = phalanx("run", str(EXAMPLES / "hello.py"), env=down)
    assert proc.returncode == 1 and "cannot reach the job store" in proc.stderr, proc.stderr
    assert f"127.0.0.1:1/{db}" in proc.stderr and "not-the-Password-42" not in proc.stdout + proc.stderr
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir()), "nothing half-created"
