"""Jobs whose supervisor runs in the cluster (``phalanx run --backend k8s --in-cluster -d``),
as any machine with the kubeconfig sees them: submit, refresh, find, list, stop.

- ``submit`` (the backend's ``host_supervisor``): ships the bundle, presigns the record's URLs,
  writes the record to the object store, creates the supervisor Job and its Secret
  (``supobjects.py``) and writes the Role it needs for ``kubectl apply``. This machine's store
  keeps the job with the supervisor ``ELSEWHERE`` (``supervise/liveness.py``).
- ``refresh``: the job's record from the object store (by the presigned URL in the supervisor's
  Secret, so only the kubeconfig is needed) into this home; ``query.find_job`` calls it for
  jobs not yet ended, so ``status``, ``logs``, ``metrics`` and ``wait`` read it as any job's.
- ``find``/``find_all``: a job id this home never saw, or every supervisor in the namespace
  (``phalanx ps --backend k8s``), found by the labels, imported into this home.
- ``stop``: the supervisor first (its pod writes the record once more), then the attempt
  (``supervise/leftover.stop``: SIGTERM, grace, delete), then the record says CANCELLED.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ...core.paths import HomePaths, JobPaths, read_json, write_atomic
from ...core.plan import Plan
from ...core.state import SUPERVISOR_ELSEWHERE, JobState, is_terminal
from ...errors import UsageError
from . import record as rec
from . import supobjects
from .supervisor import COLUMNS, row_of

if TYPE_CHECKING:
    from ...store import JobRecord, Store

Events = Callable[[str], None]
WHERE = "k8s-supervisor.json"  # in the job directory: where its supervisor runs (namespace, context, name)
LOOKUP_TIMEOUT = 5.0  # seconds a read waits for the API server
REFRESH = 2.0  # seconds a process reuses a record it refreshed (logs -f asks many times a second)
_refreshed: dict[str, float] = {}
LOCAL = (WHERE, "supervisor.yaml", "supervisor-rbac.yaml")  # this machine's files, not in the record


def where(paths: JobPaths) -> Path:
    return paths.root / WHERE


def _client(context: str | None, namespace: str | None, timeout: float = 30.0) -> Any:
    from .client import Client
    from .kubeconfig import load

    return Client(load(context, namespace), timeout=timeout)


def submit(record: JobRecord, plan: Plan, events: Events | None = None) -> dict[str, Any]:
    """Start ``record``'s supervisor in the cluster; its store columns. Raises BackendError."""
    from ...errors import BackendError
    from . import delivery, manifests
    from .client import apply

    say = events or (lambda text: None)
    ctx, spec = plan.context, record.spec
    way = delivery.choose(ctx.get("code_uri"), ctx.get("output_uri"))
    if way.store is None:
        raise UsageError("--in-cluster keeps the job record in an object store; none is configured",
                         "give one with --code-uri s3://BUCKET/PREFIX (or --output s3://...)")
    home = HomePaths(record.paths.root.parent.parent)
    try:
        client = _client(ctx.get("context"), ctx.get("namespace"))
        values: dict[str, str | None] = dict(delivery.ship(Path(ctx["code"]), way, None))
        urls = rec.presign(way.store, record.id)
        rec.put(urls.record_put, rec.pack(home.root, record.id, row_of(record), spec.state_key))
    except UsageError as exc:
        raise BackendError(exc.message, exc.hint) from None
    except OSError as exc:
        raise BackendError(f"writing the job record to {way.store} failed: {exc}", "check the object store") from None
    from ..options import validate
    from .options import OPTIONS

    opts = validate("k8s", OPTIONS, spec.backend_options)
    section = opts.get("pod") or {}
    objects = supobjects.render(record.id, record.name, record.command, record.topology, str(opts["image"]),
                                rec.location(way.store, record.id), section)
    values.update({"@RECORD_GET@": urls.record_get, "@RECORD_PUT@": urls.record_put, "@STATE_GET@": urls.state_get,
                   "@STATE_PUT@": urls.state_put})
    objects = manifests.fill(objects, values)
    write_atomic(record.paths.root / "supervisor.yaml", manifests.to_yaml(
        [o if o["kind"] != "Secret" else {**o, "stringData": "(presigned URLs)"} for o in objects]))
    apply(client, objects)
    write_atomic(where(record.paths), json.dumps({"namespace": client.namespace, "context": ctx.get("context"),
                                                  "name": supobjects.name(record.id), "record": rec.location(way.store, record.id)}))
    account = section.get("service_account") or "default"
    rbac = record.paths.root / "supervisor-rbac.yaml"
    write_atomic(rbac, manifests.to_yaml(supobjects.role(client.namespace, account,
                                                         supobjects.supervisor_verbs(str(ctx.get("kind") or "job")))))
    say(f"supervisor pod {supobjects.name(record.id)} in namespace {client.namespace} runs the job; it needs service account "
        f"'{account}' to hold the Role in {rbac} (kubectl apply -f {rbac}); this machine may go")
    return {"supervisor_pid": SUPERVISOR_ELSEWHERE, "supervisor_started": time.time()}


