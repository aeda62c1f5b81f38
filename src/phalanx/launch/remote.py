"""The remote end of an SSH node: ``python -m phalanx.launch.remote``, started over ssh.

It starts the node agent on this host and is the node's only line to the supervisor:

- stdin, first line: JSON ``{"launch": <the node's launch.json>, "stream": bool, "trees":
  {name: dir}}``; then control lines ``signal N`` (forwarded to the agent) and ``kill``. End of
  input means the supervisor or the connection is gone: the agent is stopped (SIGTERM, its
  grace, SIGKILL), so nothing is left running on this host when the link breaks;
- stdout (binary, frames only: anything else printing there goes to stderr): frames
  (:class:`Mirror`), read by :class:`Receiver` on the supervisor's side, and last ``{"exit":
  code}``. A frame is one JSON line; one that carries file data has ``"b": length`` and is
  followed by exactly that many raw bytes (no base64, no JSON around them: that cost 4x scp's
  time). Frames without ``"r"`` mirror this node's files of the attempt into the supervisor's
  job directory: ``{"f": path, "o": offset, "b"}`` (appended bytes of logs), ``{"f": path,
  "w": 1, "b"}`` (a small file, whole). Frames with ``"r": name`` mirror one of the ``trees``
  (the state and output directories, without a shared filesystem) into the supervisor's copy of
  it: a changed file is sent whole, in chunks ``{"r", "f", "o", "b"}`` of at most :data:`CHUNK`
  bytes, then ``{"r", "f", "n": size, "m": mtime_ns}`` (complete: it replaces the old file) or
  ``{"r", "f", "abort": 1}`` (it changed while being read: dropped, sent again later); ``{"r",
  "f", "x": 1}``: the file was removed. Both ends must be the same phalanx version (the ssh
  backend's preflight checks it).

A tree's files present at start (pushed there by the supervisor) are the baseline, not sent.
A file is sent once it is stable (the same size, mtime and inode at two scans in a row) or at
the final scan, which comes before the exit frame. Temporary names (dot-files, ``*.tmp*``) are
never sent.

With ``PHALANX_AUTO_IFNAME`` in the node env, GLOO/NCCL_SOCKET_IFNAME are set to the interface
that routes to the rendezvous host (on that host itself: the one holding its address, since the
route there is ``lo``), unless the user set them (``netif.interface_for``).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator, Protocol

from .netif import interface_for
from .procs import signal_group

PROTOCOL = 2  # the frames on stdout; bump on any change (the preflight refuses a host that differs)
SCAN_INTERVAL = 0.2
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
        self.root = root
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
        if top == f"node_{self.node_rank}":
            return True
        if not top.startswith("rank_"):
            return False
        if top not in self.rank_nodes:
            try:
                self.rank_nodes[top] = int(json.loads((self.root / top / "proc.json").read_text())["node_rank"])
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


def _expand_home(value: Any, prefix: str) -> Any:
    if not (prefix == "~" or prefix.startswith("~/")):
        return value
    if isinstance(value, str):
        inside = value == prefix or value.startswith(prefix.rstrip("/") + "/")
        return os.path.expanduser(value) if inside else value
    if isinstance(value, list):
        return [_expand_home(v, prefix) for v in value]
    if isinstance(value, dict):
        return {k: _expand_home(v, prefix) for k, v in value.items()}
    return value


def main() -> None:
    first = sys.stdin.readline()
    if not first:
        raise SystemExit(2)
    # Paths phalanx made under the remote home may start with ~ (that host's home, unknown to
    # the planner): expand those here, and only those (a script's own "~/x" argument stays as typed).
    request = json.loads(first)
    request = _expand_home(request, str(request.get("home") or ""))
    launch = request["launch"]
    node = launch["node"]
    env = node["env"]
    if env.pop("PHALANX_AUTO_IFNAME", None):
        master = env.get("PHALANX_NODE_ADDRS", "").split(",")[0]
        ifname = interface_for(master) if master else None
        if ifname:
            for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                env.setdefault(key, ifname)
    attempt_dir = Path(launch["job_dir"]) / f"attempt_{launch['attempt']}"
    node_dir = attempt_dir / f"node_{node['node_rank']}"
    node_dir.mkdir(parents=True, exist_ok=True)
    launch_path = node_dir / "launch.json"
    launch_path.write_text(json.dumps(launch))
    os.makedirs(node["cwd"], exist_ok=True)
    trees = {str(name): Path(path) for name, path in (request.get("trees") or {}).items()}
    # Before the agent starts: what the trees hold now is the baseline the supervisor has.
    out = _frames_out()
    mirror = Mirror(attempt_dir, int(node["node_rank"]), out, trees) if request.get("stream", True) else None
    with open(node_dir / "agent.log", "ab") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "phalanx.launch.agent", "--launch", str(launch_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=node["cwd"], start_new_session=True,
        )
    grace = float(launch.get("grace", 30))
    lost = threading.Event()

    def control() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["signal"] and len(words) == 2:
                signal_group(agent.pid, int(words[1]))
            elif words[:1] == ["kill"]:
                signal_group(agent.pid, signal.SIGKILL)
        lost.set()  # end of input: nobody controls this node any more

    threading.Thread(target=control, daemon=True).start()
    stop_deadline: float | None = None
    while agent.poll() is None:
        if lost.is_set() and stop_deadline is None:
            signal_group(agent.pid, signal.SIGTERM)
            stop_deadline = time.monotonic() + grace + 5
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            signal_group(agent.pid, signal.SIGKILL)
        if mirror:
            mirror.scan()
        time.sleep(SCAN_INTERVAL)
    code = agent.returncode
    exit_frame = {"exit": 128 - code if code < 0 else code}
    if mirror:
        mirror.scan(final=True)  # everything the node wrote arrives before its exit code
        mirror.frame(exit_frame)
    else:
        out.write(json.dumps(exit_frame).encode() + b"\n")
        out.flush()


def _frames_out() -> IO[bytes]:
    """This process's stdout, for frames alone: whatever else writes to file descriptor 1 from
    now on (a library's print, a C extension) goes to stderr, the supervisor's ``ssh.log``,
    instead of between a frame's header and its bytes."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return out


if __name__ == "__main__":
    main()
