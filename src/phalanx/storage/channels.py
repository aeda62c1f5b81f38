"""Input channels: ``--input NAME=URI`` made available as a local directory before the job starts.

- A local path (or ``file://``) is used in place: no copy. ``PHALANX_CHANNEL_<NAME>`` is the path.
- Anything else (``s3://``, ``gs://``, ``http(s)://``... through fsspec) is downloaded into the
  cache, ``$PHALANX_HOME/cache/channels/<sha256(source)[:16]>/`` (``HomePaths.channel_cache``),
  and the variable points at that directory: a prefix arrives as its tree, a single object as
  one file inside it. The cache remembers each file's size and version (ETag or mtime), so a
  repeated run downloads only what changed and removes what disappeared at the source.
- ``#extract`` unpacks an archive (.tar, .tar.gz, .zip...) into the cache instead; it is
  unpacked again only when the archive changed.

Staging holds a lock per cache entry, so jobs sharing an input wait for each other instead of
downloading twice. Files arrive whole (see ``transfer``): a crash mid-way leaves the complete
files of the previous staging and no partial ones.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import tarfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ..core.paths import ChannelCachePaths, HomePaths, read_json, write_json
from ..core.spec import Channel, JobSpec
from ..errors import PhalanxError, UsageError
from .transfer import Item, Progress, RemoteFile, check_store, download, filesystem, human_size, list_files, local_path
from .uri import validate_uri

INPUT_SCHEMES = ("http", "https")  # readable, on top of the stores --state and --output accept

Say = Callable[[str], None]


def is_single_file(channel: Channel) -> bool:
    """Whether the job reads ``channel`` as one local file: backends that ship inputs to their
    nodes copy it into a directory there and point the job at the file inside."""
    return not channel.is_remote and not channel.extract and Path(channel.source).is_file()


class ChannelError(PhalanxError):
    pass


def resolve_source(uri: str, base: Path, name: str) -> str:
    """What a (non-``job:``) input URI points at: an absolute path, or a checked ``scheme://`` URI."""
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if "://" in uri:
        return validate_uri(uri, what=f"--input {name}", extra_schemes=INPUT_SCHEMES)
    return str((base / os.path.expanduser(uri)).resolve())


def check(spec: JobSpec) -> None:
    """Fail now, with the input's name and a fix, if any input cannot be read."""
    for channel in spec.channels:
        what = f"input '{channel.name}'"
        if not channel.is_remote:
            if not os.path.exists(channel.source):
                raise UsageError(f"{what}: {channel.source} does not exist", f"check the path given to --input {channel.name}")
            if channel.extract and not os.path.isfile(channel.source):
                raise UsageError(f"{what}: {channel.source} is not an archive file", "give a .tar, .tar.gz or .zip file, or drop #extract")
            continue
        fs, root = filesystem(channel.source)
        check_store(fs, root, channel.source, f"--input {channel.name}", what=what)
        try:
            fs.info(root)
        except FileNotFoundError:
            raise ChannelError(f"{what}: nothing at '{channel.source}'", "check the URI, or upload the data first") from None
        except Exception as exc:  # noqa: BLE001 - client errors (credentials, network) are not all OSErrors
            raise ChannelError(f"cannot read {what} at '{channel.source}': {exc or type(exc).__name__}",
                               "check the URI, the endpoint and the credentials") from None


def stage(home: HomePaths, spec: JobSpec, say: Say) -> None:
    """Make every input of ``spec`` available at ``home.channel_path(channel)``. Blocking.

    Raises ChannelError (or TransferError) naming the input that could not be staged."""
    for channel in spec.channels:
        if not channel.is_remote and not channel.extract:
            continue  # used in place
        cache = home.channel_cache(channel.source, channel.extract)
        with _locked(cache, channel, say):
            try:
                if channel.extract:
                    _stage_archive(channel, cache, say)
                else:
                    _stage_tree(channel, cache, say)
            except PhalanxError:
                raise
            except Exception as exc:  # noqa: BLE001 - a client error must fail the job, not the supervisor
                raise ChannelError(f"staging input '{channel.name}' from {channel.source} failed: {exc or type(exc).__name__}",
                                   "check the URI, the endpoint and the credentials") from exc


