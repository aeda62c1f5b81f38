"""Metrics and resource samples of real processes: real DDP output, real process trees."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.core.paths import JobPaths
from phalanx.core.spec import parse_metric
from phalanx.monitor.metrics import MetricsCollector, read_metrics
from phalanx.monitor.resources import ResourceSampler, read_resources
from tests.conftest import EXAMPLES, phalanx

pytestmark = pytest.mark.local


def _only_job() -> dict:
    (job,) = json.loads(phalanx("ps", "--all", "--json", check=True).stdout)
    return job


def test_metrics_from_real_ddp_output(phx_home):
    phalanx("run", "-n", "2", str(EXAMPLES / "train_ddp.py"), "--epochs", "2", "--steps-per-epoch", "15", check=True)
    paths = JobPaths(Path(_only_job()["job_dir"]))
    for rank in paths.ranks(0):  # what phalanx run collected itself (once wired): collect afresh here
        paths.rank_metrics(0, rank).unlink(missing_ok=True)
    collector = MetricsCollector(paths, 0, [parse_metric("final=final loss=([0-9.]+)")])
    collector.poll(final=True)
    log = paths.rank_log(0, 0).read_text()
    printed = [(int(s), int(e), float(v)) for e, s, v in re.findall(r"epoch=(\d+) step=(\d+) loss=([0-9.]+)", log)]
    records = read_metrics(paths, 0, 0)
    got = [(r["step"], r["epoch"], r["value"]) for r in records if r["name"] == "loss"]
    assert got[: len(printed)] == printed and len(printed) == 30
    final = [r for r in records if r["name"] == "final"]
    assert len(final) == 1 and f"final loss={final[0]['value']:.4f}" in log and final[0]["step"] == 30
    # "final loss=X" matched the definition, so it is not picked up a second time as "loss"
    assert len(got) == 30
    assert collector.poll(final=True) == 0  # nothing twice


BUSY = "import time\nend = time.time() + {secs}\nwhile time.time() < end: pass\n"


def test_sampler_records_process_trees_of_real_processes(tmp_path):
    """Rank 0: a busy process with a busy child; rank 1: an idle process."""
    parent = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {BUSY.format(secs=3)!r}])\n"
        + BUSY.format(secs=3) + "child.wait()\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", parent]), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])]
    out = tmp_path / "node_0" / "resources.jsonl"
    sampler = ResourceSampler(out, 0, lambda: {0: procs[0].pid, 1: procs[1].pid}, interval=0.25)
    try:
        sampler.start()
        time.sleep(2.5)
    finally:
        sampler.stop()
        for p in procs:
            p.wait(timeout=30)
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(samples) >= 3  # about 10 on an idle machine; a loaded one samples late, not never
    late = samples[-1]
    assert late["node_rank"] == 0 and late["mem_total"] > late["mem_used"] > 0 and late["cpu_count"] >= 1
    assert {"disk_read", "net_sent", "net_recv_rate"} <= set(late) or "net_sent_rate" in late
    assert late["ranks"]["0"]["procs"] == 2, "the child is part of rank 0's tree"
    assert late["ranks"]["1"]["procs"] == 1
    busy = max(s["ranks"]["0"]["cpu_percent"] for s in samples[2:])
    idle = max(s["ranks"]["1"]["cpu_percent"] for s in samples[2:])
    # Two spinning processes against one sleeping one. Relative bounds only: other work may share
    # the cores (a loaded CI machine gives the spinners far less than a core each).
    assert busy > 3 * idle and busy > 2 and idle < 20, (busy, idle)
    assert late["ranks"]["0"]["rss"] > 1_000_000
    assert late["gpus"] == [] or all("util" in g for g in late["gpus"])



def test_two_process_job_records_metrics_and_resource_samples(phx_home, tmp_path):
    script = tmp_path / "logs_too.py"
    script.write_text(
        "import json, os, time\n"
        "rank = int(os.environ['RANK'])\n"
        "for step in range(1, 13):\n"
        "    print(f'step {step} loss={1 / step:.4f}', flush=True)\n"
        "    with open(os.environ['PHALANX_METRICS_FILE'], 'a') as fh:\n"
        "        fh.write(json.dumps({'custom': rank * 100 + step, 'step': step}) + '\\n')\n"
        "    time.sleep(0.25)\n"
    )
    proc = phalanx("run", "-n", "2", "--sample-interval", "0.5", "--metric", "inv=loss=([0-9.]+)", str(script), check=True)
    job = _only_job()
    paths = JobPaths(Path(job["job_dir"]))
    records = read_metrics(paths, 0)
    for rank in (0, 1):
        mine = [r for r in records if r["rank"] == rank]
        assert [r["step"] for r in mine if r["name"] == "inv"] == list(range(1, 13))
        assert [r["value"] for r in mine if r["name"] == "custom"] == [rank * 100 + s for s in range(1, 13)]
    samples = read_resources(paths, 0)
    assert len(samples) >= 3 and any(set(s["ranks"]) == {"0", "1"} for s in samples)
    shown = json.loads(phalanx("metrics", job["id"], "--json", check=True).stdout)
    assert shown["metrics"]["inv"]["last"] == 0.0833 and shown["metrics"]["inv"]["last_step"] == 12
    exported = [json.loads(line) for line in phalanx("metrics", job["id"], "--jsonl", check=True).stdout.splitlines()]
    assert exported == records, "the JSON export holds every record of every rank, as read_metrics reads them"
    assert "metrics" in phalanx("status", job["id"], check=True).stdout
    assert "node 0" in phalanx("top", job["id"], "--once", check=True).stdout
    assert proc.returncode == 0
