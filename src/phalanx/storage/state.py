"""Keeping the state directory (checkpoints) in step with a remote copy, through fsspec.

Layout at the URI: every version of a file is its own object,
``objects/<path>.<mtime_ns>-<size>``, never overwritten; the manifest
``_phalanx_manifest.json`` ({path: {size, mtime, key}}) is written *after* every object it
lists, and only then are objects no manifest lists any more deleted. Each object is written
whole (an S3 PUT is atomic; local files go to a temp name and are renamed). So an upload cut
off mid-way leaves the previous manifest pointing at the previous, complete objects: ``pull``
restores exactly what the last finished upload listed, never a half-written or mixed state.

Endpoints and credentials come from each store's standard configuration
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws/...`` for S3).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import PhalanxError
from .transfer import check_store, filesystem, write_bytes
from .transfer import is_local as _is_local

MANIFEST = "_phalanx_manifest.json"


class StateSyncError(PhalanxError):
    pass


class StateSync:
    """Pull before a job starts, push while it runs (``start``) and at the end (``stop``)."""

    def __init__(self, local: Path, uri: str, on_pushed: Callable[[float], None] | None = None,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.local = local
        self.uri = uri
        self.fs, self.root = filesystem(uri)
        self.on_pushed = on_pushed
        self.on_error = on_error
        self._pushed: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Fail now, with a clear message, if the bucket (or top directory) is not there."""
        if _is_local(self.fs):
            self.fs.makedirs(self.root, exist_ok=True)
            return
        check_store(self.fs, self.root, self.uri, "--state", what=f"the state URI '{self.uri}'", error=StateSyncError)

    # -- listing ----------------------------------------------------------------

    def _local_files(self) -> dict[str, dict[str, Any]]:
        files = {}
        if self.local.exists():
            for path in self.local.rglob("*"):
                if path.is_file() and not path.name.startswith(".") and ".tmp" not in path.name:
                    st = path.stat()
                    files[path.relative_to(self.local).as_posix()] = {"size": st.st_size, "mtime": st.st_mtime}
        return files

    def _remote_manifest(self) -> dict[str, dict[str, Any]]:
        try:
            with self.fs.open(f"{self.root}/{MANIFEST}", "rb") as fh:
                return dict(json.loads(fh.read())["files"])
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError) as exc:
            raise StateSyncError(f"cannot read the state manifest at {self.uri}: {exc}", "check the URI and credentials") from None

    # -- transfers ----------------------------------------------------------------

    def pull(self) -> int:
        """Bring files listed by the remote manifest that are missing or different locally."""
        manifest = self._remote_manifest()
        self.local.mkdir(parents=True, exist_ok=True)
        have = self._local_files()
        count = 0
        for rel, meta in manifest.items():
            if have.get(rel, {}).get("size") == meta["size"] and have.get(rel, {}).get("mtime") == meta["mtime"]:
                continue
            target = self.local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.part")
            self.fs.get_file(f"{self.root}/{meta['key']}", str(tmp))
            os.utime(tmp, (meta["mtime"], meta["mtime"]))
            os.replace(tmp, target)
            count += 1
        with self._lock:
            self._pushed = dict(manifest)
        return count

    def push(self) -> int:
        """Upload changed files, then the manifest. Raises StateSyncError; the old manifest stays valid."""
        with self._lock:
            files = self._local_files()
            for rel, meta in files.items():
                meta["key"] = f"objects/{rel}.{int(meta['mtime'] * 1e9)}-{int(meta['size'])}"
            changed = [rel for rel, meta in files.items() if self._pushed.get(rel) != meta]
            if not changed and set(files) == set(self._pushed):
                return 0
            try:
                for rel in changed:
                    self._put(self.local / rel, f"{self.root}/{files[rel]['key']}")
                payload = json.dumps({"files": files, "time": time.time()}).encode()
                self._write(f"{self.root}/{MANIFEST}", payload)
            except OSError as exc:
                raise StateSyncError(f"uploading the state to {self.uri} failed: {exc}", "the previous upload is still complete") from exc
            stale = {m["key"] for m in self._pushed.values() if "key" in m} - {m["key"] for m in files.values()}
            for key in stale:
                try:
                    self.fs.rm_file(f"{self.root}/{key}")
                except OSError:
                    pass  # garbage only; the manifest no longer points at it
            self._pushed = files
        if self.on_pushed:
            self.on_pushed(time.time())
        return len(changed)

    def reset(self) -> None:
        """Start over (``--clean-state``): an empty manifest; old objects stay but are ignored."""
        self._write(f"{self.root}/{MANIFEST}", json.dumps({"files": {}, "time": time.time()}).encode())
        self._pushed = {}

    def _put(self, src: Path, dst: str) -> None:
        self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
        if _is_local(self.fs):
            part = f"{dst}.part"
            self.fs.put_file(str(src), part)
            self.fs.mv(part, dst)
        else:
            self.fs.put_file(str(src), dst)

    def _write(self, dst: str, data: bytes) -> None:
        write_bytes(self.fs, dst, data)

    # -- background ----------------------------------------------------------------

    def start(self, interval: float) -> None:
        def loop() -> None:
            while not self._stop.wait(interval):
                self._push_logged()

        self._thread = threading.Thread(target=loop, name="phalanx-state-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic pushes and push once more (the job's last checkpoint)."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._push_logged()

    def _push_logged(self) -> None:
        try:
            self.push()
        except PhalanxError as exc:
            if self.on_error:
                self.on_error(str(exc))
