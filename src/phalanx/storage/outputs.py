"""Results out: the job's outputs and logs uploaded to ``--output``, listed, and downloaded again.

At the end of a job, whatever its outcome, everything in ``PHALANX_OUTPUT_DIR`` goes to
``<URI>/<name>-<id>/output/`` and the job directory's records (logs, metrics, results) to
``.../logs/`` (``RemoteJobPaths``). The manifest ``_phalanx_artifacts.json`` (every file with
its size, outputs with their sha256) is written last, so its presence means the upload is
complete; ``download`` checks every file against it. The job directory keeps the same
manifest as ``artifacts.json``, with the error when the upload failed.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.paths import HomePaths, JobPaths, RemoteJobPaths, read_json, write_json
from ..core.spec import JobSpec
from ..errors import PhalanxError
from .transfer import (Item, Progress, check_store, download, filesystem, human_size, is_local, local_path, sha256_file, upload,
                       write_bytes)

Say = Callable[[str], None]

class OutputError(PhalanxError):
    pass


def check(spec: JobSpec) -> None:
    """Fail now if ``--output`` cannot be written: a missing bucket, an unreachable store."""
    if not spec.output_uri:
        return
    fs, root = filesystem(spec.output_uri)
    if is_local(fs):
        try:
            fs.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create --output directory '{root}': {exc}", "fix the path or its permissions") from None
        return
    check_store(fs, root, spec.output_uri, "--output", error=OutputError)


def _local_files(root: Path, skip_top: frozenset[str] = frozenset()) -> dict[str, Path]:
    files = {}
    if root.is_dir():
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if here == root:
                dirnames[:] = [d for d in dirnames if d not in skip_top]
                filenames = [f for f in filenames if f not in skip_top]
            for name in filenames:
                path = here / name
                if path.is_file():
                    files[path.relative_to(root).as_posix()] = path
    return files


def upload_job(spec: JobSpec, paths: JobPaths, job_id: str, say: Say) -> str | None:
    """Upload the outputs and logs of a finished job to ``spec.output_uri``. Blocking.

    Returns None on success, else what went wrong (the outputs stay in the job directory)."""
    if not spec.output_uri:
        return None
    remote = RemoteJobPaths.of(spec.output_uri, spec.name, job_id)
    outputs = _local_files(paths.output_dir)
    logs = _local_files(paths.root, paths.not_logs())
    sizes = {rel: p.stat().st_size for rel, p in outputs.items()}
    log_sizes = {rel: p.stat().st_size for rel, p in logs.items()}
    items = [Item(str(p), f"{remote.output}/{rel}", sizes[rel]) for rel, p in outputs.items()]
    # Logs may still grow (the supervisor's own log) while they travel: at least their size now.
    items += [Item(str(p), f"{remote.logs}/{rel}", log_sizes[rel], grows=True) for rel, p in logs.items()]
    manifest: dict[str, Any] = {"uri": remote.root, "job_id": job_id, "name": spec.name}
    started = time.monotonic()
    try:
        fs, _ = filesystem(remote.root)
        with ThreadPoolExecutor(max_workers=1) as hasher:  # digests while the bytes travel
            digests = hasher.submit(lambda: {rel: sha256_file(p) for rel, p in outputs.items()})
            total = sum(sizes.values())
            with Progress(f"uploading outputs to {remote.root}", total, say) as progress:
                upload(fs, items, progress)
            manifest["output"] = {rel: {"size": sizes[rel], "sha256": digest} for rel, digest in digests.result().items()}
        manifest["logs"] = {rel: {"size": size} for rel, size in log_sizes.items()}
        manifest["uploaded_at"] = time.time()
        write_bytes(fs, remote.manifest, json.dumps(manifest, indent=2, sort_keys=True).encode())
    except Exception as exc:  # noqa: BLE001 - whatever failed, the job's end must be recorded
        why = str(exc) or type(exc).__name__
        write_json(paths.artifacts, {**manifest, "complete": False, "error": why})
        return f"uploading the outputs to {remote.root} failed: {why}"
    write_json(paths.artifacts, {**manifest, "complete": True})
    total = sum(sizes.values())
    say(f"outputs: {len(outputs)} file(s), {human_size(total)} and {len(logs)} log file(s) uploaded to "
        f"{remote.root} in {time.monotonic() - started:.1f}s")
    return None


# -- reading results back ---------------------------------------------------------


@dataclass(frozen=True)
class Artifacts:
    """What a job produced: its output files, where they are, and whether an upload completed."""

    location: str  # the output URI (uploaded) or the job's local output directory
    uploaded: bool
    files: dict[str, dict[str, Any]]  # rel path -> {size, sha256?}
    logs: dict[str, dict[str, Any]]
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.location, "uploaded": self.uploaded, "error": self.error,
                "files": [{"path": rel, **meta} for rel, meta in sorted(self.files.items())],
                "logs": len(self.logs)}


def artifacts(paths: JobPaths) -> Artifacts:
    """The job's outputs: as uploaded (``artifacts.json``), or as they are in the job directory."""
    record = read_json(paths.artifacts)
    if record and record.get("complete"):
        return Artifacts(record["uri"] + "/output", True, record.get("output", {}), record.get("logs", {}))
    return Artifacts(str(paths.output_dir), False, _sizes(paths.output_dir), _sizes(paths.root, paths.not_logs()),
                     (record or {}).get("error"))


