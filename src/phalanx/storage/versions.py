"""Versions of a job's state directory, kept for rollbacks (``--keep-states K``, ``--on-nan retry``).

Layout (``JobPaths.state_versions``)::

    states/versions.jsonl     one line per version: n, step, time, attempt, files {path: [size, mtime_ns]}, bytes, how
    states/v<n>/...           the state directory as it was
    states/diverged/          the state directory as a rollback found it (the last one; replaced)

A version never shares a file with the live state directory: the script may rewrite a
checkpoint in place (``torch.save`` truncates the file it saves over), which would change a
hard-linked copy too. So a file that changed since the previous version is *cloned* (a
copy-on-write reflink where the filesystem has them: btrfs, XFS; a copy elsewhere), and a file
that did not change is a hard link to the previous version's copy: K versions of a directory
whose big files rarely change cost little more than one. A restore clones the version back.

A version is taken whole or not at all: it is built under ``v<n>.part`` and renamed when every
file was copied unchanged (a file that changed while being copied aborts it; the next quiet
moment is tried). Temporary names (dot-files, ``*.tmp*``) are left out, as the state sync does.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

FICLONE = 0x40049409  # ioctl(2): clone a whole file (linux/fs.h)
Files = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns)


def listing(live: Path) -> Files:
    """Every file of the state directory a version would hold, with its size and mtime."""
    out: Files = {}
    if not live.is_dir():
        return out
    for root, dirs, names in os.walk(live):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith(".") or ".tmp" in name:
                continue
            path = os.path.join(root, name)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue  # removed as we looked
            if os.path.isfile(path):
                out[os.path.relpath(path, live)] = (st.st_size, st.st_mtime_ns)
    return out


def clone(src: Path, dst: Path) -> str:
    """``dst`` becomes a copy of ``src`` with its times: a reflink where the filesystem can,
    else a copy. Returns how: ``reflink`` or ``copy``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    how = "copy"
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
            how = "reflink"
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF,
                                 errno.EPERM):
                raise
            shutil.copyfileobj(fin, fout, 1 << 20)
    shutil.copystat(src, dst)
    return how


class Versions:
    """The kept versions of one job's state directory. One writer (the supervisor's keeper)."""

    def __init__(self, root: Path, keep: int) -> None:
        self.root = root
        self.keep = max(1, keep)
        self.index = root / "versions.jsonl"

    def list(self) -> list[dict[str, Any]]:
        """Every kept version, oldest first."""
        try:
            lines = self.index.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and (self.root / f"v{entry.get('n')}").is_dir():
                out.append(entry)
        return out

    def path(self, version: dict[str, Any]) -> Path:
        return self.root / f"v{version['n']}"

    def take(self, live: Path, step: int | None, written: float, attempt: int) -> dict[str, Any] | None:
        """A version of ``live`` as it is now, tagged with ``step`` (the latest step printed when it
        was written, at ``written``); None when nothing changed since the last version or a
        file changed while it was copied."""
        files = listing(live)
        known = self.list()
        previous = known[-1] if known else None
        before: dict[str, list[int]] = previous.get("files", {}) if previous else {}
        if not files or {k: list(v) for k, v in files.items()} == before:
            return None
        n = (max(int(v["n"]) for v in known) + 1) if known else (self._last_number() + 1)
        part = self.root / f"v{n}.part"
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        hows: dict[str, int] = {}
        size = 0
        try:
            for rel, (length, mtime) in files.items():
                src, dst = live / rel, part / rel
                if previous is not None and before.get(rel) == [length, mtime]:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.link(self.path(previous) / rel, dst)
                    how = "link"
                else:
                    how = clone(src, dst)
                    st = os.stat(src)
                    if (st.st_size, st.st_mtime_ns) != (length, mtime):
                        raise _Changed(rel)
                    size += length
                hows[how] = hows.get(how, 0) + 1
        except (_Changed, FileNotFoundError):
            shutil.rmtree(part, ignore_errors=True)
            return None
        entry = {"n": n, "step": step, "time": written, "taken": time.time(), "attempt": attempt,
                 "files": {k: list(v) for k, v in files.items()}, "bytes": size, "how": hows}
        os.replace(part, self.path(entry))
        with open(self.index, "a") as fh:
            fh.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._prune()
        return entry

    def restore(self, version: dict[str, Any], live: Path) -> Path:
        """Make ``live`` what ``version`` holds (cloned, never linked); the state directory as it
        was is kept as ``states/diverged`` (replacing an older one). Returns that place."""
        source = self.path(version)
        fresh = live.with_name(f".{live.name}.rollback")
        aside = self.root / "diverged"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        for rel in version.get("files", {}):
            clone(source / rel, fresh / rel)
        shutil.rmtree(aside, ignore_errors=True)
        if live.exists():
            try:
                os.replace(live, aside)
            except OSError:  # another filesystem: the state directory lives elsewhere
                shutil.move(str(live), str(aside))
        os.replace(fresh, live)
        return aside

    def drop_after(self, version: dict[str, Any]) -> int:
        """Forget the versions newer than ``version`` (after a rollback to it they belong to a run
        that diverged: none may be restored later). Returns how many."""
        known = self.list()
        later = [v for v in known if int(v["n"]) > int(version["n"])]
        for old in later:
            shutil.rmtree(self.path(old), ignore_errors=True)
        if later:
            kept = "".join(json.dumps(v, separators=(",", ":")) + "\n" for v in known if v not in later)
            tmp = self.index.with_name(".versions.jsonl.tmp")
            tmp.write_text(kept)
            os.replace(tmp, self.index)
        return len(later)

    def _prune(self) -> None:
        known = self.list()
        for old in known[:-self.keep]:
            shutil.rmtree(self.path(old), ignore_errors=True)
        if len(known) > self.keep:  # rewrite the index (it only ever holds K + 1 lines here)
            kept = "".join(json.dumps(v, separators=(",", ":")) + "\n" for v in known[-self.keep:])
            tmp = self.index.with_name(".versions.jsonl.tmp")
            tmp.write_text(kept)
            os.replace(tmp, self.index)

    def _last_number(self) -> int:
        numbers = [int(p.name[1:]) for p in self.root.glob("v*") if p.name[1:].isdigit()]
        return max(numbers, default=-1)


class _Changed(Exception):
    pass
