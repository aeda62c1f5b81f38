"""JobPaths: the single owner of the on-disk layout of a job. Nobody else joins job paths (one
exception left: the k8s ``--in-cluster`` files, joined in ``backends/kubernetes/hosted.py``,
``record.py`` and ``supervisor.py``).

::

    $PHALANX_HOME/
      phalanx.db                      the store (SQLite, WAL)
      config.yaml                     settings (config.py), when the user writes one
      staging/<id>.<pid>/             a job directory being laid out, moved into jobs/ with its row (supervise/submit.py)
      state/<key>/                    PHALANX_STATE_DIR: the job's own, or shared by --name (storage/statedir.py)
      state/.previous/<key>-<stamp>/  a state directory moved aside by --clean-state
      sweeps/<id>/                    a sweep's own files: runner.log (detached), code/ + code.json (the trials' snapshot),
                                      sampler.pkl (tpe: the sampler, so a resume continues the search)
      cache/code/objects/<aa>/<sha>   code snapshots' files, stored once by content (read-only; .x: executable)
      cache/code/pyc/<dev>-<ino>-...  their bytecode, compiled once for every job that runs them
      cache/sagemaker-digests.json    content digests of local inputs by (path, size, mtime) (SageMaker uploads)
      cache/channels/<key>/           a remote (or extracted) input, staged; key = sha256(source)[:16]
      cache/channels/<key>.json       what was staged there: source, files with size and version
      cache/channels/<key>.lock       held while staging (jobs sharing an input wait for each other)
      cache/channels/<key>.partial/   transfers in progress; complete files are renamed into <key>/
      jobs/<id>/
        spec.json                     the JobSpec as submitted
        plan.json                     the plan of the latest attempt (what submit executes)
        supervisor.log                the supervisor's own output (detached runs)
        attempts.jsonl                one line per finished attempt: outcome, exit code, retry decision
        trace.jsonl                   with PHALANX_TRACE=1: when each step of a start or restart happened
        stop.json                     the latest ``phalanx stop``: when, and whether --now (the grace skipped)
        output/                       PHALANX_OUTPUT_DIR
        code/                         the code snapshot (at submit time): hard links into cache/code/objects
        code.json                     what the snapshot holds: files, bytes, digest, large files left out
        inputs.json                   fingerprint of the job's inputs (--skip-if-done)
        artifacts.json                where outputs and logs were uploaded (--output), file by file
        inputs/<name>/                on a node of a backend that ships inputs with the job (Ray): its copy of input <name>
        .reserve                      space the supervisor holds to record the job's end when the disk fills (core/disk.py)
        k8s-supervisor.json           k8s --in-cluster: where the job's supervisor pod runs
        supervisor.yaml               k8s --in-cluster: the supervisor pod's objects, as applied
        supervisor-rbac.yaml          k8s --in-cluster: the Role its service account needs (kubectl apply -f)
        attempt_<k>/
          batch.sh                    the batch script submitted to a scheduler (SLURM)
          batch.log                   the batch script's own output (the scheduler writes it; Ray: the driver's)
          scheduler.json              the scheduler's id for the attempt (SLURM, Ray, SageMaker, SkyPilot job id, Kubernetes workload)
          skypilot-workdir/           what SkyPilot syncs to every VM (skypilot backend)
          manifests.yaml              the Kubernetes objects the attempt created (placeholders unfilled)
          node_<n>/agent.log          the node agent's (and torchrun's) own output
          node_<n>/ssh.log            the ssh client's messages for the node's link (ssh backend)
          node_<n>/launch.json        what the node agent runs (its part of the plan)
          node_<n>/result.json        per-rank exit codes of the node, written at its end
          node_<n>/resources.jsonl    resource samples of the node and its ranks
          rank_<r>/metrics.bin        metrics read from the rank's output (monitor/metricfile.py)
          rank_<r>/metrics.jsonl      the same as JSON lines, from phalanx before metrics.bin (read only)
          rank_<r>/user_metrics.jsonl metrics the script wrote itself (PHALANX_METRICS_FILE)
          rank_<r>/output.log         stdout+stderr of global rank r, in order
          rank_<r>/output.idx         "time size" lines: how long output.log was when (logs --since)
          rank_<r>/error.json         the rank's uncaught exception, if any
          rank_<r>/exit.json          the exit status the rank's bootstrap ended with (for workers torch reaps)
          rank_<r>/proc.json          the rank's pid, node and host, written at start
          rank_<r>/torchelastic_error.json  TORCHELASTIC_ERROR_FILE of a rank started without torchrun (-n 1)

Under ``--output URI`` a job's results go to ``<URI>/<name>-<id>/`` (``RemoteJobPaths``):
``output/`` (PHALANX_OUTPUT_DIR), ``logs/`` (the job directory's records) and
``_phalanx_artifacts.json``, written last, so its presence means the upload is complete.

Files that other processes read are written atomically (see ``write_atomic``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spec import Channel

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

    @property
    def code_objects(self) -> Path:
        """The content store of code snapshots: one read-only file per distinct content."""
        return self.root / "cache" / "code" / "objects"

    @property
    def code_bytecode(self) -> Path:
        """Bytecode of frozen code, by the stored file's inode (``launch/frozen.bytecode_dir`` finds it)."""
        return self.root / "cache" / "code" / "pyc"

    @property
    def sagemaker_digests(self) -> Path:
        """Content digests of local inputs, by (path, size, mtime): an unchanged input is not read
        again before a SageMaker upload (``backends/sagemaker/uploads.py``)."""
        return self.root / "cache" / "sagemaker-digests.json"

    def sweep_dir(self, sweep_id: str) -> Path:
        return self.root / "sweeps" / sweep_id

    def sweep_log(self, sweep_id: str) -> Path:
        """A detached sweep runner's own output."""
        return self.sweep_dir(sweep_id) / "runner.log"

    def previous_state(self, name: str, stamp: str) -> Path:
        """Where ``--clean-state`` moves a state directory aside (never deleted)."""
        return self.root / "state" / ".previous" / f"{safe_name(name)}-{stamp}"

    def sweep_outcome(self, sweep_id: str) -> Path:
        """Why a sweep that ran every trial failed (``{"reason": ...}``: no trial reported its objective)."""
        return self.sweep_dir(sweep_id) / "outcome.json"

    def sweep_stop_request(self, sweep_id: str) -> Path:
        """A stop asked on another machine than its runner's (as ``JobPaths.stop_request``)."""
        return self.sweep_dir(sweep_id) / "stop.json"

    def sweep_start_mode(self, sweep_id: str) -> Path:
        """How ``phalanx run`` started the sweep (as ``JobPaths.start_mode``)."""
        return self.sweep_dir(sweep_id) / "start.json"

    def sweep_sampler(self, sweep_id: str) -> Path:
        """The search's sampler state (pickled Optuna sampler), kept so a resume continues it."""
        return self.sweep_dir(sweep_id) / "sampler.pkl"

    def sweep_code(self, sweep_id: str) -> tuple[Path, Path]:
        """The code snapshot a sweep's trials share, and its manifest."""
        return self.sweep_dir(sweep_id) / "code", self.sweep_dir(sweep_id) / "code.json"

    def sweep_track(self, sweep_id: str, kind: str) -> Path:
        """A sweep's parent run in tracker ``kind`` (its trials are the children)."""
        return self.sweep_dir(sweep_id) / "track" / f"{kind}.json"

    def job(self, job_id: str) -> "JobPaths":
        return JobPaths(self.jobs / job_id)

    def shipped(self, job_id: str) -> Path:
        """The working directory of a job or sweep submitted to a team server: the copy of the
        submitter's code shipped with it (``server/shipping.py``), removed with the job."""
        return self.root / "shipped" / job_id

    @property
    def staging(self) -> Path:
        """Where a job's directory is laid out before it moves into ``jobs/`` together with its
        row (``supervise/submit.create_job``): ``staging/<id>.<pid>`` (the pid: whose it is)."""
        return self.root / "staging"

    def channel_cache(self, source: str, extract: bool = False) -> "ChannelCachePaths":
        """The cache entry of one input source (a remote URI, or a local archive to extract)."""
        key = hashlib.sha256((source + ("#extract" if extract else "")).encode()).hexdigest()[:16]
        return ChannelCachePaths(self.root / "cache" / "channels", key)

    def channel_path(self, channel: "Channel") -> Path:
        """Where a job reads ``channel``: a local source in place, anything else in the cache. Pure."""
        if not channel.source:
            from ..errors import UsageError

            raise UsageError(f"input '{channel.name}' ({channel.uri}) was never resolved", "build the spec with phalanx.jobfile.build_spec")
        if not channel.is_remote and not channel.extract:
            return Path(channel.source)
        return self.channel_cache(channel.source, channel.extract).data


