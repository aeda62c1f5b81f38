"""Weights & Biases: one run per job, its id fixed by the job id (``core/env.wandb_run_id``) and
resumed (``resume="allow"``) by every exporter of the job, in the group of the job (a sweep's trials:
the sweep's group). Needs ``phalanx[wandb]``; the real ``wandb`` package does the sending, its own
buffering and retries included, so ``WANDB_MODE=offline`` writes the run directory for a later
``wandb sync``.

Settings as W&B reads them: ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``, ``WANDB_BASE_URL``,
``WANDB_API_KEY`` (the environment only, never recorded), ``WANDB_DIR`` (else the job's
``track/`` directory holds the run directory).

W&B's step only grows: a point whose step is below one already logged (a retry that redid steps
from its last checkpoint) is not kept by W&B, so it is counted as dropped here. Resource samples
(``sys/...``) join the row of the latest training step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import TrackerUnavailable
from .base import Ending, Point, RunInfo
from ..core.env import wandb_run_id
from .conventions import TrackState


class WandbExporter:
    kind = "wandb"

    def __init__(self) -> None:
        self.run: Any = None
        self.step = -1  # the highest step logged
        self.state: TrackState | None = None
        self.exit_code = 0

    def open(self, run: RunInfo, state: TrackState) -> None:
        import wandb

        config = run.config
        where = os.environ.get("WANDB_DIR") or str(run.home or Path(run.workdir))
        Path(where).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(x_disable_stats=True, console="off", silent=True, x_disable_meta=True)
        tags = sorted({f"{k}:{v}"[:64] for k, v in run.tags.items() if k.startswith("phalanx.") and v})
        try:
            self.run = wandb.init(
                id=wandb_run_id(run.job_id), resume="allow", name=run.name, group=run.group,
                project=config.get("WANDB_PROJECT") or "phalanx", entity=config.get("WANDB_ENTITY") or None,
                mode=config.get("WANDB_MODE") or None,  # type: ignore[arg-type]
                dir=where, config={**run.params}, tags=tags, job_type="trial" if run.parent else "job",
                settings=settings, reinit="create_new")
        except Exception as exc:  # noqa: BLE001 - wandb raises its own types for a server that is down
            raise TrackerUnavailable(f"W&B: {exc}"[:300]) from None
        self.step = int(state.extra.get("step", -1))
        self.state = state
        state.run_id = self.run.id
        offline = (config.get("WANDB_MODE") or os.environ.get("WANDB_MODE", "")) in ("offline", "dryrun")
        # offline: the run's directory, for ``wandb sync``
        state.url = str(Path(self.run.dir).parent) if offline else (self.run.url or str(self.run.dir))
        state.extra["dir"] = str(Path(self.run.dir).parent)
        state.extra["group"] = run.group

    def params(self, run: RunInfo) -> None:
        pass  # the run's config, given to wandb.init

    def send(self, points: Sequence[Point]) -> int:
        row: dict[str, float] = {}
        row_step = self.step
        dropped = 0
        for p in points:
            if p.key.startswith("sys/"):
                row[p.key] = p.value
                continue
            if p.step < self.step or p.step < row_step:
                dropped += 1  # W&B keeps no step below one it has
                continue
            if p.step != row_step or p.key in row:
                if row:
                    self._log(row, max(row_step, 0))
                    row = {}
                row_step = p.step
            row[p.key] = p.value
        if row:
            self._log(row, max(row_step, 0))
        return dropped

    def _log(self, row: dict[str, float], step: int) -> None:
        try:
            self.run.log(row, step=step)
        except Exception as exc:  # noqa: BLE001
            raise TrackerUnavailable(f"W&B: {exc}"[:300]) from None
        self.step = step
        if self.state is not None:
            self.state.extra["step"] = step

    def finish(self, ending: Ending) -> None:
        self.exit_code = ending.exit_code or 0
        summary = {"phalanx/outcome": ending.state.lower(), **{k: v for k, v in ending.extra.items()}}
        if ending.exit_code is not None:
            summary["phalanx/exit_code"] = str(ending.exit_code)
        if ending.root_cause:
            summary["phalanx/root_cause"] = ending.root_cause
        try:
            self.run.summary.update(summary)
            self.run.tags = tuple(sorted({*self.run.tags, f"outcome:{ending.state.lower()}"}))
        except Exception as exc:  # noqa: BLE001
            raise TrackerUnavailable(f"W&B: {exc}"[:300]) from None

    def artifacts(self, files: Sequence[tuple[Path, str]]) -> None:
        """Copies under the run's files (``run.save`` with the path inside the run kept)."""
        import shutil

        staging = Path(self.run.dir) / "phalanx-files"
        for path, name in files:
            dest = staging / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            self.run.save(str(dest), base_path=str(staging), policy="now")

    def close(self) -> None:
        if self.run is not None:
            try:
                self.run.finish(exit_code=self.exit_code)
            except Exception:  # noqa: BLE001 - nothing more to do for a run that cannot close
                pass
            self.run = None
