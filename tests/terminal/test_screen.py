"""The pure parts: how several ranks' raw output is drawn on one terminal (``tail.Screen``), and
how a Ctrl-C'd attempt's outcome and a node's status follow the scripts' statuses."""

from __future__ import annotations

import signal

import pytest

from phalanx.core.contracts import NodeResult, OutcomeKind, StopReason
from phalanx.core.paths import JobPaths
from phalanx.launch.agent import interrupted_code
from phalanx.monitor.tail import Screen
from phalanx.supervise.outcome import decide


def test_a_bar_keeps_its_prefix_and_ranks_never_share_a_line():
    screen = Screen(prefix=True)
    shown = "".join([
        screen.render(0, "\rstep 1/3"),
        screen.render(0, "\rstep 2/3"),
        screen.render(1, "hello\n"),  # rank 1 speaks while rank 0's bar is open: the bar's line ends first
        screen.render(0, "\rstep 3/3"),
        screen.render(0, "\n"),
        screen.render(1, "a"), screen.render(1, "b\nc"),  # partial lines come as they are written
        screen.end(),
    ])
    assert shown == "\r[0] step 1/3\r[0] step 2/3\n[1] hello\n\r[0] step 3/3\n[1] ab\n[1] c\n"


def test_without_a_prefix_the_bytes_pass_unchanged():
    screen = Screen(prefix=False)
    assert screen.render(0, "\r10%") + screen.render(0, "\r20%\r\n") + screen.end() == "\r10%\r20%\r\n"


def _node(code: int) -> NodeResult:
    return NodeResult.synthesize(0, code, "ended", stopped_by="SIGINT")


@pytest.mark.parametrize("codes,kind,code", [
    ([0, 0], OutcomeKind.SUCCEEDED, 0),
    ([0, 130], OutcomeKind.CANCELLED, 130),
    ([3, 130], OutcomeKind.CANCELLED, 3),
    ([143], OutcomeKind.CANCELLED, 143),
])
def test_after_ctrl_c_the_outcome_is_the_scripts(tmp_path, codes, kind, code):
    outcome = decide(JobPaths(tmp_path), 0, [_node(c) for c in codes], StopReason.CANCELLED, signal.SIGINT, None, None, None)
    assert (outcome.kind, outcome.exit_code) == (kind, code)
    assert outcome.short().startswith("interrupted (Ctrl-C)")
    # phalanx stop (SIGTERM) keeps its contract: cancelled, 143, whatever the script did
    stopped = decide(JobPaths(tmp_path), 0, [_node(0)], StopReason.CANCELLED, signal.SIGTERM, None, None, None)
    assert (stopped.kind, stopped.exit_code) == (OutcomeKind.CANCELLED, 143)


def test_a_nodes_status_after_ctrl_c_is_its_lowest_failing_rank():
    assert interrupted_code({"0": {"exitcode": 0}, "1": {"exitcode": 0}}) == 0
    assert interrupted_code({"10": {"exitcode": 1}, "2": {"exitcode": 130}, "1": {"exitcode": 0}}) == 130
