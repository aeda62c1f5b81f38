"""The user's arguments are the script's own: placeholders phalanx uses internally never touch them."""

import itertools
import os
from pathlib import Path

import pytest

from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, Framework, JobSpec, Resources, Spawn
from phalanx.core.plan import bind_addresses
from phalanx.launch.host import HostFacts
from phalanx.launch.remote import _expand_home

ODD = ("--addr", "@NODE_ADDR_0@", "--far=@NODE_ADDR_7@", "{x}", "@NODE_ADDR_@x", "~/x")


@pytest.fixture(autouse=True)
def _stable_env(monkeypatch):
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)


def _plan(backend: str, spec: JobSpec):
    facts = Facts(HostFacts(gpus=0, cpus=2, env={}), ports=tuple(itertools.islice(itertools.count(29500), 16)))
    spec = spec.with_(python="python3", workdir="/work", backend=backend)
    return get_backend(backend).plan(spec, "job1234", 0, HomePaths(Path("/home/u/.phalanx")), facts)


def _user_args(node):
    argv = node.worker_argv or node.processes[0].argv
    return tuple(argv[-len(ODD):])


@pytest.mark.parametrize("backend,resources", [("slurm", Resources(2, 2)), ("slurm", Resources(2, 1)),
                                               ("local", Resources(2, 2)), ("local", Resources(1, 1))])
def test_placeholder_text_in_arguments_and_env_survives_binding(backend, resources):
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ODD), resources, name="t",
                   env={"MINE": "@NODE_ADDR_1@"})
    for node in _plan(backend, spec).nodes:
        bound = bind_addresses(node, ["10.0.0.1", "10.0.0.2"])
        assert _user_args(bound) == ODD
        assert bound.env["MINE"] == "@NODE_ADDR_1@"
        if backend == "slurm":
            assert bound.env["PHALANX_NODE_ADDRS"] == "10.0.0.1,10.0.0.2"  # phalanx's own are bound


def test_local_plans_bind_nothing_even_without_addresses():
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ODD), Resources(2, 2), name="t")
    node = _plan("local", spec).nodes[1]
    assert bind_addresses(node, []) is node


def test_templates_are_filled_wherever_phalanx_starts_each_nodes_processes():
    args = ("--rank", "{node_rank}", "--port={master_port}", "{{node_rank}}", "@NODE_ADDR_0@", "~/x")
    filled = ("--rank", "1", "--port=29500", "{node_rank}", "@NODE_ADDR_0@", "~/x")  # the first free port asked for

    def plan(res, **kw):
        return _plan("local", JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/t.py", args), res, name="t", **kw))

    two = Resources(2, 2, explicit=True)
    assert plan(two).nodes[1].worker_argv[-6:] == filled  # torchrun's workers
    for kw in ({"spawn": Spawn.SELF}, {"framework": Framework.JAX}, {"framework": Framework.TF}):
        assert plan(two, **kw).nodes[1].processes[0].argv[-6:] == filled, kw
    # one plain process: as python, whatever --framework says
    for kw in ({}, {"framework": Framework.TF}, {"framework": Framework.JAX}):
        assert plan(Resources(), **kw).nodes[0].processes[0].argv[-6:] == args, kw
    assert plan(Resources(), spawn=Spawn.SELF).nodes[0].processes[0].argv[-6:-4] == ("--rank", "0")
    # a plan whose addresses are known only at start (SLURM): {master_addr} is bound with them, the user's text is not
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/t.py", ("{master_addr}", "@NODE_ADDR_0@")), two, name="t")
    bound = bind_addresses(_plan("slurm", spec).nodes[1], ["10.0.0.1", "10.0.0.2"])
    assert bound.worker_argv[-2:] == ("10.0.0.1", "@NODE_ADDR_0@")


def test_remote_home_expands_only_phalanx_paths():
    home = os.path.expanduser("~")
    request = {"home": "~/.phalanx/remote", "launch": {"job_dir": "~/.phalanx/remote/jobs/j", "node": {
        "worker_argv": ["--script", "~/.phalanx/remote/jobs/j/code/t.py", "~/x", "--out=~/.phalanx/remote", "~"],
        "env": {"PHALANX_STATE_DIR": "~/.phalanx/remote/state/t", "MINE": "~/data"}}}}
    out = _expand_home(request, request["home"])
    node = out["launch"]["node"]
    assert out["launch"]["job_dir"] == f"{home}/.phalanx/remote/jobs/j"
    assert node["worker_argv"] == ["--script", f"{home}/.phalanx/remote/jobs/j/code/t.py", "~/x",
                                   "--out=~/.phalanx/remote", "~"]
    assert node["env"] == {"PHALANX_STATE_DIR": f"{home}/.phalanx/remote/state/t", "MINE": "~/data"}
    assert _expand_home(request, "/abs/home") == request
