"""What SkyPilot's ``run`` step starts on every node: ``python3 -m phalanx.backends.skypilot.entry``.

Standard library only (the node has the unpacked bundle on ``PYTHONPATH``, nothing else of
phalanx). SkyPilot runs it in ``~/sky_workdir`` with (docs: running-jobs/environment-variables):

- ``SKYPILOT_NODE_RANK``  this node's rank, 0 .. num_nodes-1;
- ``SKYPILOT_NODE_IPS``   every node's IP, one per line, in rank order (node 0, the head, first).

It takes this node's launch file from ``launch.json`` (``contracts.LaunchFile``), fills in the
working directory and the addresses (node 0's hosts the rendezvous), binds collectives to the
interface that reaches node 0, writes the node's launch file where ``JobPaths`` puts it and
becomes phalanx's node agent in the node's working directory (exec: SkyPilot's signals reach it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from phalanx.core.contracts import LaunchFile, read_launch, write_launch
from phalanx.core.paths import JobPaths
from phalanx.core.plan import bind_addresses
from phalanx.launch.netif import interface_for

WORKDIR = "@SKY_WORKDIR@"


def prepare(workdir: str, environ: dict[str, str]) -> str:
    """Write this node's launch file; returns its path. Raises SystemExit(2) on a bad environment."""
    rank_text = environ.get("SKYPILOT_NODE_RANK", "")
    ips = [line.strip() for line in environ.get("SKYPILOT_NODE_IPS", "").splitlines() if line.strip()]
    if not rank_text.isdigit() or not ips:
        raise SystemExit(f"phalanx: SKYPILOT_NODE_RANK={rank_text!r} and SKYPILOT_NODE_IPS={ips!r} do not say which node this is")
    with open(os.path.join(workdir, "launch.json")) as fh:
        nodes = json.loads(fh.read().replace(WORKDIR, json.dumps(workdir)[1:-1]))["nodes"]
    rank = int(rank_text)
    if rank >= len(nodes) or len(ips) != len(nodes):
        raise SystemExit(f"phalanx: SkyPilot started {len(ips)} node(s), the plan has {len(nodes)}")
    launch = LaunchFile.from_dict(nodes[rank], f"launch.json node {rank}")
    node = bind_addresses(launch.node, ips)
    env = dict(node.env)
    if env.pop("PHALANX_AUTO_IFNAME", None):
        ifname = interface_for(ips[0])
        if ifname:
            for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if key not in environ:
                    env.setdefault(key, ifname)
    for key in ("PHALANX_STATE_DIR", "PHALANX_OUTPUT_DIR"):
        if env.get(key):
            os.makedirs(env[key], exist_ok=True)
    path = JobPaths(Path(launch.job_dir)).node_launch(launch.attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_launch(path, dataclasses.replace(launch, node=dataclasses.replace(node, env=env)))
    return str(path)


def main() -> None:
    path = prepare(os.getcwd(), dict(os.environ))
    launch = read_launch(Path(path))
    assert launch is not None
    os.chdir(launch.node.cwd)  # the node's working directory (the synced code), as every backend starts its agents
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-u", "-m", "phalanx.launch.agent", "--launch", path])


if __name__ == "__main__":
    main()
