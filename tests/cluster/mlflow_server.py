"""A real MLflow tracking server for the tests (the ``mlflow`` package, SQLite, loopback), and
reading back what it holds through its REST API, independently of phalanx's own client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite store and served artifacts under ``root``.
    ``stop`` and ``start`` again keep its port and data (the fault tests)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root, self.port = root, port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 240.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PHALANX_", "MLFLOW_"))}
        # Its background job runner would start a dozen more interpreters; the tests need none.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{(self.root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self.proc = None

    # -- reading back -----------------------------------------------------------------------

    def get(self, endpoint: str, **query: Any) -> dict[str, Any]:
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())

    def post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def experiment_id(self, name: str) -> str:
        return str(self.get("experiments/get-by-name", experiment_name=name)["experiment"]["experiment_id"])

    def runs(self, experiment: str) -> list[dict[str, Any]]:
        return self.post("runs/search", {"experiment_ids": [self.experiment_id(experiment)], "max_results": 1000})\
            .get("runs", [])

    def run(self, run_id: str) -> dict[str, Any]:
        return self.get("runs/get", run_id=run_id)["run"]

    def history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token = None
        while True:
            query = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if token:
                query["page_token"] = token
            page = self.get("metrics/get-history", **query)
            out += page.get("metrics", [])
            token = page.get("next_page_token")
            if not token:
                return out


def tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def params(run: dict[str, Any]) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}