def describe(record: JobRecord) -> str:
    info = read_json(where(record.paths)) or {}
    return (f"Job {info.get('name')} in namespace {info.get('namespace')}; the record: {info.get('record')}/record.tar.gz"
            if info else "unknown (no k8s-supervisor.json)")


def _urls(client: Any, name: str) -> rec.Urls | None:
    from .client import ApiError

    try:
        data = client.get("Secret", name).get("data") or {}
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise
    return rec.Urls.from_secret({k: base64.b64decode(v).decode() for k, v in data.items()})


def _fetch(info: Mapping[str, Any], client: Any) -> bytes | None:
    """The record archive: by the presigned URL in the supervisor's Secret, else (the Job and
    its Secret gone) from the object store with this machine's credentials."""
    urls = _urls(client, str(info["name"]))
    if urls is not None:
        return rec.get(urls.record_get)
    try:
        import fsspec

        with fsspec.open(f"{info['record']}/record.tar.gz", "rb") as fh:
            return bytes(fh.read())
    except Exception:  # noqa: BLE001 - no credentials or no object: nothing newer to show
        return None


def _apply(store: Store, home: HomePaths, job_id: str, data: bytes) -> None:
    """Unpack a record archive into this home and bring the store's row in step with it."""
    paths = home.job(job_id)
    row = rec.unpack(data, home.root, job_id, keep=LOCAL)
    _localise(paths, home)
    fields = {c: row.get(c) for c in COLUMNS if c not in ("name", "backend", "nnodes", "nproc_per_node", "command",
                                                       "spec_json", "created_at")}
    state = JobState(row["state"])
    current = store.get(job_id)
    if state is not current.state and store.transition(job_id, state, **fields):
        return
    store.update(job_id, **fields)


def _localise(paths: JobPaths, home: HomePaths) -> None:
    """The plan as the supervisor pod wrote it names directories of the pod's home: this home's."""
    plan = read_json(paths.plan)
    if not plan:
        return
    trees = (plan.get("context") or {}).get("trees") or {}
    for key, value in trees.items():
        if isinstance(value, str) and value.startswith(supobjects.HOME + "/"):
            trees[key] = str(home.root / value[len(supobjects.HOME) + 1:])
    write_atomic(paths.plan, json.dumps(plan, sort_keys=True))


def refresh(store: Store, record: JobRecord, home: HomePaths) -> JobRecord:
    """``record`` brought up to date from the cluster's record of it; as it was when the
    cluster cannot be asked (a read never fails for that). LOST when its supervisor Job is
    gone and the record never said it ended."""
    from .client import ApiError

    info = read_json(where(record.paths))
    if not info or time.monotonic() - _refreshed.get(record.id, -REFRESH) < REFRESH:
        return record
    _refreshed[record.id] = time.monotonic()
    try:
        client = _client(info.get("context"), info.get("namespace"), timeout=LOOKUP_TIMEOUT)
        data = _fetch(info, client)
        if data is not None:
            _apply(store, home, record.id, data)
        now = store.get(record.id)
        if not is_terminal(now.state) and not client.list("Job", labels=supobjects.selector(record.id)):
            store.transition(record.id, JobState.LOST, root_cause=json.dumps(
                {"message": f"its supervisor Job {info['name']} is gone and the record says it never ended", "exitcode": None}))
    except (UsageError, ApiError, OSError) as exc:
        os.environ.get("PHALANX_DEBUG") and print(f"phalanx: cannot refresh job {record.id}: {exc}")
    return store.get(record.id)


