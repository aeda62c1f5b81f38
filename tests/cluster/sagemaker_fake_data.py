"""The fake SageMaker plane's data side: a job and its instances, each instance's /opt/ml tree,
S3 copies (channels in, checkpoints back, model and output archives) and the log pump into
CloudWatch Logs. Part of the fake plane (``sagemaker_fake.py``): our reading of the docs."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUP = "/aws/sagemaker/TrainingJobs"


@dataclass
class Instance:
    host: str
    ns: str
    root: Path
    stream: str
    proc: subprocess.Popen
    log: Path
    offset: int = 0
    spawned: float = 0.0  # time.time() when the instance's command was started (benchmarks read it)


@dataclass
class Job:
    request: dict[str, Any]
    arn: str
    created: float
    status: str = "InProgress"
    secondary: str = "Starting"
    transitions: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    started: float | None = None
    ended: float | None = None
    trained: float = 0.0  # seconds instances ran, over every start
    instances: list[Instance] = field(default_factory=list)  # of the current start
    all_instances: list[Instance] = field(default_factory=list)  # of every start (spot restarts add more)
    stop_asked: str | None = None  # the secondary status a stop ends in
    interrupted: bool = False
    first_failed: Instance | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return str(self.request["TrainingJobName"])


class PlaneData:
    """What the plane does with data; ``s3`` and ``logs`` are boto3 clients for moto."""

    s3: Any
    logs: Any

    def _prepare(self, job: Job, root: Path, host: str, hosts: list[str]) -> None:
        r = job.request
        config = root / "opt/ml/input/config"
        config.mkdir(parents=True)
        (config / "resourceconfig.json").write_text(json.dumps({
            "current_host": host, "current_instance_type": r["ResourceConfig"]["InstanceType"], "current_group_name": "homogeneousCluster",
            "hosts": hosts, "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": r["ResourceConfig"]["InstanceType"], "hosts": hosts}],
            "network_interface_name": "eth0"}))
        (config / "hyperparameters.json").write_text(json.dumps(r.get("HyperParameters", {})))
        (config / "inputdataconfig.json").write_text(json.dumps({c["ChannelName"]: {"TrainingInputMode": "File"} for c in r.get("InputDataConfig", [])}))
        for channel in r.get("InputDataConfig", []):
            self._copy_prefix(channel["DataSource"]["S3DataSource"]["S3Uri"], root / "opt/ml/input/data" / channel["ChannelName"])
        for sub in ("model", "output/data", "checkpoints"):
            (root / "opt/ml" / sub).mkdir(parents=True, exist_ok=True)
        if "CheckpointConfig" in r:
            self._copy_prefix(r["CheckpointConfig"]["S3Uri"], root / "opt/ml/checkpoints")

    # -- data --------------------------------------------------------------------------------------------

    def _copy_prefix(self, uri: str, dest: Path) -> None:
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        dest.mkdir(parents=True, exist_ok=True)
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):].lstrip("/") or obj["Key"].rsplit("/", 1)[-1]
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(bucket, obj["Key"], str(target))

    def _sync_checkpoints(self, job: Job, synced: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """/opt/ml/checkpoints of every instance -> CheckpointConfig.S3Uri (changed files only)."""
        config = job.request.get("CheckpointConfig")
        if not config:
            return synced
        bucket, _, prefix = config["S3Uri"][len("s3://"):].partition("/")
        for inst in job.instances:
            base = inst.root / "opt/ml/checkpoints"
            for path in sorted(base.rglob("*")) if base.exists() else []:
                try:
                    st = path.stat()
                except OSError:
                    continue
                if not path.is_file() or ".tmp" in path.name or path.name.startswith("."):
                    continue
                rel = path.relative_to(base).as_posix()
                if synced.get(rel) == (st.st_size, st.st_mtime_ns):
                    continue
                try:
                    self.s3.upload_file(str(path), bucket, prefix.rstrip("/") + "/" + rel if prefix else rel)
                except (OSError, FileNotFoundError):
                    continue
                synced[rel] = (st.st_size, st.st_mtime_ns)
        return synced

    def _upload_artifacts(self, job: Job) -> None:
        for archive, sub in (("model.tar.gz", "opt/ml/model"), ("output.tar.gz", "opt/ml/output/data")):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                for inst in job.instances:
                    base = inst.root / sub
                    for path in sorted(base.rglob("*")) if base.exists() else []:
                        if path.is_file():
                            tar.add(path, arcname=path.relative_to(base).as_posix())
            bucket, _, key = self._artifact(job, archive)[len("s3://"):].partition("/")
            self.s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())

    def _pump(self, job: Job) -> None:
        """What each instance printed since last time -> its CloudWatch stream, one event a line."""
        for inst in job.instances:
            try:
                with open(inst.log, "rb") as fh:
                    fh.seek(inst.offset)
                    data = fh.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            if inst.proc.poll() is not None:
                cut = len(data)
            if not cut:
                continue
            inst.offset += cut
            # CloudWatch refuses empty messages (PutLogEvents: message length >= 1), and Docker's
            # awslogs driver, which ships a real container's output, skips empty lines.
            lines = [line for line in data[:cut].decode(errors="replace").splitlines() if line]
            now = int(time.time() * 1000)
            for start in range(0, len(lines), 500):
                events = [{"timestamp": now, "message": line} for line in lines[start:start + 500]]
                if events:
                    self.logs.put_log_events(logGroupName=GROUP, logStreamName=inst.stream, logEvents=events)

    @staticmethod
    def _artifact(job: Job, archive: str) -> str:
        return f"{job.request['OutputDataConfig']['S3OutputPath'].rstrip('/')}/{job.name}/output/{archive}"
