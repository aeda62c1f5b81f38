"""Resource samples (with a stand-in NVML), reading them back, and the metrics/top commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from phalanx.core.paths import JobPaths
from phalanx.monitor.resources import ResourceSampler, latest_samples, rank_pids, read_resources, recent_resources

GiB = 2**30


@pytest.fixture
def fake_nvml(monkeypatch):
    """pynvml as nvidia-ml-py exposes it, for two GPUs; this process uses 3 GiB on GPU 1."""
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=[87, 3][h], memory=10)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=[60 * GiB, 3 * GiB][h], total=80 * GiB, free=0)
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * GiB)] if h == 1 else []
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr("phalanx.monitor.resources.NVIDIA_DEVICES", (os.devnull,))  # "a driver is here"
    return nvml


def test_no_nvidia_device_means_no_nvml_import(monkeypatch):
    from phalanx.monitor.resources import _Gpus

    monkeypatch.setattr("phalanx.monitor.resources.NVIDIA_DEVICES", ("/nonexistent/nvidiactl",))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import would raise ImportError: caught, but counted below
    imported = []
    real_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__
    monkeypatch.setattr("builtins.__import__", lambda name, *a, **k: imported.append(name) or real_import(name, *a, **k))
    gpus = _Gpus()
    assert gpus.handles == [] and "pynvml" not in imported


def test_sample_with_gpus_and_rank_trees(tmp_path, fake_nvml):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        sampler = ResourceSampler(tmp_path / "r.jsonl", 2, lambda: {4: os.getpid(), 5: 999_999_999}, interval=0.05)
        sampler.start()
        deadline = time.time() + 20
        while sampler.samples < 3 and time.time() < deadline:
            time.sleep(0.02)
        sampler.stop()
        sampler.stop()  # idempotent
    finally:
        child.kill()
        child.wait()
    samples = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(samples) >= 3
    last = samples[-1]
    assert last["node_rank"] == 2 and last["interval"] == 0.05
    assert last["gpus"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "util": 87, "mem_used": 60 * GiB, "mem_total": 80 * GiB},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "util": 3, "mem_used": 3 * GiB, "mem_total": 80 * GiB},
    ]
    assert set(last["ranks"]) == {"4"}, "a rank whose process does not exist is left out"
    mine = last["ranks"]["4"]
    assert mine["pid"] == os.getpid() and mine["procs"] >= 2 and mine["rss"] > 0 and mine["gpu_mem"] == 3 * GiB


def test_no_nvml_means_no_gpus(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    sample = ResourceSampler(tmp_path / "r.jsonl", 0, dict).sample()
    assert sample["gpus"] == [] and sample["ranks"] == {} and sample["cpu_count"] >= 1


def _job(tmp_path) -> JobPaths:
    paths = JobPaths(tmp_path / "job")
    for node in (0, 1):
        out = paths.node_resources(0, node)
        out.parent.mkdir(parents=True)
        with open(out, "w") as fh:
            for i in range(5):
                fh.write(json.dumps({"time": 100.0 + i, "node_rank": node, "host": f"h{node}", "cpu_percent": 10.0 * i,
                                     "mem_used": GiB, "mem_total": 8 * GiB, "ranks": {str(2 * node): {"pid": 1, "cpu_percent": 99.0, "rss": GiB, "procs": 1}},
                                     "gpus": []}) + "\n")
            fh.write('{"time": 1')  # a sample still being written
    for rank in (0, 1, 2):
        paths.rank_dir(0, rank).mkdir(parents=True)
        (paths.rank_proc(0, rank)).write_text(json.dumps({"pid": 100 + rank, "node_rank": rank // 2}))
    return paths


def test_reading_samples_back(tmp_path):
    paths = _job(tmp_path)
    assert len(read_resources(paths)) == 10 and all(s["attempt"] == 0 for s in read_resources(paths))
    assert [s["node_rank"] for s in read_resources(paths, 0, node_rank=1)] == [1] * 5
    latest = latest_samples(paths, 0)
    assert {n: s["cpu_percent"] for n, s in latest.items()} == {0: 40.0, 1: 40.0}
    assert len(recent_resources(paths, 0, max_bytes=400)) < 10  # only the end of each file
    assert rank_pids(paths, 0) == {0: 100, 1: 101, 2: 102}
    assert rank_pids(paths, 0, node_rank=1) == {2: 102}


class _Record:
    def __init__(self, paths: JobPaths, state: str = "RUNNING") -> None:
        from phalanx.core.state import JobState

        self.id, self.job_dir, self.nnodes, self.nproc_per_node, self.attempt = "feedbeef", str(paths.root), 2, 2, 0
        self.paths = paths
        self.state = JobState(state)


def _cli(monkeypatch, record, *args: str):
    import typer
    from typer.testing import CliRunner

    from phalanx.api import query
    from phalanx.cli.observe import register

    monkeypatch.setattr(query, "get_job", lambda ref, store=None, projects=None: record)
    monkeypatch.setenv("PHALANX_HOME", str(Path(record.job_dir).parent / "home"))  # never the user's own store
    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, list(args))


def test_top_once_and_metrics_commands(tmp_path, monkeypatch):
    from phalanx.monitor.metrics import MetricsCollector

    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))  # the commands open a store: never the user's own
    paths = _job(tmp_path)
    paths.rank_log(0, 0).write_text("step=1 loss=0.5\nstep=2 loss=0.25\n")
    MetricsCollector(paths, 0).poll()
    record = _Record(paths)
    top = _cli(monkeypatch, record, "top", "feedbeef", "--once")
    assert top.exit_code == 0, top.output
    assert "node 0" in top.output and "node 1" in top.output and "rank 2" in top.output and "1.0 GiB / 8.0 GiB" in top.output
    shown = _cli(monkeypatch, record, "metrics", "feedbeef")
    assert shown.exit_code == 0 and "loss" in shown.output and "0.25" in shown.output and "█▁" in shown.output
    data = json.loads(_cli(monkeypatch, record, "metrics", "feedbeef", "--json").output)
    assert data["metrics"]["loss"]["last_step"] == 2
    bad = _cli(monkeypatch, record, "top", "feedbeef", "--interval", "0")
    assert bad.exit_code != 0


def test_cli_does_not_import_the_web_stack():
    code = ("import sys, phalanx.cli.main, phalanx.cli.observe, phalanx.monitor.metrics\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'plotly', 'torch', 'phalanx.web')]\n"
            "assert not heavy and 'phalanx.web' not in sys.modules, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
