"""JobPaths: the single owner of the on-disk layout of a job. Nobody else joins job paths.

::

    $PHALANX_HOME/
      phalanx.db                      the store (SQLite, WAL)
      state/<name>/                   PHALANX_STATE_DIR, persistent per job name
      jobs/<id>/
        spec.json                     the JobSpec as submitted
        plan.json                     the plan of the latest attempt (what submit executes)
        supervisor.log                the supervisor's own output (detached runs)
        attempts.jsonl                one line per finished attempt: outcome, exit code, retry decision
        output/                       PHALANX_OUTPUT_DIR
        attempt_<k>/
          node_<n>/agent.log          the node agent's (and torchrun's) own output
          node_<n>/launch.json        what the node agent runs (its part of the plan)
          node_<n>/result.json        per-rank exit codes of the node, written at its end
          node_<n>/resources.jsonl    resource samples of the node and its ranks
          rank_<r>/metrics.jsonl      metrics read from the rank's output (one JSON per line)
          rank_<r>/user_metrics.jsonl metrics the script wrote itself (PHALANX_METRICS_FILE)
          rank_<r>/output.log         stdout+stderr of global rank r, in order
          rank_<r>/error.json         the rank's uncaught exception, if any
          rank_<r>/proc.json          the rank's pid, node and host, written at start

Files that other processes read are written atomically (see ``write_atomic``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(name: str) -> str:
    """A job name as a directory name: no slashes, no dots-only names."""
    cleaned = _SAFE.sub("-", name).strip("-.") or "job"
    return cleaned[:100]


@dataclass(frozen=True)
class HomePaths:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "phalanx.db"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def state_dir(self, name: str) -> Path:
        return self.root / "state" / safe_name(name)

    def job(self, job_id: str) -> "JobPaths":
        return JobPaths(self.jobs / job_id)


@dataclass(frozen=True)
class JobPaths:
    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    @property
    def attempts_log(self) -> Path:
        return self.root / "attempts.jsonl"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    def attempt(self, attempt: int) -> Path:
        return self.root / f"attempt_{attempt}"

    def node_dir(self, attempt: int, node_rank: int) -> Path:
        return self.attempt(attempt) / f"node_{node_rank}"

    def agent_log(self, attempt: int, node_rank: int) -> Path:
        return self.node_dir(attempt, node_rank) / "agent.log"

    def node_result(self, attempt: int, node_rank: int) -> Path:
        return self.node_dir(attempt, node_rank) / "result.json"

    def node_resources(self, attempt: int, node_rank: int) -> Path:
        return self.node_dir(attempt, node_rank) / "resources.jsonl"

    def rank_metrics(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "metrics.jsonl"

    def rank_user_metrics(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "user_metrics.jsonl"

    def node_launch(self, attempt: int, node_rank: int) -> Path:
        return self.node_dir(attempt, node_rank) / "launch.json"

    def rank_dir(self, attempt: int, rank: int) -> Path:
        return self.attempt(attempt) / f"rank_{rank}"

    def rank_dir_template(self, attempt: int) -> str:
        """``rank_dir`` with ``{rank}`` left open, for workers that learn their rank late."""
        return str(self.attempt(attempt) / "rank_{rank}")

    def rank_log(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "output.log"

    def rank_error(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "error.json"

    def rank_proc(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "proc.json"

    def attempts(self) -> list[int]:
        found = []
        if self.root.exists():
            for child in self.root.iterdir():
                if child.name.startswith("attempt_") and child.name[8:].isdigit():
                    found.append(int(child.name[8:]))
        return sorted(found)

    def ranks(self, attempt: int) -> list[int]:
        base = self.attempt(attempt)
        found = []
        if base.exists():
            for child in base.iterdir():
                if child.name.startswith("rank_") and child.name[5:].isdigit():
                    found.append(int(child.name[5:]))
        return sorted(found)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
