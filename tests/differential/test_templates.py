"""``{node_rank}``-style arguments, per mode, with an unmodified script that prints and records its
arguments (projects/plain/proj/hello.py).

- One plain process (no topology; ``--framework tf`` asks for a ``TF_CONFIG``, not for a
  topology) gets its arguments exactly as ``python`` does: compared with a python run.
- Wherever phalanx starts each node's processes (``--spawn self``, with or without a topology;
  ``-n``, ``--nnodes``, with torchrun or without; ``--framework tf|jax`` with a topology) every
  process gets the placeholders filled in with its own node's values, which the test reads from
  the variables the same process saw and from the job's plan (the port); ``{{node_rank}}`` is a
  literal ``{node_rank}``; ``@NODE_ADDR_0@``, ``~/x`` and JSON stay as typed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from phalanx.core.paths import JobPaths

from .harness import BIN, Case, run_both, run_phalanx

pytestmark = pytest.mark.local

TYPED = ("{node_rank}", "{num_nodes}", "{nproc_per_node}", "{master_addr}", "{master_port}", "{job_id}",
         "{state_dir}", "{output_dir}", "--at={master_addr}:{master_port}", "{{node_rank}}", "@NODE_ADDR_0@", "~/x",
         '{"a": {"b": 1}}', "{x}")

# options -> (node_rank, num_nodes, nproc_per_node) of each process, in any order
FILLED = {
    ("--spawn", "self"): [("0", "1", "1")],
    ("--spawn", "self", "-n", "2x2"): [("0", "2", "2"), ("1", "2", "2")],
    ("-n", "1"): [("0", "1", "1")],
    ("-n", "2"): [("0", "1", "2")] * 2,
    ("--nnodes", "2"): [("0", "2", "1"), ("1", "2", "1")],
    ("--framework", "tf", "-n", "2x1"): [("0", "2", "1"), ("1", "2", "1")],
    ("--framework", "jax", "-n", "2x1"): [("0", "2", "1"), ("1", "2", "1")],
}


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _master_port(job_dir: str) -> str | None:
    """The job's rendezvous port, from its plan: torchrun's --rdzv-endpoint, or the MASTER_PORT of the
    processes phalanx starts itself; None where nothing but the arguments holds it (--spawn self with
    no topology: one process, python's environment)."""
    node = json.loads(JobPaths(Path(job_dir)).node_launch(0, 0).read_text())["node"]
    for word in node["torchrun_argv"] or ():
        if word.startswith("--rdzv-endpoint="):
            return word.rsplit(":", 1)[1]
    return node["processes"][0]["env"].get("MASTER_PORT")


@pytest.mark.parametrize("options", [(), ("--framework", "tf")], ids=["plain", "tf_no_topology"])
def test_one_plain_process_gets_its_arguments_as_python_does(options, tmp_path, phx_home):
    case = Case("templates_untouched", "plain", "proj", ("python", "hello.py", *TYPED), ("hello.py", *TYPED))
    reference, phalanx = run_both(case, tmp_path, _env(), options=("--cold", *options))
    assert phalanx.code == reference.code == 0, phalanx.raw
    assert phalanx.lines == reference.lines and f"hello {' '.join(TYPED)}" in phalanx.lines
    ((_, seen),) = reference.seen.items()
    ((_, theirs),) = phalanx.seen.items()
    assert theirs["argv"] == seen["argv"] == ["hello.py", *TYPED]


@pytest.mark.parametrize("options", list(FILLED), ids=lambda o: "_".join(w.strip("-") for w in o))
def test_placeholders_are_filled_per_node_wherever_phalanx_starts_the_processes(options, tmp_path, phx_home):
    if "jax" in options and importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (pip install -c constraints.txt -e '.[test]')")
    case = Case("templates_filled", "plain", "proj", (), ("hello.py", *TYPED))
    run = run_phalanx(case, tmp_path, _env(), options=("--cold", *options))
    assert run.code == 0, run.raw
    assert len(run.seen) == len(FILLED[options]), run.raw
    topology = []
    for name, seen in run.seen.items():
        env = seen["env"]
        addr, port = env["PHALANX_NODE_ADDRS"].split(",")[0], _master_port(env["PHALANX_JOB_DIR"])
        if port is None:
            port = seen["argv"][5]
            assert port.isdigit() and 0 < int(port) < 65536, seen["argv"]
        topology.append((env["PHALANX_NODE_RANK"], env["PHALANX_NUM_NODES"], env["PHALANX_NPROC_PER_NODE"]))
        assert seen["argv"] == [
            "hello.py", env["PHALANX_NODE_RANK"], env["PHALANX_NUM_NODES"], env["PHALANX_NPROC_PER_NODE"], addr, port,
            env["PHALANX_JOB_ID"], env["PHALANX_STATE_DIR"], env["PHALANX_OUTPUT_DIR"], f"--at={addr}:{port}",
            "{node_rank}", "@NODE_ADDR_0@", "~/x", '{"a": {"b": 1}}', "{x}"], name
    assert sorted(topology) == sorted(FILLED[options])