@dataclass(frozen=True)
class ChannelCachePaths:
    base: Path
    key: str

    @property
    def data(self) -> Path:
        return self.base / self.key

    @property
    def manifest(self) -> Path:
        return self.base / f"{self.key}.json"

    @property
    def lock(self) -> Path:
        return self.base / f"{self.key}.lock"

    @property
    def partial(self) -> Path:
        return self.base / f"{self.key}.partial"


@dataclass(frozen=True)
class RemoteJobPaths:
    """A job's uploaded results under ``--output URI`` (a URI or a local path)."""

    root: str

    @classmethod
    def of(cls, output_uri: str, name: str, job_id: str) -> "RemoteJobPaths":
        return cls(f"{output_uri.rstrip('/')}/{safe_name(name)}-{job_id}")

    @property
    def output(self) -> str:
        return f"{self.root}/output"

    @property
    def logs(self) -> str:
        return f"{self.root}/logs"

    @property
    def manifest(self) -> str:
        return f"{self.root}/_phalanx_artifacts.json"


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
    def stop_request(self) -> Path:
        return self.root / "stop.json"

    @property
    def attempts_log(self) -> Path:
        return self.root / "attempts.jsonl"

    @property
    def start_mode(self) -> Path:
        """How ``phalanx run`` started the job (``{"detached": true}`` for ``-d``): ``resume`` starts it so again."""
        return self.root / "start.json"

    @property
    def reserve(self) -> Path:
        """Space the supervisor holds to record the job's end when the disk fills (``core/disk.py``)."""
        return self.root / ".reserve"

    @property
    def trace(self) -> Path:
        """Timestamps of the steps of starts and restarts, with ``PHALANX_TRACE=1`` (launch/trace.py)."""
        return self.root / "trace.jsonl"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def health(self) -> Path:
        """Progress and ETA, the straggler, the anomaly, the stop clocks: the supervisor's
        ``health.json`` (``health/progress_file.py``), read by status, ps and the dashboard."""
        return self.root / "health.json"

    @property
    def state_versions(self) -> Path:
        """Versions of the state directory kept for rollbacks (``--keep-states``,
        ``storage/versions.py``): ``v<n>/`` each, and ``versions.jsonl``."""
        return self.root / "states"

    def shipped_input(self, name: str) -> Path:
        """A node's copy of input ``name`` where the backend ships inputs with the job (Ray);
        ``shipped_input("")`` is the directory holding them all."""
        return self.root / "inputs" / name

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def code_manifest(self) -> Path:
        return self.root / "code.json"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs.json"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts.json"

    @property
    def track(self) -> Path:
        """The experiment trackers' files (``--track``): per tracker its run and cursor
        (``<kind>.json``), the exporter's log and lock, ``ended.json`` once the job has ended."""
        return self.root / "track"

    def track_state(self, kind: str) -> Path:
        return self.track / f"{kind}.json"

    @property
    def track_ended(self) -> Path:
        return self.track / "ended.json"

    @property
    def track_log(self) -> Path:
        return self.track / "export.log"

    @property
    def track_lock(self) -> Path:
        return self.track / ".lock"

    def not_logs(self) -> frozenset[str]:
        """Names at the top of the job directory that are not its records: the outputs (uploaded
        on their own), the code snapshot and its manifest, the upload manifest, the kept versions
        of the state directory."""
        return frozenset(p.name for p in (self.output_dir, self.code_dir, self.code_manifest, self.artifacts,
                                          self.state_versions))

    def attempt(self, attempt: int) -> Path:
        return self.root / f"attempt_{attempt}"

    def batch_script(self, attempt: int) -> Path:
        return self.attempt(attempt) / "batch.sh"

    def batch_log(self, attempt: int) -> Path:
        return self.attempt(attempt) / "batch.log"

    def scheduler_job(self, attempt: int) -> Path:
        return self.attempt(attempt) / "scheduler.json"

    def manifests(self, attempt: int) -> Path:
        return self.attempt(attempt) / "manifests.yaml"

    def node_dir(self, attempt: int, node_rank: int | str) -> Path:
        """A node's directory; a str ``node_rank`` leaves a placeholder for whoever fills it
        in at run time (``{node_rank}`` for the agent, ``%n`` for srun)."""
        return self.attempt(attempt) / f"node_{node_rank}"

    def agent_log(self, attempt: int, node_rank: int | str) -> Path:
        return self.node_dir(attempt, node_rank) / "agent.log"

    def skypilot_workdir(self, attempt: int) -> Path:
        """What SkyPilot syncs to ``~/sky_workdir`` on every VM of an attempt: the bundle (code,
        phalanx) unpacked, and every node's launch file (``backends/skypilot``)."""
        return self.attempt(attempt) / "skypilot-workdir"

    def ssh_log(self, attempt: int, node_rank: int) -> Path:
        """The ssh client's own messages for a node's link (ssh backend)."""
        return self.node_dir(attempt, node_rank) / "ssh.log"

    def node_result(self, attempt: int, node_rank: int) -> Path:
        return self.node_dir(attempt, node_rank) / "result.json"

    def node_resources(self, attempt: int, node_rank: int) -> Path:
        return self.node_dir(attempt, node_rank) / "resources.jsonl"

    def rank_metrics(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "metrics.bin"

    def rank_metrics_jsonl(self, attempt: int, rank: int) -> Path:
        """Where older versions kept a rank's metrics (JSON lines): still read, never written."""
        return self.rank_dir(attempt, rank) / "metrics.jsonl"

    def rank_user_metrics(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "user_metrics.jsonl"

    def node_launch(self, attempt: int, node_rank: int | str) -> Path:
        return self.node_dir(attempt, node_rank) / "launch.json"

    def rank_dir(self, attempt: int, rank: int) -> Path:
        return self.attempt(attempt) / f"rank_{rank}"

    def rank_dir_template(self, attempt: int) -> str:
        """``rank_dir`` with ``{rank}`` left open, for workers that learn their rank late."""
        return str(self.attempt(attempt) / "rank_{rank}")

    def rank_log(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "output.log"

    def rank_log_index(self, attempt: int, rank: int) -> Path:
        """When the rank's log had which size (``monitor/logindex.py``: ``logs --since``)."""
        return self.rank_dir(attempt, rank) / "output.idx"

    def rank_error(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "error.json"

    def rank_proc(self, attempt: int, rank: int) -> Path:
        return self.rank_dir(attempt, rank) / "proc.json"

    def rank_exit(self, attempt: int, rank: int) -> Path:
        """The exit status the rank's bootstrap ended with (for workers torch reaps)."""
        return self.rank_dir(attempt, rank) / "exit.json"

    def rank_torch_error(self, attempt: int, rank: int) -> Path:
        """TORCHELASTIC_ERROR_FILE of a worker phalanx started itself with torchrun's variables."""
        return self.rank_dir(attempt, rank) / "torchelastic_error.json"

    def nodes(self, attempt: int) -> list[int]:
        """The node ranks that have a directory in an attempt."""
        return _numbered(self.attempt(attempt), "node_")

    def attempts(self) -> list[int]:
        return _numbered(self.root, "attempt_")

    def ranks(self, attempt: int) -> list[int]:
        return _numbered(self.attempt(attempt), "rank_")


def _numbered(base: Path, prefix: str) -> list[int]:
    """The N of every ``<prefix>N`` entry in ``base``, sorted (none when ``base`` is missing)."""
    try:
        names = os.listdir(base)
    except (FileNotFoundError, NotADirectoryError):
        return []
    cut = len(prefix)
    return sorted(int(n[cut:]) for n in names if n.startswith(prefix) and n[cut:].isdigit())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write() names no file: say which (disk full)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
