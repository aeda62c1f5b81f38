"""The doctor's judgement (health/checks.py), its reading of the probe's lines
(health/doctor_report.py), and which nodes an attempt's end points at (health/checks_cause.py,
supervise/leaveout.py): pure functions over reports and results."""

from __future__ import annotations

import json

from phalanx.core.contracts import NodeResult, RankFailure
from phalanx.health.checks import (
    GIB,
    LINKS_TAG,
    REPORT_TAG,
    DeviceReport,
    LinkReport,
    NodeReport,
    judge,
    judge_node,
)
from phalanx.health.checks_cause import machine_fault, pointed
from phalanx.health.doctor_report import read, render
from phalanx.supervise import leaveout


def node(rank: int = 0, gflops: float = 100.0, **changes) -> NodeReport:
    device = changes.pop("device", DeviceReport(0, "cpu", "CPU", gflops, burn_ok=True))
    base = dict(node_rank=rank, hostname=f"h{rank}", devices=(device,), disk_free=100 * GIB, shm_free=8 * GIB)
    return NodeReport(**{**base, **changes})


def gpu(index: int = 0, gflops: float = 500e3, **nvml) -> DeviceReport:
    return DeviceReport(index, "cuda", "NVIDIA H100", gflops, burn_ok=True, nvml=nvml)


def bad_checks(findings) -> set[str]:
    return {f.check for f in findings if f.severity == "bad"}


def test_a_healthy_node_has_nothing_to_say():
    assert judge_node(node()) == []
    assert judge_node(node(device=gpu(ecc_uncorrected=0, ecc_corrected=3, throttle=[]), gpus_visible=1)) == []


