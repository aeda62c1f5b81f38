"""torchrun's command lines from PyTorch's documentation, run for real with ``torchrun`` and with
``phalanx run`` in its place, comparing what the script sees (its argv and torchrun's variables)
and what the terminal shows. One line per case; a multi-machine case is one command per machine,
all started at once on this machine.

Sources: the torchrun page (``torch/distributed/run.py`` docstring: single-node, stacked
single-node multi-worker, fault tolerant, elastic) and its argument parser (spellings).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.backends.base import free_port

pytestmark = pytest.mark.local

ENVDUMP = """import json, os, sys
keys = [k for k in os.environ if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
        or k.startswith("TORCHELASTIC")]
print("ENV " + json.dumps({k: os.environ[k] for k in keys}, sort_keys=True) + " ARGV " + json.dumps(sys.argv[1:]),
      flush=True)
"""

# Set per run from where it runs (paths, uuids) or chosen by the kernel (free ports): compared by shape.
VARIES = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}
# phalanx adds SIGUSR1/SIGUSR2 (a scheduler's preemption notice) to the signals torchrun forwards.
DELIBERATE = {"TORCHELASTIC_SIGNALS_TO_HANDLE"}

# (id, one argv per machine (before the script), script args, what to compare beyond the env)
CASES = [
    ("single-node", [["--standalone", "--nnodes=1", "--nproc-per-node=2"]], ["--lr", "0.1"], ""),
    ("stacked-single-node", [["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=1",
                              "--nproc-per-node=2"]], [], ""),
    ("fault-tolerant", [["--nnodes=2", "--nproc-per-node=1", "--max-restarts=3", "--rdzv-id=job7",
                         "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:{port}"]] * 2, ["-x"], ""),
    ("elastic", [["--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=3", "--rdzv-id=job8",
                  "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:{port}"]] * 2, [], ""),
    ("static-two-machines", [["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(k), "--master-addr",
                              "127.0.0.1", "--master-port", "{port}"] for k in (0, 1)], ["--seed", "3"], ""),
    ("underscore-spellings", [["--nproc_per_node=2", "--master_port={port}", "--max_restarts=0",
                               "--monitor_interval=0.5"]], [], ""),
    ("nproc-cpu", [["--nproc-per-node", "cpu"]], [], ""),
    ("module", [["--nproc-per-node=2", "-m"]], ["--epochs", "3", "--nproc-per-node", "9"], "module"),
    ("no-python", [["--nproc-per-node=2", "--no-python"]], ["a b"], "no-python"),
    ("local-ranks-filter", [["--nproc-per-node=2", "--local-ranks-filter=1"]], [], "shown"),
    ("redirects-to-log-dir", [["--nproc-per-node=2", "--redirects=3", "--log-dir={logs}"]], [], "logs"),
]


def _launch(prefix: list[str], machines: list[list[str]], script: list[str], cwd: Path, env: dict, logs: Path):
    port = free_port()  # as phalanx picks its own: one no port-0 listener beside us can take first
    procs = [subprocess.Popen([*prefix, *[a.format(port=port, logs=logs) for a in argv], *script],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in machines]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240))
    except subprocess.TimeoutExpired:
        for p in procs:  # the processes this test started, and say what each printed
            p.kill()
        said = [p.communicate() for p in procs]
        raise AssertionError(f"{prefix} timed out:\n" + "\n".join(f"{p.args}\n{o}\n{e}" for p, (o, e) in zip(procs, said))) from None
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"{prefix} -> {p.returncode}\n{out}\n{err}"
    return "".join(o for o, _ in outs)


def _seen(stdout: str) -> list[tuple[dict, list]]:
    # Workers share torchrun's stdout: two lines may interleave, so find each record, not each line.
    found = [(json.loads(env), json.loads(argv)) for env, argv in re.findall(r"ENV (\{[^{}]*\}) ARGV (\[[^\[\]]*\])", stdout)]
    return sorted(found, key=lambda pair: int(pair[0]["RANK"]))


def _normal(env: dict) -> dict:
    out = {k: v for k, v in env.items() if k not in VARIES | DELIBERATE}
    out["MASTER_ADDR"] = socket.gethostbyname(env["MASTER_ADDR"])  # localhost and 127.0.0.1 are one address
    out["MASTER_PORT"] = env["MASTER_PORT"].isdigit()
    return out


@pytest.mark.parametrize("case,machines,args,extra", CASES, ids=[c[0] for c in CASES])
def test_torchrun_command_lines_work_with_phalanx_run(tmp_path, case, machines, args, extra):
    (tmp_path / "envdump.py").write_text(f"#!{sys.executable}\n" + ENVDUMP)
    (tmp_path / "envdump.py").chmod(0o755)
    env = {**os.environ, "PHALANX_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    target = ["envdump"] if extra == "module" else ["./envdump.py"] if extra == "no-python" else ["envdump.py"]
    script = [*target, *args]
    torchrun = _launch([sys.executable, "-m", "torch.distributed.run"], machines, script, tmp_path, env, tmp_path / "t")
    ours = _launch([sys.executable, "-m", "phalanx", "run", "-q"], machines, script, tmp_path, env, tmp_path / "p")
    want, got = _seen(torchrun), _seen(ours)
    assert [a for _, a in got] == [a for _, a in want]  # argv exactly as torchrun passes it
    assert [_normal(e) for e, _ in got] == [_normal(e) for e, _ in want]
    assert len({e["MASTER_PORT"] for e, _ in got}) <= 1  # every rank agrees on the store
    if extra == "shown":
        assert [e["LOCAL_RANK"] for e, _ in got] == [e["LOCAL_RANK"] for e, _ in want] == ["1"]
    if extra == "logs":
        assert want == got == []  # redirected: nothing at the terminal
        for root in (tmp_path / "t", tmp_path / "p"):
            logged = [p for p in root.rglob("*") if p.is_file() and "ENV {" in p.read_text(errors="replace")]
            assert len(logged) == 2, (root, sorted(root.rglob("*")))
    if extra not in ("shown", "logs"):
        expected = 2 * len(machines) if case not in ("nproc-cpu", "fault-tolerant", "static-two-machines") else None
        assert len(got) == (expected or len(want)) and len(want) == len(got)


def test_old_launch_scripts_get_their_local_rank_argument(tmp_path):
    """``python -m torch.distributed.launch`` (without --use-env) passes --local-rank=N; phalanx does
    on request, so scripts written for it run unchanged."""
    (tmp_path / "envdump.py").write_text(ENVDUMP)
    env = {**os.environ, "PHALANX_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    machines, script = [["--nproc-per-node=2"]], ["envdump.py", "--lr", "1"]
    launch = _launch([sys.executable, "-m", "torch.distributed.launch"], machines, script, tmp_path, env, tmp_path)
    ours = _launch([sys.executable, "-m", "phalanx", "run", "-q", "--local-rank-arg=--local-rank"], machines, script,
                   tmp_path, env, tmp_path)
    want, got = _seen(launch), _seen(ours)
    assert [a for _, a in got] == [a for _, a in want] == [["--local-rank=0", "--lr", "1"], ["--local-rank=1", "--lr", "1"]]
    assert [_normal(e) for e, _ in got] == [_normal(e) for e, _ in want]
