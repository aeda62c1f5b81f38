"""What a submit to a team server carries: the manifest of the job's code (the snapshot's file
list: git's, or a walk honouring the ignore files; ``storage/snapshot.py``) and of each local
``--input``, with only the objects the server lacks sent first (``storage/objects.py``).
Rerunning unchanged code sends the manifests and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.spec import EntrypointKind, JobSpec, code_root
from ..storage import objects
from .client import Client


@dataclass
class Shipped:
    """What one submit sent: files listed, and files and bytes uploaded (the rest the server had)."""

    files: int = 0
    bytes: int = 0
    sent_files: int = 0
    sent_bytes: int = 0
    sources: dict[tuple[str, bool], Path] = field(default_factory=dict)


def manifests(spec: JobSpec, home: Path) -> tuple[dict[str, Any], dict[str, Any], Shipped]:
    """The code's manifest and each local input's (name -> manifest), and where each object's
    bytes are on this machine."""
    from ..storage.snapshot import check, hash_files, list_workdir

    shipped = Shipped()
    root = Path(code_root(spec))
    script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
    listing = list_workdir(root, home, script)
    check(listing)
    entries = objects.manifest(listing.workdir, listing.files, hash_files(listing))
    _count(shipped, listing.workdir, entries)
    code = {"root": str(listing.workdir), "files": [e.to_wire() for e in entries]}
    inputs: dict[str, Any] = {}
    for channel in spec.channels:
        if channel.is_remote or channel.uri.startswith("job:"):
            continue  # a URI, or a job of the server's: the server reads it itself
        source = Path(channel.source)
        files = objects.tree(source)
        _count(shipped, source if source.is_dir() else source.parent, files)
        inputs[channel.name] = {"files": [e.to_wire() for e in files], "single": source.is_file()}
    return code, inputs, shipped


def _count(shipped: Shipped, root: Path, entries: list[objects.Entry]) -> None:
    for entry in entries:
        if entry.link is None:
            shipped.files += 1
            shipped.bytes += entry.size
            shipped.sources.setdefault((entry.sha, entry.executable), root / entry.path)


def upload(client: Client, shipped: Shipped, connections: int = 4) -> None:
    """Send the objects the server lacks (each checked there against its digest), on a few
    connections at once (many small files cost round trips more than bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = [[sha, int(x)] for sha, x in shipped.sources]
    lacking: list[list[Any]] = []
    for start in range(0, len(wanted), 20_000):
        lacking += client.call("POST", "/objects/missing", body={"objects": wanted[start:start + 20_000]})
    if not lacking:
        return
    lanes = [client] + [Client(client.url, client.token, client.ca) for _ in range(min(connections, len(lacking)) - 1)]

    def send(lane: int) -> tuple[int, int]:
        files = sent = 0
        for sha, executable in lacking[lane::len(lanes)]:
            path = shipped.sources[(sha, bool(executable))]
            size = path.stat().st_size
            with open(path, "rb") as data:
                lanes[lane].put(f"/objects/{sha}", [("x", "1" if executable else "0")], data, size)
            files, sent = files + 1, sent + size
        return files, sent

    with ThreadPoolExecutor(len(lanes)) as pool:
        for files, sent in pool.map(send, range(len(lanes))):
            shipped.sent_files += files
            shipped.sent_bytes += sent
    for lane in lanes[1:]:
        lane.close()
