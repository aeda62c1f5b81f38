"""A real team server and the people using it: ``phalanx server`` as a subprocess on loopback
(with TLS from a test CA made by openssl, or without), users added with ``phalanx server user
add``, and each person a set of real CLI processes with a config directory and a phalanx home
of their own (``Person``), logged in with ``phalanx login URL --token-stdin``.

The server's store is a real PostgreSQL (``tests/pgserver.py``: a private server per test module,
a database of its own per server, the password in ``PGPASSWORD`` as a team would keep it);
``sqlite_server`` runs one on the SQLite file in its home, as a store of one's own would be.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_left

pytest.importorskip("starlette", reason="the server needs the web extra: pip install -e '.[web]'")

OPENSSL = shutil.which("openssl")


def cli(args: list[str], env: dict[str, str], cwd: Path = ROOT, input: str | None = None,
        timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phalanx", *args], cwd=cwd, env=env, input=input, text=True,
                          capture_output=True, timeout=timeout)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_") or k in ("PHALANX_WARM_DIR", "PHALANX_WARM")}
    env["OMP_NUM_THREADS"] = "1"
    return env


@dataclass
class Server:
    root: Path
    home: Path
    env: dict[str, str]
    store: str | None = None  # --store (a PostgreSQL URL), or None: the SQLite file in the home
    url: str = ""
    proc: subprocess.Popen | None = None
    log: Path | None = None
    ca: Path | None = None
    args: list[str] = field(default_factory=list)

    def start(self, *args: str, expect_fail: bool = False, timeout: float = 60) -> subprocess.Popen:
        self.args = list(args)
        self.log = self.root / "server.err"
        err = open(self.log, "w")
        # a session of its own: a test may kill the server's whole process group (kill -9)
        self.proc = subprocess.Popen([sys.executable, "-m", "phalanx", "server", *self._store(), "--port", "0", *args], env=self.env,
                                     cwd=self.root, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        if expect_fail:
            self.proc.wait(timeout=timeout)
            return self.proc
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("phalanx server: "):
                    self.url = line.split()[2].rstrip("/")
                    return self.proc
                if not line and self.proc.poll() is not None:
                    break
            if self.proc.poll() is not None:
                break
        raise AssertionError(f"phalanx server did not start: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _store(self) -> list[str]:
        return ["--store", self.store] if self.store else []

    def admin(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``phalanx server --store URL ...`` against the server's store (no server needed)."""
        return cli(["server", *self._store(), *args], self.env, cwd=self.root, input=input)

    def add_user(self, name: str, admin: bool = False) -> str:
        done = self.admin("user", "add", name, *(["--admin"] if admin else []))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


@dataclass
class Person:
    """Someone at their own laptop: a config directory (the login), a phalanx home of their own
    (which must stay empty while they use the server), a project directory."""

    name: str
    root: Path
    token: str = ""
    ca: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        env = base_env()
        env["XDG_CONFIG_HOME"] = str(self.root / "config")
        env["PHALANX_HOME"] = str(self.root / "home")
        env["HOME"] = str(self.root)
        return env

    def login(self, url: str, token: str | None = None, ca: Path | None = None) -> subprocess.CompletedProcess[str]:
        args = ["login", url, "--token-stdin", *(["--ca-cert", str(ca)] if ca else [])]
        return cli(args, self.env, cwd=self.root, input=(token if token is not None else self.token) + "\n")

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 240, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        return cli(list(args), {**self.env, **(env or {})}, cwd=cwd or self.root, timeout=timeout, input=input)


def make_ca(where: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A test CA and a server certificate it signed for ``host`` (openssl): (ca, cert, key)."""
    where.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (where / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = where / "san.cnf"
    ext.write_text(f"subjectAltName=IP:{host},DNS:localhost\nbasicConstraints=CA:FALSE\n")

    def openssl(*args: str) -> None:
        done = subprocess.run([OPENSSL or "openssl", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
            "-subj", "/CN=phalanx test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={host}")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out", str(cert),
            "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def new_server(root: Path, pg: object | None = None) -> Server:
    """A server's place: its home (job directories), and its store: a new database of ``pg``
    (reached over loopback TCP, the password in PGPASSWORD) or, without, the home's SQLite file."""
    home = root / "server-home"
    env = base_env()
    env["PHALANX_HOME"] = str(home)
    env["HOME"] = str(root)
    store = None
    if pg is not None:
        store = pg.tcp_url(pg.create_database(), password=False)  # type: ignore[attr-defined]
        env["PGPASSWORD"] = pg.password  # type: ignore[attr-defined]
    return Server(root, home, env, store)


@pytest.fixture(scope="module")
def postgres():
    """A private PostgreSQL for a module's servers (skipped where it cannot run, saying why;
    failed instead where CI says it must: PHALANX_REQUIRE_PG=1)."""
    from tests import pgserver

    why = pgserver.unavailable()
    if why is not None:
        pgserver.need_pg(why)
    pg = pgserver.PgServer()
    try:
        yield pg
    finally:
        from phalanx.store import postgres as engine

        engine.dispose_all()
        pg.stop()


@pytest.fixture
def server(tmp_path, postgres):
    """A server on loopback, plain HTTP, on a database of its own of a real PostgreSQL."""
    srv = new_server(tmp_path / "srv", postgres)
    srv.root.mkdir()
    yield srv
    srv.stop()
    _end_jobs(srv)


@pytest.fixture
def sqlite_server(tmp_path):
    """A server on loopback whose store is the SQLite file in its home (no --store)."""
    srv = new_server(tmp_path / "srv")
    srv.root.mkdir()
    yield srv
    srv.stop()
    _end_jobs(srv)


@pytest.fixture(scope="module")
def team(tmp_path_factory, postgres):
    """One server for a module's tests (on PostgreSQL), with alice (admin) and bob logged in, each
    a person with a project of their own."""
    root = tmp_path_factory.mktemp("team")
    srv = new_server(root / "srv", postgres)
    srv.root.mkdir()
    alice, bob = Person("alice", root / "alice"), Person("bob", root / "bob")
    alice.token, bob.token = srv.add_user("alice", admin=True), srv.add_user("bob")
    srv.start()
    try:
        for person in (alice, bob):
            person.root.mkdir()
            done = person.login(srv.url)
            assert done.returncode == 0, done.stderr
        yield srv, alice, bob
    finally:
        srv.stop()
        _end_jobs(srv)


def _end_jobs(srv: Server) -> None:
    """Jobs still running on the server's home once a test is over are stopped (their
    supervisors live on after the server, as they should)."""
    left = wait_left(str(srv.home), timeout=5)
    for line in left:
        pid = int(line.split(":", 1)[0])
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