def _sizes(root: Path, skip_top: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    return {rel: {"size": p.stat().st_size} for rel, p in _local_files(root, skip_top).items()}


def job_output_source(paths: JobPaths) -> str:
    """Where a later job reads this job's outputs (``job:NAME``): the local output directory
    while it exists (no copy), else the uploaded copy."""
    record = read_json(paths.artifacts)
    if paths.output_dir.is_dir() or not (record and record.get("complete")):
        return str(paths.output_dir)
    return str(record["uri"]) + "/output"


def download_job(spec: JobSpec, paths: JobPaths, home: HomePaths, dest: Path, logs: bool, state: bool,
                 say: Say) -> dict[str, int]:
    """Bring the job's outputs (with ``logs``/``state``: its logs, its state directory) to
    ``dest/output`` (``dest/logs``, ``dest/state``): from the uploaded copy when there is a
    complete one, else from this machine. Every file is checked; returns file counts per part."""
    found = artifacts(paths)
    counts = {"output": _fetch(found.location, found.files, dest / "output", "output", say)}
    if logs:
        where = found.location.rsplit("/", 1)[0] + "/logs" if found.uploaded else str(paths.root)
        # logs can grow after they are listed: their sizes are not checked
        counts["logs"] = _fetch(where, {rel: {} for rel in found.logs}, dest / "logs", "logs", say)
    if state:
        counts["state"] = _fetch_state(spec, home, dest / "state", say)
    return counts


def _fetch(source: str, files: dict[str, dict[str, Any]], dest: Path, label: str, say: Say) -> int:
    fs, root = filesystem(source)
    items = [Item(f"{root}/{rel}", str(local_path(dest, rel)), meta.get("size"), meta.get("sha256"))
             for rel, meta in sorted(files.items())]
    dest.mkdir(parents=True, exist_ok=True)
    with Progress(f"downloading {label}", sum(int(m.get("size") or 0) for m in files.values()), say) as progress:
        download(fs, items, dest.parent / f".{dest.name}.partial", progress)
    return len(items)


def _fetch_state(spec: JobSpec, home: HomePaths, dest: Path, say: Say) -> int:
    """The job name's state directory on this machine, else the last upload to ``--state``."""
    from .state import StateSync

    local = home.state_dir(spec.state_key)
    files = _sizes(local)
    if files or not spec.state_uri:
        return _fetch(str(local), files, dest, "state", say)
    return StateSync(dest, spec.state_uri).pull()
