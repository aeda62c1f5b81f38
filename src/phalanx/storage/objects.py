"""Shipping files by content: a tree (the code a job runs, a local ``--input``) described as a
manifest of paths and sha256 digests, and the objects behind it, stored once per content in the
home's content store (``cache/code/objects/<aa>/<sha256>[.x]``, the code snapshots' store).

A client lists a tree (``manifest``), asks a server which objects it lacks (``missing``),
sends only those (``put``, which checks every byte against its digest), and the server lays
the tree out again (``lay_out``). Rerunning unchanged code sends a manifest and nothing else.

Paths in a manifest come from another machine: each is checked to stay inside the tree it is
laid out in (no absolute path, no ``..``, no link leading out), so a manifest can never write
elsewhere on the server.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterable

from ..core.paths import HomePaths
from ..errors import UsageError

SHA = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20
MAX_OBJECT = 2 << 30  # one file of an input: 2 GiB (code is held to snapshot.MAX_BYTES before)


@dataclass(frozen=True)
class Entry:
    """One file of a tree: a regular file by content (``sha``, ``executable``), or a symlink."""

    path: str  # posix, relative to the tree
    sha: str = ""
    executable: bool = False
    size: int = 0
    link: str | None = None  # a symlink's target, as written

    def to_wire(self) -> list[Any]:
        return [self.path, self.link] if self.link is not None else [self.path, self.sha, int(self.executable), self.size]

    @classmethod
    def from_wire(cls, item: Any) -> Entry:
        if not isinstance(item, list) or len(item) not in (2, 4) or not isinstance(item[0], str):
            raise UsageError("a file of the manifest is malformed", "send [path, sha256, executable, size] or [path, link]")
        if len(item) == 2:
            if not isinstance(item[1], str):
                raise UsageError(f"the link '{item[0]}' of the manifest has no target", "send [path, target]")
            return cls(check_path(item[0]), link=item[1])
        sha, executable, size = item[1], item[2], item[3]
        if not isinstance(sha, str) or not SHA.match(sha) or not isinstance(size, int) or size < 0:
            raise UsageError(f"the file '{item[0]}' of the manifest has a malformed digest or size", "send a sha256 in hex")
        return cls(check_path(item[0]), sha, bool(executable), size)


def check_path(rel: str) -> str:
    """``rel`` if it is a relative posix path that stays below its tree; UsageError otherwise."""
    parts = PurePosixPath(rel).parts
    if not rel or "\0" in rel or rel.startswith("/") or not parts or any(p in ("..", "") for p in parts):
        raise UsageError(f"the manifest names '{rel[:80]}', which is not a path inside the tree",
                         "send paths relative to the tree's root")
    return "/".join(p for p in parts if p != ".")


def object_path(home: HomePaths, sha: str, executable: bool) -> Path:
    return home.code_objects / sha[:2] / (sha + (".x" if executable else ""))


# -- the client's side -----------------------------------------------------------------------


def manifest(root: Path, files: Iterable[str], hashes: dict[str, str]) -> list[Entry]:
    """The entries of ``files`` (relative to ``root``; ``hashes``: their sha256, a symlink's of
    its target text, as ``snapshot.hash_files`` makes them)."""
    out = []
    for rel in files:
        path = root / rel
        if path.is_symlink():
            out.append(Entry(rel, link=os.readlink(path)))
        elif rel in hashes:
            try:
                st = path.stat()
            except OSError:
                continue  # deleted since it was listed
            out.append(Entry(rel, hashes[rel], bool(st.st_mode & 0o111), st.st_size))
    return out


def tree(root: Path) -> list[Entry]:
    """Every file under ``root`` (a local ``--input`` directory, or one file), links followed
    into files as ``cp -L`` does; what its ``manifest`` would list."""
    if root.is_file():
        return [_file_entry(root, root.name)]
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file():
                out.append(_file_entry(path, path.relative_to(root).as_posix()))
    return out


def _file_entry(path: Path, rel: str) -> Entry:
    with open(path, "rb") as fh:
        sha = hashlib.file_digest(fh, "sha256").hexdigest()
    st = path.stat()
    return Entry(rel, sha, bool(st.st_mode & 0o111), st.st_size)


def digest(entries: Iterable[Entry]) -> str:
    """One fingerprint of a whole tree: names, contents, modes and links."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        h.update(f"{e.path}\0{e.sha}\0{int(e.executable)}\0{e.link or ''}\n".encode())
    return h.hexdigest()


