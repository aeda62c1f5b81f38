"""A job's record in the object store, for jobs whose supervisor runs in the cluster
(``--in-cluster``, ``hosted.py``): what outlives the supervisor pod and what any machine reads.

One archive per job, ``<store>/phalanx-home/<job id>/record.tar.gz``, holding

- ``row.json``: the job's store row (state, attempt, retries, exit code, root cause, times);
- ``jobs/<id>/...``: the job directory (spec, plan, attempts, every rank's log, results),
  without its code snapshot (the bundle carries the code);
- ``state/<key>/...``: the job's state directory (the checkpoints that came back).

and a second object, ``state.tar.gz``, the state directory as the next attempt's pods fetch it.

Nobody in the cluster holds object-store credentials: the submitting machine presigns a GET
and a PUT URL for each object (SigV4, at most 7 days) and hands them to the supervisor pod in
its Secret, so the pod reads and writes them with ``urllib`` alone (the image needs no SDK).
Standard library only, except ``presign`` (botocore, on the submitting machine).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

URL_SECONDS = 7 * 24 * 3600  # the longest a SigV4 presigned URL may live
FOLDER = "phalanx-home"
ROW = "row.json"


@dataclass(frozen=True)
class Urls:
    """Presigned URLs of one job's objects (the supervisor Secret's keys)."""

    record_get: str
    record_put: str
    state_get: str
    state_put: str

    def to_secret(self) -> dict[str, str]:
        return {"record-get": self.record_get, "record-put": self.record_put, "state-get": self.state_get,
                "state-put": self.state_put}

    @classmethod
    def from_secret(cls, data: dict[str, str]) -> "Urls":
        return cls(data["record-get"], data["record-put"], data["state-get"], data["state-put"])


def location(store: str, job_id: str) -> str:
    return f"{store.rstrip('/')}/{FOLDER}/{job_id}"


def presign(store: str, job_id: str) -> Urls:
    """GET and PUT URLs of the job's record and state archives under ``store`` (``s3://``).
    Raises UsageError when the store cannot presign."""
    from ...errors import UsageError

    if not store.startswith("s3://"):
        raise UsageError(f"--in-cluster keeps the job record in an S3 store; {store.split('://')[0]}:// is not one",
                         "give --code-uri s3://BUCKET/PREFIX")
    try:
        import botocore.session
    except ImportError:
        raise UsageError("--in-cluster needs botocore on this machine", "pip install 'phalanx[storage]'") from None
    bucket, _, prefix = store[len("s3://"):].partition("/")
    key = f"{prefix.strip('/')}/{FOLDER}/{job_id}".lstrip("/")
    # AWS_ENDPOINT_URL: S3-compatible stores (MinIO, R2, moto), as s3fs and the AWS CLI read it.
    from botocore.config import Config

    # SigV4: URLs valid up to 7 days, and the body's Content-Type is not part of what is signed.
    client = botocore.session.get_session().create_client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                                                          config=Config(signature_version="s3v4"))

    def sign(method: str, name: str) -> str:
        return str(client.generate_presigned_url(method, Params={"Bucket": bucket, "Key": f"{key}/{name}"},
                                                 ExpiresIn=URL_SECONDS))

    return Urls(sign("get_object", "record.tar.gz"), sign("put_object", "record.tar.gz"),
                sign("get_object", "state.tar.gz"), sign("put_object", "state.tar.gz"))


def get(url: str, timeout: float = 60.0) -> bytes | None:
    """The object at a presigned GET URL; None when there is none yet (404/403 of a missing key)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (403, 404):  # S3 answers 403 for a missing key without ListBucket
            return None
        raise


def put(url: str, data: bytes, timeout: float = 120.0) -> None:
    request = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()


def pack(home: Path, job_id: str, row: dict[str, Any], state_key: str | None) -> bytes:
    """The record archive of ``job_id`` in ``home`` (a PHALANX_HOME) with ``row``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        text = json.dumps(row, sort_keys=True).encode()
        info = tarfile.TarInfo(ROW)
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        trees = [(home / "jobs" / job_id, f"jobs/{job_id}")]
        if state_key:
            trees.append((home / "state" / state_key, f"state/{state_key}"))
        for root, name in trees:
            for path in sorted(root.rglob("*")) if root.is_dir() else []:
                rel = path.relative_to(root)
                if rel.parts[0] == "code" or path.is_symlink() or not path.is_file():
                    continue  # the bundle carries the code; links point at this machine's files
                try:
                    tar.add(str(path), f"{name}/{rel.as_posix()}", recursive=False)
                except (FileNotFoundError, OSError):
                    continue  # written and removed while packing (a rotating file): the next sync has it
    return buf.getvalue()


def unpack(data: bytes, home: Path, job_id: str, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """Replace ``job_id``'s directory (its code snapshot and the files named in ``keep`` kept)
    and state in ``home`` by the archive's; returns the archived row."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        row = json.loads(tar.extractfile(ROW).read())  # type: ignore[union-attr]
        job = home / "jobs" / job_id
        if job.is_dir():
            for child in job.iterdir():
                if child.name != "code" and child.name not in keep:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        safe = [m for m in members if m.isfile() and m.name != ROW and _inside(m.name, job_id)]
        tar.extractall(home, members=safe, filter="data")
    return dict(row)


def _inside(name: str, job_id: str) -> bool:
    parts = Path(name).parts
    return ".." not in parts and len(parts) > 2 and (parts[:2] == ("jobs", job_id) or parts[0] == "state")


def pack_dir(directory: Path) -> bytes | None:
    """``directory``'s files as a tar.gz (None when it holds none): the next attempt's state."""
    files = [p for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()] if directory.is_dir() else []
    if not files:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            tar.add(str(path), path.relative_to(directory).as_posix(), recursive=False)
    return buf.getvalue()
