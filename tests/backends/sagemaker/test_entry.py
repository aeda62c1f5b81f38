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


def test_a_node_whose_ranks_lost_a_peer_is_a_casualty_and_one_that_raised_is_not(tmp_path):
    """The entry on an instance whose failing ranks only lost a peer waits for that peer's
    instance to report first (SageMaker's FailureReason is the first instance's failure file)."""
    paths = HomePaths(tmp_path).job("j1")

    def node(*errors: tuple[int, str, str]) -> dict:
        for rank, kind, message in errors:
            path = paths.rank_error(0, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"type": kind, "message": message}))
        return {"failures": [{"rank": rank, "exitcode": 1} for rank, _, _ in errors]}

    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.200.1.2]:40503"
    assert entry.cut_off_by_peer(node((0, "torch.distributed.DistBackendError", gloo)), paths, 0)
    assert entry.cut_off_by_peer(node((1, "RuntimeError", "NCCL communicator was aborted on rank 1")), paths, 0)
    assert not entry.cut_off_by_peer(node((2, "RuntimeError", "injected failure at step 4")), paths, 0)
    assert not entry.cut_off_by_peer(node((0, "DistBackendError", gloo), (3, "ValueError", "bad shape")), paths, 0)
    assert not entry.cut_off_by_peer({"failures": [{"rank": 5, "exitcode": -9}]}, paths, 0)  # killed, no record
    assert not entry.cut_off_by_peer({"failures": []}, paths, 0)
