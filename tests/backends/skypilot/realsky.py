"""A real SkyPilot API server (skypilot 0.14.1, ``python -m sky.server.server``, started by
SkyPilot's SDK on first use as ``sky api start`` does) for the tests, in a network namespace of its own that has only loopback: nothing it
or its clients do can reach outside this machine (SkyPilot fetches its catalogues from GitHub and
checks clouds' APIs; here those fail as they would offline). Its state lives in a temporary HOME
(``~/.sky`` there), never the user's. Clients run in the same namespace (``nsenter``).

Stopped by PID: SkyPilot starts the server leading its own process group (its request workers and
multiprocessing helpers are in it); at the end any process left with the temporary HOME in its
environment (ours alone: the directory is new) is ended too, by PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PORT = 46580  # SkyPilot's default; the namespace is ours, so no other server is there
HEALTH = f"""
import sys, time, urllib.request
deadline = time.monotonic() + 280
while True:
    try:
        urllib.request.urlopen("http://127.0.0.1:{PORT}/api/health", timeout=2)
        break
    except Exception as exc:
        if time.monotonic() > deadline:
            sys.exit(f"SkyPilot's API server did not answer: {{exc}}")
        time.sleep(0.3)
"""


def usable() -> str | None:
    """Why a server cannot run here (None when it can): namespaces need root and util-linux."""
    if os.geteuid() != 0:
        return "a network namespace for SkyPilot's API server needs root"
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (util-linux, iproute2)" if missing else None


def sky_env(home: Path) -> dict[str, str]:
    """What SkyPilot's processes see: no cloud credentials of this machine's (a HOME of their own,
    no AWS_/GOOGLE_/KUBECONFIG variables), no usage reports, phalanx's home under it too."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")}
    return {**keep, "HOME": str(home), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1", "SKYPILOT_API_SERVER_LOCAL_PORT": str(PORT),
            "PHALANX_HOME": str(home / "phalanx"), "PHALANX_WARM": "0", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}


class SkyServer:
    """A network namespace with only loopback and SkyPilot's API server in it (``serve=True``:
    ``python -m sky.server.server``, the command ``sky api start`` runs), or only the namespace
    (held by a ``sleep``): the first SkyPilot call there then starts a server itself, as it does
    for a user."""

    def __init__(self, python: Path, home: Path, serve: bool = True) -> None:
        self.python, self.home, self.env = python, home, sky_env(home)
        self.netns: str | None = None  # the namespace's id, once its holder has made it (``ours``)
        home.mkdir(parents=True, exist_ok=True)
        program = f'exec "$0" -m sky.server.server --host 127.0.0.1 --port {PORT}' if serve else "exec sleep 1800"
        with open(home / "namespace.log", "w") as log:
            self.proc = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", f"ip link set lo up && {program}", str(python)],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self._await_namespace()
        if serve:
            self.wait()

    def _await_namespace(self) -> None:
        """Until the holder has made its namespace: before that, ``/proc/PID/ns/net`` is this
        machine's, and a client entered there (``run``) would look for the server in the wrong
        place until its timeout (what made these tests hang now and then)."""
        mine, deadline = _netns(Path("/proc/self")), time.monotonic() + 60
        while self.netns is None:
            theirs = _netns(Path(f"/proc/{self.proc.pid}"))
            if theirs is not None and theirs != mine:
                self.netns = theirs
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the namespace's holder did not start: {(self.home / 'namespace.log').read_text()[-2000:]}")
            else:
                time.sleep(0.01)

    def wait(self) -> None:
        """Until the server answers (generous: the machine may be loaded). Stops everything and
        raises, with the server's log, when it does not."""
        try:
            up = self.run([str(self.python), "-c", HEALTH], timeout=300)
            if up.returncode != 0:
                raise RuntimeError(f"{up.stderr.strip()}; server log:\n{self.log()[-3000:]}{(self.home / 'namespace.log').read_text()[-2000:]}")
        except BaseException:
            self.stop()
            raise

    def servers(self) -> list[int]:
        """The API servers SkyPilot started (of ours)."""
        return [pid for pid in self.ours() if b"sky.server.server" in _read(Path(f"/proc/{pid}/cmdline"))]

    def log(self) -> str:
        """SkyPilot's API server log (``~/.sky/api_server/server.log`` under the temporary HOME)."""
        path = self.home / ".sky" / "api_server" / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def run(self, argv: list[str], timeout: float = 180, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` in the server's network namespace, with the SkyPilot environment."""
        return subprocess.run(["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", *argv], env={**self.env, **(env or {})},
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        """The API server first (SIGTERM, by PID: it shuts its workers down), then its process group
        (multiprocessing helpers ignore SIGTERM), then whatever else runs with our HOME, then the
        namespace's holder."""
        for pid in self.servers():
            _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while pid in self.servers() and time.monotonic() < deadline:
                time.sleep(0.2)
            try:
                os.killpg(pid, signal.SIGKILL)  # SkyPilot starts it with start_new_session: it leads its group
            except ProcessLookupError:
                pass
        for left in self.ours():
            _signal(left, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while self.ours() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.proc.kill()
        self.proc.wait()

    def ours(self) -> list[int]:
        """Processes started with this server's HOME (ours alone: the directory is new), or living
        in its network namespace (ours alone: the test made it). The namespace catches SkyPilot's
        request workers, whose environment ``setproctitle`` overwrites (no HOME left to match)."""
        marker = f"HOME={self.home}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                if marker in _read(entry / "environ") or (self.netns is not None and _netns(entry) == self.netns):
                    found.append(int(entry.name))
        return found


def _netns(proc: Path) -> str | None:
    try:
        return os.readlink(proc / "ns" / "net")
    except OSError:  # the process has ended, or is not ours to look at
        return None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process has ended
        return b""


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
