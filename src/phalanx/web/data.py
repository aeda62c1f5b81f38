"""What the dashboard shows of a job, read from the store and the job directory: its record,
ranks, attempts and their outcomes, usage, artifacts. No web imports here.

Every file read goes through :func:`job_file`, which refuses paths that resolve outside the
job's directory (a symlinked log, a crafted rank or artifact path), so the API can never serve
anything else from the disk.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.contracts import read_node_result
from ..core.paths import JobPaths, read_json
from ..core.state import RESUMABLE, is_terminal
from ..errors import PhalanxError, UsageError
from ..store import JobRecord

PREVIEW_BYTES = 64 * 1024
IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}
TEXTS = {".txt", ".log", ".json", ".jsonl", ".yaml", ".yml", ".csv", ".tsv", ".md", ".py", ".cfg", ".ini", ".toml", ".out"}
MAX_ARTIFACTS = 2000


class Forbidden(PhalanxError):
    """A request for a file outside the job directory."""


def job_file(record: JobRecord, path: Path) -> Path:
    """``path`` if it resolves inside the job's directory; raises Forbidden otherwise."""
    root = Path(record.job_dir).resolve()
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise Forbidden(f"{path} is outside the job directory")
    return resolved


def job_summary(record: JobRecord) -> dict[str, Any]:
    data = record.to_dict()
    data["world_size"] = record.nnodes * record.nproc_per_node
    data["duration"] = record.duration
    return data


def actions(record: JobRecord) -> list[str]:
    """What the job's page offers: stop while it runs; resume, retry and delete once it ended."""
    if not is_terminal(record.state):
        return ["stop"]
    out = ["resume"] if record.state in RESUMABLE else []
    return [*out, "retry", "delete"] if record.sweep_id is None else out


def job_detail(record: JobRecord) -> dict[str, Any]:
    """The job with its ranks, attempts (timeline and outcomes), root cause, hints, usage,
    tags and the settings that matter to someone watching it."""
    from .. import query
    from ..lists import short_command
    from ..monitor.accounting import job_usage
    from ..monitor.hints import hints
    from ..monitor.report import recent_metrics
    from ..monitor.resources import recent_resources
    from ..store.listing import tags_of

    paths = JobPaths(Path(record.job_dir))
    data = job_summary(record)
    data["command_short"] = short_command(record.command)
    data["ranks"] = [asdict(r) for r in query.rank_statuses(record)]
    data["attempts"] = attempts_timeline(record)
    data["hints"] = hints(recent_resources(paths, record.attempt), recent_metrics(paths, record.attempt))
    data["health"] = query.health(record)  # progress and ETA, the slow rank, the anomaly, the stop clocks
    data["terminal"] = is_terminal(record.state)
    data["actions"] = actions(record)
    data["usage"] = job_usage(record).to_dict()
    store = query.open_store()
    data["tags"] = tags_of(store, [record.id]).get(record.id, {})
    spec = json.loads(record.spec_json or "{}")
    defaults = {"max_retries": 0, "max_restarts": 0, "grace": 30.0, "framework": "torch"}
    data["settings"] = {k: spec.get(k) for k in ("max_retries", "max_restarts", "grace", "stall_timeout", "state_uri",
                                                 "output_uri", "notify", "framework", "workdir")
                        if spec.get(k) not in (None, [], "") and spec.get(k) != defaults.get(k)}
    if record.sweep_id:
        data["sweep"] = {"id": record.sweep_id, "trial": record.trial, "params": data.get("params")}
    return data


def attempts_timeline(record: JobRecord) -> list[dict[str, Any]]:
    """Per attempt: start, end (None while running), exit code, per-node results, and its
    outcome and retry decision as the supervisor recorded them (``attempts.jsonl``)."""
    from .. import query

    paths = JobPaths(Path(record.job_dir))
    logged = {int(a["attempt"]): a for a in query.attempt_history(record) if "attempt" in a}
    out = []
    from ..monitor.resources import node_ranks

    for attempt in paths.attempts():
        nodes: list[dict[str, Any]] = []
        for node in node_ranks(paths, attempt):
            result = read_node_result(paths.node_result(attempt, node))
            if result is None:
                nodes.append({"node_rank": node, "host": None, "exitcode": None, "started": None, "finished": None})
            else:
                nodes.append({"node_rank": node, "host": result.host, "exitcode": result.exitcode,
                              "started": result.started, "finished": result.finished})
        starts = [n["started"] for n in nodes if n["started"]]
        for rank in paths.ranks(attempt):
            proc = read_json(paths.rank_proc(attempt, rank)) or {}
            if proc.get("started"):
                starts.append(proc["started"])
        ends: list[float] = [n["finished"] for n in nodes if n["finished"]]
        done = bool(nodes) and len(ends) == len(nodes)
        codes = [n["exitcode"] for n in nodes if n["exitcode"] not in (None, 0)]
        latest = attempt == record.attempt
        entry = logged.get(attempt, {})
        end = max(ends) if done else (record.ended_at if latest and is_terminal(record.state) else None)
        out.append({
            "attempt": attempt,
            "start": min(starts) if starts else entry.get("started") or (record.started_at if latest else None),
            "end": end if end is not None else entry.get("ended"),
            "exitcode": entry.get("exit_code", codes[0] if codes else (0 if done else None)),
            "outcome": entry.get("outcome") or ("running" if latest and not is_terminal(record.state) else None),
            "message": entry.get("message"),
            "retried": entry.get("retry"),
            "reason": entry.get("reason"),
            "nodes": nodes,
        })
    return out


# -- artifacts ---------------------------------------------------------------------------------


def artifacts(record: JobRecord) -> dict[str, Any]:
    """The job's outputs (``PHALANX_OUTPUT_DIR``) as a list: path, size, and how the page shows
    each (``image`` and ``text`` get a preview; everything can be downloaded)."""
    from .. import query

    paths = JobPaths(Path(record.job_dir))
    found = query.artifacts(record)
    files: list[dict[str, Any]] = []
    root = paths.output_dir
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        if len(files) >= MAX_ARTIFACTS:
            break
        if path.is_symlink() or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        files.append({"path": rel, "size": path.stat().st_size, "preview": preview_kind(rel)})
    return {"location": found.location, "uploaded": found.uploaded, "error": found.error, "files": files,
            "truncated": len(files) >= MAX_ARTIFACTS}


def preview_kind(rel: str) -> str | None:
    suffix = Path(rel).suffix.lower()
    return "image" if suffix in IMAGES else "text" if suffix in TEXTS else None


def artifact_file(record: JobRecord, rel: str) -> tuple[Path, str]:
    """An output file to send, and its media type (images as themselves, text as plain text,
    anything else as bytes to download: nothing a job wrote is ever served as a web page)."""
    if not rel or rel.startswith("/") or "\0" in rel:
        raise UsageError(f"invalid artifact path '{rel}'", "pick a file from the job's artifacts list")
    paths = JobPaths(Path(record.job_dir))
    path = job_file(record, paths.output_dir / rel)
    if paths.output_dir.resolve() not in path.parents or not path.is_file():
        raise Forbidden(f"'{rel}' is not one of the job's output files")
    suffix = path.suffix.lower()
    if suffix in IMAGES:
        return path, IMAGES[suffix]
    if suffix in TEXTS:
        return path, "text/plain; charset=utf-8"
    return path, "application/octet-stream"
