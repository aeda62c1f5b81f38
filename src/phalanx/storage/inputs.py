"""The fingerprint of what a job consumes, for ``--skip-if-done``.

Two runs have the same inputs when they run the same command (entrypoint, arguments,
environment, topology) on the same code (the files a snapshot takes, by content) and the same
data: every input channel's files by name, size and version (ETag or mtime) — for a ``job:``
input, the producing job's results, so a rerun of the producer that changes its output
makes its consumers run again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..core.paths import HomePaths
from ..core.spec import Channel, EntrypointKind, JobSpec
from .transfer import filesystem, list_files


def fingerprint(spec: JobSpec, home: HomePaths) -> dict[str, Any]:
    """``{"digest": ..., "parts": {...}}``; reads the code and lists the inputs (I/O)."""
    parts = {
        "command": _command(spec),
        "env": dict(sorted(spec.env.items())),
        "topology": spec.resources.display(),
        "framework": spec.framework.value,
        "code": _code(spec, home),
        "inputs": {c.name: {"uri": c.uri, "source": c.source, "extract": c.extract, "content": _content(c)}
                   for c in spec.channels},
        "output": spec.output_uri,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return {"digest": digest, "parts": parts}


def _command(spec: JobSpec) -> list[str]:
    entry = spec.entrypoint
    target = entry.target
    if entry.kind is EntrypointKind.SCRIPT:  # the same script from another checkout is the same step
        try:
            target = Path(target).resolve().relative_to(Path(spec.workdir).resolve()).as_posix()
        except ValueError:
            pass
    return [entry.kind.value, target, *entry.args]


def _code(spec: JobSpec, home: HomePaths) -> str:
    from .snapshot import digest, list_workdir

    script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
    listing = list_workdir(Path(spec.workdir), home.root, script)
    if listing.too_big and script:  # too big to snapshot: the script (listed first) stands for the code
        listing.files = listing.files[:1]
    return digest(listing)


def _content(channel: Channel) -> str:
    h = hashlib.sha256()
    if channel.is_remote:
        fs, remote = filesystem(channel.source)
        for f in list_files(fs, remote):
            h.update(f"{f.rel}\0{f.size}\0{f.version}\n".encode())
        return h.hexdigest()
    root = Path(channel.source)
    if root.is_file():
        st = root.stat()
        return f"{st.st_size}:{st.st_mtime_ns}"
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            st = path.stat()
            h.update(os.fsencode(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n"))
    return h.hexdigest()
