"""GPU-/CPU-hours and cost from a job's attempts, topology, samples and prices; the log index."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from phalanx.core.paths import JobPaths, write_json
from phalanx.core.state import JobState
from phalanx.monitor.accounting import job_usage
from phalanx.monitor.logindex import note, parse_duration, parse_since, since_offset, tail_offset
from phalanx.store import JobRecord

T0 = 1_700_000_000.0


def record(tmp_path: Path, backend: str = "local", nnodes: int = 1, nproc: int = 2, state: JobState = JobState.SUCCEEDED,
           options: dict | None = None, attempt: int = 1, ended: float | None = T0 + 7200) -> JobRecord:
    spec = {"resources": {"nnodes": nnodes, "nproc_per_node": nproc}, "backend_options": options or {}}
    return JobRecord(id="a1b2c3d4", name="train", state=state, backend=backend, nnodes=nnodes, nproc_per_node=nproc,
                     command="train.py", job_dir=str(tmp_path / "job"), spec_json=json.dumps(spec), created_at=T0,
                     started_at=T0, ended_at=ended, exit_code=0, attempt=attempt, supervisor_pid=None,
                     supervisor_started=None, root_cause=None)


def attempts(tmp_path: Path, spans: list[tuple[float, float]]) -> JobPaths:
    paths = JobPaths(tmp_path / "job")
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.attempts_log, "w") as fh:
        for number, (start, end) in enumerate(spans):
            fh.write(json.dumps({"attempt": number, "started": start, "ended": end, "outcome": "failed"}) + "\n")
    return paths


def sample(paths: JobPaths, attempt: int, gpus: int, on_gpu: int, name: str = "NVIDIA H100 80GB HBM3") -> None:
    ranks = {str(r): {"pid": 100 + r, "cpu_percent": 90.0, "rss": 1, **({"gpu_mem": 2**30} if r < on_gpu else {})} for r in range(2)}
    line = {"time": T0 + 10, "ranks": ranks, "gpus": [{"index": i, "name": name, "util": 90} for i in range(gpus)]}
    path = paths.node_resources(attempt, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(line) + "\n")


def test_every_attempt_counts_devices_times_wall_time(tmp_path):
    paths = attempts(tmp_path, [(T0, T0 + 3600)])  # attempt 0 failed after an hour; attempt 1 ran another hour
    for attempt in (0, 1):
        sample(paths, attempt, gpus=8, on_gpu=2)
    used = job_usage(record(tmp_path), prices={})
    assert [round(a["seconds"]) for a in used.attempts] == [3600, 3600]
    assert used.gpus_per_node == 2 and used.gpu_model == "NVIDIA H100 80GB HBM3"
    assert used.gpu_hours == pytest.approx(4.0) and used.cpu_hours == pytest.approx(4.0) and used.cost is None


def test_a_running_job_counts_up_to_now(tmp_path):
    attempts(tmp_path, [])
    used = job_usage(record(tmp_path, state=JobState.RUNNING, attempt=0, ended=None), now=T0 + 1800, prices={})
    assert used.cpu_hours == pytest.approx(1.0) and used.gpu_hours == 0


@pytest.mark.parametrize("backend, options, gpus, model", [
    ("slurm", {"gpus_per_node": 4}, 4, None),
    ("skypilot", {"gpus": "A100-80GB:8"}, 8, "A100-80GB"),
    ("sagemaker", {"instance_type": "ml.p4d.24xlarge"}, 8, "A100"),
    ("sagemaker", {"instance_type": "ml.g5.xlarge"}, 1, "A10G"),
    ("sagemaker", {"instance_type": "ml.m5.xlarge"}, 0, None),
])
def test_gpus_the_job_asked_for(tmp_path, backend, options, gpus, model):
    attempts(tmp_path, [(T0, T0 + 3600)])
    used = job_usage(record(tmp_path, backend=backend, nnodes=2, options=options, attempt=0, ended=T0 + 3600), prices={})
    assert used.gpus_per_node == gpus and used.gpu_model == model and used.gpu_hours == pytest.approx(2 * gpus)


def test_sagemaker_counts_its_billable_seconds(tmp_path):
    paths = attempts(tmp_path, [(T0, T0 + 7200)])
    write_json(paths.scheduler_job(0), {"scheduler": "sagemaker", "billable_seconds": 1800, "instance_count": 2})
    used = job_usage(record(tmp_path, backend="sagemaker", nnodes=2, options={"instance_type": "ml.g5.12xlarge"},
                            attempt=0, ended=T0 + 7200), prices={"ml.g5.12xlarge": 7.0})
    assert used.billed and used.gpu_hours == pytest.approx(2 * 4 * 0.5)
    assert used.cost == pytest.approx(7.0 * 2 * 0.5) and used.priced_by == "ml.g5.12xlarge"


def test_prices_by_gpu_model_then_cpu(tmp_path):
    paths = attempts(tmp_path, [(T0, T0 + 3600)])
    sample(paths, 0, gpus=2, on_gpu=2)
    prices = {"H100": 2.5, "A100": 1.5, "cpu": 0.05}
    used = job_usage(record(tmp_path, attempt=0, ended=T0 + 3600), prices=prices)
    assert used.cost == pytest.approx(2 * 2.5) and used.priced_by == "H100"
    cpu_only = tmp_path / "cpu"
    attempts(cpu_only, [(T0, T0 + 3600)])
    used = job_usage(record(cpu_only, attempt=0, ended=T0 + 3600), prices=prices)
    assert used.cost == pytest.approx(2 * 0.05) and used.priced_by == "cpu"
    assert job_usage(record(cpu_only, attempt=0, ended=T0 + 3600), prices={"H100": 2.5}).cost is None


def test_the_prices_setting_parses(monkeypatch, tmp_path):
    from phalanx import config
    from phalanx.errors import UsageError

    monkeypatch.setenv("PHALANX_HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text("prices:\n  H100: 2.5\n  ml.g5.xlarge: 1.41\n")
    assert config.get("prices") == {"H100": 2.5, "ml.g5.xlarge": 1.41}
    monkeypatch.setenv("PHALANX_PRICES", "{cpu: cheap}")
    with pytest.raises(UsageError, match="setting 'prices' must map names to numbers"):
        config.get("prices")


# -- the log index ----------------------------------------------------------------------------------


def test_logs_since_a_time_start_where_the_log_was_then(tmp_path):
    paths = JobPaths(tmp_path / "job")
    log = paths.rank_log(0, 0)
    log.parent.mkdir(parents=True)
    log.write_text("one\ntwo\n")
    note(paths, 0, now=T0)
    note(paths, 0, now=T0 + 5)  # unchanged: nothing noted
    with open(log, "a") as fh:
        fh.write("three\nfour\n")
    note(paths, 0, now=T0 + 10)
    assert paths.rank_log_index(0, 0).read_text().splitlines() == [f"{T0:.3f} 8", f"{T0 + 10:.3f} 19"]
    assert since_offset(paths, 0, 0, T0 - 1) == 0
    assert since_offset(paths, 0, 0, T0 + 3) == 8 and log.read_bytes()[8:] == b"three\nfour\n"
    assert since_offset(paths, 0, 0, T0 + 60) == 19
    assert since_offset(paths, 0, 1, T0) is None, "no index: the caller shows everything and says why"


def test_tail_offsets(tmp_path):
    log = tmp_path / "output.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1, 10001)))
    data = log.read_bytes()
    assert data[tail_offset(log, 3):] == b"line 9998\nline 9999\nline 10000\n"
    assert tail_offset(log, 20000) == 0 and tail_offset(log, 0) == len(data)
    log.write_bytes(b"a\nb\nno newline")
    assert log.read_bytes()[tail_offset(log, 2):] == b"b\nno newline"


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("2h", 7200), ("30d", 30 * 86400), ("1w", 604800), ("15", 15)])
def test_durations(text, seconds):
    assert parse_duration(text, "--older-than") == seconds
    assert parse_since(text, now=T0) == T0 - seconds


def test_times_and_bad_ones():
    from phalanx.errors import UsageError

    assert parse_since("2025-03-01T14:30") == time.mktime((2025, 3, 1, 14, 30, 0, 0, 0, -1))
    for bad in ("yesterday", "10 parsecs", "-5m", ""):
        with pytest.raises(UsageError):
            parse_since(bad)


@pytest.mark.parametrize("value, shown", [
    (None, "-"), (0.0, "0 CPU-h"), (6.48e-05, "0.23 CPU-s"), (0.001, "3.6 CPU-s"), (0.0123, "0.012 CPU-h"),
    (0.02, "0.02 CPU-h"), (3.25, "3.2 CPU-h"), (1234.5, "1,234.5 CPU-h"),
])
def test_device_time_is_shown_in_a_unit_that_fits(value, shown):
    from phalanx.monitor.accounting import hours

    assert hours(value, "CPU") == shown
