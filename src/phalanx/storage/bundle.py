"""A job's code and phalanx itself as one archive, for backends whose nodes have neither.

Kubernetes pods, SageMaker instances and Ray workers start from an image that knows nothing
of phalanx. Rather than asking users to build and push an image for every change, a backend
ships this archive; the image then needs only ``python3`` (and the user's framework):

::

    bundle.tar.gz
      code/...            the job's code snapshot (regular files only: linked data stays home)
      lib/phalanx/...     the phalanx package that built the bundle (sources, static assets)
      bundle.json         {"format": 1, "phalanx": VERSION, "files": N}

On the node, ``PYTHONPATH=<dir>/lib`` makes ``python3 -m phalanx.launch.agent`` importable.

The archive is deterministic (sorted names, fixed owner and times), so the same code gives
the same digest and an unchanged bundle need not be uploaded twice. ``FETCH`` is a one-line
Python program, standard library only, that a node runs to download, check and unpack it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import UsageError

FORMAT = 1
# Above this a bundle is refused: a code directory this large holds data, which belongs in
# an input channel (--input), not in the code that every node downloads at start.
MAX_BYTES = 512 * 1024 * 1024
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str
    size: int  # bytes of the compressed archive
    files: int


def code_files(code_dir: Path) -> Iterator[tuple[str, Path]]:
    """(name inside ``code/``, file) for every regular file under ``code_dir``.

    Symlinks are skipped, not followed: the snapshot links what it left out (data, ``.venv``),
    and those must not travel with the code. Nor does the user's secrets file (a ``--no-snapshot``
    working directory that holds it)."""
    from ..config import secrets_filter

    is_secrets_file = secrets_filter()
    for dirpath, dirnames, filenames in os.walk(code_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file() or name.endswith(_SKIP_SUFFIXES) or is_secrets_file(path):
                continue
            yield path.relative_to(code_dir).as_posix(), path


def phalanx_files() -> Iterator[tuple[str, Path]]:
    """(name inside ``lib/``, file) for the installed phalanx package itself."""
    package = Path(__file__).resolve().parent.parent
    for rel, path in code_files(package):
        yield f"phalanx/{rel}", path


def build(code: Iterable[tuple[str, Path]], dest: Path, max_bytes: int = MAX_BYTES) -> Bundle:
    """Write the bundle of ``code`` (pairs from ``code_files``) and phalanx to ``dest``.

    Raises UsageError, naming the largest files, when the code is bigger than ``max_bytes``."""
    from importlib.metadata import PackageNotFoundError, version

    entries = [(f"code/{rel}", path) for rel, path in code] + [(f"lib/{rel}", path) for rel, path in phalanx_files()]
    total = sum(path.stat().st_size for _, path in entries)
    if total > max_bytes:
        largest = sorted(entries, key=lambda e: e[1].stat().st_size, reverse=True)[:3]
        names = ", ".join(f"{name[len('code/'):]} ({path.stat().st_size >> 20} MiB)" for name, path in largest)
        raise UsageError(
            f"the code to ship is {total >> 20} MiB, more than the {max_bytes >> 20} MiB a bundle may hold (largest: {names})",
            "list data in .phalanxignore and pass it with --input NAME=URI instead",
        )
    try:
        phalanx_version = version("phalanx")
    except PackageNotFoundError:
        phalanx_version = "unknown"
    meta = json.dumps({"format": FORMAT, "phalanx": phalanx_version, "files": len(entries)}, sort_keys=True).encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    # No name and mtime=0 in the gzip header, fixed metadata per member: same input, same bytes.
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in sorted(entries):
            info = _member(name, path.stat().st_size, path.stat().st_mode & 0o111)
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
        tar.addfile(_member("bundle.json", len(meta), 0), io.BytesIO(meta))
    os.replace(tmp, dest)
    return Bundle(dest, _sha256(dest), dest.stat().st_size, len(entries))


def _member(name: str, size: int, exec_bits: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644 | (0o111 if exec_bits else 0)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(archive: Path, dest: Path) -> None:
    """Unpack a bundle into ``dest`` (``code/``, ``lib/``), refusing names that leave it."""
    with tarfile.open(archive, "r:gz") as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python without extraction filters (before 3.10.12 / 3.11.4)
            for member in tar.getmembers():
                target = (dest / member.name).resolve()
                if not (member.isfile() or member.isdir()) or not str(target).startswith(str(dest.resolve())):
                    raise ValueError(f"refusing bundle member {member.name!r}")
            tar.extractall(dest)


# What a node runs to fetch a bundle, with nothing but python3: download PHX_BUNDLE_URL, check
# it against PHX_BUNDLE_SHA256 (when set), unpack into PHX_BUNDLE_DIR. Exit 1 with one line on
# failure (a node's log then says why). Kept on one line so it fits a manifest's command.
FETCH = (
    "import hashlib,io,os,sys,tarfile,urllib.request as u;"
    "e=os.environ;d=e.get('PHX_BUNDLE_DIR','/phx');url=e['PHX_BUNDLE_URL'];"
    "b=u.urlopen(url,timeout=120).read() if '://' in url else open(url,'rb').read();"
    "h=hashlib.sha256(b).hexdigest();w=e.get('PHX_BUNDLE_SHA256');"
    "(w and w!=h) and sys.exit('phalanx: bundle digest %s, expected %s' % (h,w));"
    "t=tarfile.open(fileobj=io.BytesIO(b),mode='r:gz');"
    "os.makedirs(d,exist_ok=True);"
    "t.extractall(d,filter='data') if hasattr(tarfile,'data_filter') else t.extractall(d);"
    "print('phalanx: bundle %s (%d bytes) unpacked in %s' % (h[:12],len(b),d),flush=True)"
)