def test_each_fault_of_one_node_is_named_bad():
    assert bad_checks(judge_node(node(device=gpu(ecc_uncorrected=2), gpus_visible=1))) == {"gpu"}
    assert bad_checks(judge_node(node(device=gpu(remap_failure=True), gpus_visible=1))) == {"gpu"}
    wrong = DeviceReport(0, "cuda", "GPU", 1.0, burn_ok=False, error="gave a wrong result (max error 3 against float64)")
    assert bad_checks(judge_node(node(device=wrong, gpus_visible=1))) == {"burn"}
    assert bad_checks(judge_node(node(disk_free=GIB // 2))) == {"disk"}
    assert bad_checks(judge_node(node(shm_free=32 * 1024**2))) == {"shm"}
    assert bad_checks(judge_node(node(gpus_visible=2, nproc_per_node=8, device=gpu()))) == {"devices"}
    assert bad_checks(judge_node(node(skew=7.5))) == {"clock"}
    assert bad_checks(judge_node(NodeReport(0, error="torch is not installed on this node"))) == {"report"}


def test_warnings_do_not_make_a_node_bad():
    findings = judge_node(node(device=gpu(retired_pending=True, throttle=["hardware thermal slowdown"]), gpus_visible=1,
                               skew=0.5))
    assert findings and all(f.severity == "warn" for f in findings)


def test_a_device_far_slower_than_the_others_is_named_and_only_it():
    nodes = [node(0, 100.0), node(1, 95.0), node(2, 20.0), node(3, 105.0)]
    verdict = judge(nodes, [], 4)
    assert verdict.bad_nodes == [2]
    assert "slower than the median device" in verdict.about(2)[0].message


def test_a_node_seeing_fewer_gpus_than_the_others_is_named():
    nodes = [node(0, device=gpu(), gpus_visible=8), node(1, device=gpu(), gpus_visible=7), node(2, device=gpu(), gpus_visible=8)]
    assert judge(nodes, [], 3).bad_nodes == [1]


def test_links_name_the_node_whose_every_link_is_slow_and_both_ends_of_a_failed_one():
    fast, slow = 10e9, 1e9
    links = [LinkReport(0, 1, 1e-5, fast), LinkReport(0, 2, 1e-5, slow), LinkReport(1, 2, 1e-5, slow),
             LinkReport(0, 3, 1e-5, fast), LinkReport(1, 3, 1e-5, fast), LinkReport(2, 3, 1e-5, slow)]
    verdict = judge([node(n) for n in range(4)], links, 4)
    assert verdict.bad_nodes == [2]
    failed = judge([node(0), node(1)], [LinkReport(0, 1, error="Connection reset by peer")], 2)
    assert failed.bad_nodes == [0, 1]
    # two nodes and one slow link: nothing to compare it with, nothing said
    assert judge([node(0), node(1)], [LinkReport(0, 1, 1e-3, 1e6)], 2).healthy


def test_a_node_that_never_reported_is_bad_with_why():
    verdict = judge([node(0)], [], 2, missing={1: "the connection to node2 ended without the node's exit"})
    assert verdict.bad_nodes == [1] and "node2" in verdict.about(1)[0].message


def test_the_report_lines_of_the_rank_logs_become_the_verdict_and_its_table():
    bad = node(1, disk_free=GIB // 4)
    links = {"backend": "gloo", "size_mb": 8, "skews": {"0": 0.0, "1": 0.0021}, "links": [
        {"a": 0, "b": 1, "latency": 2e-4, "bandwidth": 1.5e9}]}
    logs = {0: f"noise\n{REPORT_TAG}{json.dumps(node(0).to_dict())}\n{LINKS_TAG}{json.dumps(links)}\n",
            1: f"[1] {REPORT_TAG}not json\n{REPORT_TAG}{json.dumps(bad.to_dict())}\n"}
    verdict, said = read(logs, 2, {})
    assert verdict.bad_nodes == [1] and said["backend"] == "gloo"
    assert [round(n.skew or 0, 4) for n in verdict.nodes] == [0.0, 0.0021]
    text = render(verdict, {0: "gpu1", 1: "gpu2"}, said)
    rows = {line.split()[1]: line for line in text.splitlines() if line[:1].isdigit()}
    assert rows["gpu1"].endswith("ok") and rows["gpu2"].endswith("BAD") and "+2.1 ms" in rows["gpu2"]
    assert "1.50 GB/s 200 us" in text
    assert "bad: node 1 (gpu2): disk:" in text
    assert "1 of 2 node(s) outside the healthy range: 1 (gpu2); 1 healthy" in text


def result(rank: int, code: int = 1, host: str = "", **details) -> NodeResult:
    return NodeResult(rank, code, host, details=details)


def test_the_end_points_at_the_node_that_failed_its_check():
    results = [result(0, 143, "node1"), result(1, 1, "node2", health={"ok": False, "reason": "bad: disk: 12 MiB free"})]
    assert [(p.node_rank, p.why) for p in pointed(None, results)] == [(1, "failed its health check: bad: disk: 12 MiB free")]
    # a check that the supervisor's stop ended (another node failed first) says nothing of its node
    stopped = [result(0, 143, "node1", health={"ok": None, "stopped_by": "SIGTERM"}), results[1]]
    assert [p.node_rank for p in pointed(None, stopped)] == [1]


def test_machine_faults_in_the_root_cause_point_at_its_node_and_script_errors_do_not():
    assert machine_fault({"signal": "SIGBUS"}) is not None
    assert "Xid" in machine_fault({"log_tail": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"})
    assert "ECC" in machine_fault({"message": "CUDA error: uncorrectable ECC error encountered"})
    assert "NIC" in machine_fault({"log_tail": "NCCL WARN NET/IB : Got completion from peer 10.0.0.3 with error 12"})
    lost = NodeResult.synthesize(1, 255, "the connection to node2 ended without the node's exit (see ...)", host="node2")
    assert "could not be reached" in machine_fault({"message": "node agent 1 exited with code 255"}, lost)
    for script in ({"message": "ValueError: boom"}, {"message": "CUDA out of memory"}, {"signal": "SIGSEGV"}):
        assert machine_fault(script) is None
    results = [result(0, 0, "a"), result(1, 135, "b")]
    assert [p.node_rank for p in pointed({"node_rank": 1, "signal": "SIGBUS", "rank": 1}, results)] == [1]


def test_leave_out_names_nodes_as_the_backend_knows_them_where_it_can():
    failed = NodeResult(1, 1, "127.0.0.3", details={"node_name": "n2", "health": {"ok": False, "reason": "exit 3"}})
    stopped = NodeResult(0, 143, "127.0.0.2", stopped_by="SIGTERM")
    leave = leaveout.decide("exclude", None, [stopped, failed])
    assert leave.names == ("n2",) and leave.check_only
    assert leave.entries[0]["left_out"] and leave.entries[0]["how"] == "left out of the next attempt"
    assert leaveout.decide("exclude", None, [stopped, failed], already=("n2",)).names == ()
    here = leaveout.decide("", None, [stopped, failed])
    assert here.names == () and here.entries[0]["how"] == "cannot be left out by this backend"
    rank_died = NodeResult(1, 135, "b", failures=(RankFailure(1, 135, 1.0, signal="SIGBUS"),))
    leave = leaveout.decide("exclude", {"node_rank": 1, "signal": "SIGBUS"}, [stopped, rank_died])
    assert leave.names == ("b",) and not leave.check_only  # a retry within --max-retries, not a free rerun