# -- the server's side -----------------------------------------------------------------------


def missing(home: HomePaths, wanted: Iterable[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """The objects of ``wanted`` (sha256, executable) the content store lacks."""
    out = []
    for sha, executable in wanted:
        if not SHA.match(sha):
            raise UsageError(f"'{sha[:80]}' is not a sha256 digest", "send 64 lower-case hex digits")
        if not object_path(home, sha, executable).exists():
            out.append((sha, executable))
    return sorted(set(out))


class Upload:
    """One object arriving in pieces (``write``), hashed as it comes, stored by ``finish``
    only when its bytes match the digest it was sent for. Use as a context manager: whatever
    did not finish leaves no file."""

    def __init__(self, home: HomePaths) -> None:
        self.home = home
        incoming = home.code_objects / ".incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        self.tmp = incoming / f"{os.getpid()}.{secrets.token_hex(6)}"
        self._out: BinaryIO = open(self.tmp, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def __enter__(self) -> Upload:
        return self

    def __exit__(self, *exc: object) -> None:
        self._out.close()
        self.tmp.unlink(missing_ok=True)

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > MAX_OBJECT:
            raise UsageError(f"an object over the limit of {MAX_OBJECT >> 20} MiB",
                             "pass large data as an --input URI (s3://...) rather than a local path")
        self._hash.update(data)
        self._out.write(data)

    def finish(self, sha: str, executable: bool) -> int:
        """Store it as object ``sha``; the bytes stored (0: the store had it). UsageError when
        the bytes are not ``sha``'s."""
        if not SHA.match(sha):
            raise UsageError(f"'{sha[:80]}' is not a sha256 digest", "send 64 lower-case hex digits")
        self._out.close()
        if self._hash.hexdigest() != sha:
            raise UsageError(f"object {sha[:12]}… arrived with other bytes ({self.size})", "send it again")
        target = object_path(self.home, sha, executable)
        if target.exists():
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.tmp, 0o555 if executable else 0o444)  # shared by every job that links it
        os.replace(self.tmp, target)  # the same bytes stored meanwhile by another upload: harmless
        return self.size


def lay_out(home: HomePaths, entries: Iterable[Entry], dest: Path, copy: bool) -> int:
    """The tree of ``entries`` in ``dest`` (made here, must not exist). ``copy``: each file a
    writable copy of its object (a job's working directory: a script writing into a file there
    must not change the stored object); else hard links (read-only data). Raises UsageError for
    an object the store lacks or a link leading out of the tree. Returns the files laid out."""
    dest.mkdir(parents=True)
    root = dest.resolve()
    count = 0
    for entry in entries:
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.link is not None:
            landing = os.path.normpath(os.path.join(os.path.dirname(str(target)), entry.link))
            if os.path.commonpath([str(root), os.path.abspath(landing)]) != str(root):
                raise UsageError(f"the link '{entry.path}' leads out of the shipped tree ({entry.link})",
                                 "make it point inside the project, or leave it out (.phalanxignore)")
            os.symlink(entry.link, target)
            continue
        obj = object_path(home, entry.sha, entry.executable)
        if not obj.exists():
            raise UsageError(f"the server lacks the content of '{entry.path}' ({entry.sha[:12]}…)", "submit again")
        if copy:
            shutil.copyfile(obj, target)
            os.chmod(target, 0o755 if entry.executable else 0o644)
        else:
            try:
                os.link(obj, target)
            except OSError:
                shutil.copyfile(obj, target)
        count += 1
    return count
