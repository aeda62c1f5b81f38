"""``phalanx ps`` as data: running jobs and sweeps, or all of them with ``--all`` or any filter,
newest first, each as the row ``ps --json`` prints. A view: reads, never writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

from ..core.state import is_terminal
from ..errors import UsageError
from ..store import JobRecord, Store
from ..store.sweeps import SweepRecord
from .lists import Query, build_query, check_metrics, job_rows, sweep_progress



@dataclass(frozen=True)
class PsRequest:
    """What ``phalanx ps`` (or a client of the server) asks for, as typed: checked by ``ps``."""

    all: bool = False
    states: tuple[str, ...] = ()
    name: str | None = None
    backend: str | None = None
    tags: tuple[str, ...] = ()
    since: str | None = None
    search: str | None = None
    sort: str | None = None
    columns: tuple[str, ...] = ()
    limit: int | None = None
    wide: bool = False
    people: bool = True  # rows for a table: each job's progress and health read (a file per job)
    user: str | None = None  # only what this user submitted
    mine: bool = False  # only what the asker submitted
    project: str | None = None  # only jobs of this project (``--project NAME``)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PsRequest:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("states", "tags", "columns"):
            if key in known:
                known[key] = tuple(known[key] or ())
        return cls(**known)


@dataclass
class PsListing:
    """The rows of a listing, newest first, produced as they are read (a million jobs never sit in
    memory). A row is what ``ps --json`` prints of it; keys starting with ``_`` are for people
    only (duration, a platform's own state word, a sweep's progress) and are left out of JSON."""

    rows: Iterator[dict[str, Any]]
    everything: bool  # finished jobs included (--all or a filter), else only running ones
    columns: list[str]  # metric column labels
    wide: bool


def ps(store: Store, request: PsRequest, default_limit: int, me: str,
       projects: tuple[str, ...] | None = None) -> PsListing:
    """``phalanx ps``: running jobs and sweeps, or all of them with ``all`` or any filter.
    ``me``: who asks (``--mine``); ``projects``: the only projects whose jobs are listed (None:
    all). Queued jobs carry their place in their project's queue."""
    from .query import refresh_hosted

    if request.limit is not None and request.limit < 1:
        raise UsageError(f"invalid --limit {request.limit}", "give a number of rows of at least 1, e.g. --limit 20")
    user = request.user
    if request.mine:
        if user is not None and user != me:
            raise UsageError(f"--mine (you are {me}) and --user {user} contradict", "give one of them")
        user = me
    refresh_hosted(store, request.backend)  # jobs supervised in a cluster (k8s --in-cluster), from any machine
    query = build_query(states=request.states, name=request.name, backend=request.backend, tags=request.tags,
                        since=request.since, search=request.search, sort=request.sort, columns=request.columns,
                        user=user, projects=projects)
    check_metrics(store, query.columns, query.sort)
    filtered = bool(request.states or request.name or request.backend or request.tags or request.since
                    or request.search or request.sort or request.columns or user or request.project)
    everything = request.all or filtered
    limit = request.limit if request.limit is not None else (default_limit if everything else None)
    if not request.states and not everything:
        query = build_query(states=["active"], columns=request.columns, user=user, projects=projects)
    records = _jobs(store, query, limit)
    sweeps = [] if (request.backend or query.sort.key != "created") else _sweeps(store, query, limit, everything)
    detailed = bool(query.columns or request.wide)

    def rows() -> Iterator[dict[str, Any]]:
        places: dict[str, tuple[int, int]] | None = None
        for chunk in _chunks(_merge(records, sweeps, limit, query.sort.key == "created"), 200):
            jobs = [r for r in chunk if isinstance(r, JobRecord)]
            full = {r["id"]: r for r in job_rows(store, jobs, query.columns)} if detailed else {}
            if places is None and any(r.state.value == "QUEUED" for r in jobs):
                places = _places(store, projects)
            for record in chunk:
                yield _job_line(record, full.get(record.id), request.people, places) if isinstance(record, JobRecord) \
                    else _sweep_line(store, record, request.wide)

    return PsListing(rows(), everything, [c.label for c in query.columns], request.wide)


def _places(store: Store, projects: tuple[str, ...] | None) -> dict[str, tuple[int, int]]:
    """Every queued job's place in its project's queue (the projects listed)."""
    from ..supervise.admission import places

    names = projects if projects is not None else [p.name for p in store.projects.all()]
    return places(store, names)


def _job_line(record: JobRecord, row: dict[str, Any] | None, people: bool,
              places: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    from .lists import job_health
    from .query import platform_state

    line = row if row is not None else record.to_dict()
    line["_duration"] = record.duration
    place = (places or {}).get(record.id)
    if place is not None:
        line["queue_place"], line["queue_length"] = place
    if people:
        seen = row if row is not None else job_health(record)
        line["_progress"], line["_health"] = seen.get("progress"), seen.get("health")
    platform = platform_state(record)  # the platform's own words (SageMaker: Starting, Training...)
    if platform:
        line["_platform"] = platform
    return line


def _sweep_line(store: Store, sweep: SweepRecord, wide: bool) -> dict[str, Any]:
    progress = sweep_progress(store, sweep)
    share = f"{100 * sweep.finished / sweep.total:.0f}%" if sweep.total else None
    eta = f" ETA {_human(progress['eta'])}" if share and progress.get("eta") is not None else ""
    line = {**sweep.to_dict(), "kind": "sweep", "_duration": sweep.duration, "_sweep": progress["text"],
            "_progress": (share + eta) if share else None}
    if wide:
        from ..store.listing import usage_sum

        line["_usage"] = usage_sum(store, sweep_id=sweep.id)
    return line


def _human(seconds: float) -> str:
    from ..health.progress import human

    return human(seconds)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _jobs(store: Store, query: Query, limit: int | None) -> Iterator[JobRecord]:
    """The matching jobs, a page at a time (memory stays flat for any limit)."""
    from ..store.listing import page_jobs
    from ..supervise.liveness import effective

    after, left = None, limit
    while left is None or left > 0:
        page = page_jobs(store, query.filter, query.sort, 500 if left is None else min(500, left), after)
        for record in page.rows:
            if not is_terminal(record.state):
                record = effective(record)
                if query.filter.states and record.state.value not in query.filter.states:
                    continue
            yield record
        if page.next is None:
            return
        after = page.next
        if left is not None:
            left -= len(page.rows)


def _sweeps(store: Store, query: Query, limit: int | None, everything: bool) -> list[Any]:
    from ..store.listing import page_sweeps
    from ..supervise.liveness import effective

    out = []
    for sweep in page_sweeps(store, query.filter, limit=limit or 1000).rows:
        if not is_terminal(sweep.state):
            sweep = effective(sweep)  # its runner gone: LOST (computed, not written)
            if not everything and is_terminal(sweep.state):
                continue
        out.append(sweep)
    return out


def _merge(records: Iterator[Any], sweeps: list[Any], limit: int | None, by_time: bool) -> Iterator[Any]:
    import heapq
    import itertools

    rows = heapq.merge(records, sweeps, key=lambda r: r.created_at, reverse=True) if by_time \
        else itertools.chain(records, sweeps)
    return itertools.islice(rows, limit)
