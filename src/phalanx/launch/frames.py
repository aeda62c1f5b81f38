"""The frames of an SSH node's link (see :mod:`phalanx.launch.remote`): the remote end's
:class:`Mirror` sends what its node wrote; the supervisor's :class:`Receiver` writes it into the
local job directory. Both ends must be the same phalanx version (``PROTOCOL``).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator, Protocol

from ..core.paths import JobPaths

PROTOCOL = 2  # the frames on stdout; bump on any change (the preflight refuses a host that differs)
TREE_INTERVAL = 1.0  # seconds between scans of the trees: they may hold many files
WHOLE_FILES = (".json",)  # rewritten in place (atomically): sent whole when they change
CHUNK = 1 << 20  # bytes of a tree file per frame: memory stays bounded at both ends, whatever the file size
MAX_HEADER = 1 << 16  # a longer line is not a frame's header (paths are at most 4 KiB)

Signature = tuple[int, int, int]  # size, mtime_ns, inode
Frame = dict[str, Any]


class Send(Protocol):
    def __call__(self, frame: Frame, data: bytes | None = None) -> bool: ...


class Mirror:
    """Sends what changed since the last scan: this node's files of the attempt (its ``node_<n>/``
    directory and the ``rank_<r>/`` directories of its ranks), and the ``trees``."""

    def __init__(self, root: Path, node_rank: int, out: IO[bytes], trees: dict[str, Path] | None = None) -> None:
        self.root = root  # the attempt directory (``JobPaths.attempt``)
        self.attempt = int(root.name[len("attempt_"):]) if root.name.startswith("attempt_") else 0
        self.node_rank = node_rank
        self.out = out
        self.sent: dict[str, tuple[int, float]] = {}
        self.rank_nodes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.closed = False  # the link is gone: nobody reads frames any more
        # The baseline of each tree is taken now, before the agent starts anything.
        self.trees = [TreeMirror(name, path, self.frame) for name, path in (trees or {}).items()]
        self._trees_at = 0.0

    def _mine(self, top: str) -> bool:
        if top == JobPaths(self.root.parent).node_dir(self.attempt, self.node_rank).name:
            return True
        if not (top.startswith("rank_") and top[len("rank_"):].isdigit()):
            return False
        if top not in self.rank_nodes:
            try:
                rank = int(top[len("rank_"):])
                proc = json.loads(JobPaths(self.root.parent).rank_proc(self.attempt, rank).read_text())
                self.rank_nodes[top] = int(proc["node_rank"])
            except (OSError, ValueError, KeyError):
                return False  # not started yet (or another host's, on a shared home)
        return self.rank_nodes[top] == self.node_rank

    def scan(self, final: bool = False) -> None:
        """Send what changed; ``final``: also tree files that are not stable yet (the node is done)."""
        self._scan_attempt()
        if final or time.monotonic() - self._trees_at >= TREE_INTERVAL:
            for tree in self.trees:
                tree.scan(final)
            self._trees_at = time.monotonic()

    def _scan_attempt(self) -> None:
        if not self.root.exists():
            return
        for path in sorted(self.root.rglob("*")):
            if not path.is_file() or _temporary(path.name):
                continue
            if not self._mine(path.relative_to(self.root).parts[0]):
                continue
            rel = path.relative_to(self.root).as_posix()
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            size, mtime = self.sent.get(rel, (0, 0.0))
            if path.suffix in WHOLE_FILES:
                if (st.st_size, st.st_mtime) != (size, mtime):
                    self.frame({"f": rel, "w": 1}, path.read_bytes())
                    self.sent[rel] = (st.st_size, st.st_mtime)
            elif st.st_size > size:
                with open(path, "rb") as fh:
                    fh.seek(size)
                    while size < st.st_size:  # a flood of output goes in bounded frames too
                        data = fh.read(min(CHUNK, st.st_size - size))
                        if not data or not self.frame({"f": rel, "o": size}, data):
                            break
                        size += len(data)
                self.sent[rel] = (size, st.st_mtime)

    def frame(self, frame: Frame, data: bytes | None = None) -> bool:
        """Write one frame, followed by ``data`` if given (its header then says how many bytes:
        ``"b"``); False once the link is gone (then nothing more is written). Thread-safe."""
        header = json.dumps(frame if data is None else {**frame, "b": len(data)}).encode() + b"\n"
        with self.lock:  # a header and its bytes are never split by another frame
            if self.closed:
                return False
            try:
                self.out.write(header)
                if data:
                    self.out.write(data)
                self.out.flush()
            except (OSError, ValueError):
                self.closed = True  # keep going: the agent must still be stopped cleanly
            return not self.closed


class TreeMirror:
    """One directory mirrored to the supervisor: files written or replaced there (whole, in
    chunks, once stable) and files removed. What is there at start is the baseline: the
    supervisor has it already."""

    def __init__(self, name: str, root: Path, send: Send) -> None:
        self.name = name
        self.root = root
        self.send = send
        self.known = listing(root)  # what the supervisor has, as far as this node knows
        self.seen = dict(self.known)  # what the last scan saw

    def scan(self, final: bool = False) -> None:
        now = listing(self.root)
        for rel, sig in now.items():
            if self.known.get(rel) != sig and (final or self.seen.get(rel) == sig):
                if self._send_file(rel, sig):
                    self.known[rel] = sig
        for rel in [r for r in self.known if r not in now]:
            if not self.send({"r": self.name, "f": rel, "x": 1}):
                return
            del self.known[rel]
        self.seen = now

    def _send_file(self, rel: str, sig: Signature) -> bool:
        path = self.root / rel
        offset = 0
        try:
            with open(path, "rb") as fh:
                while offset < sig[0]:
                    data = fh.read(min(CHUNK, sig[0] - offset))
                    if not data:
                        break  # truncated under us
                    if not self.send({"r": self.name, "f": rel, "o": offset}, data):
                        return False
                    offset += len(data)
            intact = offset == sig[0] and _signature(os.stat(path)) == sig
        except OSError:
            intact = False
        if intact:
            return self.send({"r": self.name, "f": rel, "n": sig[0], "m": sig[1]})
        self.send({"r": self.name, "f": rel, "abort": 1})  # changed while read: again once stable
        return False


def listing(root: Path) -> dict[str, Signature]:
    """The regular files under ``root`` by relative path, leaving out temporary names."""
    files: dict[str, Signature] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _temporary(d))
        for name in sorted(filenames):
            if _temporary(name):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # removed meanwhile
            if stat.S_ISREG(st.st_mode):
                files[Path(path).relative_to(root).as_posix()] = _signature(st)
    return files


def _signature(st: os.stat_result) -> Signature:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _temporary(name: str) -> bool:
    """A name that is being written (``x.tmp.123``) or hidden (``.x.part``): never mirrored."""
    return name.startswith(".") or ".tmp" in name


class Receiver:
    """The supervisor's end of one node's frames: writes them into the attempt directory and
    into the local copies of the trees.

    Nothing is written outside those directories. A tree file arrives in a temp file
    (``.<name>.<tag>.part``, one per sender, as nodes may send the same path at once) and
    replaces the old file only when complete, so a broken link never leaves half a file in
    place of a good one. Not thread-safe: one reader per node.
    """

    def __init__(self, attempt_dir: Path, trees: dict[str, Path] | None = None, tag: str = "0") -> None:
        self.attempt_dir = attempt_dir
        self.trees = dict(trees or {})
        self.tag = tag
        self.partial: dict[tuple[str, str], tuple[Path, IO[bytes]]] = {}

    def receive(self, stream: IO[bytes]) -> int | None:
        """Apply one node's frames as they come, until its stream ends (blocking); then drop
        every file still arriving. Returns the node's exit code, None when the stream ended
        without it (the link was lost). A bad frame or a failed write (a full disk) is skipped."""
        code = None
        try:
            while line := stream.readline(MAX_HEADER):
                try:
                    frame = json.loads(line)
                    if not isinstance(frame, dict):
                        continue
                    if "exit" in frame:
                        code = int(frame["exit"])
                    else:
                        self.apply(frame, stream)
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # a line that is no frame (a login banner) or a full disk: the mirror goes on
        except EOFError:
            pass  # cut off within a frame's bytes: the link is lost
        finally:
            self.close()
        return code

    def apply(self, frame: Frame, stream: IO[bytes] | None = None) -> None:
        """Write one frame; its bytes (``"b"`` of them) are read from ``stream``, at most
        :data:`CHUNK` at a time, and all of them whatever becomes of the frame, so that the next
        header is read where it starts. Frames for unknown trees and paths leaving their
        directory are ignored. Raises EOFError if the stream ends within the bytes (whatever
        of them was written is removed)."""
        payload = Payload(stream, frame.get("b", 0))
        try:
            self._apply(frame, payload)
        finally:
            payload.skip()

    def close(self) -> None:
        """The stream ended: drop every file still arriving."""
        for key in list(self.partial):
            self._drop(key)

    def _apply(self, frame: Frame, payload: Payload) -> None:
        name = frame.get("r")
        base = self.attempt_dir if name is None else self.trees.get(str(name))
        if base is None or not isinstance(frame.get("f"), str):
            return
        target = _inside(base, frame["f"])
        if target is None:
            return
        if name is None:
            self._attempt_file(target, frame, payload)
        else:
            self._tree_file((str(name), frame["f"]), target, frame, payload)

    def _attempt_file(self, target: Path, frame: Frame, payload: Payload) -> None:
        if "b" not in frame:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        if "w" in frame:
            tmp = target.with_name(f".{target.name}.part")
            try:
                with open(tmp, "wb") as fh:
                    payload.copy_to(fh)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            tmp.replace(target)
        elif "o" in frame:
            offset = int(frame["o"])
            with open(target, "ab") as fh:
                fh.truncate(offset)
                try:
                    payload.copy_to(fh)
                except BaseException:
                    fh.truncate(offset)  # all of the appended bytes or none, as when a frame was one line
                    raise

    def _tree_file(self, key: tuple[str, str], target: Path, frame: Frame, payload: Payload) -> None:
        if "b" in frame:
            offset = int(frame["o"])
            if offset == 0:
                self._drop(key)
                target.parent.mkdir(parents=True, exist_ok=True)
                part = target.with_name(f".{target.name}.{self.tag}.part")
                self.partial[key] = (part, open(part, "wb"))
            entry = self.partial.get(key)
            if entry is None or entry[1].tell() != offset:
                self._drop(key)  # a chunk without the ones before it: the file comes again whole
                return
            payload.copy_to(entry[1])  # cut off: close() drops the part file
        elif "n" in frame:
            entry = self.partial.pop(key, None)
            if entry is None:
                if int(frame["n"]) != 0:
                    return
                target.parent.mkdir(parents=True, exist_ok=True)
                part = target.with_name(f".{target.name}.{self.tag}.part")
                entry = (part, open(part, "wb"))
            part, fh = entry
            size = fh.tell()
            fh.close()
            if size != int(frame["n"]):
                part.unlink(missing_ok=True)
                return
            mtime = int(frame.get("m") or time.time_ns())
            os.utime(part, ns=(mtime, mtime))
            os.replace(part, target)
        elif "abort" in frame:
            self._drop(key)
        elif "x" in frame:
            self._drop(key)
            if target.is_file() or target.is_symlink():
                target.unlink(missing_ok=True)

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self.partial.pop(key, None)
        if entry is not None:
            entry[1].close()
            entry[0].unlink(missing_ok=True)


class Payload:
    """The raw bytes that follow a frame's header line, read at most :data:`CHUNK` at a time
    (a pipe or socket may return fewer than asked: read until all came or the stream ended)."""

    def __init__(self, stream: IO[bytes] | None, size: Any) -> None:
        self.left = int(size)
        if self.left < 0 or (self.left and stream is None):
            raise ValueError(f"a frame's byte count {size!r} without a stream to read them from")
        self.stream = stream

    def pieces(self) -> Iterator[bytes]:
        """The bytes not read yet; raises EOFError if the stream ends before them."""
        while self.left > 0:
            assert self.stream is not None
            data = self.stream.read(min(CHUNK, self.left))
            if not data:
                raise EOFError(f"the stream ended {self.left} bytes short of a frame's end")
            self.left -= len(data)
            yield data

    def copy_to(self, fh: IO[bytes]) -> None:
        for data in self.pieces():
            fh.write(data)

    def skip(self) -> None:
        for _ in self.pieces():
            pass


def _inside(base: Path, rel: str) -> Path | None:
    """``base/rel`` if it stays inside ``base`` (links followed), else None."""
    root = base.resolve()
    target = (root / rel).resolve()
    return target if target != root and target.is_relative_to(root) else None


