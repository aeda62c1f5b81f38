"""The code reaches the pods without an image build.

The job's code snapshot and phalanx itself travel as one bundle (``storage/bundle.py``):

- **object store** (``--code-uri``, else an ``--output`` URI such as ``s3://bucket/prefix``):
  uploaded once per content (``<prefix>/phalanx-bundles/<sha256>.tar.gz``, so unchanged code
  is not uploaded again), and each attempt's Secret holds a presigned GET URL, valid for 7
  days: the pods need no credentials, only ``python3`` to download it;
- **ConfigMap**, when no object store is configured: the bundle rides in the attempt's
  ConfigMap, which holds at most 1 MiB (with the launch plan;
  https://kubernetes.io/docs/concepts/configuration/configmap/). A bigger bundle is refused
  before anything is created, saying so.

The job's state directory (its checkpoints) travels the same way, as a second archive, when
it holds files: a retry, or ``phalanx resume``, then starts from the last checkpoint that came
back from the pods. Either way the init container checks each archive's SHA-256 before it
unpacks it.
"""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ...core.spec import EntrypointKind, JobSpec, code_root
from ...errors import BackendError, UsageError
from ...storage.bundle import Bundle, build, code_files
from .manifests import BUNDLE_BYTES, BUNDLE_SHA256, BUNDLE_URL, CONFIGMAP_MAX, STATE_BYTES, STATE_SHA256, STATE_URL

URL_SECONDS = 7 * 24 * 3600  # the longest a SigV4 presigned URL may live
HEADROOM = 64 * 1024  # bytes of the ConfigMap kept for the launch plan and metadata


@dataclass(frozen=True)
class Delivery:
    """Where the bundle goes: an object store prefix, or None for the attempt's ConfigMap."""

    store: str | None

    @property
    def limit(self) -> int:
        return CONFIGMAP_MAX - HEADROOM


def choose(code_uri: str | None, output_uri: str | None) -> Delivery:
    """``--code-uri``, else an ``--output`` object store, else the ConfigMap. Pure."""
    if code_uri:
        return Delivery(code_uri.rstrip("/"))
    if output_uri and "://" in output_uri and not output_uri.startswith("file://"):
        return Delivery(output_uri.rstrip("/"))
    return Delivery(None)


def too_big(size: int, delivery: Delivery) -> UsageError:
    return UsageError(
        f"the code bundle is {size / 1024:.0f} KiB compressed, more than the {delivery.limit // 1024} KiB a ConfigMap can carry "
        "(no object store is configured)",
        "give an object store for the code with --code-uri s3://BUCKET/PREFIX (or --output s3://...), "
        "or leave data out of the code with a .phalanxignore",
    )


def build_for(code: Iterable[tuple[str, Path]], dest: Path, delivery: Delivery) -> Bundle:
    """Build the bundle; raises UsageError when it cannot travel the way chosen."""
    bundle = build(code, dest)
    if delivery.store is None and bundle.size > delivery.limit:
        raise too_big(bundle.size, delivery)
    return bundle


def estimate(spec: JobSpec, home: Path, delivery: Delivery) -> None:
    """Before anything is created: build the bundle the snapshot will give (to a temporary
    file) and refuse it if it cannot travel the way chosen. Raises UsageError."""
    if delivery.store is not None:
        return  # an object store takes bundles up to the bundle's own limit, checked at build
    from ...storage.snapshot import list_workdir

    workdir = Path(code_root(spec))  # what the snapshot freezes (the script's own directory when outside)
    script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
    listing = list_workdir(workdir, home, script)
    files = [(rel, workdir / rel) for rel in listing.files if (workdir / rel).is_file() and not (workdir / rel).is_symlink()]
    from ...core.paths import HomePaths

    with tempfile.TemporaryDirectory(prefix="phx-bundle-") as tmp:
        bundle = build_for(files, Path(tmp) / "bundle.tar.gz", delivery)
        # A job without a shared state directory (no --name, no --state) gets its own, new and
        # empty (storage/statedir.py): only a shared one can already hold files to ship.
        shared = spec.state_name
        state = pack(HomePaths(home).state_dir(shared), Path(tmp) / "state.tar.gz") if shared else None
        if state is not None and bundle.size + state.size > delivery.limit:
            raise UsageError(f"the code ({bundle.size >> 10} KiB) and the state directory ({state.size >> 10} KiB, compressed) "
                             f"are more than the {delivery.limit >> 10} KiB a ConfigMap can carry",
                             "give an object store with --code-uri s3://BUCKET/PREFIX (or --output s3://...), or --clean-state")


