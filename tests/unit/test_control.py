"""The line between the supervisor and a kept node agent (launch/control.py), both ends in one
process over a real socket pair."""

from __future__ import annotations

import os
import signal
import time

from phalanx.launch.control import AgentControl, AgentLine
from phalanx.launch.procs import ChildWatcher


def _pair() -> tuple[AgentControl, AgentLine]:
    control = AgentControl()
    line = AgentLine(os.dup(control.agent_end.fileno()))
    control.started()
    return control, line


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_run_and_ended_cross_the_line_and_wake_the_supervisor():
    control, line = _pair()
    with ChildWatcher() as watcher:
        assert control.run("/job/attempt_1/node_0/launch.json", "/job/attempt_1/node_0/agent.log")
        assert line.next(watcher) == ("/job/attempt_1/node_0/launch.json", "/job/attempt_1/node_0/agent.log", {})
        assert control.run("/job/attempt_2/node_0/launch.json", "/job/attempt_2/node_0/agent.log", {"HF_TOKEN": "v"})
        assert line.next(watcher) == ("/job/attempt_2/node_0/launch.json", "/job/attempt_2/node_0/agent.log", {"HF_TOKEN": "v"})
        line.ended(1, 137)
        # The report wakes the supervisor's watcher (procs.wake) as a child's exit would.
        woke = time.monotonic()
        watcher.wait(30.0)
        assert time.monotonic() - woke < 25
        _until(lambda: 1 in control.ends, "the report")
        assert control.ends == {1: 137}
    control.close()
    line.sock.close()


def test_release_ends_the_agents_wait():
    control, line = _pair()
    control.close()
    with ChildWatcher() as watcher:
        assert line.next(watcher) is None
    line.sock.close()


def test_a_stop_signal_between_attempts_ends_the_agents_wait():
    control, line = _pair()
    with ChildWatcher() as watcher:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert line.next(watcher) is None
        assert watcher.stop_requests == [signal.SIGUSR1]
    control.close()
    line.sock.close()


def test_an_agent_that_is_gone_is_seen_and_refuses_runs():
    control, line = _pair()
    line.sock.close()  # the agent died
    _until(control.closed.is_set, "the end of the line")
    assert not control.run("/launch.json", "/agent.log")
    control.close()
