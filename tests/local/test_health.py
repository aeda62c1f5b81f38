"""A gang's health on real jobs: progress and ETA from a real tqdm bar and a real Lightning
Trainer (status, ps, wait --progress, the end notification); a NaN stopping a 2-rank job, and
rolled back (the state restored byte for byte) and retried; --max-duration and --idle-timeout
ending jobs as TIMEOUT; the slow rank of a real 4-rank gloo DDP job named with no code in the
script, and a healthy one left alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, phalanx
from tests.local.test_run import _wait_for
from tests.unit.test_notify import Webhook

pytestmark = pytest.mark.local

STRAGGLER = ROOT / "bench" / "straggler_train.py"


def status(job: str) -> dict:
    return json.loads(phalanx("status", job, "--json", check=True).stdout)


# -- progress and ETA ---------------------------------------------------------------------------------

TQDM = """
import sys, time
from tqdm import tqdm
bar = tqdm(total=200, file=sys.stderr, mininterval=0.2)
for i in range(200):
    time.sleep(0.05)
    bar.set_postfix(loss=1.0 / (i + 1))
    bar.update(1)
bar.close()
"""


def test_progress_and_eta_of_a_real_tqdm_bar_in_status_ps_wait_and_the_notification(phx_home, tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(TQDM)
    hook = Webhook()
    try:
        job = phalanx("run", "-d", "--notify", hook.url, str(script), check=True).stdout.strip()
        seen: dict = {}

        def eta_known() -> bool:
            seen.update(status(job))
            progress = (seen.get("health") or {}).get("progress") or {}
            return progress.get("eta_now") is not None or seen["state"] not in ("PENDING", "RUNNING")

        _wait_for(eta_known, 120, "an ETA")
        progress = seen["health"]["progress"]
        assert seen["state"] == "RUNNING", "the job ended before its progress was read"
        assert progress["text"].endswith("/200") and 0 < progress["fraction"] < 1 and progress["eta_now"] > 0
        text = phalanx("status", job, check=True).stdout
        assert f"progress  {progress['text'].split('/')[0]}" in text or "progress  " in text and "ETA" in text
        ps = phalanx("ps", check=True).stdout.splitlines()
        assert "PROGRESS" in ps[0] and "% ETA " in next(line for line in ps if line.startswith(job))
        from tests.web.test_api import client  # the dashboard's API, in process, on this home

        row = next(j for j in client().get("/api/jobs").json() if j["id"] == job)
        assert "% ETA " in row["progress"] and 0 < row["fraction"] < 1
        waited = phalanx("wait", job, "--progress", timeout=120)
        assert waited.returncode == 0 and f"{job} RUNNING: " in waited.stderr and "/200 (" in waited.stderr
        assert phalanx("status", job, check=True).stdout.count("progress  200/200 (100%)") == 1
        page = client().get(f"/api/jobs/{job}").json()
        assert page["health"]["progress"]["words"] == "200/200 (100%)" and page["health"]["lines"][0]["label"] == "progress"
        _wait_for(lambda: hook.received, 30, "the notification")
        event = hook.received[-1]["body"]["phalanx"]
        assert event["kind"] == "succeeded" and event["detail"].startswith("200/200 (100%) in ")
        assert "loss=0.005" in event["fields"]["summary"]
    finally:
        hook.close()


LIGHTNING = """
import argparse, torch, lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset
p = argparse.ArgumentParser(); p.add_argument("--max_epochs", type=int); args = p.parse_args()
class M(L.LightningModule):
    def __init__(self): super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y); self.log("train_loss", loss, prog_bar=True); return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(320, 8), torch.randn(320, 1)), batch_size=8)
L.Trainer(max_epochs=args.max_epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
          enable_model_summary=False, callbacks=[TQDMProgressBar(refresh_rate=5)]).fit(M(), data)
