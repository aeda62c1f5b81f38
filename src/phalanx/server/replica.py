"""One replica of a team server among others on the same store (docs/server.md, "High
availability"). The server keeps no state of its own but the supervisors it runs; for those, a
lease per job in the store (``store/leases.py``) says which replica answers for it.

Every ``ttl / 3`` seconds a replica:

1. renews its leases (a statement: every job it holds gets ``ttl`` more seconds) and releases
   those of jobs that ended;
2. takes over each lease that expired (its holder stopped renewing: killed, or cut off from
   the store for longer than ``ttl``), one compare-and-set per job, so of two replicas reaching
   for a job one gets it, and adopts the job (``adopt``);
3. looks after its own jobs: one whose supervisor died under it (killed, or given up on a
   database away for longer than the ``store_retry`` setting) is adopted as below, once per job
   (a supervisor that dies again leaves its job LOST, for a person to look at);
4. removes what submits killed half-way on this machine left (``shipping.sweep_abandoned``).

Adopting a job, by what is left of it:

- its supervisor still lives (on this machine: a replica elsewhere cannot see a pid here, and
  counts a supervisor on a dead replica's machine as gone with it): re-attached, nothing else;
- it is PENDING and its supervisor never started (a server killed between recording the job and
  starting its supervisor): its supervisor is started now, so the submit completes;
- it was stopping: the stop is finished (what of it still runs is stopped);
- it was running: resumed as ``phalanx resume`` would (a new attempt from the state directory,
  or the attempt its ranks still run, watched again).

A server restarted on its own store is a new replica: it adopts its own earlier jobs the same
way once their leases expire.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from ..api import query
from ..core.state import JobState, is_terminal
from ..errors import PhalanxError, StoreError
from ..store import Store
from ..supervise import detached, leasing, liveness, relay
from . import shipping

TTL = 30.0
LOG = logging.getLogger("phalanx.server")


class Replica:
    def __init__(self, ttl: float = TTL, say: Callable[[str], None] | None = None) -> None:
        self.holder = leasing.new_holder(ttl)
        self.say = say or (lambda text: LOG.warning("%s", text))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._down = False  # the store did not answer the last tick (said once)
        self._revived: set[str] = set()  # own jobs whose dead supervisor this replica replaced
        self._store: Store | None = None

    @property
    def id(self) -> str:
        return self.holder.id

    def start(self) -> None:
        """Lease every job this process starts from now on, and keep the leases (a thread); the
        supervisors it starts keep their own job's lease too (``supervise/relay.py``)."""
        leasing.hold_as(self.holder)
        os.environ[relay.TTL_ENV] = repr(self.holder.ttl)
        self._thread = threading.Thread(target=self._loop, name="phalanx-leases", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                if self._down:
                    self.say("phalanx server: the job store answers again")
                self._down = False
            except StoreError as exc:  # the store is away: the next tick tries again
                if not self._down:
                    self.say(f"phalanx server: cannot renew leases: {exc.message}")
                self._down = True
            except Exception:  # noqa: BLE001 - a bug must not end the leases of every job
                LOG.exception("phalanx server: the lease keeper failed (it goes on)")
            self._stop.wait(self.holder.ttl / 3)

    def tick(self) -> list[tuple[str, str]]:
        """One round (see the module docstring); returns the jobs adopted and how."""
        if self._store is None:  # one store for the replica's life (a SQLite one is a connection)
            self._store = query.open_store()
        store = self._store
        leases = store.leases
        leases.renew(self.id, self.holder.ttl)
        leases.release_ended()
        adopted = []
        for record, was in leases.expired():
            if was == self.id:  # its own, lapsed while this round was slow (a store coming back): renewed next round
                continue
            if not leases.take(record.id, self.id, self.holder.ttl):
                continue  # another replica was first
            how = self.adopt(store, record.id, was)
            adopted.append((record.id, how))
            self.say(f"phalanx server: adopted job {record.id} from replica {was}: {how}")
        for record in leases.held(self.id):
            if record.id in self._revived or record.supervisor_pid is None or liveness.elsewhere(record) \
                    or not liveness.gone_here(record):
                continue
            self._revived.add(record.id)
            how = self.adopt(store, record.id, self.id)
            adopted.append((record.id, how))
            self.say(f"phalanx server: the supervisor of job {record.id} (pid {record.supervisor_pid}) died: {how}")
        adopted += self._sweeps(store)
        shipping.sweep_abandoned(query.home(), store)
        return adopted

    def _sweeps(self, store: Store) -> list[tuple[str, str]]:
        """Steps 2 and 3 for sweeps: their runners hold leases as supervisors do."""
        adopted = []
        for sweep, was in store.leases.expired_sweeps():
            if was != self.id and store.leases.take(sweep.id, self.id, self.holder.ttl, table="sweeps"):
                how = self.adopt_sweep(store, sweep.id)
                adopted.append((sweep.id, how))
                self.say(f"phalanx server: adopted sweep {sweep.id} from replica {was}: {how}")
        for sweep in store.leases.held_sweeps(self.id):
            if sweep.id in self._revived or sweep.supervisor_pid is None or not liveness.gone_here(sweep):
                continue
            self._revived.add(sweep.id)
            how = self.adopt_sweep(store, sweep.id)
            adopted.append((sweep.id, how))
            self.say(f"phalanx server: the runner of sweep {sweep.id} (pid {sweep.supervisor_pid}) died: {how}")
        return adopted

    def adopt_sweep(self, store: Store, sweep_id: str) -> str:
        """``adopt`` for a sweep: its runner re-attached, or a new one started (its trials cut off
        continue as new attempts, those not tried yet start)."""
        from ..api import sweepjobs
        from .submit import CHILDREN

        sweep = store.sweeps.get(sweep_id)
        if is_terminal(sweep.state):
            return f"nothing to do ({sweep.state.value})"
        if not liveness.gone_here(sweep):
            if not liveness.elsewhere_host(sweep):
                return f"re-attached (its runner, pid {sweep.supervisor_pid}, still runs)"
            # its runner on another machine let the lease lapse with its replica's: gone with them
            store.sweeps.transition(sweep.id, JobState.LOST)
        try:
            if sweep.state is JobState.STOPPING:
                sweepjobs.stop_sweep(store.sweeps.get(sweep_id))
                return "finished its stop"
            done, _ = sweepjobs.resume_sweep(store.sweeps.get(sweep_id), detach=True)
            CHILDREN.add(done.supervisor_pid)
            return f"resumed (runner pid {done.supervisor_pid})"
        except PhalanxError as exc:
            return f"could not adopt it: {exc.message}"

    def adopt(self, store: Store, job_id: str, was: str) -> str:
        """Take charge of ``job_id``, whose lease ``was`` (a replica's id) let lapse; says how."""
        from ..api import jobs
        from .submit import CHILDREN

        record = store.get(job_id)
        if is_terminal(record.state) or liveness.elsewhere(record):
            return f"nothing to do ({record.state.value})"
        if record.state is JobState.QUEUED:  # waiting for its project's quota: the queue starts it, not us
            return "kept in its project's queue"
        away = liveness.elsewhere_host(record)
        if not away and liveness.alive(record.supervisor_pid, record.supervisor_started):
            return f"re-attached (its supervisor, pid {record.supervisor_pid}, still runs)"
        if away and record.state is not JobState.PENDING:
            # its supervisor on another machine let the lease lapse with its replica's: gone with them
            store.transition(record.id, JobState.LOST, root_cause=liveness.lost_cause(record))
        try:
            if record.state is JobState.PENDING:
                identity = detached.spawn_supervisor(record, record.spec.workdir)
                CHILDREN.add(identity["supervisor_pid"])
                if not store.leases.claim_start(job_id, record.supervisor_pid, int(identity["supervisor_pid"]),
                                                float(identity["supervisor_started"]), identity["supervisor_host"]):
                    return "its supervisor started meanwhile"
                return f"started its supervisor (pid {identity['supervisor_pid']}), which had never started"
            if record.state is JobState.STOPPING:
                jobs.stop(job_id)
                return "finished its stop"
            done, _ = jobs.resume(job_id, detach=True)
            CHILDREN.add(done.supervisor_pid)
            return f"resumed as attempt {done.attempt} (supervisor pid {done.supervisor_pid})"
        except PhalanxError as exc:
            return f"could not adopt it: {exc.message}"
