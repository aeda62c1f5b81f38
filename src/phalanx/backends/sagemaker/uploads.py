"""What goes up to S3 before a training job starts: the phalanx channel and local inputs.

- A local input (a path, or the outputs of an earlier job) is uploaded once per *content*: its
  prefix is ``channels/<digest>/`` where the digest covers every file's name and bytes, and a
  marker ``channels/<digest>.json`` is written after the last file. A marker present means a
  complete upload, so an unchanged input costs one HEAD request, however large it is. File
  digests are remembered by (path, size, mtime) in ``$PHALANX_HOME/cache/sagemaker-digests.json``
  (``HomePaths.sagemaker_digests``), so an unchanged input is not even read again.
- The phalanx channel of an attempt holds the bundle (the job's code and phalanx itself,
  ``storage/bundle.py``) and ``launch.json`` (every node's part of the plan).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from ...core.paths import write_json
from ...storage.bundle import build, code_files
from .client import Aws
from .layout import BUNDLE, LAUNCH, JobS3

Say = Callable[[str], None]


def _files(path: Path) -> Iterator[tuple[str, Path]]:
    """(name inside the channel, file): a file input is itself, a directory its tree (links followed)."""
    if path.is_file():
        yield path.name, path
        return
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath, name)
            if full.is_file():
                yield full.relative_to(path).as_posix(), full


def _file_digest(path: Path, cache: dict[str, Any]) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if key not in cache:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        cache[key] = digest.hexdigest()
    return str(cache[key])


def _load_cache(cache_file: Path | None) -> dict[str, Any]:
    if cache_file is None:
        return {}
    try:
        return dict(json.loads(cache_file.read_text()))
    except (OSError, ValueError):
        return {}


def local_digest(path: str, cache_file: Path | None, remember: bool = False) -> str:
    """The content digest of a local input (a file or a directory tree). Reads only files the
    cache (``HomePaths.sagemaker_digests``; None: no cache) has not seen with the same size and
    mtime; ``remember`` writes what it read to the cache."""
    cache = _load_cache(cache_file)
    before = len(cache)
    digest = hashlib.sha256()
    for name, file in _files(Path(path)):
        digest.update(os.fsencode(f"{name}\0{_file_digest(file, cache)}\n"))
    if remember and cache_file is not None and len(cache) != before:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache_file, cache)
    return digest.hexdigest()[:32]


def upload_channel(aws: Aws, s3: JobS3, name: str, path: str, digest: str, say: Say) -> bool:
    """Upload a local input to its content prefix unless a complete copy is there; True if uploaded."""
    marker = s3.channel_marker(digest)
    if aws.exists(marker):
        return False
    files = list(_files(Path(path)))
    total = sum(f.stat().st_size for _, f in files)
    say(f"uploading input '{name}' ({len(files)} file(s), {total >> 20} MiB) to {s3.channel(digest)}")
    for rel, file in files:
        aws.upload(str(file), s3.channel(digest) + rel)
    aws.put(marker, json.dumps({"source": path, "files": len(files), "bytes": total}, sort_keys=True).encode())
    return True


def upload_code(aws: Aws, s3: JobS3, attempt: int, code_dir: Path, launch: dict[str, Any]) -> None:
    """The attempt's phalanx channel: the bundle, then ``launch.json``."""
    with tempfile.TemporaryDirectory(prefix="phalanx-sm-") as tmp:
        bundle = build(code_files(code_dir), Path(tmp) / BUNDLE)
        aws.upload(str(bundle.path), s3.code(attempt) + BUNDLE)
    aws.put(s3.code(attempt) + LAUNCH, json.dumps(launch, indent=1, sort_keys=True).encode())
