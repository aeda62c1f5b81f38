"""The code snapshot: the working directory as it was at submit time, copied into the job.

A retry or a resume then runs the code that was submitted, not whatever the files hold by
then, and remote backends have a self-contained tree to ship. What is copied:

- in a git work tree, the files git would show: tracked ones plus untracked ones that are
  not ignored (``git ls-files --cached --others --exclude-standard``), so ``.venv``,
  data and build outputs named in ``.gitignore`` stay out;
- elsewhere, every file except the usual heavy directories (``DEFAULT_EXCLUDES``);
- never what ``.phalanxignore`` (gitignore-style patterns) names, nor the phalanx home;
- always the entrypoint script itself.

Entries that are not copied (ignored data, ``.venv``, ``.git``...) are symlinked into the
snapshot at the highest level where they are missing, so relative paths such as
``--data data/train`` keep working from the snapshot. Paths that climb out of the working
directory (``../data``) do not; use absolute paths or ``--input`` for those.

A working directory larger than ``MAX_FILES`` files or ``MAX_BYTES`` is not snapshotted (the
job runs from it in place, with a warning); ``--no-snapshot`` turns snapshots off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from ..core.paths import JobPaths, write_json
from ..core.spec import EntrypointKind, JobSpec

MAX_FILES = 10_000
MAX_BYTES = 100 * 1024 * 1024
IGNORE_FILE = ".phalanxignore"
DEFAULT_EXCLUDES = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".tox", ".ipynb_checkpoints",
})
NEVER_LINKED = frozenset({"__pycache__"})  # Python makes its own in the snapshot


class IgnoreRules:
    """gitignore-style patterns: ``name`` anywhere, ``/anchored`` or ``dir/file``, ``dir/``, ``!negation``."""

    def __init__(self, lines: list[str]) -> None:
        self.rules: list[tuple[bool, bool, bool, str]] = []
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if line.startswith("**/"):
                line = line[3:]
            anchored = "/" in line
            self.rules.append((negate, dir_only, anchored, line.lstrip("/")))

    @classmethod
    def read(cls, workdir: Path) -> "IgnoreRules":
        try:
            return cls((workdir / IGNORE_FILE).read_text().splitlines())
        except OSError:
            return cls([])

    def _matches(self, rel: str, is_dir: bool) -> bool:
        hit = False
        for negate, dir_only, anchored, pattern in self.rules:
            if dir_only and not is_dir:
                continue
            if fnmatchcase(rel if anchored else rel.rsplit("/", 1)[-1], pattern):
                hit = not negate
        return hit

    def excludes(self, rel: str, is_dir: bool = False) -> bool:
        """Whether ``rel`` (posix, relative to the working directory) or a directory above it is ignored."""
        if not self.rules:
            return False
        parts = rel.split("/")
        last = len(parts) - 1
        return any(self._matches("/".join(parts[: i + 1]), is_dir or i < last) for i in range(len(parts)))


@dataclass
class Listing:
    """The files a snapshot of ``workdir`` would copy."""

    workdir: Path
    files: list[str] = field(default_factory=list)  # posix paths relative to workdir
    nbytes: int = 0
    mode: str = "walk"  # git | walk
    too_big: bool = False

    def describe(self) -> str:
        more = "more than " if self.too_big else ""
        return f"{more}{len(self.files)} files, {self.nbytes / 1e6:.0f} MB"


def list_workdir(workdir: Path, home: Path, script: str | None = None, limit: bool = True) -> Listing:
    """What to copy from ``workdir``; with ``limit``, stops once past the limits (``too_big``)."""
    workdir = workdir.resolve()
    rules = IgnoreRules.read(workdir)
    skip = _inside(home.resolve(), workdir)
    listing = Listing(workdir)
    candidates = _git_files(workdir)
    if candidates is not None:
        listing.mode = "git"
    else:
        candidates = _walk(workdir, rules, skip, MAX_FILES if limit else None)
    entry = _rel(Path(script), workdir) if script else None
    seen = set()
    for rel in [entry] if entry else []:
        seen.add(rel)
        listing.files.append(rel)
        listing.nbytes += _size(workdir / rel)
    for rel in candidates:
        if rel in seen or rules.excludes(rel) or (skip and (rel == skip or rel.startswith(skip + "/"))):
            continue
        seen.add(rel)
        path = workdir / rel
        if path.is_dir() and not path.is_symlink():  # a submodule: its files, as if not in git
            for sub in _walk(path, rules, None, None):
                listing.files.append(f"{rel}/{sub}")
                listing.nbytes += _size(path / sub)
        elif path.is_file() or path.is_symlink():
            listing.files.append(rel)
            listing.nbytes += _size(path)
        if limit and (len(listing.files) > MAX_FILES or listing.nbytes > MAX_BYTES):
            listing.too_big = True
            break
    return listing


def _rel(path: Path, workdir: Path) -> str | None:
    try:
        return path.resolve().relative_to(workdir).as_posix()
    except ValueError:
        return None


def _inside(path: Path, workdir: Path) -> str | None:
    """``path`` relative to ``workdir`` if it lies within it (posix), else None."""
    rel = _rel(path, workdir)
    return rel if rel not in (None, ".", "") else None


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _git_files(workdir: Path) -> list[str] | None:
    try:
        proc = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=workdir, capture_output=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [p for p in proc.stdout.decode(errors="surrogateescape").split("\0") if p]


def _walk(root: Path, rules: IgnoreRules, skip: str | None, most: int | None) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        dirnames[:] = sorted(d for d in dirnames if d not in DEFAULT_EXCLUDES and prefix + d != skip
                             and not rules.excludes(prefix + d, is_dir=True))
        out.extend(prefix + f for f in sorted(filenames))
        if most is not None and len(out) > most:
            break
    return out


def take(listing: Listing, dest: Path, manifest: Path) -> dict[str, int]:
    """Copy the listed files to ``dest`` (keeping times, so cached bytecode stays valid) and
    link what was left out; records both in ``manifest``."""
    dest.mkdir(parents=True, exist_ok=True)
    dirs = {""}
    for rel in listing.files:
        src, dst = listing.workdir / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        parts = rel.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        try:
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
        except FileNotFoundError:
            continue  # deleted since it was listed
    linked = _link_the_rest(listing, dest, dirs)
    write_json(manifest, {"source": str(listing.workdir), "mode": listing.mode, "files": len(listing.files),
                          "bytes": listing.nbytes, "linked": linked})
    return {"files": len(listing.files), "bytes": listing.nbytes, "linked": len(linked)}


def _link_the_rest(listing: Listing, dest: Path, dirs: set[str]) -> list[str]:
    copied = set(listing.files)
    linked = []
    for rel_dir in sorted(dirs):
        try:
            entries = list(os.scandir(listing.workdir / rel_dir))
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel in copied or rel in dirs or entry.name in NEVER_LINKED or _contains(entry.path, dest):
                continue
            os.symlink(entry.path, dest / rel)
            linked.append(rel)
    return linked


def _contains(path: str, inner: Path) -> bool:
    """Whether ``inner`` (the snapshot itself, inside the phalanx home) lies within ``path``."""
    try:
        inner.resolve().relative_to(Path(path).resolve())
        return True
    except ValueError:
        return False


def digest(listing: Listing) -> str:
    """A fingerprint of the listed files' names and contents."""
    h = hashlib.sha256()
    for rel in sorted(listing.files):
        path = listing.workdir / rel
        h.update(rel.encode() + b"\0")
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        else:
            with open(path, "rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def snapshot_job(spec: JobSpec, paths: JobPaths, home: Path) -> dict[str, int]:
    """Copy the job's working directory into ``paths.code_dir`` (at submit time)."""
    script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
    listing = list_workdir(Path(spec.workdir), home, script, limit=False)
    return take(listing, paths.code_dir, paths.code_manifest)
