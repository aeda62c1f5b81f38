"""Golden files for the local backend's plans (what --dry-run prints and submit executes).

Refresh after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/backends
"""

import itertools
import json
import os
from pathlib import Path

import pytest

from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, Framework, JobSpec, Resources, Spawn
from phalanx.errors import UsageError
from phalanx.launch.host import HostFacts

from .golden_files import assert_golden

CASES = {
    "torchrun_2x2": JobSpec(
        Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--lr", "0.01")), Resources(2, 2), name="train",
    ),
    "single_process": JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--lr", "0.01")), name="train"),
    "command_1x2": JobSpec(Entrypoint(EntrypointKind.COMMAND, "bash", ("-c", "echo $RANK")), Resources(1, 2), name="bash"),
    "spawn_self_2x4": JobSpec(
        Entrypoint(EntrypointKind.SCRIPT, "/work/spawn.py", ("--node-rank", "{node_rank}", "--addr", "{master_addr}:{master_port}")),
        Resources(2, 4), name="spawn", spawn=Spawn.SELF,
    ),
    "tf_2x1": JobSpec(Entrypoint(EntrypointKind.MODULE, "pkg.train"), Resources(2, 1), name="tf", framework=Framework.TF),
    "jax_2x1": JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/j.py"), Resources(2, 1), name="jax", framework=Framework.JAX),
    "channels_snapshot_1x2": JobSpec(
        Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--data", "$PHALANX_CHANNEL_TRAIN")), Resources(1, 2), name="train",
        channels=(Channel("train", "s3://bucket/imagenet/train", "s3://bucket/imagenet/train"),
                  Channel("val", "./data/val", "/work/data/val"),
                  Channel("prep", "job:prep", "/home/u/.phalanx/jobs/0000abcd/output")),
        output_uri="s3://bucket/runs/", snapshot=True,
    ),
}


@pytest.fixture(autouse=True)
def _stable_env(monkeypatch):
    # The plan reads a few host facts; pin them so golden files are the same everywhere.
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def _plan(spec):
    # Plans are pure: the host facts and free ports are given, so golden files are the same everywhere.
    facts = Facts(HostFacts(gpus=0, cpus=2, env={}), ports=tuple(itertools.islice(itertools.count(29500), 16)))
    spec = spec.with_(python="python3", workdir="/work")
    return get_backend("local").plan(spec, "job1234", 0, HomePaths(Path("/home/u/.phalanx")), facts)


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_golden(case):
    assert_golden(f"{case}.json", _plan(CASES[case]).to_json(), f"plan for {case}")


def test_torchrun_plan_essentials():
    plan = _plan(CASES["torchrun_2x2"])
    n0, n1 = plan.nodes
    for node in (n0, n1):
        argv = node.torchrun_argv
        assert "--rdzv-backend=c10d" in argv and "--rdzv-id=job1234" in argv
        assert "--rdzv-endpoint=127.0.0.1:29500" in argv
        assert "--nnodes=2" in argv and "--nproc-per-node=2" in argv
        assert node.worker_argv == ("--script", "/work/train.py", "--lr", "0.01")
        assert node.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "--rdzv-conf=is_host=true,join_timeout=600" in n0.torchrun_argv
    assert "--rdzv-conf=is_host=false,join_timeout=600" in n1.torchrun_argv


def test_spawn_self_templates_are_per_node():
    plan = _plan(CASES["spawn_self_2x4"])
    assert [len(n.processes) for n in plan.nodes] == [1, 1]
    assert plan.nodes[1].processes[0].argv[-3:] == ("1", "--addr", "127.0.0.1:29500")
    assert plan.nodes[1].processes[0].env["WORLD_SIZE"] == "2"


def test_plan_render_shows_argv_and_env():
    text = _plan(CASES["torchrun_2x2"]).render()
    assert "[node 1 @ localhost-1]" in text
    assert "torchrun --nnodes=2" in text
    assert "PHALANX_JOB_ID=job1234" in text


def test_plan_round_trips():
    from phalanx.core.plan import Plan

    plan = _plan(CASES["tf_2x1"])
    assert Plan.from_dict(json.loads(plan.to_json())) == plan


def test_unknown_backend_lists_known():
    with pytest.raises(UsageError, match=r"known backends: .*\blocal\b"):
        get_backend("nope")
