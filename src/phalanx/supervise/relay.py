"""What a supervisor a team server started does for the server's replicas on other machines
(docs/server.md, "High availability"). Its pid means nothing there, so:

- it keeps its job's lease itself (``SelfLease``): a replica elsewhere takes a job over only once
  nobody on the job's machine renews its lease, supervisor or replica, so the death of the
  replica alone (a restart, a crash) never makes a second supervisor of a job that runs;
- if a replica elsewhere took its job over all the same (this machine lost the database, or was
  frozen, for longer than the lease), it ends its attempt's processes at once and records
  nothing: the job is the new supervisor's (``SelfLease.taken``);
- a stop asked there reaches it through the job's directory, which replicas share (``StopRelay``):
  the stop writes its request marked ``relay`` and signals nobody; the supervisor looks at the
  file between its ticks (a ``stat``) and stops as if signalled.

A supervisor started outside a server (no lease TTL handed down) does neither.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from ..core.contracts import StopRequest, read_stop_request
from ..errors import ContractError, StoreError
from ..store import Store
from .leasing import host_of

TTL_ENV = "PHALANX_LEASE_TTL"  # set by a server's replica for the supervisors it starts; never passed on
LOOK_EVERY = 0.5  # seconds between looks at the stop request
LOG = logging.getLogger("phalanx.supervise")


def lease_ttl() -> float | None:
    """The lease TTL a replica handed this supervisor, taken out of the environment (its ranks do
    not see it)."""
    value = os.environ.pop(TTL_ENV, None)
    try:
        return float(value) if value else None
    except ValueError:
        return None


class SelfLease:
    """Renews ``row_id``'s lease every ``ttl / 3`` seconds while a replica of this machine holds
    it; a sweep's (``table`` "sweeps") is stamped on its running trials too. A thread with a store
    of its own (``opener``), so that a database away for a while (retried for ``store_retry``)
    never holds up the supervisor's loop; ``taken`` is what the loop reads."""

    def __init__(self, opener: Callable[[], Store], row_id: str, ttl: float | None, host: str,
                 table: str = "jobs") -> None:
        self.opener, self.row_id, self.ttl, self.host, self.table = opener, row_id, ttl, host, table
        self.taken: str | None = None  # the replica elsewhere that took the job over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "SelfLease":
        if self.ttl is not None:
            self._thread = threading.Thread(target=self._loop, name="phalanx-own-lease", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _loop(self) -> None:
        store: Store | None = None
        while self.ttl is not None and not self._stop.is_set():
            try:
                store = store or self.opener()
                self.renew(store)
            except StoreError:
                pass  # the store is away: the next round tries again (the lease lasts ttl)
            except Exception:  # noqa: BLE001 - a bug here must not end the job it keeps
                LOG.exception("phalanx: keeping the job's lease failed (it goes on)")
            self._stop.wait((self.ttl or 0.0) / 3)

    def renew(self, store: Store) -> None:
        """One round: renewed, or found ended (nothing more to keep) or taken over elsewhere."""
        assert self.ttl is not None
        leases = store.leases
        if leases.renew_own(self.row_id, self.host, self.ttl, self.table):
            if self.table == "sweeps" and (held := leases.holder(self.row_id, "sweeps")) is not None:
                leases.stamp_trials(self.row_id, *held)
            return
        held = leases.holder(self.row_id, self.table)
        self.ttl = None
        if held is not None and host_of(held[0]) != self.host:
            self.taken = held[0]


class StopRelay:
    """Stops asked on another machine, read from ``path`` (the job's or sweep's ``stop.json``)."""

    def __init__(self, path: Path, since: float | None = None) -> None:
        self.path = path
        self.since = time.time() if since is None else since  # older requests are an earlier run's
        self._stamp: int | None = None
        self._next = 0.0

    def due(self) -> StopRequest | None:
        """A relayed stop not seen yet (at most one look every ``LOOK_EVERY`` seconds)."""
        if time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + LOOK_EVERY
        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            asked = read_stop_request(self.path)
        except ContractError:
            return None
        if asked is None or not asked.relay or asked.at <= self.since:
            return None
        self.since = asked.at
        return asked
