"""A real SkyPilot API server (skypilot 0.14.1, ``python -m sky.server.server``, what ``sky api
start`` runs) for the tests, in a network namespace of its own that has only loopback: nothing it
or its clients do can reach outside this machine (SkyPilot fetches its catalogues from GitHub and
checks clouds' APIs; here those fail as they would offline). Its state lives in a temporary HOME
(``~/.sky`` there), never the user's. Clients run in the same namespace (``nsenter``).

Started and stopped by PID: the server leads its own process group (its request workers and
multiprocessing helpers are in it); at the end any process left with the temporary HOME in its
environment is ended too, by PID.
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
deadline = time.monotonic() + 120
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
    def __init__(self, python: Path, home: Path) -> None:
        self.python, self.home, self.env = python, home, sky_env(home)
        self.log_path = home / "api-server.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--net", "--", "sh", "-c", f'ip link set lo up && exec "$0" -m sky.server.server --host 127.0.0.1 --port {PORT}',
                 str(python)], env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            up = self.run([str(python), "-c", HEALTH], timeout=150)
            if up.returncode != 0 or self.proc.poll() is not None:
                raise RuntimeError(f"{up.stderr.strip()}; server log:\n{self.log()[-3000:]}")
        except BaseException:
            self.stop()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def run(self, argv: list[str], timeout: float = 180, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` in the server's network namespace, with the SkyPilot environment."""
        return subprocess.run(["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", *argv], env={**self.env, **(env or {})},
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        pid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)  # its workers and multiprocessing helpers (they ignore SIGTERM)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for left in self.ours():
            try:
                os.kill(left, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while self.ours() and time.monotonic() < deadline:
            time.sleep(0.1)

    def ours(self) -> list[int]:
        """Processes started with this server's HOME (ours alone: the directory is new)."""
        marker = f"HOME={self.home}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if marker in (entry / "environ").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found
