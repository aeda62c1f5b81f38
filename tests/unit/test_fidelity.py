"""What the script sees, without processes: the environment's two regimes, imports read from
source, the state key, the plan's notes and the relative-path warnings."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from phalanx.backends.base import Facts
from phalanx.backends.registry import get_backend
from phalanx.core.env import TORCHRUN_VARS, Topology, process_env, runs_as_python
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, Framework, JobSpec, Resources, Spawn
from phalanx.launch.explain import infer, relative_path_warnings, warnings
from phalanx.launch.host import HostFacts
from phalanx.launch.imports import infer_framework, module_file, read_imports
from phalanx.storage import statedir


def _spec(res=Resources(), **kw) -> JobSpec:
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py", (), "t.py"), res, name="t", workdir="/w", **kw)


FACTS = Facts(HostFacts(), ports=(29500,))  # plans are pure: what they know of the world is given
TOPO = Topology("jid", 0, ("10.0.0.1",), 29500, (), "/s", "/o", "/j")


def test_no_topology_is_python_an_explicit_one_is_torchrun():
    assert runs_as_python(_spec()) and process_env(_spec(), TOPO, 0, 0) == {}
    assert runs_as_python(_spec(spawn=Spawn.SELF)) and runs_as_python(_spec(framework=Framework.JAX))
    explicit = _spec(Resources(1, 1, explicit=True))
    assert not runs_as_python(explicit)
    env = process_env(explicit, TOPO, 0, 0)
    assert set(TORCHRUN_VARS) <= set(env)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RUN_ID"]) == (
        "0", "0", "1", "1", "jid")
    assert not runs_as_python(_spec(Resources(1, 2)))  # several processes are a launcher's by definition


def test_plain_plan_sets_no_launcher_or_network_variables():
    plan = get_backend("local").plan(_spec(), "j1", 0, HomePaths(Path("/h")), FACTS)
    node = plan.nodes[0]
    env = {**node.env, **node.processes[0].env}
    assert not set(env) & {*TORCHRUN_VARS, "NODE_RANK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "JAX_COORDINATOR_ADDRESS", "TF_CONFIG"}
    assert any("started as python starts it" in n for n in plan.notes)
    explicit = get_backend("local").plan(_spec(Resources(1, 1, explicit=True)), "j1", 0, HomePaths(Path("/h")), FACTS)
    assert explicit.nodes[0].processes[0].env["LOCAL_RANK"] == "0"
    assert any("like torchrun --nproc-per-node 1" in n for n in explicit.notes)
    assert "# process: one, with torchrun's variables" in explicit.render()


def test_reading_imports(tmp_path):
    cases = {
        "import jax as j\nj.distributed.initialize(None)\n": {"jax"},
        "from jax.distributed import initialize as init\ninit()\n": {"jax"},
        "import jax\nimport helper\nhelper.initialize()\n": {"jax", "helper"},
        "import flax.linen as nn\nfrom optax import adam\n": {"flax", "optax"},
        "def f():\n    import tensorflow as tf\nfrom . import sibling\n": {"tensorflow"},
    }
    for source, modules in cases.items():
        path = tmp_path / "s.py"
        path.write_text(source)
        found = read_imports(str(path))
        assert found is not None and found.modules == modules, source
    (tmp_path / "bad.py").write_text("def (:\n")
    assert read_imports(str(tmp_path / "bad.py")) is None and read_imports(str(tmp_path / "none.py")) is None


def test_framework_inferred_from_imports_torch_stays_the_default(tmp_path):
    def infer_of(source: str):
        (tmp_path / "s.py").write_text(source)
        return infer_framework(str(tmp_path / "s.py"))

    assert infer_of("import jax\n") == ("jax", "it imports jax")
    assert infer_of("import tensorflow as tf\nimport keras\n") == ("tf", "it imports keras, tensorflow")
    assert infer_of("import jax\nimport torch\n") is None  # torch wins: the default
    assert infer_of("import jax\nimport tensorflow\n") is None  # no telling
    assert infer_of("import numpy\n") is None
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import flax\n")
    assert module_file("pkg.train", str(tmp_path)) == str(tmp_path / "pkg" / "train.py")
    module = JobSpec(Entrypoint(EntrypointKind.MODULE, "pkg.train"), Resources(2, 1, True), name="m", workdir=str(tmp_path))
    assert infer(module) == ("jax", "framework: jax, inferred from -m pkg.train (it imports flax); --framework torch|tf|jax chooses")
    assert infer(module.with_(resources=Resources(1, 1))) is None  # one node: never inferred
    assert infer(module.with_(framework=Framework.TF)) is None  # given


def test_build_spec_infers_the_framework_for_several_nodes_and_says_so(tmp_path, monkeypatch, capsys, phx_home):
    from phalanx.jobfile import RunOptions, build_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "j.py").write_text("import jax\n")
    spec = build_spec(RunOptions(words=["j.py"], n="2x1"))
    assert spec.framework is Framework.JAX
    assert "phalanx: framework: jax, inferred from j.py (it imports jax)" in capsys.readouterr().err
    assert build_spec(RunOptions(words=["j.py"], n="2x1", framework="torch")).framework is Framework.TORCH
    assert build_spec(RunOptions(words=["j.py"])).framework is Framework.TORCH


def test_state_is_the_jobs_own_unless_named_or_given_a_uri():
    assert statedir.state_name("train", named=True, state_uri=None) == "train"
    assert statedir.state_name("train", named=False, state_uri=None) == ""
    by_uri = statedir.state_name("train", named=False, state_uri="s3://b/r")
    assert by_uri.startswith("train-") and by_uri != statedir.state_name("train", False, "s3://b/other")
    spec = _spec()
    assert statedir.for_job(spec, "ab12").state_key == "t-ab12"
    named = _spec(state_name="resnet")
    assert statedir.for_job(named, "ab12").state_key == "resnet"
    assert JobSpec.from_dict(json.loads(json.dumps(named.to_dict()))).state_key == "resnet"
    legacy = spec.to_dict()
    del legacy["state_name"]
    assert JobSpec.from_dict(legacy).state_key == "t"  # jobs recorded before: by name, as then


def test_build_spec_keys_state_by_name_only_when_named(tmp_path, monkeypatch, phx_home):
    from phalanx.jobfile import RunOptions, build_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    assert build_spec(RunOptions(words=["train.py"])).state_name == ""
    assert build_spec(RunOptions(words=["train.py"], name="resnet")).state_name == "resnet"
    (tmp_path / "job.yaml").write_text("name: fromfile\nscript: train.py\n")
    assert build_spec(RunOptions(job_file="job.yaml")).state_name == "fromfile"


class _Record:
    def __init__(self, id: str, name: str, spec: dict):
        self.id, self.name, self.spec_json = id, name, json.dumps(spec)


def test_pickup_line_names_the_writer_and_how_to_start_over(tmp_path):
    home = HomePaths(tmp_path)
    spec = _spec(state_name="resnet")
    assert statedir.pickup_line(home, spec, lambda: [], "new1") is None  # nothing there yet
    state = home.state_dir("resnet")
    state.mkdir(parents=True)
    (state / "ckpt.pt").write_bytes(b"x" * 2000)
    os.utime(state / "ckpt.pt", (time.time() - 7200, time.time() - 7200))
    records = [_Record("new1", "resnet", {"state_name": "resnet"}), _Record("other", "x", {"state_name": "x-other"}),
               _Record("old9", "resnet", {"name": "resnet"})]
    line = statedir.pickup_line(home, spec, lambda: records, "new1")
    assert line is not None and "1 file(s)" in line and "last written 2h ago by job old9 'resnet'" in line
    assert "--clean-state" in line
    resumed = statedir.pickup_line(home, spec, lambda: records, "old9", resuming=True)
    assert resumed is not None and resumed.startswith("state: job old9 continues from")


def test_relative_paths_that_a_shipped_copy_lacks_are_warned_about(tmp_path):
    proj = tmp_path / "proj"
    (proj / "conf").mkdir(parents=True)
    (proj / "train.py").write_text("")
    (proj / "conf" / "a.yaml").write_text("")
    (proj / "big.bin").write_bytes(b"0" * (1024 * 1024 + 1))  # left out of the snapshot
    (tmp_path / "data").mkdir()
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(proj / "train.py"),
                              ("--data", "../data", "--conf=conf/a.yaml", "--cfg-dir", "conf", "--blob", "big.bin",
                               "--out", "new_dir", "--remote", "s3://b/x", "--abs", "/etc")), name="t", workdir=str(proj))
    found = relative_path_warnings(spec, "~/.phalanx/remote/jobs/j/code", tmp_path / "home")
    assert [w.split("'")[1] for w in found] == ["../data", "big.bin"]
    assert "--input NAME=../data" in found[0] and "--shared-fs" in found[0]


def test_dry_run_notes_say_cwd_code_and_state(tmp_path):
    spec = _spec(snapshot=True, state_name="t-j1")
    plan = get_backend("local").plan(spec, "j1", 0, HomePaths(Path("/h")), FACTS)
    text = "\n".join(plan.notes)
    assert "cwd: /w: relative paths and files written to cwd behave as under python" in text
    assert "code: frozen at submit in /h/jobs/j1/code, a copy of /w" in text
    assert "state: PHALANX_STATE_DIR=/h/state/t-j1, this job's own" in text
    assert warnings(plan) == []
    named = get_backend("local").plan(spec.with_(state_name="resnet", snapshot=False), "j1", 0, HomePaths(Path("/h")), FACTS)
    assert any("shared by every run named 'resnet'" in n for n in named.notes)
    assert any("code: read live from /w" in n for n in named.notes)


@pytest.mark.parametrize("exists", [True, False])
def test_python_is_named_as_the_users_path_names_it(tmp_path, monkeypatch, exists):
    import sys

    from phalanx.core.env import python_as_typed

    if exists:
        (tmp_path / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert python_as_typed() == (str(tmp_path / "python") if exists else sys.executable)


def test_ssh_dry_run_says_what_cwd_means_on_the_hosts_and_warns(tmp_path, phx_home):
    import subprocess
    import sys

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    base = [sys.executable, "-m", "phalanx", "run", "--backend", "ssh", "--hosts", "gpu1", "--dry-run"]
    shipped = subprocess.run([*base, "train.py", "--data", "../data"], cwd=proj, capture_output=True, text=True, timeout=60)
    assert shipped.returncode == 0, shipped.stderr
    assert "# cwd on the hosts: ~/.phalanx/remote/jobs/" in shipped.stdout and f"the shipped copy of {proj}" in shipped.stdout
    assert "# warning: argument '../data' is a relative path that will not exist on the hosts" in shipped.stdout
    shared = subprocess.run([*base, "--shared-fs", "train.py", "--data", "../data"], cwd=proj, capture_output=True,
                            text=True, timeout=60)
    assert f"# cwd: {proj} (the same path on the nodes" in shared.stdout and "warning" not in shared.stdout
