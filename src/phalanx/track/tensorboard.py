"""TensorBoard: event files written with TensorBoard's own writer (``phalanx[tensorboard]``; no
TensorFlow), one log directory per job whatever its attempts (``conventions.local_logdir``), so
its curves continue where a retry resumes. A restarted exporter adds a new event file to the same
directory; TensorBoard reads them as one run.

Scalars are TensorBoard's ``simple_value`` (32-bit floats: what every TensorBoard reader shows);
the parameters are the HParams plugin's session, the outcome a text-free ``phalanx/exit_code``
scalar and the HParams session's end. With an object-store ``--track-dir`` the directory is copied
there (fsspec) after every write of new points, at most every ``MIRROR_EVERY`` seconds, and at the end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import TrackerUnavailable
from .base import Ending, Point, RunInfo
from .conventions import TrackState

MIRROR_EVERY = 30.0


class TensorBoardExporter:
    kind = "tensorboard"

    def __init__(self) -> None:
        self.writer: Any = None
        self.logdir: Path | None = None
        self.mirror: str | None = None
        self.mirrored_at = 0.0

    def open(self, run: RunInfo, state: TrackState) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        assert run.logdir is not None
        self.logdir, self.mirror = run.logdir, run.mirror
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackerUnavailable(f"cannot write TensorBoard files in {self.logdir}: {exc}") from None
        if self.writer is None:
            self.writer = EventFileWriter(str(self.logdir), flush_secs=5, filename_suffix=f".phalanx.{os.getpid()}")
        state.run_id = state.run_id or run.job_id
        where = self.mirror or str(self.logdir)
        state.url = f"{where}  (tensorboard --logdir {where.rpartition('/')[0] or where})"

    def params(self, run: RunInfo) -> None:
        from tensorboard.plugins.hparams import summary_v2

        hparams = {k: v for k, v in run.params.items()}
        self._write(summary_v2.hparams_pb(hparams, trial_id=run.job_id, start_time_secs=run.started), 0, run.started)
        self.writer.flush()

    def _write(self, summary: Any, step: int, wall: float) -> None:
        from tensorboard.compat.proto import event_pb2

        self.writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))

    def send(self, points: Sequence[Point]) -> int:
        from tensorboard.compat.proto import summary_pb2

        for p in points:
            self._write(summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=p.key, simple_value=p.value)]),
                        p.step, p.time)
        self.writer.flush()
        if self.mirror and time.monotonic() - self.mirrored_at >= MIRROR_EVERY:
            self._mirror()
        return 0

    def finish(self, ending: Ending) -> None:
        from tensorboard.compat.proto import summary_pb2

        if ending.exit_code is not None:
            value = summary_pb2.Summary.Value(tag="phalanx/exit_code", simple_value=float(ending.exit_code))
            self._write(summary_pb2.Summary(value=[value]), 0, ending.ended)
        self.writer.flush()
        if self.mirror:
            self._mirror()

    def _mirror(self) -> None:
        """The event files to ``--track-dir``'s object store (``RunInfo.mirror``: NAME-ID/ under it)."""
        assert self.logdir is not None and self.mirror is not None
        import fsspec

        self.mirrored_at = time.monotonic()
        target = self.mirror
        try:
            fs, root = fsspec.core.url_to_fs(target)
            for path in sorted(self.logdir.glob("events.out.tfevents.*")):
                fs.put_file(str(path), f"{root}/{path.name}")
        except Exception as exc:  # noqa: BLE001 - any store failure: try again later
            raise TrackerUnavailable(f"copying TensorBoard files to {target} failed: {exc}") from None

    def artifacts(self, files: Sequence[tuple[Path, str]]) -> None:
        pass  # TensorBoard keeps no files; the outputs stay in the job's directory

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
