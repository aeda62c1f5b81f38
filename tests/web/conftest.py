"""A phalanx home with real jobs for the dashboard tests: a 2-rank DDP run that succeeded (with
metrics and resource samples recorded while it ran) and one whose rank 1 failed.

The collector and the sampler are driven here around real jobs, so these tests do not depend
on how the supervisor and the agent start them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, phalanx

pytest.importorskip("starlette", reason="the dashboard needs the web extra: pip install -e '.[web]'")


FINAL = "final=final loss=([0-9.]+)"


@dataclass
class Demo:
    home: Path
    ok: str  # id of the succeeded job
    failed: str  # id of the failed job
    sweep: str = ""  # a 4-trial sweep: two trials finish, two are pruned by the median rule
    outputs: str = ""  # a tagged job that wrote outputs (an image, text, bytes, an HTML file)


SWEEP_TRIAL = """
import argparse, time
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--width", type=int, default=8)
p.add_argument("--steps", type=int, default=8)
a = p.parse_args()
for step in range(1, a.steps + 1):
    print(f"step={step} loss={a.lr * 10 / step:.5f} acc={1 - a.lr / 10 / step:.5f}", flush=True)
    time.sleep(0.35)
"""

OUTPUTS = r"""
import json, os, struct, zlib
out = os.environ["PHALANX_OUTPUT_DIR"]
def png(width, height):
    raw = b"".join(b"\x00" + b"".join(bytes((x * 4 % 256, y * 5 % 256, 180)) for x in range(width)) for y in range(height))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
os.makedirs(os.path.join(out, "plots"), exist_ok=True)
open(os.path.join(out, "plots", "curve.png"), "wb").write(png(64, 48))
json.dump({"accuracy": 0.91, "note": "summary of the run"}, open(os.path.join(out, "summary.json"), "w"))
open(os.path.join(out, "model.bin"), "wb").write(os.urandom(2048))
open(os.path.join(out, "report.html"), "w").write("<script>document.title='pwned'</script>")
for step in range(1, 6):
    print(f"step={step} loss={1 / step:.4f} acc={0.5 + step / 20:.3f}", flush=True)
"""


def _job_dir(home: Path, job_id: str) -> Path:
    return home / "jobs" / job_id


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Demo:
    from phalanx.api import jobs, query
    from phalanx.core.paths import JobPaths
    from phalanx.core.spec import parse_metric
    from phalanx.monitor.metrics import MetricsCollector
    from phalanx.monitor.resources import ResourceSampler, rank_pids

    home = tmp_path_factory.mktemp("phx-web") / "home"
    env = {"PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    # Once phalanx run collects metrics and samples resources itself, let it; until then
    # this fixture does it around the job, the way the supervisor will.
    wired = "--sample-interval" in phalanx("run", "--help-all", env=env).stdout
    options = ["--sample-interval", "0.25", "--metric", FINAL] if wired else []
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        started = phalanx("run", "-d", "--json", "--name", "ddp", "-n", "2", *options, str(EXAMPLES / "train_ddp.py"),
                          "--epochs", "2", "--steps-per-epoch", "20", "--sleep", "0.1", check=True, env=env)
        ok = json.loads(started.stdout)["id"]
        paths = JobPaths(_job_dir(home, ok))
        collector = sampler = None
        if not wired:
            collector = MetricsCollector(paths, 0, [parse_metric(FINAL)]).start(0.3)
            sampler = ResourceSampler(paths.node_resources(0, 0), 0, lambda: rank_pids(paths, 0), 0.25).start()
        try:
            jobs.wait(ok, timeout=240)
        finally:
            if sampler and collector:
                sampler.stop()
                collector.stop()
        phalanx("run", "--name", "broken", "-n", "2", str(EXAMPLES / "train_ddp.py"), "--epochs", "1",
                "--steps-per-epoch", "10", "--fail-at-step", "3", "--fail-rank", "1", "--checkpoint-every", "0", env=env)
        failed = query.get_job("broken").id
        if not wired:
            MetricsCollector(JobPaths(_job_dir(home, failed)), 0).poll(final=True)
        scripts = home.parent / "scripts"
        scripts.mkdir()
        (scripts / "sweep_trial.py").write_text(SWEEP_TRIAL)
        (scripts / "outputs.py").write_text(OUTPUTS)
        phalanx("run", "--name", "sweepy", "--objective", "loss:min", "--early-stop", "median", "--parallel", "1",
                "--sample-interval", "0.25", str(scripts / "sweep_trial.py"), "--lr", "[0.1, 0.2, 3.0, 5.0]",
                "--width", "[8]", check=True, env=env)
        sweep = query.find_sweep("sweepy").id
        phalanx("run", "--name", "outputs", "--tag", "team=vision", "--tag", "stage=eval", str(scripts / "outputs.py"),
                check=True, env=env)
        outputs = query.get_job("outputs").id
    return Demo(home, ok, failed, sweep, outputs)


@pytest.fixture
def demo_env(demo, monkeypatch) -> Demo:
    monkeypatch.setenv("PHALANX_HOME", str(demo.home))
    return demo


def ui_command() -> list[str]:
    """``phalanx ui`` (registered on the main CLI once wired; until then through observe.register)."""
    shim = (
        "from phalanx.cli import main as m\n"
        "from phalanx.cli.observe import register\n"
        "names = {c.name or c.callback.__name__ for c in m.app.registered_commands}\n"
        "if 'ui' not in names and 'ui_cmd' not in names:\n"
        "    register(m.app)\n"
        "m.main()\n"
    )
    return [sys.executable, "-c", shim, "ui"]


class UiServer:
    """A real ``phalanx ui`` subprocess on 127.0.0.1 and a free port; stopped by its pid."""

    def __init__(self, home: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*ui_command(), "--port", "0", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PHALANX_HOME": str(home)},
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if "http://" not in line:
            self.stop()
            raise AssertionError(f"phalanx ui did not start: {line}{self.proc.stderr.read() if self.proc.stderr else ''}")
        self.url = line.split()[2]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
