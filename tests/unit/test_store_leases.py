"""The leases of a team server's jobs (``store/leases.py``), on both engines: renewed by their
holder, released when the job ends, taken over only once expired and by one replica of two,
and a never-started job's supervisor recorded only over the identity it replaces."""

from __future__ import annotations

import threading

from phalanx.core.state import JobState
from phalanx.store import Store


def _job(store: Store, job_id: str, holder: str | None, expires: float | None) -> None:
    store.insert_job(id=job_id, name="job", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                     job_dir=f"/tmp/{job_id}", spec_json="{}", lease_holder=holder, lease_expires=expires)


def test_renewed_released_expired_and_taken_over_once(store_at):
    store = Store(store_at)
    leases = store.leases
    _job(store, "aa000001", "a/1/x", 100.0)
    _job(store, "aa000002", "a/1/x", 100.0)
    _job(store, "aa000003", None, None)  # a job of nobody's server (a CLI's): never leased, never adopted
    assert leases.renew("a/1/x", 30.0, now=1000.0) == 2
    assert leases.holder("aa000001") == ("a/1/x", 1030.0) and leases.holder("aa000003") is None
    assert leases.expired(now=1020.0) == []
    store.transition("aa000002", JobState.RUNNING)
    store.transition("aa000002", JobState.SUCCEEDED)
    assert leases.renew("a/1/x", 30.0, now=1010.0) == 1
    assert leases.holder("aa000002") is None, "released when the job ended"
    assert [(r.id, was) for r, was in leases.expired(now=1050.0)] == [("aa000001", "a/1/x")]

    wins = []
    barrier = threading.Barrier(2)

    def reach(holder: str) -> None:
        barrier.wait()
        if Store(store_at).leases.take("aa000001", holder, 30.0, now=1050.0):
            wins.append(holder)

    threads = [threading.Thread(target=reach, args=(h,)) for h in ("b/2/y", "c/3/z")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1 and leases.holder("aa000001") == (wins[0], 1080.0), "one replica of two takes it"
    assert not leases.take("aa000001", "d/4/w", 30.0, now=1060.0), "a lease not expired is not taken"
    assert [r.id for r in leases.held(wins[0])] == ["aa000001"] and leases.held("a/1/x") == []


def test_a_supervisor_is_recorded_only_over_the_one_it_replaces(store_at):
    store = Store(store_at)
    _job(store, "bb000001", "a/1/x", 100.0)
    assert store.leases.claim_start("bb000001", None, 4242, 12.5)
    assert not store.leases.claim_start("bb000001", None, 4343, 13.5), "another came first"
    assert store.leases.claim_start("bb000001", 4242, 4444, 14.5), "over a dead one"
    assert (store.get("bb000001").supervisor_pid, store.get("bb000001").supervisor_started) == (4444, 14.5)
    store.transition("bb000001", JobState.RUNNING)
    assert not store.leases.claim_start("bb000001", 4444, 4545, 15.5), "a job that started is its supervisor's"
    released = Store(store_at)
    released.transition("bb000001", JobState.FAILED)
    assert released.leases.release_ended(now=200.0) == 1 and released.leases.holder("bb000001") is None


def test_a_queued_job_whose_lease_lapsed_stays_in_its_projects_queue(store_at):
    """A replica adopting the jobs of a dead one (or of itself before a restart) leaves a job that
    waits for its project's quota to the queue: starting it would step over the quota."""
    from phalanx.server.replica import Replica

    store = Store(store_at)
    _job(store, "cc000001", "a/1/x", 100.0)
    store.transition("cc000001", JobState.QUEUED)
    said = Replica(30.0, lambda text: None).adopt(store, "cc000001", "a/1/x")
    record = store.get("cc000001")
    assert said == "kept in its project's queue"
    assert record.state is JobState.QUEUED and record.supervisor_pid is None and record.attempt == 0


def _sweep(store: Store, sweep_id: str, holder: str | None, expires: float | None) -> None:
    store.sweeps.insert(id=sweep_id, name="sweep", strategy="grid", objective=None, direction=None, total=2,
                        command="t.py", topology="1x1", spec_json="{}", settings_json="{}", sweep_dir=f"/tmp/{sweep_id}",
                        lease_holder=holder, lease_expires=expires)


def test_a_supervisor_keeps_its_own_lease_only_while_its_machine_holds_it(store_at):
    """``renew_own``: a supervisor whose replica died keeps the lease of its job (its machine's);
    one taken over by a replica on another machine it no longer renews, which tells it so."""
    store = Store(store_at)
    leases = store.leases
    _job(store, "dd000001", "host-a/1/x", 100.0)
    assert leases.renew_own("dd000001", "host-a", 30.0, now=1000.0)
    assert leases.holder("dd000001") == ("host-a/1/x", 1030.0)
    assert not leases.renew_own("dd000001", "host", 30.0, now=1001.0), "a host name that is a prefix is another host"
    assert leases.take("dd000001", "host-b/2/y", 30.0, now=1031.0)
    assert not leases.renew_own("dd000001", "host-a", 30.0, now=1032.0), "taken over elsewhere: not renewed"
    assert leases.holder("dd000001") == ("host-b/2/y", 1061.0)


def test_sweeps_are_leased_and_their_trials_carry_the_lease_of_their_sweep(store_at):
    store = Store(store_at)
    leases = store.leases
    _sweep(store, "ee000001", "host-a/1/x", 100.0)
    _job(store, "ee000002", None, None)
    _job(store, "ee000003", None, None)
    store.update("ee000002", sweep_id="ee000001", trial=0)
    store.update("ee000003", sweep_id="ee000001", trial=1)
    store.transition("ee000003", JobState.RUNNING)
    store.transition("ee000003", JobState.SUCCEEDED)
    assert leases.renew_own("ee000001", "host-a", 30.0, table="sweeps", now=1000.0)
    assert leases.stamp_trials("ee000001", "host-a/1/x", 1030.0) == 1, "the running trial only"
    assert store.get("ee000002").lease_holder == "host-a/1/x" and store.get("ee000003").lease_holder is None
    assert leases.expired(now=2000.0) == [], "a trial is adopted with its sweep, never on its own"
    assert leases.held("host-a/1/x") == []
    assert [(s.id, was) for s, was in leases.expired_sweeps(now=2000.0)] == [("ee000001", "host-a/1/x")]
    assert leases.take("ee000001", "host-b/2/y", 30.0, now=2000.0, table="sweeps")
    assert [s.id for s in leases.held_sweeps("host-b/2/y")] == ["ee000001"]
    assert leases.renew("host-b/2/y", 30.0, now=2010.0) == 0 and leases.holder("ee000001", "sweeps") == ("host-b/2/y", 2040.0)
    store.sweeps.transition("ee000001", JobState.RUNNING)
    store.sweeps.transition("ee000001", JobState.SUCCEEDED)
    assert leases.release_ended(now=3000.0) >= 1 and leases.holder("ee000001", "sweeps") is None


def test_a_row_supervised_on_another_machine_is_judged_by_its_lease(store_at):
    """``liveness``: a pid of another machine means nothing here; its lease says whether it lives."""
    import dataclasses
    import time

    from phalanx.supervise import liveness

    store = Store(store_at)
    _job(store, "ff000001", "elsewhere/1/x", time.time() + 30)
    store.update("ff000001", supervisor_pid=1, supervisor_started=0.0, supervisor_host="elsewhere")
    store.transition("ff000001", JobState.RUNNING)
    record = store.get("ff000001")
    assert liveness.elsewhere_host(record) and not liveness.is_lost(record), "pid 1 here is not its supervisor"
    assert liveness.is_lost(dataclasses.replace(record, lease_expires=time.time() - 1)), "its lease lapsed"
    here = dataclasses.replace(record, supervisor_host=liveness.HOST)
    assert liveness.is_lost(here), "on this machine the pid decides (pid 1 did not start then)"
    assert not liveness.is_lost(dataclasses.replace(record, supervisor_host=None, supervisor_pid=None)), "not yet started"
    assert "lease_holder" not in record.to_dict() and "supervisor_host" in record.to_dict()
