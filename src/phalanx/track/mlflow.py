"""MLflow: one run per job (a sweep: a parent run, one nested run per trial), spoken to through
MLflow's REST API (``/api/2.0/mlflow/...``) with the standard library when the tracking URI is
http(s), so the exporter needs no MLflow package; any other URI (a directory, ``sqlite:``,
``databricks``) goes through the ``mlflow`` package's own client (``phalanx[mlflow]``).

Settings as MLflow reads them: ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` or
``MLFLOW_EXPERIMENT_ID`` (else the Default experiment), ``MLFLOW_TRACKING_TOKEN`` or
``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` (from the environment only), ``MLFLOW_TRACKING_INSECURE_TLS``.

A repeated point is stored once: MLflow keys a metric by (key, timestamp, step, value), and a point
sent again carries the same four (its time is when phalanx read it, kept in ``metrics.bin``).
"""

from __future__ import annotations

import base64
import fcntl
import http.client
import json
import os
import re
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any, Sequence

from ..core.paths import read_json, write_json
from ..errors import TrackerRefused, TrackerUnavailable
from .base import Ending, Point, RunInfo
from .conventions import TrackState, is_http

MAX_METRICS = 1000  # per log-batch request (MLflow's limit)
MAX_PARAMS = 100
MAX_TAGS = 100
PARAM_LONGEST = 6000
TAG_LONGEST = 5000
TIMEOUT = 30.0
_BAD_KEY = re.compile(r"[^\w\-. /]")
# The job's final state -> the run's status.
STATUS = {"SUCCEEDED": "FINISHED", "CANCELLED": "KILLED", "PRUNED": "KILLED"}


def clean_key(name: str) -> str:
    """A name MLflow accepts (letters, digits, ``_-. /``; at most 250 characters)."""
    return _BAD_KEY.sub("_", name)[:250] or "_"


