"""The one door to a Ray cluster's Jobs API (Ray's ``JobSubmissionClient``, imported here only).

Every call phalanx makes to a cluster goes through :class:`RayClient`: submit, status, stop, the
job's log (tailed as it grows), the Ray version and the nodes. Errors come out as phalanx errors
that say what to fix: ``UsageError`` for what the user gave (address, token), ``BackendError``
for a cluster that stopped answering.

Authentication (Ray's token mode, on by default for clusters since Ray 2.59 [docs.ray.io,
"Token authentication"]): the token goes in the ``Authorization: Bearer`` header, found as Ray's
own tools find it (``RAY_AUTH_TOKEN``, then the file ``RAY_AUTH_TOKEN_PATH``, then
``~/.ray/auth_token``), or in ``--token-file``. It is never written into the job's records.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from ...errors import BackendError, MissingDependency, UsageError

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def resolve_address(given: str | None) -> str:
    """The Jobs API address: ``--address``, else ``RAY_ADDRESS``; ``http://`` when no scheme."""
    address = (given or os.environ.get("RAY_ADDRESS") or "").strip()
    if not address:
        raise UsageError("the ray backend needs the cluster's address",
                         "give --address http://HEAD:8265 (the Ray dashboard) or set RAY_ADDRESS")
    if address.startswith("ray://"):
        raise UsageError(f"'{address}' is a Ray Client address; phalanx submits through the Jobs API",
                         "give the dashboard's address instead, e.g. --address http://HEAD:8265")
    return address if "://" in address else f"http://{address}"


def find_token(token_file: str | None) -> str | None:
    """The cluster's auth token, from where Ray's own tools look (see the module docstring)."""
    if token_file:
        path = Path(token_file).expanduser()
        if not path.is_file():
            raise UsageError(f"token file '{token_file}' not found", "check the path given to --token-file")
        return path.read_text().strip() or None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), "~/.ray/auth_token"):
        if candidate and Path(candidate).expanduser().is_file():
            return Path(candidate).expanduser().read_text().strip() or None
    return None


class RayClient:
    """A Jobs API connection to one cluster. Blocking calls, each bounded by Ray's own timeouts."""

    def __init__(self, address: str, token: str | None) -> None:
        self.address = address
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise MissingDependency("ray", "ray") from None
        from ray.exceptions import AuthenticationError

        # The SDK's INFO lines (packaging, uploads) would land among the job's output.
        for name in [n for n in logging.Logger.manager.loggerDict if n == "ray" or n.startswith("ray.")]:
            logging.getLogger(name).setLevel(logging.WARNING)
        # The code snapshot already applied .gitignore (storage/snapshot.py); Ray must not
        # drop files of it again (a non-git directory keeps what its .gitignore lists).
        os.environ.setdefault("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
        try:
            self.sdk = JobSubmissionClient(address, headers=dict(self.headers))
        except AuthenticationError as exc:
            said = str(exc).splitlines()[0] if str(exc) else "authentication failed"
            raise UsageError(f"the Ray cluster at {address} refused the token ({said})",
                             "set RAY_AUTH_TOKEN (or --token-file) to the cluster's token") from None
        except (ConnectionError, OSError, RuntimeError, ValueError) as exc:
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"the Ray cluster at {address} does not answer ({said})",
                             "check --address / RAY_ADDRESS: the Ray dashboard's http address, usually port 8265") from None

    def version(self) -> str:
        return str(self.sdk.get_version())

    def ray_version(self) -> str:
        """The cluster's Ray version (its dashboard's ``/api/version``)."""
        return str(self._get("/api/version").get("ray_version", ""))

    def nodes(self) -> list[dict[str, Any]]:
        """Alive nodes: ``{"ip", "resources": {"CPU": .., "GPU": ..}}`` each."""
        summary = self._get("/nodes?view=summary").get("data", {}).get("summary", [])
        out = []
        for node in summary:
            raylet = node.get("raylet", {})
            if raylet.get("state") == "ALIVE":
                out.append({"ip": raylet.get("nodeManagerAddress") or node.get("ip"),
                            "resources": dict(raylet.get("resourcesTotal") or {})})
        return out

    def _get(self, path: str) -> dict[str, Any]:
        req = urllib.request.Request(self.address.rstrip("/") + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise BackendError(f"the Ray cluster at {self.address} did not answer {path} ({exc})",
                               "check that the cluster is up") from None
        return data if isinstance(data, dict) else {}

    def submit(self, entrypoint: str, runtime_env: dict[str, Any], submission_id: str,
               metadata: dict[str, str]) -> str:
        try:
            return str(self.sdk.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id,
                                           metadata=metadata, entrypoint_num_cpus=0))
        except Exception as exc:  # noqa: BLE001 - the SDK raises RuntimeError for every HTTP error
            said = str(exc).strip().splitlines()
            raise BackendError(f"the Ray cluster at {self.address} did not take the job ({said[-1] if said else exc})",
                               "check the cluster's dashboard and its job logs") from None

    def status(self, submission_id: str) -> tuple[str, str]:
        """(status, message): PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED; UNKNOWN while the
        cluster does not answer, GONE when it does not know the job."""
        try:
            info = self.sdk.get_job_info(submission_id)
        except Exception as exc:  # noqa: BLE001 - HTTP errors are RuntimeErrors here
            return ("GONE", str(exc)) if "does not exist" in str(exc) or "404" in str(exc) else ("UNKNOWN", str(exc))
        status = getattr(info.status, "value", str(info.status))
        return str(status), str(info.message or "")

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job (SIGTERM to the driver, SIGKILL after the job's
        ``RAY_JOB_STOP_WAIT_TIME_S``). Idempotent; False when the cluster did not answer."""
        try:
            self.sdk.stop_job(submission_id)
            return True
        except Exception:  # noqa: BLE001 - gone or ended: nothing to stop
            return False

    def logs(self, submission_id: str) -> str:
        return str(self.sdk.get_job_logs(submission_id))

    def tail(self, submission_id: str, stop: threading.Event) -> Iterator[str]:
        """The job's log from its start, chunk by chunk as it grows, until the job has ended
        (or ``stop`` is set). Raises BackendError when the stream breaks off."""
        chunks: queue.Queue[Any] = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for chunk in self.sdk.tail_job_logs(submission_id):
                    chunks.put(chunk)
                    if stop.is_set():
                        break
                chunks.put(done)
            except Exception as exc:  # noqa: BLE001 - handed to the reader
                chunks.put(exc)

        thread = threading.Thread(target=asyncio.run, args=(pump(),), daemon=True)
        thread.start()
        while True:
            item = chunks.get()
            if item is done:
                return
            if isinstance(item, Exception):
                raise BackendError(f"following the Ray job's log broke off ({item})", "it is followed again")
            yield str(item)
