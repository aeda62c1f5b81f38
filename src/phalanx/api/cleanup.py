"""``phalanx rm`` and ``phalanx prune``: delete finished jobs and sweeps with their files.

What goes: the store's rows, the job directory (logs, metrics, outputs, the code snapshot),
the job's state directory unless another job still names it (a shared ``--name``), and the
code objects no job links any more. What never goes: a job that has not ended (stop it first),
a single trial of a sweep (its sweep goes as a whole), a state directory another job names.

Order: every check first (nothing is removed when one target is refused), then the rows,
then the files: a removal cut off halfway leaves files no job points to, never a job whose
files are gone.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..core.paths import HomePaths
from ..core.state import TERMINAL, is_terminal
from ..errors import Ambiguous, UsageError
from ..store import JobRecord, Store
from ..store.sweeps import SweepRecord
from ..supervise.liveness import effective


@dataclass
class Target:
    kind: str  # job | sweep
    id: str
    name: str
    state: str
    dirs: list[Path]  # job and sweep directories
    records: list[JobRecord]  # the job, or the sweep's trials
    owner: str | None = None  # who submitted it (None: before users were recorded)
    project: str = "default"


@dataclass
class Removed:
    jobs: int = 0
    sweeps: int = 0
    bytes: int = 0
    state_dirs: list[str] = field(default_factory=list)
    kept_state: list[str] = field(default_factory=list)  # named by a job that stays
    objects: int = 0
    ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def resolve(store: Store, refs: Sequence[str], all_named: bool = False,
            projects: Sequence[str] | None = None) -> list[Target]:
    """The jobs and sweeps ``refs`` name, each checked: UsageError on the first that cannot go.
    A job whose supervisor vanished counts as ended (LOST, ``liveness.effective``). A name
    several jobs or sweeps carry is ``Ambiguous`` (the person says which) unless ``all_named``:
    all of them. ``projects``: only those of these projects exist (``Store.find``)."""
    targets: list[Target] = []
    for ref in refs:
        targets.extend(_named(store, ref, all_named, projects))
    seen: set[str] = set()
    return [t for t in targets if not (t.id in seen or seen.add(t.id))]  # type: ignore[func-returns-value]


def _named(store: Store, ref: str, all_named: bool, projects: Sequence[str] | None = None) -> list[Target]:
    """The sweep or job ``ref`` names by id or id prefix; by name, the one sweep or job of that
    name, or all of them with ``all_named`` (never the newest of several, silently). Only those
    of ``projects`` exist (None: all)."""
    from ..errors import JobNotFound
    from ..store.listing import jobs_named, sweeps_named

    sweep = store.sweeps.find(ref, projects)
    if sweep is not None and sweep.id.startswith(ref.lower()):
        return [_sweep_target(store, sweep)]
    try:
        record: JobRecord | None = store.find(ref, projects)
    except JobNotFound:
        if sweep is None:
            raise
        record = None
    if record is not None and record.id.startswith(ref.lower()):
        return [_job_target(effective(record))]
    seen = (lambda project: True) if projects is None else (lambda project: project in projects)
    jobs = [effective(r) for r in jobs_named(store, ref, trials=False) if seen(r.project)]
    sweeps = [s for s in sweeps_named(store, ref) if seen(s.project)]
    if len(jobs) + len(sweeps) <= 1 or all_named:
        found = [*(_sweep_target(store, s) for s in sweeps), *(_job_target(r) for r in jobs)]
        if not found and record is not None:  # a trial by its name: refused, naming its sweep
            found = [_job_target(effective(record))]
        return found
    choices = [*({"id": s.id, "name": s.name, "state": s.state.value, "created_at": s.created_at,
                  "command": f"(sweep) {s.command}"} for s in sweeps),
               *({"id": r.id, "name": r.name, "state": r.state.value, "created_at": r.created_at,
                  "command": r.command} for r in jobs)]
    counted = " and ".join(f"{n} {what}" for n, what in ((len(sweeps), "sweeps"), (len(jobs), "jobs")) if n)
    if len(sweeps) == 1 or len(jobs) == 1:
        counted = counted.replace("1 sweeps", "1 sweep").replace("1 jobs", "1 job")
    ids = [str(c["id"]) for c in choices]
    raise Ambiguous(f"{counted} are named '{ref}' ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})",
                    f"name the one to remove by its id (phalanx ps --all --name {ref}), or remove them all: "
                    f"phalanx rm --all-named {ref}", choices)


def _job_target(record: JobRecord) -> Target:
    if not is_terminal(record.state):
        raise UsageError(f"job {record.id} is {record.state.value}: phalanx removes only jobs that ended",
                         f"stop it first: phalanx stop {record.id}")
    if record.sweep_id is not None:
        raise UsageError(f"job {record.id} is trial {record.trial} of sweep {record.sweep_id}",
                         f"remove the whole sweep: phalanx rm {record.sweep_id}")
    return Target("job", record.id, record.name, record.state.value, [record.paths.root], [record], record.user_name,
                  record.project)


def _sweep_target(store: Store, sweep: SweepRecord) -> Target:
    if not is_terminal(sweep.state):
        raise UsageError(f"sweep {sweep.id} is {sweep.state.value}: phalanx removes only sweeps that ended",
                         f"stop it first: phalanx stop {sweep.id}")
    trials = [effective(t) for t in store.trials(sweep.id)]
    running = [t for t in trials if not is_terminal(t.state)]
    if running:
        raise UsageError(f"sweep {sweep.id} still has {len(running)} trial(s) running (e.g. job {running[0].id})",
                         f"stop them first: phalanx stop {sweep.id}")
    return Target("sweep", sweep.id, sweep.name, sweep.state.value,
                  [Path(sweep.sweep_dir), *(t.paths.root for t in trials)], trials, sweep.user_name, sweep.project)


def remove(store: Store, home: HomePaths, targets: Sequence[Target], dry_run: bool = False) -> Removed:
    """Delete ``targets`` (already checked by ``resolve``); with ``dry_run`` only count."""
    from ..store.listing import delete_jobs, delete_sweep, jobs_named

    out = Removed()
    for target in targets:  # submitted to a team server: the shipped copy of the code it ran in
        shipped = home.shipped(target.id)
        if shipped.exists() and shipped not in target.dirs:
            target.dirs.append(shipped)
    leaving = {r.id for t in targets for r in t.records} | {t.id for t in targets}
    states: dict[Path, bool] = {}  # state dir -> may go
    for target in targets:
        for record in target.records:
            key = _state_key(record)
            if not key:
                continue
            path = home.state_dir(key)
            others = [r for name in {record.name, key} for r in jobs_named(store, name)
                      if r.id not in leaving and _state_key(r) == key]
            states[path] = states.get(path, True) and not others
    links: dict[tuple[int, int], int] = {}
    for target in targets:
        for directory in target.dirs:
            out.bytes += _size(directory, links)
    for state, free in states.items():
        if free and state.exists():
            out.bytes += _size(state, links)
            out.state_dirs.append(str(state))
        elif not free:
            out.kept_state.append(str(state))
    objects = _freeable(home, links)
    out.objects = len(objects)
    out.bytes += sum(size for _, size in objects)
    out.jobs = sum(1 for t in targets if t.kind == "job") + sum(len(t.records) for t in targets if t.kind == "sweep")
    out.sweeps = sum(1 for t in targets if t.kind == "sweep")
    out.ids = [t.id for t in targets]
    if dry_run:
        return out
    for target in targets:
        delete_jobs(store, [r.id for r in target.records])
        if target.kind == "sweep":
            delete_sweep(store, target.id)
    for target in targets:
        for directory in target.dirs:
            shutil.rmtree(directory, ignore_errors=True)
    for gone in out.state_dirs:
        shutil.rmtree(gone, ignore_errors=True)
    out.objects = _drop_orphans(home, set(links))
    return out


def _state_key(record: JobRecord) -> str:
    try:
        spec = json.loads(record.spec_json or "{}")
    except ValueError:
        return ""
    return str(spec.get("state_name") or spec.get("name") or "") if isinstance(spec, dict) else ""


def _size(root: Path, links: dict[tuple[int, int], int]) -> int:
    """Bytes that go with ``root``: files linked only there; hard-linked files (the code
    snapshot's links into the content store) are counted in ``links`` (per inode) and their
    bytes go with the objects they free."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                links[key] = links.get(key, 0) + 1
            else:
                total += st.st_size
    return total


def _objects(home: HomePaths) -> list[tuple[Path, os.stat_result]]:
    out = []
    for dirpath, _, files in os.walk(home.code_objects):
        for name in files:
            path = Path(dirpath) / name
            try:
                out.append((path, path.lstat()))
            except OSError:
                continue
    return out


def _freeable(home: HomePaths, links: dict[tuple[int, int], int]) -> list[tuple[Path, int]]:
    """Content-store objects whose every link but the store's own is among ``links``."""
    if not links:
        return []
    return [(p, st.st_size) for p, st in _objects(home)
            if st.st_nlink == 1 + links.get((st.st_dev, st.st_ino), -1)]


def _drop_orphans(home: HomePaths, inodes: set[tuple[int, int]]) -> int:
    """Unlink the objects among ``inodes`` whose link count is down to 1 (only the store's),
    and their cached bytecode."""
    dropped = 0
    for path, st in _objects(home):
        if (st.st_dev, st.st_ino) in inodes and st.st_nlink == 1:
            try:
                path.unlink()
                dropped += 1
            except OSError:
                continue
            for pyc in home.code_bytecode.glob(f"{st.st_dev:x}-{st.st_ino:x}-*") if home.code_bytecode.is_dir() else []:
                pyc.unlink(missing_ok=True)
    return dropped


def prune_targets(store: Store, older_than: float, states: Sequence[str], now: float,
                  projects: Sequence[str] | None = None) -> list[Target]:
    """Every ended job and sweep created more than ``older_than`` seconds ago (in ``states``;
    ``projects``: of these projects only)."""
    from ..store.listing import old_jobs, old_sweeps

    wanted = [s for s in states if s in {t.value for t in TERMINAL}] if states else [t.value for t in TERMINAL]
    before = now - older_than
    targets: list[Target] = []
    for record in old_jobs(store, before, wanted):
        targets.append(Target("job", record.id, record.name, record.state.value, [record.paths.root], [record],
                              record.user_name, record.project))
    for sweep in old_sweeps(store, before, wanted):
        try:
            targets.append(_sweep_target(store, sweep))
        except UsageError:
            continue  # a trial still runs (a LOST sweep's leftover): not old news yet
    return targets if projects is None else [t for t in targets if t.project in projects]