"""


def test_a_real_lightning_trainer_run(phx_home, tmp_path):
    """Lightning's tqdm bar says the epoch (from 0) and the batch; the epochs come from --max_epochs."""
    script = tmp_path / "lit.py"
    script.write_text(LIGHTNING)
    phalanx("run", "-q", str(script), "--max_epochs", "3", check=True, timeout=240)
    progress = status("lit")["health"]["progress"]
    assert progress["text"] == "epoch 2 · 40/40" and progress["fraction"] == 1.0 and not progress["of_epoch"]
    rows = phalanx("ps", "-a", check=True).stdout.splitlines()
    assert "100%" in rows[1].split()


# -- bad numbers -------------------------------------------------------------------------------------

NAN_AT = """
import os, sys, time
rank = int(os.environ["RANK"])
for step in range(1, 601):
    loss = float("nan") if (rank == 1 and step == 30) else 1.0 / step
    print(f"step {step} loss={loss}", flush=True)
    time.sleep(0.05)
"""


def test_a_nan_stops_the_job_within_seconds_of_the_line(phx_home, tmp_path):
    script = tmp_path / "nan.py"
    script.write_text(NAN_AT)
    done = phalanx("run", "-n", "2", "--on-nan", "stop", str(script), timeout=180)
    assert done.returncode != 0
    assert "diverged: loss=nan at step 30 (rank 1)" in done.stderr
    record = status("nan")
    assert record["state"] == "FAILED" and record["root_cause"]
    cause = json.loads(record["root_cause"]) if isinstance(record["root_cause"], str) else record["root_cause"]
    assert cause["message"] == "diverged: loss=nan at step 30 (rank 1)" and cause["anomaly"]["step"] == 30
    assert record["attempts"][-1]["outcome"] == "diverged"
    # stopped, not run to the end: the last step rank 0 printed is far from 600 (30 s more of work)
    log = Path(record["job_dir"]) / "attempt_0" / "rank_0" / "output.log"
    last = int(log.read_text().strip().splitlines()[-1].split()[1])
    assert 30 <= last < 400


ROLLBACK = """
import json, os, shutil, sys, time
state, out = os.environ["PHALANX_STATE_DIR"], os.environ["PHALANX_OUTPUT_DIR"]
ckpt = os.path.join(state, "ckpt.json")
start, w = 0, 1.0
if os.path.exists(ckpt):
    shutil.copyfile(ckpt, os.path.join(out, f"resumed-{os.environ['PHALANX_ATTEMPT']}.json"))
    with open(ckpt) as fh:
        saved = json.load(fh)
    start, w = saved["step"], saved["w"]
    print(f"resumed from step {start}", flush=True)
once = os.path.join(out, "nan-printed")
for step in range(start + 1, 101):
    w *= 0.99
    loss = w
    if step == 57 and not os.path.exists(once):
        open(once, "w").close()
        loss = float("nan")
    print(f"step {step} loss={loss}", flush=True)
    if step % 10 == 0:
        with open(ckpt, "w") as fh:  # rewritten in place, as torch.save does
            json.dump({"step": step, "w": w, "pad": "x" * 1000}, fh)
        shutil.copyfile(ckpt, os.path.join(out, f"written-{step}-{os.environ['PHALANX_ATTEMPT']}.json"))
    time.sleep(0.05)
"""


def test_nan_retry_rolls_back_to_the_state_written_before_it(phx_home, tmp_path):
    script = tmp_path / "roll.py"
    script.write_text(ROLLBACK)
    done = phalanx("run", "--on-nan", "retry", str(script), timeout=180)
    assert done.returncode == 0, done.stderr
    assert "rolled back to the state of step 50" in done.stderr
    record = status("roll")
    assert record["state"] == "SUCCEEDED" and record["attempt"] == 1
    first, second = record["attempts"]
    assert first["outcome"] == "diverged" and first["message"] == "diverged: loss=nan at step 57 (rank 0)"
    assert first["retry"] and first["reason"] == "rolled back to the state of step 50; retrying"
    out = Path(record["job_dir"]) / "output"
    assert (out / "resumed-1.json").read_bytes() == (out / "written-50-0.json").read_bytes()
    logs = Path(record["job_dir"]) / "attempt_1" / "rank_0" / "output.log"
    assert logs.read_text().startswith("resumed from step 50\nstep 51 ")
    text = phalanx("status", "roll", check=True).stdout
    assert "[rolled back to the state of step 50; retrying]" in text


