"""A job submitted from another machine: its code and its local inputs arrive as manifests of
objects the server already holds (``storage/objects.py``; the client sent only what it lacked),
and the spec the client built is made to run here.

- The code tree is laid out, as writable copies, in ``$PHALANX_HOME/shipped/<id>/`` (the id is
  the job's or the sweep's): that is the job's working directory, as the shipped copy is on an
  ssh host (``core.spec.in_snapshot(..., shipped=True)``): relative paths resolve inside it, the
  script is its copy there, files written to cwd stay on the server. The job is then submitted
  with its code snapshot as any local job (so retries run the code as submitted).
- A local ``--input`` directory or file is laid out once per content (hard links, read-only) in
  ``$PHALANX_HOME/cache/uploads/<digest>/`` and the channel reads from there; URIs pass through.
- The interpreter is the server's (the client's path means nothing here); the ranks get
  ``PHALANX_USER``, who submitted the job (the environment contract's server mode). That also
  says whose secrets the job reads: the submitter's, in this server's table
  (``secrets/server.py``: checked at submit, read by the supervisor as each attempt starts).

If anything fails before the job exists, the shipped directory goes again: nothing half-made
stays behind. A server killed in between leaves a ``shipped/<id>`` no job names: while a submit
lays one out, ``shipped/.<id>.owner`` names the process doing it (machine, pid, start time), and
once that process is gone and no job or sweep has the id, ``sweep_abandoned`` removes both (any
replica on that machine, every few seconds); ``sweep_orphans`` removes, when a server starts,
those older than an hour that no marker explains.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.env import python_as_typed
from ..core.paths import HomePaths
from ..core.spec import EntrypointKind, JobSpec, in_snapshot
from ..errors import UsageError
from ..storage import objects
from ..store import Store

UPLOADS = ("cache", "uploads")


def decode_spec(data: Any) -> JobSpec:
    try:
        spec = JobSpec.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise UsageError(f"request.spec is not a job spec: {exc}", "send what JobSpec.to_dict() makes") from None
    return spec


def entries(data: Any, where: str) -> list[objects.Entry]:
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise UsageError(f"{where}: expected an object with a list 'files'", "see the API in docs/server.md")
    out = [objects.Entry.from_wire(item) for item in data["files"]]
    seen: set[str] = set()
    for entry in out:
        if entry.path in seen:
            raise UsageError(f"{where} names '{entry.path}' twice", "send each file once")
        seen.add(entry.path)
    return out


def receive(home: HomePaths, body: dict[str, Any], ship_id: str, user: str, plan_only: bool = False) -> JobSpec:
    """The client's spec made to run here, its code laid out under ``home.shipped(ship_id)``
    (with ``plan_only``: nothing laid out, for a dry run), submitted by ``user`` (the ranks'
    ``PHALANX_USER``). Raises UsageError; on any error the shipped directory is gone again."""
    spec = decode_spec(body["spec"])
    spec = spec.with_(env={**spec.env, "PHALANX_USER": user})
    code = entries(body["code"], "request.code") if body.get("code") else None
    dest = home.shipped(ship_id)
    if not plan_only:
        mark(home, ship_id)
    try:
        if code is not None and not plan_only:
            lacking = objects.missing(home, {(e.sha, e.executable) for e in code if e.link is None})
            if lacking:
                raise UsageError(f"the server lacks {len(lacking)} file(s) of the code", "submit again (they are sent first)")
            objects.lay_out(home, code, dest, copy=True)
        return _rebased(spec, dest, code is not None, _inputs(home, body.get("inputs") or {}, plan_only))
    except BaseException:
        if not plan_only:
            abandon(home, ship_id)
        raise


def _rebased(spec: JobSpec, dest: Path, shipped: bool, sources: dict[str, str]) -> JobSpec:
    channels = []
    for channel in spec.channels:
        if channel.uri.startswith("job:"):  # a job of this server's store, resolved now (retries read the same)
            from ..api.query import resolve_job_input

            channels.append(replace(channel, source=resolve_job_input(channel.uri)))
        elif channel.is_remote:
            channels.append(channel)
        elif channel.name in sources:
            channels.append(replace(channel, source=sources[channel.name]))
        else:
            raise UsageError(f"input '{channel.name}' is a local path ({channel.uri}) whose files were not sent",
                             "submit again with the same phalanx on both ends")
    spec = spec.with_(channels=tuple(channels), python=python_as_typed())
    if not shipped:
        if spec.entrypoint.kind is EntrypointKind.SCRIPT:
            raise UsageError("a script was submitted without its code", "submit again with the same phalanx on both ends")
        return spec.with_(workdir=str(dest.parent), snapshot=False, code_dir="")
    root = spec.workdir if spec.entrypoint.kind is not EntrypointKind.SCRIPT else None
    rebased = in_snapshot(spec, str(dest), shipped=True)
    entry = rebased.entrypoint
    if entry.kind is EntrypointKind.COMMAND and root and os.path.isabs(entry.target) \
            and os.path.commonpath([root, entry.target]) == root:  # ./run.sh in the project: its copy
        entry = replace(entry, target=os.path.join(str(dest), os.path.relpath(entry.target, root)))
    return rebased.with_(entrypoint=entry, snapshot=True)


def _inputs(home: HomePaths, data: Any, plan_only: bool) -> dict[str, str]:
    """Each local input, laid out once per content; name -> where its channel reads."""
    if not isinstance(data, dict):
        raise UsageError("request.inputs: expected an object", "see the API in docs/server.md")
    out = {}
    for name, item in data.items():
        files = entries(item, f"request.inputs.{name}")
        single = bool(item.get("single"))
        digest = objects.digest(files)
        where = home.root.joinpath(*UPLOADS, digest)
        if not plan_only and not where.exists():
            lacking = objects.missing(home, {(e.sha, e.executable) for e in files if e.link is None})
            if lacking:
                raise UsageError(f"the server lacks {len(lacking)} file(s) of input '{name}'", "submit again")
            tmp = where.parent / f".{digest}.{os.getpid()}.{secrets.token_hex(3)}"
            objects.lay_out(home, files, tmp, copy=False)
            try:
                os.rename(tmp, where)
            except OSError:  # another submit laid the same content out meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
        out[name] = str(where / files[0].path) if single and len(files) == 1 else str(where)
    return out


def sweep_orphans(home: HomePaths, store: Store, older_than: float = 3600.0) -> list[str]:
    """Shipped directories of submits that died before their job or sweep was recorded (left
    alone while younger than ``older_than`` seconds: another replica may be submitting it)."""
    import time

    root = home.root / "shipped"
    gone = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if child.name.startswith("."):  # a submit's marker (``sweep_abandoned``)
            continue
        try:
            if time.time() - child.stat().st_mtime < older_than:
                continue
            store.get(child.name)
            continue
        except UsageError:
            try:
                store.sweeps.get(child.name)
                continue
            except UsageError:
                pass
        except OSError:
            continue
        shutil.rmtree(child, ignore_errors=True)
        gone.append(child.name)
    return gone


# -- submits killed half-way ------------------------------------------------------------------


def _marker(home: HomePaths, ship_id: str) -> Path:
    return home.root / "shipped" / f".{ship_id}.owner"


def mark(home: HomePaths, ship_id: str) -> None:
    """This process is laying ``ship_id`` out (until ``settled`` or ``abandon``)."""
    import psutil

    from ..core.paths import write_json

    marker = _marker(home, ship_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_json(marker, {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()})


def settled(home: HomePaths, ship_id: str) -> None:
    """The job or sweep ``ship_id`` is recorded: its shipped code is its own now."""
    _marker(home, ship_id).unlink(missing_ok=True)


def abandon(home: HomePaths, ship_id: str) -> None:
    """The submit of ``ship_id`` failed: its shipped code goes, then its marker."""
    shutil.rmtree(home.shipped(ship_id), ignore_errors=True)
    settled(home, ship_id)


def sweep_abandoned(home: HomePaths, store: Store) -> list[str]:
    """Shipped code of submits whose process died (on this machine) before recording the job
    or sweep: removed; a marker whose job exists is only dropped. Returns the ids removed."""
    from ..core.paths import read_json
    from ..supervise.liveness import alive

    root, gone = home.root / "shipped", []
    for marker in sorted(root.glob(".*.owner")) if root.is_dir() else []:
        ship_id = marker.name[1:-len(".owner")]
        owner = read_json(marker) or {}
        if owner.get("host") != socket.gethostname() or alive(owner.get("pid"), owner.get("started")):
            continue
        if not _recorded(store, ship_id):
            shutil.rmtree(home.shipped(ship_id), ignore_errors=True)
            gone.append(ship_id)
        marker.unlink(missing_ok=True)
    return gone


def _recorded(store: Store, ship_id: str) -> bool:
    for get in (store.get, store.sweeps.get):
        try:
            get(ship_id)
            return True
        except UsageError:
            continue
    return False


def sweep_scratch(home: HomePaths) -> None:
    """What killed uploads and submits left half-written on this machine: object uploads
    (``<pid>.<random>``), inputs being laid out (``.<digest>.<pid>.<random>``), staged job
    directories (``<id>.<pid>``), each removed once its pid is gone."""
    import psutil

    from ..supervise.submit import clear_staging

    clear_staging(home)
    for where, field in ((home.code_objects / ".incoming", 0), (home.root.joinpath(*UPLOADS), -2)):
        for child in where.iterdir() if where.is_dir() else []:
            parts = child.name.split(".")
            if field == -2 and not child.name.startswith("."):
                continue
            pid = parts[field] if len(parts) >= 3 or field == 0 else ""
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
