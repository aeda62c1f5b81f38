"""The SLURM backend's plans: the batch script as golden files, the per-node part, the options.

Refresh the golden files after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/backends
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.backends.slurm import sbatch
from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, Framework, JobSpec, Resources, Spawn
from phalanx.errors import UsageError
from phalanx.core.plan import Plan, bind_addresses
from phalanx.launch.host import HostFacts

from .golden_files import assert_golden

ROOT = Path(__file__).resolve().parents[2]
TRAIN = Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--lr", "0.01"))

CASES = {
    "slurm_2x4": JobSpec(TRAIN, Resources(2, 4), name="train", backend="slurm", backend_options={
        "partition": "gpu", "account": "ml", "time": "4:00:00", "gpus_per_node": 4, "sbatch": ["--qos=high", "#SBATCH --exclusive"],
    }),
    "slurm_defaults_2x1": JobSpec(TRAIN, Resources(2, 1), name="train", backend="slurm"),
    "slurm_single": JobSpec(Entrypoint(EntrypointKind.COMMAND, "bash", ("-c", "echo $RANK\nrm -rf /")), name="odd name; $x",
                            backend="slurm", backend_options={"time": "30", "signal_lead": 120}),
}


@pytest.fixture(autouse=True)
def _stable_env(monkeypatch):
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def _plan(spec: JobSpec, attempt: int = 0) -> Plan:
    facts = Facts(HostFacts(gpus=0, cpus=2, env={}), ports=tuple(itertools.islice(itertools.count(29500), 16)))
    spec = spec.with_(python="python3", workdir="/work")
    return get_backend("slurm").plan(spec, "job1234", attempt, HomePaths(Path("/home/u/.phalanx")), facts)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_script_matches_golden(case):
    assert_golden(f"{case}.sbatch", _plan(CASES[case]).submission, f"batch script for {case}")


def test_nodes_learn_addresses_at_run_time():
    plan = _plan(CASES["slurm_2x4"])
    n0, n1 = plan.nodes
    assert "--rdzv-endpoint=@NODE_ADDR_0@:29500" in n1.torchrun_argv
    assert "--local-addr=@NODE_ADDR_1@" in n1.torchrun_argv
    assert "--rdzv-conf=is_host=true,join_timeout=600" in n0.torchrun_argv
    assert "--rdzv-conf=is_host=false,join_timeout=600" in n1.torchrun_argv
    assert n0.env["SM_NUM_GPUS"] == "4" and "GLOO_SOCKET_IFNAME" not in n0.env
    bound = bind_addresses(n1, ["10.0.0.1", "10.0.0.2"])
    assert "--rdzv-endpoint=10.0.0.1:29500" in bound.torchrun_argv
    assert "--local-addr=10.0.0.2" in bound.torchrun_argv
    assert bound.env["PHALANX_NODE_ADDRS"] == "10.0.0.1,10.0.0.2"
    assert bound.host == "10.0.0.2" and bound.worker_argv == n1.worker_argv
    with pytest.raises(ValueError, match="address of node 1"):
        bind_addresses(n1, ["10.0.0.1"])


def test_tf_and_spawn_self_plans_bind_too():
    tf = _plan(JobSpec(TRAIN, Resources(2, 1), name="tf", framework=Framework.TF, backend="slurm"))
    config = json.loads(bind_addresses(tf.nodes[1], ["a", "b"]).processes[0].env["TF_CONFIG"])
    assert config["cluster"]["worker"] == ["a:29501", "b:29502"]
    spawn = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/s.py", ("--addr", "{master_addr}:{master_port}")), Resources(2, 2),
                    spawn=Spawn.SELF, backend="slurm")
    node = bind_addresses(_plan(spawn).nodes[1], ["a", "b"])
    assert node.processes[0].argv[-1] == "a:29500" and node.processes[0].env["MASTER_ADDR"] == "a"


def test_plan_round_trips_with_its_script():
    plan = _plan(CASES["slurm_2x4"], attempt=2)
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    text = plan.render()
    assert text.startswith(plan.submission) and "#   [node 1 @ @NODE_ADDR_1@]" in text
    assert all(line.startswith("#") for line in text[len(plan.submission):].splitlines() if line)


@pytest.mark.parametrize("text,seconds", [
    ("30", 1800), ("5:30", 330), ("4:00:00", 14400), ("1-12", 129600), ("2-1:30", 178200), ("1-0:0:5", 86405),
    ("unlimited", None), ("INFINITE", None),
])
def test_time_limits(text, seconds):
    assert sbatch.time_limit_seconds(text) == seconds


@pytest.mark.parametrize("options,message", [
    ({"time": "4h"}, "invalid --time '4h'"),
    ({"time": "1"}, "leaves no time to run: ranks would get SIGTERM 60s before the limit"),
    ({"time": "10", "signal_lead": 0}, "--signal-lead must be at least 1"),
    ({"partition": "gpu a"}, "invalid --partition"),
    ({"sbatch": ["--qos=high\nrm -rf /"]}, "--sbatch must be one line"),
    ({"gpus_per_node": -1}, "--gpus-per-node must not be negative"),
    ({"hosts": "a,b"}, "do not apply to the slurm backend"),
    ({"time": "10", "gpus_per_node": "many"}, "invalid --gpus-per-node 'many'"),
])
def test_bad_options_are_refused_before_anything_runs(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _plan(JobSpec(TRAIN, Resources(2, 1), backend="slurm", backend_options=options))


def test_slurm_options_do_not_apply_to_the_local_backend():
    with pytest.raises(UsageError, match="partition do not apply to the local backend"):
        get_backend("local").plan(JobSpec(TRAIN, backend_options={"partition": "gpu"}), "j", 0, HomePaths(Path("/h")),
                                  Facts(HostFacts(), (29500,)))


def test_dry_run_prints_the_batch_script(tmp_path):
    env = {**os.environ, "PHALANX_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "run", "--backend", "slurm", "--dry-run", "--partition", "gpu", "--time", "1:00:00",
         "--sbatch", "--qos=high", "-n", "2x4", str(ROOT / "examples" / "hello.py"), "--x", "a b"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00", "#SBATCH --signal=TERM@60",
                 "#SBATCH --qos=high", "#SBATCH --no-requeue"):
        assert line + "\n" in proc.stdout
    assert not list(tmp_path.glob("jobs/*")), "a dry run starts nothing"


def _run_with_stubs(script: str, tmp_path: Path) -> list[str]:
    """Run the batch script with stand-ins for scontrol and srun; returns the argv srun got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n[ \"$2\" = hostnames ] && { echo n1; echo n2; exit 0; }\n"
        "echo \"NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.$(echo $4 | tr -d n) NodeHostName=$4\"\n"
    )
    (bin_dir / "srun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'addrs': os.environ['PHALANX_NODE_ADDRS']}))\n"
    )
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7",
           "SLURM_CPUS_PER_TASK": "4", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "phalanx: job job1234 attempt 0: SLURM job 7 on n[1-2] (10.0.0.1,10.0.0.2)"
    srun = json.loads(lines[1])
    assert srun["addrs"] == "10.0.0.1,10.0.0.2"
    return srun["argv"]


ODD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ODD, max_size=5), name=ODD)
def test_no_argument_or_name_can_reach_the_shell(tmp_path, args, name):
    """Arguments travel in launch.json; the script that sbatch runs only names files. Whatever
    the user types, the script runs exactly the srun line, with the arguments untouched."""
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", tuple(args)), Resources(2, 1),
                   name=name or "job", backend="slurm")
    plan = _plan(spec)
    argv = _run_with_stubs(plan.submission, tmp_path)
    assert argv == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                    "--output=/home/u/.phalanx/jobs/job1234/attempt_0/node_%n/agent.log", "--open-mode=append",
                    "python3", "-m", "phalanx.launch.agent", "--launch",
                    "/home/u/.phalanx/jobs/job1234/attempt_0/node_{node_rank}/launch.json", "--node-rank-from", "SLURM_NODEID",
                    "--node-name-from", "SLURMD_NODENAME"]
    assert list(tmp_path.iterdir()) == [tmp_path / "bin"], "the script must create nothing"
    assert plan.nodes[1].worker_argv[2:] == tuple(args) or "{" in "".join(args)
