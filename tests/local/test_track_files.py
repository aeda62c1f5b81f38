"""``--track tensorboard`` and ``--track wandb`` with no server: TensorBoard's event files read back
with TensorBoard's own reader, and W&B's offline run directory (the real ``wandb`` package,
``WANDB_MODE=offline``) read record by record, against phalanx's own series."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import phalanx

pytestmark = [pytest.mark.local]

SCRIPT = '''
import os, time
rank = int(os.environ.get("RANK", "0"))
for step in range(int(os.environ.get("STEPS", "8"))):
    print(f"step {step} loss={(rank + 1) / (step + 1):.6f} lr_now={0.1 * 0.9 ** step:.6f}", flush=True)
    time.sleep(0.05)
if os.environ.get("OWN_WANDB"):
    import wandb
    run = wandb.init()
    with open(os.path.join(os.environ["PHALANX_OUTPUT_DIR"], "own.json"), "w") as f:
        f.write(__import__("json").dumps({"id": run.id, "group": run.group, "project": run.project}))
    run.log({"own": 1.0})
    run.finish()
'''


def wandb_records(run_dir: Path) -> dict[str, Any]:
    """Every record of W&B's offline run files under ``run_dir`` (``run-*.wandb``: W&B's
    transaction log, LevelDB's log format of 32 KiB blocks, each record a ``wandb_internal_pb2.Record``):
    history rows, the config, the run ids."""
    from wandb.proto import wandb_internal_pb2 as pb

    history: list[dict[str, str]] = []
    config: dict[str, str] = {}
    run_ids: set[str] = set()
    groups: set[str] = set()
    for path in sorted(run_dir.glob("**/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B"
        pos, block, payloads, partial = 7, 32768, [], b""
        while pos + 7 <= len(data):
            left = block - pos % block
            if left < 7:
                pos += left
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0 and length == 0:
                pos += left
                continue
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 1:
                payloads.append(chunk)
            elif kind == 2:
                partial = chunk
            elif kind == 3:
                partial += chunk
            elif kind == 4:
                payloads.append(partial + chunk)
        for payload in payloads:
            record = pb.Record()
            record.ParseFromString(payload)
            which = record.WhichOneof("record_type")
            if which == "history":
                history.append({i.key or "/".join(i.nested_key): i.value_json for i in record.history.item})
            elif which == "run":
                run_ids.add(record.run.run_id)
                groups.add(record.run.run_group)
                config.update({i.key: i.value_json for i in record.run.config.update})
            elif which == "config":
                config.update({i.key: i.value_json for i in record.config.update})
    return {"history": history, "config": config, "run_ids": run_ids, "groups": groups}


def finished(job_dir: str, kind: str, timeout: float = 180.0) -> dict:
    """The exporter's state once it has closed the run (it runs beside the job, a moment longer)."""
    path = Path(job_dir) / "track" / f"{kind}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            state = json.loads(path.read_text())
            if state.get("finished") and not state.get("waiting"):
                return state
        time.sleep(0.2)
    raise AssertionError(f"{kind} exporter did not finish: {(Path(job_dir) / 'track' / 'export.log').read_text()}")


def _series(name: str, rank: int) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in map(json.loads, phalanx("metrics", name, "--jsonl", "--rank", str(rank), check=True).stdout.splitlines()):
        out.setdefault(r["name"], []).append((r["step"], r["value"]))
    return out


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def test_tensorboard_event_files_equal_the_series(phx_home, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    board = tmp_path / "board"
    phalanx("run", "--name", "tb", "-n", "2", "--track", "tensorboard", "--track-ranks", "all", "--track-dir",
            str(board), str(tmp_path / "train.py"), "--lr", "0.1", check=True)
    job = json.loads(phalanx("status", "tb", "--json", check=True).stdout)
    state = finished(job["job_dir"], "tensorboard")
    logdir = board / f"tb-{job['id']}"
    assert str(logdir) in state["url"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    for rank, prefix in ((0, ""), (1, "rank1/")):
        for name, points in _series("tb", rank).items():
            assert [(e.step, e.value) for e in events.Scalars(prefix + name)] == [(s, _f32(v)) for s, v in points]
    assert "sys/cpu_percent" in events.Tags()["scalars"]
    assert "tensorboard --logdir" in phalanx("status", "tb", check=True).stdout
    # status of a tracked job imports no tracker
    import subprocess
    import sys

    code = ("import sys\nsys.argv = ['phalanx', 'status', 'tb']\nfrom phalanx.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PHALANX_HOME": str(phx_home), "PATH": "/usr/bin:/bin"}).stdout
    assert "tensorboard --logdir" in out
    assert not set(out.strip().splitlines()[-1].split()) & {"tensorboard", "mlflow", "wandb"}


def test_wandb_offline_run_holds_history_and_config_and_the_script_joins_the_group(phx_home, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {"WANDB_MODE": "offline", "WANDB_PROJECT": "phx-test", "OWN_WANDB": "1"}
    phalanx("run", "--name", "wb", "--track", "wandb", "--track-artifacts", str(tmp_path / "train.py"), "--lr", "0.1",
            "--bs=32", env=env, check=True, cwd=tmp_path)
    job = json.loads(phalanx("status", "wb", "--json", check=True).stdout)
    state = finished(job["job_dir"], "wandb")
    assert state["run_id"] == f"phalanx-{job['id']}"
    records = wandb_records(Path(state["url"]))
    rows = [(int(r["_step"]), float(r["loss"])) for r in records["history"] if "loss" in r]
    assert rows == _series("wb", 0)["loss"]
    config = {k: json.loads(v) for k, v in records["config"].items()}
    assert config["lr"] == "0.1" and config["bs"] == "32" and config["phalanx.job_id"] == job["id"]
    assert records["groups"] == {job["id"]}
    # the script's own wandb.init(), given WANDB_RUN_ID/WANDB_RESUME/WANDB_RUN_GROUP, is the job's run in its group
    own = json.loads((Path(job["job_dir"]) / "output" / "own.json").read_text())
    assert own == {"id": f"phalanx-{job['id']}", "group": job["id"], "project": "phx-test"}
    # --track-artifacts: the outputs and the log among the run's files
    files = Path(state["url"]) / "files" / "phalanx-files"
    assert json.loads((files / "outputs" / "own.json").read_text()) == own
    assert "loss=" in (files / "logs" / "attempt_0" / "rank_0.log").read_text()
