"""What the dashboard shows of a job beyond its view (``api/jobview.py``, shared with ``phalanx
status``): its artifacts, and the files the API may serve. No web imports here.

Every file read goes through :func:`job_file`, which refuses paths that resolve outside the
job's directory (a symlinked log, a crafted rank or artifact path), so the API can never serve
anything else from the disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.identity import Principal
from ..core.rawtext import escaped, unescaped
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
    root = record.paths.root.resolve()
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise Forbidden(f"{path} is outside the job directory")
    return resolved


def job_summary(record: JobRecord) -> dict[str, Any]:
    data = record.to_dict()
    data["world_size"] = record.nnodes * record.nproc_per_node
    data["duration"] = record.duration
    return data


def job_detail(record: JobRecord, principal: Principal) -> dict[str, Any]:
    """The job's page: the one view of a job (``api/jobview.py``, what ``phalanx status``
    renders too)."""
    from ..api.jobview import job_view

    return job_view(record, principal)


# -- artifacts ---------------------------------------------------------------------------------


def artifacts(record: JobRecord) -> dict[str, Any]:
    """The job's outputs (``PHALANX_OUTPUT_DIR``) as a list: path, size, and how the page shows
    each (``image`` and ``text`` get a preview; everything can be downloaded)."""
    from ..api import query

    paths = record.paths
    found = query.artifacts(record)
    files: list[dict[str, Any]] = []
    root = paths.output_dir
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        if len(files) >= MAX_ARTIFACTS:
            break
        if path.is_symlink() or not path.is_file():
            continue
        rel = escaped(path.relative_to(root).as_posix())  # what artifact_file finds again
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
    paths = record.paths
    path = job_file(record, paths.output_dir / rel)
    if not path.exists() and unescaped(rel) != rel:  # a name that is not UTF-8, as ``artifacts`` shows it
        path = job_file(record, paths.output_dir / unescaped(rel))
    if paths.output_dir.resolve() not in path.parents or not path.is_file():
        raise Forbidden(f"'{rel}' is not one of the job's output files")
    suffix = path.suffix.lower()
    if suffix in IMAGES:
        return path, IMAGES[suffix]
    if suffix in TEXTS:
        return path, "text/plain; charset=utf-8"
    return path, "application/octet-stream"