@contextmanager
def _locked(cache: ChannelCachePaths, channel: Channel, say: Say) -> Iterator[None]:
    cache.lock.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"input {channel.name}: waiting for another job that is staging {channel.source}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _listing(channel: Channel) -> tuple[Any, str, list[RemoteFile]]:
    fs, root = filesystem(channel.source)
    try:
        return fs, root, list_files(fs, root)
    except FileNotFoundError:
        raise ChannelError(f"input '{channel.name}': nothing at '{channel.source}'", "check the URI, or upload the data first") from None


def _stage_tree(channel: Channel, cache: ChannelCachePaths, say: Say) -> None:
    fs, _, files = _listing(channel)
    old = read_json(cache.manifest) or {}
    had: dict[str, Any] = old.get("files", {}) if old.get("source") == channel.source else {}
    items = []
    for f in files:
        dst = local_path(cache.data, f.rel)
        if had.get(f.rel) == {"size": f.size, "version": f.version} and _has_size(dst, f.size):
            continue
        items.append(Item(f.path, str(dst), f.size))
    for rel in set(had) - {f.rel for f in files}:
        (cache.data / rel).unlink(missing_ok=True)  # gone at the source
    cache.data.mkdir(parents=True, exist_ok=True)
    total = sum(i.size or 0 for i in items)
    started = time.monotonic()
    with Progress(f"input {channel.name}", total, say) as progress:
        download(fs, items, cache.partial, progress)
    write_json(cache.manifest, {
        "source": channel.source, "staged_at": time.time(),
        "files": {f.rel: {"size": f.size, "version": f.version} for f in files},
    })
    reused = len(files) - len(items)
    if items:
        say(f"input {channel.name}: {len(items)} file(s), {human_size(total)} from {channel.source} "
            f"in {time.monotonic() - started:.1f}s" + (f" ({reused} unchanged)" if reused else ""))
    else:
        say(f"input {channel.name}: {len(files)} file(s) unchanged since the last download (cache)")


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _stage_archive(channel: Channel, cache: ChannelCachePaths, say: Say) -> None:
    if channel.is_remote:
        fs, root, files = _listing(channel)
        if len(files) != 1 or files[0].path != root:
            raise ChannelError(f"input '{channel.name}': '{channel.source}' is a directory, not an archive", "#extract needs one archive file")
        archive: RemoteFile | None = files[0]
        version = f"{files[0].size}:{files[0].version}"
    else:
        st = os.stat(channel.source)
        archive, version = None, f"{st.st_size}:{st.st_mtime_ns}"
    old = read_json(cache.manifest) or {}
    if old.get("source") == channel.source and old.get("archive") == version and cache.data.is_dir():
        say(f"input {channel.name}: {channel.source} unchanged since it was last extracted (cache)")
        return
    work = cache.partial / secrets.token_hex(4)
    work.mkdir(parents=True)
    try:
        local = channel.source
        if archive is not None:
            local = str(work / archive.rel)
            with Progress(f"input {channel.name}", archive.size, say) as progress:
                download(fs, [Item(archive.path, local, archive.size)], cache.partial, progress)
        started = time.monotonic()
        _extract(local, work / "tree", channel)
        if cache.data.exists():
            os.replace(cache.data, work / "previous")  # swapped out whole, then removed
        os.replace(work / "tree", cache.data)
        write_json(cache.manifest, {"source": channel.source, "archive": version, "staged_at": time.time()})
        say(f"input {channel.name}: extracted {os.path.basename(channel.source)} in {time.monotonic() - started:.1f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        try:
            cache.partial.rmdir()
        except OSError:
            pass


def _extract(archive: str, dest: Path, channel: Channel) -> None:
    dest.mkdir()
    try:
        if archive.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(dest)  # ZipFile drops absolute paths and '..' components
        else:
            with tarfile.open(archive, "r:*") as tf:
                tf.extractall(dest, filter="data")  # refuses links and paths leaving dest
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise ChannelError(f"input '{channel.name}': cannot extract {os.path.basename(archive)}: {exc}",
                           "check that the file is a valid archive") from None