class Rest:
    """The REST API over one kept-alive connection. Every failure is ``TrackerUnavailable``
    (retry later) or ``TrackerRefused`` (a 4xx MLflow explains: the request is wrong)."""

    def __init__(self, uri: str, timeout: float = TIMEOUT) -> None:
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.uri)
        self.https = parts.scheme == "https"
        self.host = parts.netloc.rpartition("@")[2]
        self.prefix = parts.path
        self.headers = {"Content-Type": "application/json"}
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif user and password:
            basic = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {basic}"
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                context = ssl.create_default_context()
                if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                self._conn = http.client.HTTPSConnection(self.host, timeout=self.timeout, context=context)
            else:
                self._conn = http.client.HTTPConnection(self.host, timeout=self.timeout)
        return self._conn

    def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
             raw: bytes | None = None) -> dict[str, Any]:
        url = self.prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = self.headers if raw is None else {**self.headers, "Content-Type": "application/octet-stream"}
        for fresh in (self._conn is None, True):
            try:
                conn = self._connection()
                conn.request(method, url, body=data, headers=headers)
                response = conn.getresponse()
                text = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()  # the next try opens a new connection
                if fresh:  # a kept-alive connection the server had closed gets one more try
                    raise TrackerUnavailable(f"MLflow at {self.uri} did not answer: {exc or type(exc).__name__}") from None
        if response.status >= 400:
            try:
                err = json.loads(text)
            except ValueError:
                err = {}
            code = err.get("error_code") or f"HTTP {response.status}"
            message = f"MLflow answered {code}: {str(err.get('message') or text[:200])[:300]}"
            if response.status in (400, 404, 409, 413, 422) or code in ("INVALID_PARAMETER_VALUE",
                                                                         "RESOURCE_DOES_NOT_EXIST",
                                                                         "RESOURCE_ALREADY_EXISTS"):
                raise TrackerRefused(message, code)
            raise TrackerUnavailable(message)  # 5xx, 429, 401/403: may pass; keep the points
        return json.loads(text) if text.strip() else {}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _tags(pairs: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": clean_key(k), "value": str(v)[:TAG_LONGEST]} for k, v in pairs.items()]


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class MlflowExporter:
    kind = "mlflow"

    def __init__(self, timeout: float = TIMEOUT) -> None:
        self.timeout = timeout  # seconds per request (the job's start creates the run with less)
        self.api: Any = None
        self.uri = ""
        self.run_id = ""
        self.state: TrackState | None = None

    # -- the run ---------------------------------------------------------------------------

    def open(self, run: RunInfo, state: TrackState) -> None:
        self.uri = run.config.get("MLFLOW_TRACKING_URI", "")
        self.state = state
        if self.api is None:
            if is_http(self.uri):
                self.api = Rest(self.uri, self.timeout)
            else:
                from .mlflow_client import ClientApi

                self.api = ClientApi(self.uri, run.workdir)
        if state.run_id:
            self._continue(state)
        else:
            experiment = self._experiment(run.config)
            parent = self._parent(run, experiment) if run.parent is not None else ""
            tags = {"mlflow.runName": run.name, "mlflow.user": run.tags.get("phalanx.user", ""),
                    "mlflow.source.type": "JOB", "mlflow.source.name": run.script, **run.tags}
            if run.git_commit:
                tags["mlflow.source.git.commit"] = run.git_commit
            if parent:
                tags["mlflow.parentRunId"] = parent
            created = self.api.call("POST", "/api/2.0/mlflow/runs/create", {
                "experiment_id": experiment, "run_name": run.name, "start_time": int(run.started * 1000),
                "tags": _tags({k: v for k, v in tags.items() if v})})
            info = created["run"]["info"]
            state.run_id = info["run_id"]
            state.extra = {"experiment_id": experiment, "artifact_uri": info.get("artifact_uri", ""), "parent": parent}
            state.url = self._url(experiment, state.run_id)
        self.run_id = state.run_id

    def params(self, run: RunInfo) -> None:
        self._log_params(run.params)

    def _continue(self, state: TrackState) -> None:
        """A later attempt or a restarted exporter: the same run, RUNNING again."""
        self.api.call("POST", "/api/2.0/mlflow/runs/update", {"run_id": state.run_id, "status": "RUNNING"})

    def _experiment(self, config: dict[str, str]) -> str:
        if config.get("MLFLOW_EXPERIMENT_ID"):
            return config["MLFLOW_EXPERIMENT_ID"]
        name = config.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return "0"  # MLflow's Default experiment
        try:
            found = self.api.call("GET", "/api/2.0/mlflow/experiments/get-by-name", query={"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except TrackerRefused:
            pass
        try:
            return str(self.api.call("POST", "/api/2.0/mlflow/experiments/create", {"name": name})["experiment_id"])
        except TrackerRefused:  # created meanwhile by another job
            found = self.api.call("GET", "/api/2.0/mlflow/experiments/get-by-name", query={"experiment_name": name})
            return str(found["experiment"]["experiment_id"])

    def _parent(self, run: RunInfo, experiment: str) -> str:
        """The sweep's run, created by the first of its trials to get here (a file lock keeps two
        trials' exporters from creating two)."""
        parent = run.parent
        assert parent is not None
        parent.state_file.parent.mkdir(parents=True, exist_ok=True)
        with open(parent.lock_file, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = read_json(parent.state_file) or {}
            if known.get("run_id"):
                return str(known["run_id"])
            created = self.api.call("POST", "/api/2.0/mlflow/runs/create", {
                "experiment_id": experiment, "run_name": parent.name, "start_time": int(time.time() * 1000),
                "tags": _tags({"mlflow.runName": parent.name, "mlflow.source.type": "JOB",
                               "phalanx.sweep_id": parent.sweep_id, "phalanx.kind": "sweep"})})
            run_id = str(created["run"]["info"]["run_id"])
            write_json(parent.state_file, {"kind": "mlflow", "run_id": run_id, "url": self._url(experiment, run_id),
                                           "extra": {"experiment_id": experiment}})
            return run_id

    def _url(self, experiment: str, run_id: str) -> str:
        if is_http(self.uri):
            return f"{self.uri.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"
        return f"{self.uri or 'mlflow'} run {run_id}"

    def _log_params(self, params: dict[str, str]) -> None:
        items = [{"key": clean_key(k), "value": str(v)[:PARAM_LONGEST]} for k, v in params.items()]
        for chunk in _chunks(items, MAX_PARAMS):
            try:
                self.api.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": self.run_id, "params": chunk})
            except TrackerRefused:
                # A param logged before with another value (MLflow's params never change): log
                # the rest one by one, keeping what MLflow already has.
                for item in chunk:
                    try:
                        self.api.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": self.run_id, "params": [item]})
                    except TrackerRefused:
                        pass

    # -- points ----------------------------------------------------------------------------

    def send(self, points: Sequence[Point]) -> int:
        for start in range(0, len(points), MAX_METRICS):
            metrics = [{"key": clean_key(p.key), "value": p.value, "timestamp": int(round(p.time * 1000)), "step": p.step}
                       for p in points[start:start + MAX_METRICS]]
            self.api.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": self.run_id, "metrics": metrics})
        return 0

    def finish(self, ending: Ending) -> None:
        tags = {"phalanx.outcome": ending.state.lower(), **ending.extra}
        if ending.exit_code is not None:
            tags["phalanx.exit_code"] = str(ending.exit_code)
        if ending.root_cause:
            tags["phalanx.root_cause"] = ending.root_cause
        for chunk in _chunks(_tags(tags), MAX_TAGS):
            self.api.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": self.run_id, "tags": chunk})
        self.api.call("POST", "/api/2.0/mlflow/runs/update", {
            "run_id": self.run_id, "status": STATUS.get(ending.state, "FAILED"), "end_time": int(ending.ended * 1000)})

    def artifacts(self, files: Sequence[tuple[Path, str]]) -> None:
        """To the run's artifact store: through the server (``mlflow-artifacts:``, MLflow's default
        for ``mlflow server``), a directory here, or the mlflow package's client for the rest."""
        assert self.state is not None
        root = str(self.state.extra.get("artifact_uri") or "")
        if root.startswith("mlflow-artifacts:") and isinstance(self.api, Rest):
            base = urllib.parse.urlsplit(root).path.strip("/")
            for path, name in files:
                target = urllib.parse.quote(f"{base}/{name}")
                self.api.call("PUT", f"/api/2.0/mlflow-artifacts/artifacts/{target}", raw=path.read_bytes())
            return
        local = root.removeprefix("file://") if root.startswith(("file://", "/")) else ""
        if local:
            import shutil

            for path, name in files:
                dest = Path(local) / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
            return
        from .mlflow_client import ClientApi

        client = self.api if isinstance(self.api, ClientApi) else ClientApi(self.uri, ".")
        client.log_artifacts(self.run_id, files)

    def close(self) -> None:
        if self.api is not None:
            self.api.close()


def parent_finish(state_file: Path, config: dict[str, str], state: str, tags: dict[str, str]) -> None:
    """Close a sweep's parent run with the sweep's outcome (its runner calls this at the end)."""
    known = read_json(state_file) or {}
    uri = config.get("MLFLOW_TRACKING_URI", "")
    if not known.get("run_id") or not is_http(uri):
        return
    api = Rest(uri)
    try:
        api.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": known["run_id"], "tags": _tags(tags)})
        api.call("POST", "/api/2.0/mlflow/runs/update", {"run_id": known["run_id"], "status": STATUS.get(state, "FAILED"),
                                                           "end_time": int(time.time() * 1000)})
    finally:
        api.close()
