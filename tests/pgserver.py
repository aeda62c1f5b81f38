"""A private PostgreSQL for the tests and benchmarks: Debian's ``postgresql`` binaries,
``initdb`` and ``pg_ctl`` into a temporary directory, listening on a unix socket there and on a
loopback port the kernel chose; stopped (by ``pg_ctl``, then by its pid) and removed at the end.

PostgreSQL refuses to run as root: as root, every command runs as the ``postgres`` user
(``runuser``) and the directory is that user's. Logins: over the socket, ``postgres`` with no
password (``trust``: the tests' own administration); over TCP, a password (scram-sha-256) for
the role ``phx``, so what the store does with credentials is tested as a team would use it.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROLE = "phx"


def bindir() -> Path | None:
    """The newest PostgreSQL's binaries (Debian keeps each major version apart), or PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(re.sub(r"\D", "", p) or 0))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def unavailable() -> str | None:
    """Why no private server can run here, or the store cannot talk to one (None: it can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed: pip install -e '.[postgres]'"
    if bindir() is None:
        return "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' user to run PostgreSQL as (it refuses root)"
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as the 'postgres' user"
    return None


def need_pg(server: "PgServer | str") -> "PgServer":
    """The session's server (conftest's ``pg_server``), or skip saying why there is none (fail
    instead where CI says it must run: ``PHALANX_REQUIRE_PG=1``)."""
    import pytest

    if isinstance(server, str):
        if os.environ.get("PHALANX_REQUIRE_PG") == "1":
            pytest.fail(server)
        pytest.skip(server)
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self, settings: dict[str, str] | None = None) -> None:
        bins = bindir()
        assert bins is not None, unavailable()
        self.bin = bins
        self.dir = Path(tempfile.mkdtemp(prefix="phx-pg-"))  # short: a socket path has ~100 bytes
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.password = secrets.token_urlsafe(12)
        self.settings = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                         "max_connections": "300", "shared_buffers": "64MB", **(settings or {})}
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.dir, 0o700)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        self.port = 0
        for _ in range(5):  # a port another process took between the choice and the start: another
            self.port = _free_port()
            if self._start():
                break
        else:
            raise RuntimeError(f"PostgreSQL did not start:\n{self.log.read_text()[-3000:]}")
        self.admin(f"CREATE ROLE {ROLE} LOGIN SUPERUSER PASSWORD '{self.password}'")

    # -- processes ---------------------------------------------------------------------------

    def _argv(self, tool: str, *args: str) -> list[str]:
        argv = [str(self.bin / tool), *args]
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

    def _run(self, tool: str, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(self._argv(tool, *args), capture_output=True, text=True, env=self._env(),
                              cwd=self.dir, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
        return proc.stdout

    def _start(self) -> bool:
        options = " ".join([f"-k {self.dir}", f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                            *(f"-c {k}={v}" for k, v in self.settings.items())])
        try:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "120", "start")
            return True
        except RuntimeError:
            return False

    def restart(self) -> None:
        """Stop (fast: every connection is cut) and start again on the same port."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        if not self._start():
            raise RuntimeError(f"PostgreSQL did not start again:\n{self.log.read_text()[-3000:]}")

    def stop_for(self, seconds: float) -> None:
        """Down for a while (the store's retries are tested against this), then up again."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        time.sleep(seconds)
        if not self._start():
            raise RuntimeError(f"PostgreSQL did not start again:\n{self.log.read_text()[-3000:]}")

    def halt(self) -> None:
        """Stop (fast: every connection is cut) until ``start_again``."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def start_again(self) -> None:
        if not self._start():
            raise RuntimeError(f"PostgreSQL did not start again:\n{self.log.read_text()[-3000:]}")

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop", timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            pid = self.pid()
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- addresses and databases -------------------------------------------------------------

    def socket_url(self, db: str = "postgres", options: str = "") -> str:
        """A URL over the unix socket, as ``postgres`` with no password."""
        extra = f"&{options}" if options else ""
        return f"postgresql://postgres@/{db}?host={self.dir}&port={self.port}{extra}"

    def tcp_url(self, db: str, password: bool = True) -> str:
        """A URL over loopback TCP as ``phx``, the password in it (or not: then from elsewhere)."""
        secret = f":{self.password}" if password else ""
        return f"postgresql://{ROLE}{secret}@127.0.0.1:{self.port}/{db}"

    def admin(self, sql: str, db: str = "postgres") -> list[tuple]:
        import psycopg

        with psycopg.connect(self.socket_url(db), autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database (collation: ICU's English where PostgreSQL has ICU, so that
        nothing of the store leans on the C locale's byte order by accident); its name."""
        name = name or f"t_{secrets.token_hex(6)}"
        try:
            self.admin(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                       "LOCALE 'C.UTF-8'")
        except Exception:  # noqa: BLE001 - no ICU: the database's own locale
            self.admin(f"CREATE DATABASE {name}")
        return name

    def create_schema(self, db: str) -> str:
        """A fresh schema in ``db`` and a URL whose connections use it (``search_path``):
        a new, empty store in milliseconds."""
        name = f"s_{secrets.token_hex(6)}"
        self.admin(f"CREATE SCHEMA {name}", db)
        return self.socket_url(db, f"options=-c%20search_path%3D{name}")
