"""Run the same project both ways, python/torchrun and ``phalanx run``, and compare what the
script saw and left.

A case (``cases.py``) names a project under ``projects/``, the directory (inside it) the
command is typed in, and the two command lines. ``run_both`` copies the project into a fresh
directory, runs the reference, puts the tree back as it was, runs phalanx in the same place
(so paths are the same), and returns both ``Observation``s. What is compared:

- the exit code;
- the output, as a multiset of lines (ranks interleave differently; phalanx puts a rank's
  stderr in its log beside stdout): torchrun's own log lines and phalanx's ``phalanx: ...``
  lines and rank prefixes are dropped, nothing else;
- the files the run created or changed, by path and content (the ``seen_*.json`` records by
  path only: they hold ports and ids);
- for scripts that use ``observe.py``, every record: ``sys.argv``, cwd, ``__file__``,
  ``sys.path[0]``, the main module's globals, and the **whole environment**: the same keys, with
  equal values except those that differ run to run (ports, run ids), and besides them only
  what phalanx adds on purpose (``ALLOWED_EXTRA``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
PROJECTS = HERE / "projects"
BIN = Path(sys.executable).parent
TIMEOUT = 240.0

# What phalanx adds on purpose. Never anything a library reads as "a launcher started me".
ALLOWED_EXTRA = re.compile(r"^(PHALANX_|SM_)|^PYTHONUNBUFFERED$")
# Added to explicit multi-process topologies on this machine: the collectives stay on loopback,
# torchrun's in-place restarts get a store per round (docs/restarts.md).
ALLOWED_EXTRA_MULTI = re.compile(r"^(GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME|TORCH_DISABLE_SHARE_RDZV_TCP_STORE)$")
# Values phalanx sets differently on purpose, and why.
ON_PURPOSE = {
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "phalanx's torchrun forwards SLURM's SIGUSR1/SIGUSR2 preemption warnings too",
}
# Values that differ from one run to the next, whoever launches: compared by presence only.
VOLATILE = {
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE",
    "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT", "OLDPWD",
}
# A loopback port in an argument ({master_port} filled in, or picked by hand): differs run to run.
PORT_IN_ARGUMENT = re.compile(r"^(127\.0\.0\.1):\d+$")


def portless(argv: list[str]) -> list[str]:
    return [PORT_IN_ARGUMENT.sub(r"\1:PORT", word) for word in argv]


# torchrun's and the elastic agent's own log lines on stderr, and phalanx's own lines.
LAUNCHER_LINES = re.compile(r"^([WIE]\d{4} |\*{5}|phalanx: |.*torch/distributed/run\.py|.*Setting OMP_NUM_THREADS)")
RANK_PREFIX = re.compile(r"^\[\d+\] ")


@dataclass
class Observation:
    code: int
    lines: Counter[str]
    files: dict[str, str]  # created or changed: path -> sha256 ("" for seen_*.json)
    seen: dict[str, dict] = field(default_factory=dict)  # seen_<rank>.json -> record
    timed_out: bool = False
    raw: str = ""


def tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(root).as_posix()
            out[rel] = "" if path.name.startswith("seen_") else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str, str, bool]:
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, nothing else
        out, err = proc.communicate()
        return -9, out, err, True


def _observe(root: Path, before: dict[str, str], code: int, out: str, err: str, timed_out: bool) -> Observation:
    after = tree(root)
    changed = {p: h for p, h in after.items() if before.get(p) != h}
    seen = {p: json.loads((root / p).read_text()) for p in changed if Path(p).name.startswith("seen_")}
    lines = Counter(RANK_PREFIX.sub("", line) for line in (out + err).splitlines()
                    if line.strip() and not LAUNCHER_LINES.match(RANK_PREFIX.sub("", line)))
    return Observation(code, lines, changed, seen, timed_out, out + err)


def restore(root: Path, pristine: Path) -> None:
    shutil.rmtree(root)
    shutil.copytree(pristine, root, symlinks=True)


def _copy_project(case: "Case", workspace: Path) -> tuple[Path, Path]:
    """A fresh copy of the case's project (the probe beside every script), and its pristine twin."""
    root = workspace / "case"
    pristine = workspace / "pristine"
    shutil.copytree(PROJECTS / case.project, pristine, symlinks=True)
    for folder in {path.parent for path in pristine.rglob("*.py")} | {pristine / case.cwd}:  # the probe beside every script
        shutil.copy(HERE / "observe.py", folder / "observe.py")
    if case.prepare:
        case.prepare(pristine)
    shutil.copytree(pristine, root, symlinks=True)
    return root, pristine


