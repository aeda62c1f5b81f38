"""What a supervisor pod (``--in-cluster``) needs of the Kubernetes backend: its record's URLs
(``record.py``) from its environment, restoring and syncing the record, and the values of an
attempt's manifests (``pod_values``: the pod's own bundle, the state directory through the store).
Standard library only. The pod's program is ``supervise/remote.py``
(``python3 -m phalanx.supervise.remote JOB_ID``; the objects: ``supobjects.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import record as rec
from .manifests import BUNDLE_SHA256, BUNDLE_URL, STATE_BYTES, STATE_SHA256, STATE_URL

if TYPE_CHECKING:
    from ...store import JobRecord

SYNC = float(os.environ.get("PHX_SYNC_SECONDS") or 5.0)
# The store columns the record carries; the rest (job_dir, supervisor identity) is per machine.
COLUMNS = ("name", "backend", "nnodes", "nproc_per_node", "command", "spec_json", "created_at", "started_at", "ended_at",
           "exit_code", "attempt", "root_cause", "state_synced_at", "retries", "gpu_hours", "cpu_hours", "cost")


def active() -> bool:
    """Whether this process is a supervisor pod's (its record's URLs in the environment)."""
    return bool(os.environ.get("PHX_RECORD_PUT"))


def urls() -> rec.Urls:
    e = os.environ
    return rec.Urls(e["PHX_RECORD_GET"], e["PHX_RECORD_PUT"], e["PHX_STATE_GET"], e["PHX_STATE_PUT"])


def pod_values(state_dir: Path | None) -> dict[str, str | None]:
    """The placeholders of an attempt's manifests, in the supervisor pod: the bundle this pod
    was started from, and the state directory uploaded to the job's state object."""
    values: dict[str, str | None] = {BUNDLE_URL: os.environ["PHX_BUNDLE_URL"], BUNDLE_SHA256: os.environ["PHX_BUNDLE_SHA256"],
                                     STATE_URL: "", STATE_SHA256: "", STATE_BYTES: None}
    data = rec.pack_dir(state_dir) if state_dir is not None else None
    if data is not None:
        rec.put(urls().state_put, data)
        values[STATE_URL], values[STATE_SHA256] = urls().state_get, hashlib.sha256(data).hexdigest()
    return values


def row_of(record: JobRecord) -> dict[str, Any]:
    row = {c: getattr(record, c) for c in COLUMNS}
    row.update(id=record.id, state=record.state.value)
    return row


def restore(home: Path, job_id: str) -> dict[str, Any]:
    """The record from the object store into ``home``; the archived row."""
    data = rec.get(urls().record_get)
    if data is None:
        raise SystemExit(f"phalanx: the record of job {job_id} is not in the object store (its URL: {urls().record_get[:80]}...)")
    row = rec.unpack(data, home, job_id)
    # This pod reaches the API server with its service account: no kubeconfig context.
    spec = json.loads(row["spec_json"])
    spec.get("backend_options", {}).pop("context", None)
    row["spec_json"] = json.dumps(spec, sort_keys=True)
    (home / "jobs" / job_id / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return row


class Syncer(threading.Thread):
    """Writes the record to the object store every SYNC seconds, and once more on ``flush``."""

    def __init__(self, home: Path, job_id: str, state_key: str | None) -> None:
        super().__init__(name="record-sync", daemon=True)
        self.home, self.job_id, self.state_key = home, job_id, state_key
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SYNC):
            self.flush()

    def flush(self) -> None:
        from ...store import Store

        with self.lock:
            try:
                row = row_of(Store(_db(self.home)).get(self.job_id))
                rec.put(urls().record_put, rec.pack(self.home, self.job_id, row, self.state_key))
            except Exception as exc:  # noqa: BLE001 - the next sync tries again; the pod must not die of it
                print(f"phalanx: writing the job record failed: {exc}", flush=True)


def _db(home: Path) -> Path:
    from ...core.paths import HomePaths

    return HomePaths(home).db
