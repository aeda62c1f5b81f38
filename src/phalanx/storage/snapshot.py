"""The code snapshot: the job's code as it was at submit time, costing kilobytes, not copies.

A retry, a resume or a queued sweep trial then runs the code that was submitted, not whatever
the files hold by then (``launch/frozen.py`` reads Python code from the snapshot while the job
runs in the user's own directory), and remote backends have a self-contained tree to ship.

What is taken, from the code root (``core.spec.code_root``: the working directory, or the
script's directory when the script lies outside it):

- in a git work tree, the files git would show: tracked ones plus untracked ones that are not
  ignored (``git ls-files --cached --others --exclude-standard``);
- elsewhere, every file except the usual heavy directories (``DEFAULT_EXCLUDES``) and what the
  ``.gitignore`` files name;
- never what ``.phalanxignore`` (gitignore-style patterns) names, nor the phalanx home, nor the
  user's secrets file (``config.secrets_filter``) should it lie inside;
- never a file over ``LARGE_FILE`` that is not Python source (data, checkpoints, archives), unless
  a ``!pattern`` line of ``.phalanxignore`` names it; ``Listing.skipped`` says what was left out;
- always the entrypoint script itself.

A snapshot of more than ``MAX_FILES`` files or ``MAX_BYTES`` is refused (``check``): that much
beside the code is data, which belongs in ``.phalanxignore`` or an input channel.

Storage: every file's bytes are stored once, by content, in ``$PHALANX_HOME/cache/code/objects/``
(read-only; ``<sha256>`` or ``<sha256>.x`` for executables), and a job's ``code/`` directory is a
tree of hard links to them, so ten runs of an unchanged project add directory entries, not
bytes, and ``storage.bundle.code_files`` still sees plain files. Where hard links are not
possible (another filesystem), files are copied.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from ..core.paths import HomePaths, JobPaths, write_json
from ..core.spec import EntrypointKind, JobSpec, code_root
from ..errors import UsageError

MAX_FILES = 10_000
MAX_BYTES = 100 * 1024 * 1024
LARGE_FILE = 1024 * 1024  # a file above this that is not Python source is data, not code
PYTHON_SUFFIXES = (".py", ".pyi", ".pyx", ".pxd")
IGNORE_FILE = ".phalanxignore"
GITIGNORE = ".gitignore"
DEFAULT_EXCLUDES = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".tox", ".ipynb_checkpoints",
})


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
    def read(cls, workdir: Path, name: str = IGNORE_FILE) -> "IgnoreRules":
        try:
            return cls((workdir / name).read_text().splitlines())
        except (OSError, UnicodeDecodeError):
            return cls([])

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """The last rule matching ``rel`` itself: True ignores, False re-includes; None: no rule."""
        hit = None
        for negate, dir_only, anchored, pattern in self.rules:
            if dir_only and not is_dir:
                continue
            if fnmatchcase(rel if anchored else rel.rsplit("/", 1)[-1], pattern):
                hit = not negate
        return hit

    def excludes(self, rel: str, is_dir: bool = False) -> bool:
        """Whether ``rel`` (posix, relative to the rules' directory) or a directory above it is ignored."""
        if not self.rules:
            return False
        parts = rel.split("/")
        last = len(parts) - 1
        return any(self.decide("/".join(parts[: i + 1]), is_dir or i < last) for i in range(len(parts)))

    def includes(self, rel: str) -> bool:
        """Whether a ``!pattern`` names ``rel`` (a large file taken after all)."""
        return self.decide(rel, False) is False


@dataclass
class Listing:
    """The files a snapshot of ``workdir`` (the code root) takes."""

    workdir: Path
    home: Path | None = None  # the phalanx home, whose code store the snapshot fills
    files: list[str] = field(default_factory=list)  # posix paths relative to workdir
    nbytes: int = 0
    mode: str = "walk"  # git | walk
    too_big: bool = False
    skipped: list[tuple[str, int]] = field(default_factory=list)  # large non-code files left out
    hashes: dict[str, str] = field(default_factory=dict)  # rel -> sha256, once computed

    def describe(self) -> str:
        more = "more than " if self.too_big else ""
        return f"{more}{len(self.files)} files, {self.nbytes / 1e6:.0f} MB"

    def skipped_line(self) -> str | None:
        """One line: what large files were left out, and how to take one anyway."""
        if not self.skipped:
            return None
        largest = sorted(self.skipped, key=lambda s: -s[1])
        names = ", ".join(f"{rel} ({size / 1e6:.1f} MB)" for rel, size in largest[:3])
        more = f" and {len(largest) - 3} more" if len(largest) > 3 else ""
        total = sum(size for _, size in largest) / 1e6
        return (f"code snapshot: left out {len(largest)} large file(s) that are not Python source, {total:.0f} MB: "
                f"{names}{more}; the job reads them live from {self.workdir}; to freeze one, add "
                f"'!{largest[0][0]}' to {IGNORE_FILE}")


def list_workdir(workdir: Path, home: Path, script: str | None = None, limit: bool = True) -> Listing:
    """What a snapshot of ``workdir`` takes; with ``limit``, stops once past the limits (``too_big``)."""
    workdir = workdir.resolve()
    rules = IgnoreRules.read(workdir)
    skip = _inside(home.resolve(), workdir)
    listing = Listing(workdir, home)
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
    from ..config import secrets_filter

    is_secrets_file = secrets_filter()
    for rel in candidates:
        if rel in seen or rules.excludes(rel) or (skip and (rel == skip or rel.startswith(skip + "/"))):
            continue
        if is_secrets_file(workdir / rel):  # the user's secrets, kept in the project: never copied
            continue
        seen.add(rel)
        path = workdir / rel
        if path.is_dir() and not path.is_symlink():  # a submodule: its files, as if not in git
            for sub in _walk(path, rules, None, None):
                _add(listing, f"{rel}/{sub}", path / sub, rules)
        elif path.is_file() or path.is_symlink():
            _add(listing, rel, path, rules)
        if limit and (len(listing.files) > MAX_FILES or listing.nbytes > MAX_BYTES):
            listing.too_big = True
            break
    return listing


def _add(listing: Listing, rel: str, path: Path, rules: IgnoreRules) -> None:
    size = _size(path)
    if size > LARGE_FILE and not path.is_symlink() and not rel.endswith(PYTHON_SUFFIXES) and not rules.includes(rel):
        listing.skipped.append((rel, size))
        return
    listing.files.append(rel)
    listing.nbytes += size


def check(listing: Listing, script: str | None = None) -> None:
    """Refuse a snapshot too big to be code, before anything is copied. Raises UsageError."""
    if listing.too_big or len(listing.files) > MAX_FILES or listing.nbytes > MAX_BYTES:
        raise UsageError(
            f"{listing.workdir} is too big for a code snapshot ({listing.describe()} that are not large data files; "
            f"a snapshot takes at most {MAX_FILES} files and {MAX_BYTES >> 20} MB)", _smaller(listing.workdir, script))


def _smaller(root: Path, script: str | None) -> str:
    """How to snapshot less: a project of its own (the script's directory, when the command was
    typed above it: ``cd / && phalanx run /home/me/proj/train.py``), the ignore file (never in
    ``/``, which is no project), or no snapshot."""
    ways = []
    here = Path(script).resolve().parent if script else None
    if here is not None and here != root:
        ways.append(f"the script's directory {here}, not {root}, can be the project: run from there "
                    f"(cd {here}) or add --workdir {here}")
    elif root == Path(root.anchor):
        ways.append(f"{root} is no project: run from your project's directory, or add --workdir DIR")
    if root != Path(root.anchor):
        ways.append(f"list data, outputs and environments in {IGNORE_FILE} (gitignore patterns) or move them out of "
                    "the project")
    return "; or ".join(ways) + ", or run the code live with --no-snapshot"


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
    """Files under ``root`` (no symlinked directories), minus heavy directories, ``.gitignore``d
    paths (every level's, as git reads them) and ``rules``."""
    out: list[str] = []
    gitignores: list[tuple[str, IgnoreRules]] = []  # (directory prefix, its .gitignore), outer first

    def ignored(rel: str, is_dir: bool) -> bool:
        verdict = None
        for prefix, found in gitignores:
            if rel.startswith(prefix):
                decided = found.decide(rel[len(prefix):], is_dir)
                verdict = decided if decided is not None else verdict
        return bool(verdict) or rules.excludes(rel, is_dir)

    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        if GITIGNORE in filenames:
            found = IgnoreRules.read(Path(dirpath), GITIGNORE)
            if found.rules:
                gitignores.append((prefix, found))
        dirnames[:] = sorted(d for d in dirnames if d not in DEFAULT_EXCLUDES and prefix + d != skip
                             and not ignored(prefix + d, True))
        out.extend(prefix + f for f in sorted(filenames) if not ignored(prefix + f, False))
        if most is not None and len(out) > most:
            break
    return out


def hash_files(listing: Listing) -> dict[str, str]:
    """sha256 of every listed file (of the link text for a symlink), computed once."""
    for rel in listing.files:
        if rel in listing.hashes:
            continue
        path = listing.workdir / rel
        try:
            if path.is_symlink():
                listing.hashes[rel] = hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
            else:
                with open(path, "rb") as fh:
                    listing.hashes[rel] = hashlib.file_digest(fh, "sha256").hexdigest()
        except OSError:
            continue  # deleted since it was listed
    return listing.hashes


def digest(listing: Listing) -> str:
    """A fingerprint of the listed files' names and contents."""
    h = hashlib.sha256()
    hashes = hash_files(listing)
    for rel in sorted(listing.files):
        if rel in hashes:
            h.update(os.fsencode(rel) + b"\0" + hashes[rel].encode())  # a name's bytes, UTF-8 or not
    return h.hexdigest()


def take(listing: Listing, dest: Path, manifest: Path) -> dict[str, int]:
    """Lay the listed files out in ``dest`` as hard links into the home's content store (adding
    what it lacks; times kept, so cached bytecode stays valid); records them in ``manifest``."""
    store = HomePaths(listing.home).code_objects if listing.home else None
    dest.mkdir(parents=True, exist_ok=True)
    hashes = hash_files(listing)
    added = 0
    for rel in listing.files:
        src, dst = listing.workdir / rel, dest / rel
        if rel not in hashes:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            elif store is None:
                shutil.copy2(src, dst)
            else:
                added += _link_stored(src, dst, store, hashes[rel])
        except FileNotFoundError:
            continue  # deleted since it was listed
    write_json(manifest, {"source": str(listing.workdir), "mode": listing.mode, "files": len(listing.files),
                          "bytes": listing.nbytes, "stored_bytes": added, "digest": digest(listing),
                          "skipped": [list(s) for s in listing.skipped[:100]], "skipped_count": len(listing.skipped)})
    return {"files": len(listing.files), "bytes": listing.nbytes, "stored_bytes": added, "skipped": len(listing.skipped)}


def _link_stored(src: Path, dst: Path, store: Path, sha: str) -> int:
    """Hard-link ``dst`` to the stored copy of ``src`` (storing it first if new); bytes added."""
    executable = os.access(src, os.X_OK)
    obj = store / sha[:2] / (sha + (".x" if executable else ""))
    added = 0
    if not obj.exists():
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = obj.parent / f".{sha}.{os.getpid()}.{secrets.token_hex(3)}"
        shutil.copy2(src, tmp)
        os.chmod(tmp, 0o555 if executable else 0o444)  # shared by every job that links it
        os.replace(tmp, obj)  # another job storing the same bytes meanwhile is harmless
        added = obj.stat().st_size
    try:
        os.link(obj, dst)
    except OSError:  # another filesystem, or no hard links there: a copy of our own
        shutil.copy2(obj, dst)
    return added


def freeze(spec: JobSpec, home: Path, dest: Path, manifest: Path) -> dict[str, int]:
    """Snapshot the code of ``spec`` (its code root) into ``dest``."""
    script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
    return take(list_workdir(Path(code_root(spec)), home, script, limit=False), dest, manifest)


def snapshot_job(spec: JobSpec, paths: JobPaths, home: Path) -> dict[str, int]:
    """Snapshot the job's code into ``paths.code_dir`` (at submit time)."""
    return freeze(spec, home, paths.code_dir, paths.code_manifest)


def preflight(spec: JobSpec, home: Path) -> Listing:
    """What the snapshot of ``spec`` will take; refuses one that is too big (UsageError)."""
    script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
    listing = list_workdir(Path(code_root(spec)), home, script)
    check(listing, script)
    return listing