def _import(store: Store, home: HomePaths, job: Mapping[str, Any], client: Any) -> JobRecord | None:
    """A supervisor Job this home never saw, as a job of its store."""
    meta = job["metadata"]
    info = {"namespace": client.namespace, "context": client.creds.context if client.creds.context != "in-cluster" else None,
            "name": meta["name"], "record": (meta.get("annotations") or {}).get(supobjects.RECORD, "")}
    data = _fetch(info, client)
    if data is None:
        return None
    import tarfile
    import io

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        row = json.loads(tar.extractfile(rec.ROW).read())  # type: ignore[union-attr]
    paths = home.job(row["id"])
    paths.root.mkdir(parents=True, exist_ok=True)
    write_atomic(where(paths), json.dumps(info))
    store.insert_job(id=row["id"], job_dir=str(paths.root), state=JobState.PENDING.value, supervisor_pid=SUPERVISOR_ELSEWHERE,
                     **{c: row[c] for c in ("name", "backend", "nnodes", "nproc_per_node", "command", "spec_json", "created_at")})
    _apply(store, home, row["id"], data)
    return store.get(row["id"])


def _reachable() -> bool:
    """A kubeconfig is configured (or this is a pod): worth asking the cluster about an unknown id."""
    from .kubeconfig import _config_files, in_cluster

    return bool(_config_files()) or in_cluster() is not None


def find(ref: str, store: Store, home: HomePaths) -> JobRecord | None:
    """The job of id ``ref`` from its supervisor's labels in the current context's namespace,
    imported into this home; None when there is none (or no cluster to ask)."""
    from .client import ApiError

    if not re.fullmatch(r"[0-9a-f]{8}", ref) or not _reachable():
        return None  # a name or a prefix (a typo, most likely) is not worth a round trip to the cluster
    try:
        client = _client(None, None, timeout=LOOKUP_TIMEOUT)
        found = client.list("Job", labels=supobjects.selector(ref))
        return _import(store, home, found[0], client) if found else None
    except (UsageError, ApiError, OSError):
        return None


def find_all(store: Store, home: HomePaths) -> int:
    """Every supervisor Job in the current context's namespace, imported or refreshed; how many."""
    from .client import ApiError
    from .manifests import JOB_ID

    if not _reachable():
        return 0
    try:
        client = _client(None, None, timeout=LOOKUP_TIMEOUT)
        jobs = client.list("Job", labels=supobjects.selector())
    except (UsageError, ApiError, OSError):
        return 0
    for job in jobs:
        job_id = job["metadata"]["labels"][JOB_ID]
        try:
            known = store.find(job_id)
        except UsageError:
            _import(store, home, job, client)
            continue
        if known.id == job_id and not is_terminal(known.state):
            refresh(store, known, home)
    return len(jobs)


def stop(store: Store, record: JobRecord, events: Events | None, stop_attempt: Callable[..., Any]) -> JobRecord:
    """Stop a job supervised in the cluster: its supervisor Job first (the pod saves the record
    and exits; no replacement), then what its attempt still runs (``stop_attempt``: the caller's
    ``supervise.leftover.stop``, as for any lost supervisor's job), then CANCELLED in the record."""
    from .client import ApiError

    say = events or (lambda text: None)
    info = read_json(where(record.paths)) or {}
    home = HomePaths(record.paths.root.parent.parent)
    if is_terminal(record.state):
        return record
    client = _client(info.get("context"), info.get("namespace"))
    urls = _urls(client, str(info["name"]))
    store.transition(record.id, JobState.STOPPING)
    try:
        client.delete("Job", str(info["name"]), propagation="Foreground")
    except ApiError as exc:
        if exc.code != 404:
            raise
    deadline = time.monotonic() + supobjects.GRACE + 30
    while client.list("Pod", labels=supobjects.selector(record.id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    data = rec.get(urls.record_get) if urls is not None else None
    if data is not None:
        _apply(store, home, record.id, data)  # what the supervisor pod wrote last (STOPPING stays)
    record = store.get(record.id)
    if is_terminal(record.state):
        return record
    say(f"supervisor {info['name']} deleted; stopping the attempt it watched")
    stop_attempt(store, record, events)
    store.transition(record.id, JobState.CANCELLED, exit_code=143)
    record = store.get(record.id)
    if urls is not None:
        rec.put(urls.record_put, rec.pack(home.root, record.id, row_of(record), record.spec.state_key))
    return record
