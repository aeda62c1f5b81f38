"""A warm stand-in started ahead (``standin --defer``, ``launch/workers.py``: a kept agent's
retry under warm starts) becomes the stand-in the rank's command line names: its child sees what a
stand-in started the ordinary way gives its child, and what a cold start sees. Differential, as
``test_differential.py``; the pool's count of forks says the child really came from it."""

from __future__ import annotations

import json
import os

from phalanx.launch.workers import Standbys

from .conftest import PROBE, argv, ensure_pool, probe, script, served
from .test_differential import _normal, differences


def test_a_stand_in_started_ahead_gives_its_child_what_an_ordinary_one_does(tmp_path, pool_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log_path = tmp_path / "out.log"
    log = open(log_path, "ab")
    kwargs = dict(cwd=tmp_path, stdout=log, stderr=log)
    cold = probe(tmp_path, None, "--print", **kwargs)
    ensure_pool(pool_dir)
    ordinary = probe(tmp_path, pool_dir, "--print", **kwargs)
    ready = Standbys()
    # The agent's stdin (which the rank would inherit from torch) is /dev/null as subprocess opens it.
    null, saved = os.open(os.devnull, os.O_RDWR), os.dup(0)
    os.dup2(null, 0)
    try:
        ready.prepare(1, "warm")
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(null)
    before = served(pool_dir)
    out = tmp_path / "probe.json"
    out.unlink(missing_ok=True)
    try:
        taken = ready.take(argv(script(PROBE, str(out), "--print"), pool_dir), dict(os.environ), str(log_path))
        assert taken is not None
        assert taken.wait(timeout=120) == 0
    finally:
        ready.close()
    assert served(pool_dir) == before + 1, "the child was not forked from the pool"
    ahead = json.loads(out.read_text())
    for other in (ordinary, cold):
        diff = differences(_normal(json.loads(json.dumps(other))), _normal(ahead))
        assert not diff, "\n".join(diff)
    assert log_path.read_text().count("probe: hello") == 3
