"""The in-pod entry (``phalanx.backends.kubernetes.pod``) and the supervisor's end of its log
stream (``node.Frames``): what each controller's environment becomes for the script, the
frames rebuilding a node's files exactly (twice read, still once), the termination message."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.backends.kubernetes import manifests, pod
from phalanx.backends.kubernetes.node import Frames
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources, Spawn

SRC = Path(__file__).resolve().parents[2] / "src"
SHOW_ENV = """import json, os
keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PHALANX_NODE_RANK", "PET_NNODES", "PET_NODE_RANK",
        "PET_MASTER_ADDR", "JOB_COMPLETION_INDEX"]
print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
"""
# What each controller sets in node 1's pod (research §1.2).
CONTROLLER_ENV = {
    "job": {"JOB_COMPLETION_INDEX": "1"},
    "jobset": {"JOB_COMPLETION_INDEX": "1"},
    "pytorchjob": {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "phx-j-a0-master-0", "MASTER_PORT": "23456",
                   "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "phx-j-a0-master-0"},
    "trainjob": {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "PET_MASTER_PORT": "29500",
                 "PET_MASTER_ADDR": "phx-j-a0-node-0-0.phx-j-a0", "JOB_COMPLETION_INDEX": "1"},
}


def _launch_for(kind: str, tmp: Path, spawn: Spawn = Spawn.SELF) -> tuple[Path, str]:
    """The launch file phalanx would put in the ConfigMap, with /phx moved under ``tmp``."""
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/show_env.py"), Resources(2, 1), name="j", backend="k8s",
                   workdir="/work", snapshot=True, spawn=spawn, backend_options={"k8s_kind": kind})
    backend = get_backend("k8s")
    plan = backend.plan(spec, "j", 0, HomePaths(tmp), backend.facts(spec))
    config = manifests.from_yaml(plan.submission)[0]
    text = config["data"]["launch.json"].replace('"/phx/', f'"{tmp}/phx/')
    launch = tmp / "launch.json"
    launch.write_text(text)
    (tmp / "phx" / "code").mkdir(parents=True)
    (tmp / "phx" / "code" / "show_env.py").write_text(SHOW_ENV)
    workload = manifests.from_yaml(plan.submission)[-1]
    return launch, json.dumps(workload)


@pytest.mark.parametrize("kind", sorted(CONTROLLER_ENV))
def test_k8s_pod_entry_maps_each_controllers_env_onto_the_agent(tmp_path, kind):
    launch, workload = _launch_for(kind, tmp_path)
    rank_var = manifests.rank_variable(kind)
    assert "--node-rank-from" in workload and rank_var in workload, "the manifest reads the controller's variable"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), **CONTROLLER_ENV[kind]}
    proc = subprocess.run([sys.executable, "-m", "phalanx.backends.kubernetes.pod", "--launch", str(launch),
                           "--node-rank-from", rank_var, "--termination-log", str(tmp_path / "termination-log")],
                          env=env, capture_output=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    frames = [json.loads(line) for line in proc.stdout.splitlines()]
    assert frames[-1] == {"exit": 0}
    out = Path(tmp_path, "rebuilt")
    f = Frames(out, {}, tag="1")
    for line in proc.stdout.splitlines(keepends=True):
        f.feed(line)
    seen = json.loads((out / "rank_1" / "output.log").read_text())
    assert seen["RANK"] == "1" and seen["WORLD_SIZE"] == "2" and seen["PHALANX_NODE_RANK"] == "1"
    node0 = manifests.node_hosts(kind, "phx-j-a0", 2)[0]
    assert seen["MASTER_ADDR"] == node0, "phalanx's node 0, not the controller's variable"
    assert seen["PET_NNODES"] is None and seen["PET_NODE_RANK"] is None and seen["PET_MASTER_ADDR"] is None
    told = json.loads((tmp_path / "termination-log").read_text())
    assert told["exitcode"] == 0 and told["node_rank"] == 1


def test_k8s_pod_entry_refuses_a_rank_it_cannot_read(tmp_path):
    launch, _ = _launch_for("job", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "phalanx.backends.kubernetes.pod", "--launch", str(launch),
                           "--node-rank-from", "JOB_COMPLETION_INDEX"],
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), "JOB_COMPLETION_INDEX": "7"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "node rank 7 is not one of the 2 nodes" in proc.stderr


def test_k8s_frames_rebuild_the_node_files_once_even_when_read_twice(tmp_path):
    src, out = tmp_path / "attempt_0", tmp_path / "local"  # named as JobPaths names it: the mirror reads the attempt from it
    (src / "node_0").mkdir(parents=True)
    (src / "rank_0").mkdir()
    (src / "rank_3").mkdir()
    (src / "node_0" / "agent.log").write_text("agent says hi\n")
    (src / "rank_0" / "proc.json").write_text(json.dumps({"node_rank": 0}))
    (src / "rank_3" / "proc.json").write_text(json.dumps({"node_rank": 1}))  # another node's rank: not sent
    big = os.urandom(pod.FRAME_BYTES * 2 + 17)  # binary, split into pieces
    (src / "rank_0" / "output.log").write_bytes(b"step=1\n")
    (src / "rank_3" / "output.log").write_text("not mine\n")
    trees = {"output": tmp_path / "pod_output"}
    trees["output"].mkdir()
    stream = io.BytesIO()
    mirror = pod.LineMirror(src, 0, stream, trees)
    mirror.scan()
    with open(src / "rank_0" / "output.log", "ab") as fh:
        fh.write(big)
    (trees["output"] / "model.pt").write_bytes(b"\x00weights")
    mirror.scan(final=True)
    with open(src / "rank_0" / "output.log", "ab") as fh:
        fh.write(b"step=2\n")
    mirror.scan(final=True)
    mirror.frame({"exit": 0})
    lines = stream.getvalue().splitlines(keepends=True)
    assert all(len(line) < 2 * pod.FRAME_BYTES for line in lines)
    assert b'"t":"step=1\\n' in stream.getvalue(), "text travels readable (kubectl logs)"
    local_output = tmp_path / "local_output"
    local_output.mkdir()
    for _ in range(2):  # a reconnect reads the stream from its start again
        frames = Frames(out, {"output": local_output}, tag="0")
        for line in [*lines, b"Traceback (most recent call last):\n"]:
            frames.feed(line)
        frames.close()
    assert (out / "rank_0" / "output.log").read_bytes() == b"step=1\n" + big + b"step=2\n"
    assert (out / "node_0" / "agent.log").read_text() == "agent says hi\n"
    assert not (out / "rank_3").exists()
    assert (local_output / "model.pt").read_bytes() == b"\x00weights"
    assert frames.exit == 0 and frames.other == ["Traceback (most recent call last):"]


def test_k8s_termination_message_fits_4096_bytes():
    failures = [{"rank": r, "exitcode": 1, "signal": None, "timestamp": 1.0 + r, "message": "x" * 500, "traceback": "y" * 5000}
                for r in range(64)]
    text = pod.termination_message({"exitcode": 1, "node_rank": 3, "failures": failures, "ranks": {"0": {}}})
    told = json.loads(text)
    assert len(text.encode()) <= 4096 and told["exitcode"] == 1 and told["failures"][0]["rank"] == 0
    assert told.get("truncated") and "traceback" not in told["failures"][0]


def test_k8s_oom_kills_are_read_from_the_cgroup(tmp_path):
    assert pod.oom_kills(tmp_path) is None
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n")
    assert pod.oom_kills(tmp_path) == 1
    result = {"exitcode": 137, "failures": [{"rank": 5, "exitcode": 137, "signal": "SIGKILL"},
                                            {"rank": 4, "exitcode": 143, "signal": "SIGTERM"}]}
    pod.name_oom(result, 1)
    assert result["failures"][0]["message"].startswith("OOM-killed") and "message" not in result["failures"][1]


def test_k8s_launch_files_of_many_nodes_travel_gzipped_and_are_read_back(tmp_path):
    data = {"job_dir": "/phx/job", "attempt": 2, "grace": 5.0, "nodes": [{"node_rank": i, "env": {}} for i in range(3)]}
    path = tmp_path / "launch.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert pod.read_launch(str(path), 2)["node"]["node_rank"] == 2


def test_k8s_in_pod_import_path_is_the_standard_library_and_phalanx_only():
    """What a pod imports before torch: no site-packages at all (python -S), phalanx from the
    bundle's lib/ only; resource sampling degrades to nothing without psutil."""
    probe = (
        "import sys\n"
        "import phalanx.backends.kubernetes.pod, phalanx.launch.agent, phalanx.launch.bootstrap\n"
        "from phalanx.launch.agent import _start_sampler\n"
        "assert _start_sampler(None, 0, 0, 1.0) is None\n"
        "names = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'phalanx', '__main__'}\n"
        "print(sorted(names))\n"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", probe], env={"PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_k8s_pod_says_at_once_that_it_was_told_to_stop(tmp_path):
    """A preempted pod may leave the API before a listing sees its DisruptionTarget: the entry
    sends its own frame when SIGTERM comes (from its loop, not the handler), once, before its
    end; the supervisor's end reads it and writes no file for it."""
    import signal
    import time

    launch, _ = _launch_for("job", tmp_path)
    stream = io.BytesIO()
    entry = pod.Pod(pod.read_launch(str(launch), 0), stream, str(tmp_path / "termination-log"), tmp_path / "no-cgroup")
    entry._tell_signal()
    assert stream.getvalue() == b"", "nothing to say before a signal"
    before = time.time()
    entry._forward(signal.SIGTERM, None)  # as the handler does: records, sends nothing
    assert stream.getvalue() == b""
    entry._tell_signal()
    entry._tell_signal()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["signal"] == "SIGTERM"
    out = tmp_path / "local"
    frames = Frames(out, {}, tag="0")
    frames.feed(lines[0] + b"\n")
    assert frames.stop is not None and frames.stop[0] == "SIGTERM" and before <= frames.stop[1] <= time.time()
    assert not out.exists() or not any(out.rglob("*")), "a signal frame writes no file"


def test_k8s_casualty_slack_only_for_a_conditions_second():
    """A failure half a second before the peer was taken: a casualty when the time is a
    condition's (dated to the second), its own failure when the time is the pod's own."""
    result = {"exitcode": 1, "failures": [{"rank": 1, "exitcode": 1, "timestamp": 99.5}]}
    from phalanx.backends.kubernetes.node import as_casualty

    assert as_casualty(dict(result), 0, "taken", 100.0)["failures"] == [], "within the condition's second"
    assert as_casualty(dict(result), 0, "taken", 100.0, slack=0.0) == result, "the pod's own clock: it failed first"


@pytest.mark.parametrize("spawn", [Spawn.SELF, Spawn.AUTO], ids=["processes", "torchrun"])
def test_k8s_pod_entry_fails_saying_so_when_node_0s_name_never_resolves(tmp_path, spawn):
    """Processes the agent starts itself wait for the name before they start; a torchrun node's
    agent starts at once (its imports overlap the wait) and is stopped when the name never comes."""
    launch, _ = _launch_for("job", tmp_path, spawn)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), "JOB_COMPLETION_INDEX": "1"}
    proc = subprocess.run([sys.executable, "-m", "phalanx.backends.kubernetes.pod", "--launch", str(launch),
                           "--node-rank-from", "JOB_COMPLETION_INDEX", "--wait-for", "phx-node-0.invalid",
                           "--dns-timeout", "3", "--termination-log", str(tmp_path / "termination-log")],
                          env=env, capture_output=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr.decode()
    told = json.loads((tmp_path / "termination-log").read_text())
    assert told["error"] == "node 0's name phx-node-0.invalid did not resolve within 3s"
    out = Path(tmp_path, "rebuilt")
    frames = Frames(out, {}, tag="1")
    for line in proc.stdout.splitlines(keepends=True):
        frames.feed(line)
    assert "waiting for node 0's name phx-node-0.invalid to resolve" in (out / "node_1" / "agent.log").read_text()
    assert not (out / "rank_1" / "output.log").exists(), "no rank may run before node 0's name resolves"
