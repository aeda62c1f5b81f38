"""A sweep's verbs: run one (foreground or detached), wait for it, stop it (its runner, then any
trial a vanished runner left), resume it. The trials themselves are jobs (``jobs.py``); the
runner is ``sweeps/runner.py``; the views of a sweep are ``sweepview.py``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Callable

from ..core.contracts import StopRequest, write_stop_request
from ..core.paths import write_json
from ..core.spec import JobSpec
from ..core.state import JobState, can_resume, is_terminal
from ..errors import PhalanxError, UsageError
from ..store import Store
from ..supervise import detached, liveness, submit
from ..supervise.liveness import effective
from .jobs import Events, WaitTimeout, started_detached, stop_leftover
from .query import home, open_store

if TYPE_CHECKING:
    from ..store.sweeps import SweepRecord
    from ..sweeps.settings import SweepSettings


def run_sweep(spec: JobSpec, settings: SweepSettings, detach: bool = False, events: Events | None = None,
              user: str | None = None, sweep_id: str | None = None,
              created: Callable[[SweepRecord], None] | None = None) -> tuple[SweepRecord, int | None]:
    """Run a sweep over the search space written in ``spec``'s args; foreground unless ``detach``.
    ``user`` and ``sweep_id`` as for ``submit_detached``; ``created`` is called once the sweep exists.

    Returns the sweep record and (foreground) the exit code: 0 when every trial ended."""
    from ..sweeps.runner import SweepRunner, create_sweep

    store, where = open_store(), home()
    submit.check_storage(spec, where)
    sweep = create_sweep(store, where, spec, settings, user=user, sweep_id=sweep_id)
    write_json(where.sweep_start_mode(sweep.id), {"detached": detach})
    if created is not None:
        created(sweep)
    if detach:
        store.sweeps.update(sweep.id, **detached.spawn(["phalanx.sweeps.runner", sweep.id], where.sweep_log(sweep.id), spec.workdir))
        return store.sweeps.get(sweep.id), None
    code = SweepRunner(store, where, sweep, events).run()
    return store.sweeps.get(sweep.id), code


def wait_sweep(sweep_id: str, timeout: float | None = None, poll: float = 0.5) -> SweepRecord:
    """Block until the sweep ends (a vanished runner counts: LOST); returns its record. Raises
    ``WaitTimeout`` after ``timeout`` seconds. Writes nothing."""
    store = open_store()
    sweep = effective(store.sweeps.get(sweep_id))
    deadline = None if timeout is None else time.monotonic() + timeout
    while not is_terminal(sweep.state):
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"sweep {sweep.id} still {sweep.state.value} after {timeout:g}s",
                              f"wait longer or look: phalanx sweep show {sweep.id}")
        time.sleep(poll)
        sweep = effective(store.sweeps.get(sweep_id))
    return sweep


def stop_sweep(sweep: SweepRecord, timeout: float | None = None) -> SweepRecord:
    """Cancel every running trial of a sweep and the sweep itself. Idempotent; blocks."""
    store = open_store()
    sweep = liveness.record_sweep_lost(store, store.sweeps.get(sweep.id))
    if is_terminal(sweep.state):
        return _stop_lost_trials(store, sweep)
    store.sweeps.transition(sweep.id, JobState.STOPPING)
    if liveness.elsewhere_host(sweep):  # its runner is on another machine: it finds the request (supervise/relay.py)
        write_stop_request(home().sweep_stop_request(sweep.id), StopRequest(time.time(), relay=True))
    elif sweep.supervisor_pid is not None:
        try:
            os.kill(sweep.supervisor_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + (timeout if timeout is not None else sweep.spec.grace + 15)
    while time.monotonic() < deadline:
        current = liveness.record_sweep_lost(store, store.sweeps.get(sweep.id))
        if is_terminal(current.state):
            return _stop_lost_trials(store, current)
        time.sleep(0.1)
    raise PhalanxError(f"sweep {sweep.id} did not stop in time", f"its runner is pid {sweep.supervisor_pid}; try again")


def _stop_lost_trials(store: Store, sweep: SweepRecord) -> SweepRecord:
    """A LOST sweep's trials lost their runner too: recorded so, and what their scheduler
    still runs is stopped."""
    if sweep.state is JobState.LOST:
        for trial in store.trials(sweep.id):
            stop_leftover(store, liveness.record_lost(store, trial), None)
    return sweep


def resume_sweep(sweep: SweepRecord, detach: bool | None = None, events: Events | None = None) -> tuple[SweepRecord, int | None]:
    """Run what did not finish: unfinished trials continue, untried ones start. ``detach`` None:
    as ``phalanx run`` started the sweep."""
    from ..sweeps.runner import SweepRunner

    store, where = open_store(), home()
    if detach is None:
        detach = started_detached(where.sweep_start_mode(sweep.id))
    sweep = liveness.record_sweep_lost(store, store.sweeps.get(sweep.id))
    if not can_resume(sweep.state):
        raise UsageError(f"sweep {sweep.id} is {sweep.state.value}: nothing to resume", f"see: phalanx sweep show {sweep.id}")
    if detach:
        if not store.sweeps.reopen(sweep.id):
            raise PhalanxError(f"sweep {sweep.id} changed state meanwhile", "try again")
        store.sweeps.update(sweep.id, **detached.spawn(["phalanx.sweeps.runner", sweep.id], where.sweep_log(sweep.id), sweep.spec.workdir))
        return store.sweeps.get(sweep.id), None
    if not store.sweeps.reopen(sweep.id, **liveness.identity()):
        raise PhalanxError(f"sweep {sweep.id} changed state meanwhile", "try again")
    code = SweepRunner(store, where, store.sweeps.get(sweep.id), events).run()
    return store.sweeps.get(sweep.id), code
