"""What a user writes by hand instead of phalanx's Ray backend: a STRICT_SPREAD placement group, one
actor per node, each running torchrun; node 0's IP is the rendezvous. ``ray job submit ... --
python ray_hand_driver.py NNODES SCRIPT`` (bench_ray.py compares it with phalanx)."""
import subprocess
import sys

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init()
nnodes, script = int(sys.argv[1]), sys.argv[2]
pg = placement_group([{"CPU": 1}] * nnodes, strategy="STRICT_SPREAD")
ray.get(pg.ready())


@ray.remote(num_cpus=1)
class Node:
    def ip(self) -> str:
        return ray.util.get_node_ip_address()

    def run(self, rank: int, master: str) -> int:
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=1",
                f"--node-rank={rank}", f"--master-addr={master}", "--master-port=29511", script]
        return subprocess.run(argv).returncode


actors = [Node.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
          for i in range(nnodes)]
master = ray.get(actors[0].ip.remote())
sys.exit(max(ray.get([a.run.remote(i, master) for i, a in enumerate(actors)])))
