"""What a job's tracker run is made of, read from the job's spec and files: its parameters (the
script's ``--name value`` arguments, a sweep trial's values, topology, backend, job id, code
snapshot digest, git commit), its tags (user, project, job name, sweep id, the job's ``--tag``s),
its group and parent (a sweep), where TensorBoard writes; and, with ``--track-artifacts``, the files
that go along at the end."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
from pathlib import Path

from ..core.paths import HomePaths, JobPaths, read_json
from ..core.spec import JobSpec, code_root
from ..track.base import Parent, RunInfo
from ..track.conventions import local_logdir, logdir_name

MAX_ARTIFACT_BYTES = 1 << 30


def script_params(args: tuple[str, ...]) -> dict[str, str]:
    """``--lr 0.1 --bs=32 --amp data.csv`` -> ``{lr: 0.1, bs: 32, amp: true}``: the options a
    script was given, as argparse-style scripts read them; positional words are not parameters."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(args) and not (args[i + 1].startswith("--") or _is_flag(args[i + 1])):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = "true"
        i += 1
    return out


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit() and word[1:2] != "."


def git_commit(directory: str) -> str:
    try:
        done = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def run_info(paths: JobPaths, spec: JobSpec) -> RunInfo:
    job_id = paths.root.name
    home = HomePaths(paths.root.parent.parent)
    env = dict(spec.env)
    sweep_id = env.get("PHALANX_SWEEP_ID", "")
    trial = json.loads(env.get("PHALANX_PARAMS") or "{}")
    manifest = read_json(paths.code_manifest) or (read_json(home.sweep_code(sweep_id)[1]) if sweep_id else None) or {}
    params = {**script_params(spec.entrypoint.args), **{k: str(v) for k, v in trial.items()}}
    params.update({
        "phalanx.job_id": job_id, "phalanx.backend": spec.backend,
        "phalanx.nnodes": str(spec.resources.nnodes), "phalanx.nproc_per_node": str(spec.resources.nproc_per_node),
        "phalanx.framework": spec.framework.value,
    })
    root = code_root(spec)
    commit = git_commit(root) if os.path.isdir(root) else ""
    if manifest.get("digest"):
        params["phalanx.code_digest"] = str(manifest["digest"])
    if commit:
        params["phalanx.git_commit"] = commit
    user = os.environ.get("PHALANX_USER") or env.get("PHALANX_USER") or _user()
    project = os.environ.get("PHALANX_PROJECT") or env.get("PHALANX_PROJECT") or spec.tags.get("project", "")
    tags = {"phalanx.user": user, "phalanx.project": project, "phalanx.job_name": spec.name,
            "phalanx.job_id": job_id, "phalanx.sweep_id": sweep_id, **{k: v for k, v in spec.tags.items()}}
    if sweep_id:
        tags["phalanx.trial"] = env.get("PHALANX_TRIAL_ID", "")
    parent = None
    if sweep_id:
        name = spec.name.rpartition("-")[0] or spec.name
        state = home.sweep_track(sweep_id, "mlflow")
        parent = Parent(sweep_id, name, state, state.parent / ".mlflow.lock")
    started = (read_json(paths.root / "track" / "started.json") or {}).get("time") or _created(paths)
    mirror = None
    if spec.track_dir and "://" in spec.track_dir and not spec.track_dir.startswith("file://"):
        mirror = spec.track_dir.rstrip("/") + "/" + logdir_name(spec.name, job_id)
    script = spec.entrypoint.typed or spec.entrypoint.target
    return RunInfo(job_id=job_id, name=spec.name, started=float(started), params=params,
                   tags={k: v for k, v in tags.items() if v}, config=dict(spec.track_config), workdir=spec.workdir,
                   group=sweep_id or job_id, parent=parent, script=script, git_commit=commit,
                   logdir=local_logdir(paths, spec.track_dir, spec.name, job_id), mirror=mirror, home=paths.track)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _created(paths: JobPaths) -> float:
    try:
        return paths.spec.stat().st_mtime
    except OSError:
        import time

        return time.time()


def artifact_files(paths: JobPaths) -> list[tuple[Path, str]]:
    """The job's outputs (``outputs/...``) and every attempt's rank logs (``logs/attempt_K/rank_R.log``)."""
    files: list[tuple[Path, str]] = []
    if paths.output_dir.is_dir():
        for path in sorted(paths.output_dir.rglob("*")):
            if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_ARTIFACT_BYTES:
                files.append((path, "outputs/" + path.relative_to(paths.output_dir).as_posix()))
    for attempt in paths.attempts():
        for rank in paths.ranks(attempt):
            log = paths.rank_log(attempt, rank)
            if log.is_file():
                files.append((log, f"logs/attempt_{attempt}/rank_{rank}.log"))
    return files