def ship(code_dir: Path, delivery: Delivery, state_dir: Path | None = None) -> dict[str, str | None]:
    """Build the bundle of ``code_dir`` (and the archive of ``state_dir`` when it holds files)
    and put them where the pods fetch them; returns the values of the manifests' placeholders.
    Raises UsageError (too big) or BackendError (upload)."""
    with tempfile.TemporaryDirectory(prefix="phx-bundle-") as tmp:
        bundle = build_for(code_files(code_dir), Path(tmp) / "bundle.tar.gz", delivery)
        state = pack(state_dir, Path(tmp) / "state.tar.gz") if state_dir is not None else None
        values: dict[str, str | None] = {BUNDLE_SHA256: bundle.sha256, STATE_SHA256: state.sha256 if state else "",
                                         STATE_URL: "", STATE_BYTES: None}
        if delivery.store is None:
            if state is not None and bundle.size + state.size > delivery.limit:
                raise UsageError(f"the code ({bundle.size >> 10} KiB) and the state directory ({state.size >> 10} KiB, "
                                 f"compressed) are more than the {delivery.limit >> 10} KiB a ConfigMap can carry",
                                 "give an object store with --code-uri s3://BUCKET/PREFIX (or --output s3://...), "
                                 "or --clean-state")
            values[BUNDLE_BYTES] = base64.b64encode(bundle.path.read_bytes()).decode()
            if state is not None:
                values[STATE_BYTES] = base64.b64encode(state.path.read_bytes()).decode()
                values[STATE_URL] = "/phx-launch/state.tar.gz"
        else:
            values[BUNDLE_URL] = upload(bundle, delivery.store, "phalanx-bundles")
            if state is not None:
                values[STATE_URL] = upload(state, delivery.store, "phalanx-state")
        return values


def pack(directory: Path, dest: Path) -> Bundle | None:
    """``directory``'s regular files as a deterministic tar.gz (None when it holds none)."""
    import gzip
    import hashlib
    import tarfile

    files = [(rel, path) for rel, path in code_files(directory)] if directory.is_dir() else []
    if not files:
        return None
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path in files:
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, int(path.stat().st_mtime)
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()
    return Bundle(dest, digest, dest.stat().st_size, len(files))


def upload(bundle: Bundle, store: str, folder: str) -> str:
    """Upload ``bundle`` under ``store`` (unless it is there already); its presigned URL."""
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"uploading the code to {store} needs fsspec", "pip install 'phalanx[storage]'") from None
    target = f"{store}/{folder}/{bundle.sha256}.tar.gz"
    try:
        fs, path = fsspec.core.url_to_fs(target)
        if not fs.exists(path):
            fs.put_file(str(bundle.path), path)
        url = fs.sign(path, expiration=URL_SECONDS)
    except NotImplementedError:
        raise UsageError(f"{store.split('://')[0]}:// cannot make presigned URLs, which pods fetch the code with",
                         "use an s3:// or gs:// prefix for --code-uri") from None
    except ImportError as exc:
        raise UsageError(f"uploading the code to {store} needs {exc.name}", "pip install 'phalanx[storage]'") from None
    except Exception as exc:  # noqa: BLE001 - any store's error is reported the same way
        raise BackendError(f"uploading the code bundle to {target} failed: {exc}",
                           "check the object store's address and credentials (--code-uri / --output)") from None
    return str(url)
