"""An attempt that outlived its supervisor is found again with the plan it was started with
(supervise/leftover.attempt_plan): its ``plan.json`` (the backend's context included: the Ray
cluster's address, SageMaker's region) when it is that attempt's, else its launch files."""

from __future__ import annotations

from types import SimpleNamespace

from phalanx.core.contracts import LaunchFile, write_launch
from phalanx.core.paths import JobPaths, write_atomic
from phalanx.core.plan import NodePlan, Plan
from phalanx.supervise.leftover import attempt_plan

NODE = NodePlan(0, "@NODE_ADDR_0@", ("python3", "-m", "phalanx.launch.agent"), {"PHALANX_JOB_DIR": "~/j"}, "~/j/code")


def _record(paths: JobPaths) -> SimpleNamespace:
    return SimpleNamespace(id="j1", backend="ray", nnodes=1, paths=paths)


def test_the_attempts_own_plan_keeps_the_backends_context(tmp_path):
    paths = JobPaths(tmp_path / "j1")
    plan = Plan("j1", 2, "ray", (NODE,), 30.0, "# Ray job phalanx-j1-2\n", context={"address": "http://head:8265"})
    write_atomic(paths.plan, plan.to_json())
    assert attempt_plan(_record(paths), 2) is None  # it never got as far as its launch files
    paths.node_dir(2, 0).mkdir(parents=True)
    write_launch(paths.node_launch(2, 0), LaunchFile(NODE, "~/j", 2, 30.0))
    assert attempt_plan(_record(paths), 2) == plan
    # plan.json already names a later attempt: the earlier one is read back from its launch files
    write_atomic(paths.plan, Plan("j1", 3, "ray", (NODE,), 30.0).to_json())
    again = attempt_plan(_record(paths), 2)
    assert again is not None and again.attempt == 2 and again.nodes == (NODE,) and again.context == {}
