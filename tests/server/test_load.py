"""The load test, small (``bench/bench_server_load.py`` is the full one: 50 clients x 20 submits):
a real server on a real PostgreSQL, 10 clients each submitting 5 real jobs at once in 2
processes while 3 others list with ``ps``; then the store itself is audited. No timing is asserted."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.local, pytest.mark.slow]

sys.path.insert(0, str(ROOT / "bench"))


def test_load_concurrent_submits_and_ps_lose_nothing_and_fail_nothing(server, tmp_path, monkeypatch):
    import bench_server_load as load

    tokens = [server.add_user("load0"), server.add_user("load1")]
    server.start()
    monkeypatch.setenv("PGPASSWORD", server.env["PGPASSWORD"])
    seen = load.load(server.url, tokens, tmp_path / "load", clients=10, submits=5, ps_clients=3, procs=2)
    assert seen["errors"] == [], seen["errors"]  # the only documented 429 (failed logins) cannot happen here
    assert len(seen["ids"]) == 50 and seen["ps"]
    assert server.store is not None
    counts = load.audit(server.store, seen["ids"])
    assert counts == {"jobs": 50, "answered": 50, "lost": 0, "duplicated": 0, "unclaimed": 0}, counts
    assert load.wait_ended(server.store, 300) == 0  # no job left running: every supervisor finished its job
    from phalanx.store import Store

    states = Store(server.store).engine.rows("SELECT state, COUNT(*) FROM jobs GROUP BY state")
    assert dict(states) == {"SUCCEEDED": 50}, states
