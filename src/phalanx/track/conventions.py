"""Each tracker's own conventions, and what phalanx keeps of a tracker run.

Settings come from the tools' own environment variables, as their clients read them. At submit a
job records the ones that name *places* (``MLFLOW_TRACKING_URI``, ``WANDB_PROJECT``, ...) in its
spec, so a retry, a ``resume`` or a detached exporter next week sends to the same place; keys and
passwords (``WANDB_API_KEY``, ``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``) are never
recorded: the exporter reads them from its environment, which it inherits from the supervisor.

Per tracker the exporter keeps one state file (``JobPaths.track_state(kind)``, written atomically,
only by the exporter): the run (id, link), the cursor into the job's files, and the counts
``status`` shows: sent, waiting (read from the files, not yet taken by the tracker) and dropped
(refused by the tracker). Pure apart from ``read_state``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..core.env import TRACKER_PLACES
from ..core.paths import JobPaths, read_json

KINDS = ("mlflow", "tensorboard", "wandb")

# The variables that say where a tool's runs go (recorded in the spec at submit; core/env.py
# hands them on to the script with the run ids).
PLACES: dict[str, tuple[str, ...]] = {**TRACKER_PLACES, "tensorboard": ()}
# The Python package each exporter needs (the ``phalanx[...]`` extra of the same name); MLflow's
# REST API needs none when the tracking URI is http(s).
PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}


def capture(kinds: tuple[str, ...], env: Mapping[str, str]) -> dict[str, str]:
    """The tools' place settings in ``env`` (the submitting environment, the job's ``-e`` over it)."""
    return {name: env[name] for kind in kinds for name in PLACES.get(kind, ()) if env.get(name)}


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def missing_package(kind: str, config: Mapping[str, str]) -> str | None:
    """The package ``kind`` needs that is not installed here, or None (looked up, never imported)."""
    if kind == "mlflow" and is_http(config.get("MLFLOW_TRACKING_URI", "")):
        return None
    package = PACKAGES[kind]
    return None if importlib.util.find_spec(package) is not None else package


def metric_key(name: str, rank: int, all_ranks: bool) -> str:
    """A rank's metric as the tracker names it: ``loss``; with ``--track-ranks all`` rank 3's is
    ``rank3/loss`` (rank 0 keeps the plain name, so a run compares with a rank-0-only one)."""
    return f"rank{rank}/{name}" if all_ranks and rank else name


@dataclass
class TrackState:
    """One tracker's state file. ``cursor`` belongs to the feed (supervise/tracking.py)."""

    kind: str
    run_id: str = ""
    url: str = ""  # where a person sees the run (a web page, or a directory)
    extra: dict[str, Any] = field(default_factory=dict)  # the tracker's own ids (experiment, parent)
    cursor: dict[str, Any] = field(default_factory=dict)
    sent: int = 0
    waiting: int = 0
    dropped: int = 0
    error: str = ""  # the last failure, while it lasts
    error_since: float | None = None
    finished: bool = False  # the run was closed with the job's outcome
    pid: int | None = None  # the exporter that writes this file
    updated: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, kind: str, data: Mapping[str, Any] | None) -> "TrackState":
        known = set(cls.__dataclass_fields__)
        state = cls(kind=kind, **{k: v for k, v in (data or {}).items() if k in known and k != "kind"})
        return state


def read_state(paths: JobPaths, kind: str) -> TrackState:
    return TrackState.from_dict(kind, read_json(paths.track_state(kind)))


def describe(state: TrackState, exporter_alive: bool) -> str:
    """One line of ``phalanx status``: the run and its link, and what has not arrived yet."""
    where = state.url or (f"run {state.run_id}" if state.run_id else "no run yet")
    parts = [f"{state.sent:,} points sent"]
    if state.waiting:
        parts.append(f"{state.waiting:,} waiting" + ("" if exporter_alive else " (exporter stopped; they stay on disk)"))
    if state.dropped:
        parts.append(f"{state.dropped:,} dropped (refused by {state.kind})")
    line = f"{where}  ({', '.join(parts)})"
    if state.error:
        line += f"\n          last error: {state.error}"
    return line


def logdir_name(job_name: str, job_id: str) -> str:
    """A job's TensorBoard run directory under ``--track-dir``."""
    from ..core.paths import safe_name

    return f"{safe_name(job_name)}-{job_id}"


def local_logdir(paths: JobPaths, track_dir: str | None, job_name: str, job_id: str) -> Path:
    """Where the job's event files are written here: the job's directory by default (so
    ``tensorboard --logdir ~/.phalanx/jobs`` shows every job), ``--track-dir``/NAME-ID when it is a
    directory, and the job's directory again when it is an object store (copied there)."""
    if not track_dir or "://" in track_dir and not track_dir.startswith("file://"):
        return paths.root
    base = Path(track_dir.removeprefix("file://")).expanduser()
    return base / logdir_name(job_name, job_id)
