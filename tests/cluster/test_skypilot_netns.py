"""The node side of the SkyPilot backend for real: two "VMs" as network namespaces, each with its
own copy of the workdir (SkyPilot syncs it to ~/sky_workdir on every node), running the task's
``run`` step with SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS set as SkyPilot sets them
(docs: running-jobs/environment-variables). A gloo all_reduce across both proves the rendezvous.
SkyPilot itself (provisioning, sync, its API server) is not involved: it cannot reach a cloud here.
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from phalanx.backends.registry import get_backend
from phalanx.backends.skypilot.backend import stage
from phalanx.core.paths import HomePaths, JobPaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SCRIPT = '''
import json, os, socket
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("seen " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "host": socket.gethostname(),
      "master": os.environ["MASTER_ADDR"], "node_rank": os.environ["PHALANX_NODE_RANK"], "sum": t.item(),
      "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}), flush=True)
dist.destroy_process_group()
'''


def test_skypilot_nodes_read_skypilots_environment(tmp_path):
    from tests.cluster import netns

    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(SCRIPT)
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(code / "probe.py")), Resources(2, 1), name="probe",
                   backend="skypilot", workdir=str(code), snapshot=False)
    paths = JobPaths(tmp_path / "job")
    backend = get_backend("skypilot")
    plan = backend.plan(spec, "sky0001", 0, HomePaths(tmp_path), backend.facts(spec))
    task = yaml.safe_load("\n".join(l for l in plan.submission.splitlines() if not l.startswith("#")))
    staged = stage(plan, paths, code, 5.0)
    try:
        network = netns.create(2)
    except (netns.Unavailable, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot run nodes in network namespaces here: {exc}")
    procs = []
    try:
        ips = "\n".join(network.node_addrs)
        for rank, ns in enumerate(network.node_namespaces):
            workdir = tmp_path / f"vm{rank}" / "sky_workdir"
            shutil.copytree(staged, workdir)
            env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workdir.parent),
                   "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NUM_NODES": "2",
                   "SKYPILOT_NUM_GPUS_PER_NODE": "0", "SKYPILOT_TASK_ID": "sky-task-1", **task["envs"]}
            procs.append(netns.spawn(ns, ["bash", "-c", task["run"]], env, hostname=f"vm{rank}", cwd=str(workdir),
                                     log=tmp_path / f"vm{rank}.log"))
        deadline = time.monotonic() + 180
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.3)
        logs = {r: (tmp_path / f"vm{r}.log").read_text() for r in range(2)}
        assert [p.poll() for p in procs] == [0, 0], logs
        for rank in range(2):
            job = tmp_path / f"vm{rank}" / "sky_workdir" / "job" / "attempt_0"
            line = next(l for l in (job / f"rank_{rank}" / "output.log").read_text().splitlines() if l.startswith("seen "))
            seen = json.loads(line[len("seen "):])
            assert (seen["world"], seen["sum"], seen["host"], seen["node_rank"]) == (2, 3.0, f"vm{rank}", str(rank))
            assert seen["master"] == network.node_addrs[0] and seen["ifname"] == "eth0"
            result = json.loads((job / f"node_{rank}" / "result.json").read_text())
            assert result["exitcode"] == 0
    finally:
        for p in procs:
            netns.stop_group(p, grace=2)
        netns.destroy(network)
