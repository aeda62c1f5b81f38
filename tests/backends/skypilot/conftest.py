"""Fixtures for the tests against the real SkyPilot library (test_real_skypilot.py): its own
environment (``skyenv``) and a real API server in a namespace with only loopback (``realsky``)."""

import os
import subprocess

import pytest

from . import realsky, skyenv


@pytest.fixture(scope="session")
def sky_python():
    """The SkyPilot environment's interpreter, built on first use. Where it cannot be built (no
    package index), the tests skip saying so; CI sets PHALANX_REQUIRE_SKY=1 to fail instead."""
    try:
        return skyenv.ensure()
    except (subprocess.CalledProcessError, OSError) as exc:
        reason = f"no SkyPilot environment ({exc}); build it with: python3 tests/backends/skypilot/skyenv.py"
        if os.environ.get("PHALANX_REQUIRE_SKY") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def sky_server(sky_python, tmp_path_factory):
    """One real SkyPilot API server for the session, stopped by PID at the end. Opt-in
    (``PHALANX_SKY_SERVER=1``) until more CI runs agree: they hung now and then before the
    namespace race in ``realsky`` was fixed; the tests that need no server run always."""
    if os.environ.get("PHALANX_SKY_SERVER") != "1":
        pytest.skip("a real SkyPilot API server: opt in with PHALANX_SKY_SERVER=1 (see docs/skypilot.md)")
    why = realsky.usable()
    if why:
        if os.environ.get("PHALANX_REQUIRE_SKY") == "1":
            pytest.fail(why)
        pytest.skip(why)
    try:
        server = realsky.SkyServer(sky_python, tmp_path_factory.mktemp("skyhome"))
    except (RuntimeError, subprocess.TimeoutExpired) as first:
        # Seen twice with the machine's load average above 10: the server did not come up (reason
        # unknown yet; the error carries its log). One more start, in a fresh HOME, says so if it fails.
        try:
            server = realsky.SkyServer(sky_python, tmp_path_factory.mktemp("skyhome"))
        except (RuntimeError, subprocess.TimeoutExpired) as second:
            raise RuntimeError(f"SkyPilot's API server did not start twice: {first} / {second}") from second
    yield server
    server.stop()
    assert not server.ours(), f"left running by SkyPilot's API server: {server.ours()}"
