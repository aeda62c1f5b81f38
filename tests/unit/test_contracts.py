"""The files that cross process and machine boundaries (core/contracts.py): they round-trip,
files written before versions existed still read, a newer version and a malformed field are
refused with the file and the field named."""

from __future__ import annotations

import json

import pytest

from phalanx.core.contracts import (
    AttemptRecord, LaunchFile, NodeResult, OutcomeKind, RankError, SchedulerRecord, StopReason, append_attempt,
    read_attempts, read_launch, read_node_result, read_rank_error, read_scheduler, write_launch, write_node_result,
)
from phalanx.core.plan import NodePlan, ProcessPlan
from phalanx.errors import ContractError

NODE = NodePlan(1, "gpu2", ("python3", "-m", "phalanx.launch.agent", "--launch", "/j/attempt_0/node_1/launch.json"),
                {"PHALANX_JOB_DIR": "/j"}, "/work", processes=(ProcessPlan(0, 1, ("python3", "t.py"), {"RANK": "1"}),))

# As phalanx wrote them before the files had versions (old job directories must still show).
OLD_LAUNCH = {"node": NODE.to_dict(), "job_dir": "/j", "attempt": 0, "grace": 30.0}  # no sample_interval
OLD_RESULT = {"node_rank": 0, "host": "localhost-0", "exitcode": 1, "started": 1.0, "finished": 2.0,
              "failures": [{"rank": 1, "local_rank": 1, "pid": 42, "exitcode": 1, "signal": None, "timestamp": 1.5,
                            "terminated": False}],
              "terminated": [0]}
OLD_SLURM_RESULT = {"node_rank": 1, "host": None, "exitcode": 143, "failures": [], "error": "SLURM job 41 ended TIMEOUT",
                    "slurm_job": "41", "slurm_state": "TIMEOUT", "finished": 3.0, "stopped_by": "SIGTERM"}
OLD_ERROR = {"rank": 1, "local_rank": 1, "node_rank": 0, "host": "h", "pid": 42, "exitcode": 1, "type": "ValueError",
             "message": "bad", "traceback": "Traceback ...\nValueError: bad\n", "timestamp": 1.25}
OLD_ATTEMPT = {"attempt": 0, "started": 1.0, "ended": 2.0, "outcome": "failed", "exit_code": 1, "message": "rank 1: bad",
               "retry": True, "reason": "retryable"}


def test_old_files_read_as_version_1(tmp_path):
    for name, data in (("launch.json", OLD_LAUNCH), ("result.json", OLD_RESULT), ("slurm.json", OLD_SLURM_RESULT),
                       ("error.json", OLD_ERROR)):
        (tmp_path / name).write_text(json.dumps(data))
    launch = read_launch(tmp_path / "launch.json")
    assert launch == LaunchFile(NODE, "/j", 0, 30.0, 5.0)  # the sample interval's default
    result = read_node_result(tmp_path / "result.json")
    assert result.exitcode == 1 and result.failures[0].rank == 1 and result.failures[0].timestamp == 1.5
    assert result.terminated == (0,) and not result.synthesized
    slurm = read_node_result(tmp_path / "slurm.json")
    assert slurm.stopped_by == "SIGTERM" and slurm.details == {"slurm_job": "41", "slurm_state": "TIMEOUT"}
    assert read_rank_error(tmp_path / "error.json") == RankError(1, 1.25, "ValueError", "bad", OLD_ERROR["traceback"],
                                                                  1, 1, 0, "h", 42)
    (tmp_path / "attempts.jsonl").write_text(json.dumps(OLD_ATTEMPT) + "\n")
    assert read_attempts(tmp_path / "attempts.jsonl")[0].outcome is OutcomeKind.FAILED


def test_written_files_round_trip_and_keep_their_keys(tmp_path):
    launch = LaunchFile(NODE, "/j", 2, 10.0, 0.5)
    write_launch(tmp_path / "launch.json", launch)
    assert read_launch(tmp_path / "launch.json") == launch
    result = NodeResult.from_dict(OLD_SLURM_RESULT)
    write_node_result(tmp_path / "result.json", result)
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["version"] == 1 and data["slurm_state"] == "TIMEOUT" and data["stopped_by"] == "SIGTERM"
    assert read_node_result(tmp_path / "result.json") == result
    record = AttemptRecord(3, 1.0, 2.0, OutcomeKind.LOST, None, "its supervisor vanished", False, "lost")
    append_attempt(tmp_path / "attempts.jsonl", record)
    assert read_attempts(tmp_path / "attempts.jsonl") == [record]
    assert SchedulerRecord.from_dict({"scheduler": "slurm", "job_id": 4711}).job_id == "4711"  # old ids as numbers


def test_a_scheduler_record_keeps_the_backends_details(tmp_path):
    """Ray's address and placed nodes, SageMaker's last status: beside the id, kept as written."""
    from phalanx.core.contracts import write_scheduler

    record = SchedulerRecord("ray", "phalanx-j1-0", 1.0, address="http://head:8265")
    placed = record.with_details(nodes=[{"ip": "10.0.0.1"}])
    write_scheduler(tmp_path / "scheduler.json", placed)
    data = json.loads((tmp_path / "scheduler.json").read_text())
    assert data["address"] == "http://head:8265" and data["nodes"] == [{"ip": "10.0.0.1"}] and data["version"] == 1
    assert read_scheduler(tmp_path / "scheduler.json") == placed and placed.details == {"nodes": [{"ip": "10.0.0.1"}]}
    assert placed.with_details(status="Completed").details == {"nodes": [{"ip": "10.0.0.1"}], "status": "Completed"}
    old = SchedulerRecord.from_dict({"scheduler": "sagemaker", "job_id": "phx-j-a0", "status": "Training"})
    assert old.address is None and old.details == {"status": "Training"}