# -- stops that save money -------------------------------------------------------------------------------

FOREVER = """
import os, signal, sys, time
state = os.environ["PHALANX_STATE_DIR"]
def bye(*_):
    with open(os.path.join(state, "saved-on-sigterm.txt"), "w") as fh:
        fh.write("checkpoint")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
step = 0
while True:
    step += 1
    print(f"step {step} loss={1 / step}", flush=True)
    time.sleep(0.1)
"""


def test_max_duration_ends_the_job_with_timeout_and_its_state_synced(phx_home, tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    remote = tmp_path / "remote-state"
    done = phalanx("run", "--max-duration", "4s", "--grace", "10", "--state", f"file://{remote}", str(script), timeout=120)
    assert done.returncode == 124
    assert "--max-duration 4s reached" in done.stderr and "timed out" in done.stderr
    record = status("forever")
    assert record["state"] == "TIMEOUT"
    manifest = json.loads((remote / "_phalanx_manifest.json").read_text())
    assert "saved-on-sigterm.txt" in manifest["files"]  # the SIGTERM handler's checkpoint, uploaded
    resumed = phalanx("resume", "-d", record["id"], check=True)  # TIMEOUT can be resumed
    assert resumed.stdout.strip() == record["id"]
    phalanx("stop", record["id"], check=True)


def test_idle_timeout_ends_a_job_that_does_nothing(phx_home, tmp_path):
    script = tmp_path / "idle.py"
    script.write_text("import time\nprint('loading', flush=True)\ntime.sleep(600)\n")
    began = time.monotonic()
    done = phalanx("run", "--idle-timeout", "6s", "--sample-interval", "1", str(script), timeout=120)
    assert done.returncode == 124 and time.monotonic() - began < 100
    cause = status("idle")["root_cause"]
    cause = json.loads(cause) if isinstance(cause, str) else cause
    assert cause["limit"] == "idle_timeout" and cause["message"].startswith("idle for ")
    assert "no rank used more than 5% of a core and none printed anything" in cause["message"]


# -- the slow rank --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_slow_rank_of_a_real_ddp_job_is_named_and_a_healthy_job_is_left_alone(phx_home):
    """4 ranks of gloo DDP on CPU, rank 3 with 3x the work of the others per step, only rank 0
    printing: status, ps --wide and the supervisor's log name rank 3. The healthy twin (20 more
    healthy runs are replayed in tests/unit/test_straggler.py) gets no warning."""
    job = phalanx("run", "-d", "-n", "4", str(STRAGGLER), "--seconds", "150", "--slow-rank", "3", "--factor", "3",
                  check=True).stdout.strip()
    try:
        found: dict = {}

        def named() -> bool:
            found.update(status(job))
            return bool((found["health"] or {}).get("straggler")) or found["state"] not in ("PENDING", "RUNNING")

        _wait_for(named, 200, "the straggler")
        straggler = found["health"]["straggler"]
        assert straggler["ranks"] == [3] and straggler["nodes"] == [0] and straggler["factor"] >= 1.5
        text = phalanx("status", job, check=True).stdout
        assert "straggler rank 3 on node 0 (" in text and "slower per step than the median; the others wait for it" in text
        wide = phalanx("ps", "--wide", check=True).stdout.splitlines()
        assert "HEALTH" in wide[0] and "rank 3 slow" in next(line for line in wide if line.startswith(job))
    finally:
        phalanx("stop", job)
    log = Path(status(job)["job_dir"]) / "supervisor.log"
    assert "warning: rank 3 on node 0" in log.read_text()
    healthy = phalanx("run", "-d", "-n", "4", str(STRAGGLER), "--seconds", "45", check=True).stdout.strip()
    assert phalanx("wait", healthy, timeout=240).returncode == 0
    assert "slower per step" not in (Path(status(healthy)["job_dir"]) / "supervisor.log").read_text()
    assert status(healthy)["health"]["straggler"] is None
