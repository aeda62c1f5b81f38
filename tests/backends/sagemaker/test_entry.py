"""The in-container entry in one process, without a plane: a fake /opt/ml tree under
PHALANX_SM_ROOT, the real node agent, a one-process job; and the log-line protocol both ends share."""

import io
import json
import os
import signal
import sys
from pathlib import Path

from phalanx.backends.registry import get_backend
from phalanx.backends.sagemaker import entry, layout
from phalanx.backends.sagemaker.plan import launch_data
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
from phalanx.storage.bundle import build, code_files, unpack

ROLE = "arn:aws:iam::123456789012:role/sm"


def test_lines_are_rank_output_records_or_the_agents():
    assert entry.parse_line("[rank 12] loss=0.5") == ("rank", (12, "loss=0.5"))
    assert entry.parse_line('[phalanx] {"file": "result", "data": {"exitcode": 0}}') == ("frame", {"file": "result", "data": {"exitcode": 0}})
    assert entry.parse_line("[phalanx] not json") == ("agent", "[phalanx] not json")
    assert entry.parse_line("[rank0]:[W socket.cpp] torch's own prefix") == ("agent", "[rank0]:[W socket.cpp] torch's own prefix")


def test_paths_move_under_the_test_root_and_nowhere_else():
    data = {"a": "/opt/ml/model", "b": ["--launch=/opt/ml/x/launch.json", "/opt/mlx", "/x/opt/ml/y"], "c": "/opt/ml"}
    moved = entry.under_root("/r oot", data)
    assert moved == {"a": "/r oot/opt/ml/model", "b": ["--launch=/r oot/opt/ml/x/launch.json", "/opt/mlx", "/x/opt/ml/y"],
                     "c": "/r oot/opt/ml"}
    assert entry.under_root("", data) == data


def test_one_instance_runs_its_node_and_reports_through_stdout(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    # The image's python3 has the framework; here that is this venv's.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text("import os, sys\nprint('state', os.environ['PHALANX_STATE_DIR'], 'host', os.environ['SM_CURRENT_HOST'])\n"
                                 "open(os.path.join(os.environ['SM_MODEL_DIR'], 'w.txt'), 'w').write('x')\nsys.exit(3)\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(code / "job.py")), Resources(1, 1), name="one", backend="sagemaker",
                   workdir=str(code), backend_options={"role": ROLE, "s3_prefix": "s3://b/p", "image": "x/y:1"})
    backend, spec = get_backend("sagemaker"), spec.with_(python=sys.executable)
    plan = backend.plan(spec, "e2e1", 0, HomePaths(tmp_path / "home"), backend.facts(spec))
    root = tmp_path / "instance"
    channel = root / "opt/ml/input/data" / layout.CHANNEL
    channel.mkdir(parents=True)
    build(code_files(code), channel / layout.BUNDLE)
    (channel / layout.LAUNCH).write_text(json.dumps(launch_data(plan, 5.0)))
    config = root / "opt/ml/input/config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}))
    (root / "opt/ml/output").mkdir(parents=True)
    unpack(channel / layout.BUNDLE, root / "opt/ml/phalanx")
    out = io.StringIO()
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        code_ = entry.run(str(root), out)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    lines = out.getvalue().splitlines()
    assert code_ == 3, out.getvalue()
    assert f"[rank 0] state {root}/opt/ml/checkpoints host algo-1" in lines
    frames = [entry.parse_line(l)[1] for l in lines if entry.parse_line(l)[0] == "frame"]
    result = next(f["data"] for f in frames if f["file"] == "result")
    assert result["exitcode"] == 3 and result["failures"][0]["rank"] == 0
    assert any(f["file"] == "proc" and f["rank"] == 0 for f in frames)
    assert (root / "opt/ml/model/w.txt").read_text() == "x"
    assert (root / "opt/ml/output/failure").read_text().startswith("rank 0 on node 0 (algo-1) failed: exit code 3")