def test_a_synthesized_result_says_so():
    result = NodeResult.synthesize(1, 255, "the connection to gpu2 ended", host="gpu2")
    assert result.synthesized and result.failures == () and result.to_dict()["synthesized"] is True
    assert NodeResult.from_dict(result.to_dict()) == result


def test_a_newer_version_is_refused_with_upgrade(tmp_path):
    (tmp_path / "result.json").write_text(json.dumps({**OLD_RESULT, "version": 99}))
    with pytest.raises(ContractError, match=r"result.json was written by a newer phalanx \(format 99.*upgrade phalanx"):
        read_node_result(tmp_path / "result.json")


@pytest.mark.parametrize("data, message", [
    ({"node_rank": 0, "failures": []}, "'exitcode' must be present"),
    ({"exitcode": "1"}, "'exitcode' must be a whole number, not '1'"),
    ({"exitcode": 1, "failures": [{"rank": 0, "exitcode": 1}]}, r"failures\[0\]: 'timestamp' must be present"),
    ({"exitcode": 1, "terminated": ["a"]}, "'terminated' must be a list of rank numbers"),
    ([1, 2], "expected a JSON object, got list"),
])
def test_a_malformed_result_names_the_file_and_the_field(tmp_path, data, message):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError, match=message) as err:
        read_node_result(path)
    assert str(path) in str(err.value)


def test_an_attempt_line_still_being_written_is_left_for_later(tmp_path):
    path = tmp_path / "attempts.jsonl"
    path.write_text(json.dumps(OLD_ATTEMPT) + "\n" + '{"attempt": 1, "sta')
    assert [a.attempt for a in read_attempts(path)] == [0]
    path.write_text(json.dumps({**OLD_ATTEMPT, "outcome": "exploded"}) + "\n")
    with pytest.raises(ContractError, match=r"attempts.jsonl:1: 'outcome' must be one of succeeded, failed"):
        read_attempts(path)


def test_missing_files_are_none_not_errors(tmp_path):
    assert read_launch(tmp_path / "x") is None and read_node_result(tmp_path / "x") is None
    assert read_rank_error(tmp_path / "x") is None and read_scheduler(tmp_path / "x") is None
    assert read_attempts(tmp_path / "x") == []


def test_stop_reasons_are_outcomes():
    assert [r.outcome for r in StopReason] == [OutcomeKind.CANCELLED, OutcomeKind.PREEMPTED, OutcomeKind.PRUNED,
                                               OutcomeKind.DIVERGED, OutcomeKind.TIMEOUT]


def test_a_job_directory_written_before_the_versions_shows_in_ps_and_status(tmp_path, monkeypatch):
    """Files as phalanx wrote them before core/contracts existed, in a store of that time."""
    from typer.testing import CliRunner

    from phalanx.cli.main import app
    from phalanx.core.paths import HomePaths
    from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
    from phalanx.store import Store

    monkeypatch.setenv("PHALANX_HOME", str(tmp_path))
    home = HomePaths(tmp_path)
    paths = home.job("0ld0ld00")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py"), Resources(1, 2), name="old")
    for attempt in (0, 1):
        paths.node_dir(attempt, 0).mkdir(parents=True)
        paths.node_launch(attempt, 0).write_text(json.dumps({**OLD_LAUNCH, "attempt": attempt}))
        paths.node_result(attempt, 0).write_text(json.dumps(OLD_RESULT))
        for rank in (0, 1):
            paths.rank_dir(attempt, rank).mkdir()
            paths.rank_proc(attempt, rank).write_text(json.dumps({"pid": 40 + rank, "rank": rank, "node_rank": 0,
                                                                  "host": "h", "started": 1.0}))
        paths.rank_error(attempt, 1).write_text(json.dumps(OLD_ERROR))
    paths.attempts_log.write_text(json.dumps(OLD_ATTEMPT) + "\n" + json.dumps(
        {**OLD_ATTEMPT, "attempt": 1, "retry": False, "reason": "no retries left (1/1 used)"}) + "\n")
    store = Store(home.db)
    store.insert_job(id="0ld0ld00", name="old", backend="local", nnodes=1, nproc_per_node=2, command="t.py",
                     job_dir=str(paths.root), spec_json=json.dumps(spec.to_dict()), state="FAILED", exit_code=1,
                     attempt=1, root_cause=json.dumps({"rank": 1, "node_rank": 0, "message": "bad", "exitcode": 1}))
    ps = CliRunner().invoke(app, ["ps", "--all"])
    assert "0ld0ld00  old   FAILED(1)" in ps.output, ps.output
    status = CliRunner().invoke(app, ["status", "old"])
    assert status.exit_code == 0, status.output
    assert "  0  failed    exit 1" in status.output and "  1  failed    exit 1" in status.output
    assert "1     0     h     41   1     failed" in status.output and "root cause: rank 1 on node 0: bad" in status.output
