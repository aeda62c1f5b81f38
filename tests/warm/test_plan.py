"""Which processes of a plan start warm, and what their pool keeps imported (pure), and the one
seam that applies it (``supervise.submit.plan_attempt``)."""

from __future__ import annotations

from pathlib import Path

from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources, Spawn
from phalanx.launch.warm import plan as warm
from phalanx.launch.host import HostFacts
from phalanx.supervise.submit import plan_attempt

HOME = HomePaths(Path("/home/u/.phalanx"))
WARM = warm.WarmFacts("/run/user/0/phalanx-warm", 600.0)


def _plan(spec: JobSpec):
    """The backend's pure plan, made warm as ``plan_attempt`` makes it, from facts built by hand."""
    plan = get_backend("local").plan(spec, "job1234", 0, HOME, Facts(HostFacts(), tuple(range(29500, 29520))))
    return warm.apply(plan, spec, WARM) if spec.warm else plan


def _script(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_torchrun_workers_run_the_stand_in_under_torchrun(tmp_path):
    script = _script(tmp_path, "import torch\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(script), ("--lr", "1")), Resources(1, 2, explicit=True),
                   workdir=str(tmp_path), warm=True)
    node = _plan(spec).nodes[0]
    at = node.torchrun_argv.index("--module")
    assert node.torchrun_argv[at + 1] == "phalanx.launch.warm.standin"  # torchrun still starts every worker
    options, cold = node.worker_argv[:node.worker_argv.index("--")], node.worker_argv[node.worker_argv.index("--") + 1:]
    assert cold == ("phalanx.launch.bootstrap", "--script", str(script), "--lr", "1")
    assert options[options.index("--preload") + 1] == "torch"
    assert node.agent_argv[1:4] == ("-m", "phalanx.launch.warm.standin", "--dir")
    assert node.agent_argv[-3:-1] == ("phalanx.launch.agent", "--launch")
    assert "torch.distributed.run" in node.agent_argv[node.agent_argv.index("--preload") + 1]


def test_cold_plans_are_unchanged_and_commands_never_warm(tmp_path):
    script = _script(tmp_path, "print(1)\n")
    cold = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(script)), workdir=str(tmp_path))
    assert _plan(cold).to_dict() == _plan(cold.with_(warm=False)).to_dict()
    assert "warm.standin" not in _plan(cold).to_json()
    command = JobSpec(Entrypoint(EntrypointKind.COMMAND, "bash", ("-c", "true")), Resources(1, 2, explicit=True), warm=True)
    assert "warm.standin" not in _plan(command).to_json()


def test_single_and_direct_processes_start_warm(tmp_path):
    script = _script(tmp_path, "print(1)\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(script)), Resources(2, 1, explicit=True), spawn=Spawn.SELF,
                   workdir=str(tmp_path), warm=True)
    for node in _plan(spec).nodes:
        (proc,) = node.processes
        assert proc.argv[:4] == (spec.python, "-u", "-m", "phalanx.launch.warm.standin")
        assert proc.argv[proc.argv.index("--") + 1:] == ("phalanx.launch.bootstrap", "--script", str(script))
        assert "--preload" not in proc.argv  # nothing heavy imported by the script


def test_preloads_follow_the_scripts_imports_into_modules_next_to_it(tmp_path):
    _script(tmp_path, "import helpers.model\n", "train.py")
    (tmp_path / "helpers").mkdir()
    _script(tmp_path / "helpers", "", "__init__.py")
    _script(tmp_path / "helpers", "from numpy import zeros\nimport torch.nn as nn\n", "model.py")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "train.py"), workdir=str(tmp_path))
    assert warm.script_preloads(spec) == ("torch", "numpy")
    module = JobSpec(Entrypoint(EntrypointKind.MODULE, "helpers.model"), workdir=str(tmp_path))
    assert warm.script_preloads(module) == ("torch", "numpy")
    assert warm.script_preloads(spec.with_(entrypoint=Entrypoint(EntrypointKind.SCRIPT, "missing.py"))) == ()


def test_the_host_facts_are_what_the_stand_ins_are_told(tmp_path):
    script = _script(tmp_path, "print(1)\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(script)), workdir=str(tmp_path), warm=True)
    cold = _plan(spec.with_(warm=False))
    plan = warm.apply(cold, spec, warm.WarmFacts("/run/user/7/phalanx-warm", 90.0))
    (proc,) = plan.nodes[0].processes
    assert proc.argv[4:8] == ("--dir", "/run/user/7/phalanx-warm", "--idle", "90")
    assert warm.apply(cold, spec, warm.WarmFacts("/x", 1.0)) == warm.apply(cold, spec, warm.WarmFacts("/x", 1.0))


def test_the_supervisor_plans_warm_only_where_the_backend_starts_processes_here(tmp_path, phx_home):
    """Every job, retry and trial is planned by ``plan_attempt``: it applies warm starts when the
    spec asks and the backend's processes start on this machine with its interpreter."""
    script = _script(tmp_path, "print(1)\n")
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(script)), workdir=str(tmp_path), warm=True)
    home = HomePaths(phx_home)
    local = get_backend("local")
    assert "phalanx.launch.warm.standin" in plan_attempt(local, spec, "job1234", 0, home).to_json()
    assert "warm.standin" not in plan_attempt(local, spec.with_(warm=False), "job1234", 0, home).to_json()
    assert [name for name in ("local", "ssh", "slurm") if get_backend(name).warm_starts] == ["local"]