def run_phalanx(case: "Case", workspace: Path, env: dict[str, str], options: tuple[str, ...] = ()) -> Observation:
    """Only the case's phalanx run, in a fresh copy of its project: for what has no reference run
    but its own promise (``{node_rank}``-style arguments filled in)."""
    root, _ = _copy_project(case, workspace)
    before = tree(root)
    return _observe(root, before, *_run([str(BIN / "phalanx"), "run", *options, *case.phalanx], root / case.cwd, env,
                                        case.timeout))


def run_both(case: "Case", workspace: Path, env: dict[str, str], options: tuple[str, ...] = (),
             settle: Callable[[], None] | None = None) -> tuple[Observation, Observation]:
    """The case's reference run, then its phalanx run (``phalanx run OPTIONS ...``), in the same
    fresh copy of its project. With ``settle``, phalanx runs once before, unobserved, the tree is
    put back and ``settle()`` waits for what that run set up (warm starts: the first run of an
    environment starts its pool in the background and runs cold)."""
    root, pristine = _copy_project(case, workspace)
    cwd = root / case.cwd
    before = tree(root)

    def once(run: Callable[[], tuple[int, str, str, bool]]) -> tuple[int, str, str, bool]:
        """A run, and once more from the pristine tree if a C++ thread aborted it at exit (below)."""
        done = run()
        if TORN_DOWN in done[1] + done[2]:
            restore(root, pristine)
            done = run()
        return done

    reference = _observe(root, before, *once(lambda: _reference(case, cwd, env)))
    restore(root, pristine)
    argv = [str(BIN / "phalanx"), "run", *options, *case.phalanx]
    if settle is not None:
        _run(argv, cwd, env, case.timeout)
        restore(root, pristine)
        settle()
    phx = _observe(root, before, *once(lambda: _run(argv, cwd, env, case.timeout)))
    return reference, phx


# A process whose C++ thread (gloo's, in Lightning's own spawned workers) is still joinable when
# the interpreter exits aborts with this (SIGABRT), under plain python as under phalanx, now and
# then: a race of the library's teardown, not something either run did. Such a run is run again once.
TORN_DOWN = "terminate called without an active exception"


def _reference(case: "Case", cwd: Path, env: dict[str, str]) -> tuple[int, str, str, bool]:
    if case.by_hand is None:
        return _run([*_tool(case.reference[0]), *case.reference[1:]], cwd, env, case.timeout)
    # Several processes started by hand, each with its own variables (JAX's documented way), and
    # arguments of its own where it needs them (what phalanx fills in for {node_rank}-style ones).
    procs = []
    for extra in case.by_hand(env, cwd):
        extra, args = extra if isinstance(extra, tuple) else (extra, ())
        procs.append(subprocess.Popen([*_tool(case.reference[0]), *case.reference[1:], *args], cwd=cwd, env={**env, **extra},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    outs, code, timed_out = [], 0, False
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=case.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        outs.append((out, err))
        code = code or proc.returncode
    return code, "".join(o for o, _ in outs), "".join(e for _, e in outs), timed_out


def _tool(name: str) -> list[str]:
    """A tool of this venv; ``torchrun`` is ``python -m torch.distributed.run`` (its entry point)."""
    if (BIN / name).exists():
        return [str(BIN / name)]
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [name]


def env_differences(reference: dict[str, str], phalanx: dict[str, str], multi: bool) -> list[str]:
    """What a library reading the environment would see differently, as readable lines."""
    problems = []
    allowed = [ALLOWED_EXTRA] + ([ALLOWED_EXTRA_MULTI] if multi else [])
    for key in sorted(set(reference) | set(phalanx)):
        if key not in phalanx:
            problems.append(f"missing under phalanx: {key}={reference[key]!r}")
        elif key not in reference:
            if not any(p.search(key) for p in allowed):
                problems.append(f"added by phalanx: {key}={phalanx[key]!r}")
        elif key not in VOLATILE and key not in ON_PURPOSE and reference[key] != phalanx[key]:
            problems.append(f"differs: {key}: python {reference[key]!r}, phalanx {phalanx[key]!r}")
    return problems


@dataclass(frozen=True)
class Case:
    """One row of the table: the same project run both ways."""

    name: str
    project: str  # a directory under projects/
    cwd: str  # where, inside the project, the command is typed
    reference: tuple[str, ...]  # python ... or torchrun ... (a tool of this venv, or on PATH)
    phalanx: tuple[str, ...]  # the words after `phalanx run`
    needs: tuple[str, ...] = ()  # importable modules the case needs (skipped without)
    multi: bool = False  # an explicit multi-process topology (see ALLOWED_EXTRA_MULTI)
    by_hand: object = None  # (env, cwd) -> [extra env, or (extra env, extra args), per process]: the reference starts them itself
    prepare: object = None  # project root -> None: extra files made before the runs
    timeout: float = TIMEOUT
    # (reference, phalanx) -> None: what the case promises besides being the same (where a model went)
    check: object = None
    starts: tuple[str, ...] = ("warm", "cold")  # how phalanx starts its processes in the runs compared
