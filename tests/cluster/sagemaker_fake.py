"""A small fake SageMaker control plane: OUR READING OF THE DOCUMENTATION, not SageMaker.

No SageMaker service can run here, so this stands in for the few operations phalanx uses,
speaking the real wire protocol (AWS JSON 1.1: ``POST /`` with ``X-Amz-Target:
SageMaker.CreateTrainingJob`` ...), so phalanx's real boto3 client talks to it through
``AWS_ENDPOINT_URL_SAGEMAKER``. What it does, and where each behaviour comes from:

- CreateTrainingJob / DescribeTrainingJob / StopTrainingJob / ListTrainingJobs; every request is
  checked with the strict service-model validator and names are unique (``ResourceInUse``);
  an unknown name is ``ValidationException: Requested resource not found``;
- status and secondary status follow API_DescribeTrainingJob and the "Managed Spot Training
  Lifecycle" page: InProgress (Starting, Downloading, Training, Uploading) -> Completed;
  Stopping -> Stopped (Stopped, MaxRuntimeExceeded, MaxWaitTimeExceeded); Failed with
  FailureReason = the first 1024 characters of ``/opt/ml/output/failure``; a spot interruption
  (``interrupt``, a test's hook) is Interrupted, then Starting, Downloading, Training again;
- it *runs* each instance for real: the container's command (ContainerEntrypoint +
  ContainerArguments) as processes in a network namespace of its own, hostname ``algo-<n>``,
  ``algo-1..N`` resolvable, a private ``/opt/ml`` tree (``PHALANX_SM_ROOT``) with
  ``resourceconfig.json``, the channels copied from (moto) S3, the checkpoints restored from
  CheckpointConfig.S3Uri and synced back while it runs; stdout goes to (moto) CloudWatch Logs,
  group ``/aws/sagemaker/TrainingJobs``, one stream per instance start ``<job>/algo-<n>-<epoch>``;
- one instance exiting non-zero fails the job (the others get SIGTERM); all exiting 0 completes
  it; /opt/ml/model and /opt/ml/output/data of every instance are merged into model.tar.gz and
  output.tar.gz under ``S3OutputPath/<job>/output/``;
- StopTrainingJob is SIGTERM, then SIGKILL after ``stop_timeout`` (120 s on SageMaker,
  "docker stop -t120"; shorter in tests).

What it is not: no image is pulled (the instance runs this machine's Python: the test puts
its venv first on PATH), no IAM, no billing (BillableTimeInSeconds is the training wall time),
no warm pools, no Pipe/FastFile modes, no service-side RetryStrategy.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3

from phalanx.backends.sagemaker import schema
from tests.cluster import netns
from tests.cluster.sagemaker_fake_data import GROUP, Instance, Job, PlaneData

class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FakeSageMaker(PlaneData):
    """Start with ``FakeSageMaker(...)``; ``url`` is its endpoint; ``close()`` stops everything."""

    def __init__(self, work: Path, network: netns.Network, aws_endpoint: str, path_dirs: list[str],
                 stop_timeout: float = 15.0, step: float = 0.3, region: str = "us-east-1") -> None:
        self.work = work
        self.network = network
        self.free = list(zip(network.node_namespaces, network.node_addrs))
        self.aws_endpoint = aws_endpoint
        self.path_dirs = path_dirs
        self.stop_timeout = stop_timeout
        self.step = step
        self.region = region
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        kwargs = dict(endpoint_url=aws_endpoint, region_name=region, aws_access_key_id="test", aws_secret_access_key="test")
        self.s3 = boto3.client("s3", **kwargs)
        self.logs = boto3.client("logs", **kwargs)
        try:
            self.logs.create_log_group(logGroupName=GROUP)
        except self.logs.exceptions.ResourceAlreadyExistsException:
            pass
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                try:
                    if not target.startswith("SageMaker."):
                        raise ApiError("UnknownOperationException", f"unknown target {target}")
                    answer = plane.call(target[len("SageMaker."):], json.loads(body or b"{}"))
                    status, payload = 200, answer
                except ApiError as exc:
                    status, payload = 400, {"__type": exc.code, "message": exc.message}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    # -- the API ------------------------------------------------------------------------------------

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        handler = {"CreateTrainingJob": self.create, "DescribeTrainingJob": self.describe,
                   "StopTrainingJob": self.stop, "ListTrainingJobs": self.list}.get(operation)
        if handler is None:
            raise ApiError("UnknownOperationException", f"the fake plane does not implement {operation}")
        try:
            schema.check(operation, params)
        except schema.Invalid as exc:
            raise ApiError("ValidationException", str(exc)) from None
        return handler(params)

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request["TrainingJobName"]
        with self.lock:
            if name in self.jobs:
                raise ApiError("ResourceInUse", f"Training job names must be unique within an AWS account and region, "
                                                f"and a training job with this name already exists ({self._arn(name)})")
            job = Job(request, self._arn(name), time.time())
            self._move(job, "InProgress", "Starting", "Launching requested ML instances")
            self.jobs[name] = job
        threading.Thread(target=self._life, args=(job,), daemon=True, name=f"fake-sm-{name}").start()
        return {"TrainingJobArn": job.arn}

    def describe(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self._job(params["TrainingJobName"])
        r = job.request
        with job.lock:
            out: dict[str, Any] = {
                "TrainingJobName": job.name, "TrainingJobArn": job.arn, "TrainingJobStatus": job.status,
                "SecondaryStatus": job.secondary, "SecondaryStatusTransitions": [dict(t) for t in job.transitions],
                "ModelArtifacts": {"S3ModelArtifacts": self._artifact(job, "model.tar.gz")},
                "StoppingCondition": r["StoppingCondition"], "CreationTime": job.created, "LastModifiedTime": time.time(),
                "AlgorithmSpecification": r["AlgorithmSpecification"], "RoleArn": r["RoleArn"],
                "OutputDataConfig": r["OutputDataConfig"],
                "ResourceConfig": r["ResourceConfig"], "EnableManagedSpotTraining": bool(r.get("EnableManagedSpotTraining")),
            }
            if job.trained:  # present once instances have run (the shape's minimum is 1)
                out["TrainingTimeInSeconds"] = out["BillableTimeInSeconds"] = max(1, math.ceil(job.trained))
            for key in ("InputDataConfig", "CheckpointConfig", "Environment", "VpcConfig"):
                if key in r:
                    out[key] = r[key]
            if job.started:
                out["TrainingStartTime"] = job.started
            if job.ended:
                out["TrainingEndTime"] = job.ended
            if job.failure:
                out["FailureReason"] = job.failure
        schema.check("DescribeTrainingJob", out, output=True)  # our answer keeps to the real shape too
        return out

    def stop(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self._job(params["TrainingJobName"])
        with job.lock:
            if job.status != "InProgress":
                raise ApiError("ValidationException", f"The training job {job.name} is not in InProgress status")
            job.stop_asked = "Stopped"
            self._move(job, "Stopping", "Stopping", "Stopping the training job")
        return {}

    def list(self, params: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            jobs = sorted(self.jobs.values(), key=lambda j: j.created, reverse=True)
        jobs = [j for j in jobs if params.get("NameContains", "") in j.name
                and params.get("StatusEquals", j.status) == j.status]
        start = int(params.get("NextToken") or 0)
        page = jobs[start:start + int(params.get("MaxResults") or 10)]
        out: dict[str, Any] = {"TrainingJobSummaries": [
            {"TrainingJobName": j.name, "TrainingJobArn": j.arn, "CreationTime": j.created, "TrainingJobStatus": j.status,
             "SecondaryStatus": j.secondary, "LastModifiedTime": time.time(), **({"TrainingEndTime": j.ended} if j.ended else {})}
            for j in page]}
        if start + len(page) < len(jobs):
            out["NextToken"] = str(start + len(page))
        return out

    # -- a test's hook: what AWS does when it takes spot capacity back ---------------------------------

    def interrupt(self, name: str) -> None:
        job = self._job(name)
        with job.lock:
            job.interrupted = True
        for inst in list(job.instances):
            _kill(inst.proc, signal.SIGKILL)

    def history(self, name: str) -> list[Instance]:
        """Every instance a job has started so far (spot restarts add more)."""
        return list(self._job(name).all_instances)

    # -- a job's life -----------------------------------------------------------------------------------

    def _life(self, job: Job) -> None:
        try:
            while True:
                outcome = self._run_once(job)
                if outcome != "interrupted":
                    break
            self._finish(job, outcome)
        except Exception as exc:  # noqa: BLE001 - a fake that breaks must say so in the job
            with job.lock:
                job.failure = f"InternalServerError: the fake plane failed: {type(exc).__name__}: {exc}"
                self._move(job, "Failed", "Failed", job.failure)
                job.ended = time.time()
        finally:
            self._release(job)

    def _run_once(self, job: Job) -> str:
        count = job.request["ResourceConfig"]["InstanceCount"]
        slots = self._claim(job, count)
        if slots is None:
            return "stopped"
        time.sleep(self.step)
        if self._stopping(job):
            return "stopped"
        with job.lock:
            self._move(job, "InProgress", "Downloading", "Downloading input data")
        epoch = int(time.time())
        hosts = [f"algo-{i + 1}" for i in range(count)]
        names = {h: addr for h, (_, addr) in zip(hosts, slots)}
        roots = []
        for i, (host, (ns, _addr)) in enumerate(zip(hosts, slots)):
            root = self.work / job.name / f"{host}-{epoch}-{len(job.transitions)}"
            self._prepare(job, root, host, hosts)
            netns.set_hosts(self.network, ns, names)
            roots.append((host, ns, root))
        with job.lock:
            if job.stop_asked:
                return "stopped"
            self._move(job, "InProgress", "Training", "Training image download completed. Training in progress.")
            job.started = job.started or time.time()
            for host, ns, root in roots:
                job.instances.append(self._spawn(job, host, ns, root, epoch))
            job.all_instances.extend(job.instances)
        return self._watch(job)

    def _claim(self, job: Job, count: int) -> list[tuple[str, str]] | None:
        while True:
            with self.lock:
                if len(self.free) >= count:
                    taken, self.free = self.free[:count], self.free[count:]
                    job_slots = taken
                    break
            if self._stopping(job) or self.closed.wait(0.2):
                return None
        setattr(job, "_slots", job_slots)
        return job_slots

    def _release(self, job: Job) -> None:
        slots = getattr(job, "_slots", None)
        if slots:
            with self.lock:
                self.free.extend(slots)
            setattr(job, "_slots", None)

    def _spawn(self, job: Job, host: str, ns: str, root: Path, epoch: int) -> Instance:
        r = job.request
        algo = r["AlgorithmSpecification"]
        argv = [*algo.get("ContainerEntrypoint", []), *algo.get("ContainerArguments", [])]
        env = {"PATH": os.pathsep.join([*self.path_dirs, "/usr/local/bin", "/usr/bin", "/bin"]), "HOME": str(root),
               "LANG": "C.UTF-8", "PHALANX_SM_ROOT": str(root), "TRAINING_JOB_NAME": job.name, "TRAINING_JOB_ARN": job.arn,
               **r.get("Environment", {})}
        log = root / "stdout.log"
        spawned = time.time()
        proc = netns.spawn(ns, argv, env, hostname=host, cwd=str(root), log=log)
        stream = f"{job.name}/{host}-{epoch}"
        self.logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
        return Instance(host, ns, root, stream, proc, log, spawned=spawned)

    def _watch(self, job: Job) -> str:
        """Until the instances end: logs, checkpoints, limits, stops, failures."""
        begun = time.monotonic()
        synced: dict[str, tuple[int, int]] = {}
        limits = job.request["StoppingCondition"]
        while True:
            self._pump(job)
            synced = self._sync_checkpoints(job, synced)
            codes = [i.proc.poll() for i in job.instances]
            with job.lock:
                if job.interrupted:
                    return self._interrupted(job, begun)
            if all(c is not None for c in codes):
                self._account(job, begun)
                return "ended"
            failed = [i for i, c in zip(job.instances, codes) if c not in (None, 0)]
            if failed and not job.stop_asked:
                job.first_failed = failed[0]  # the cause: the others are stopped because of it
                self._stop_instances(job)
                self._account(job, begun)
                return "ended"
            elapsed = time.monotonic() - begun
            if not job.stop_asked and elapsed > limits["MaxRuntimeInSeconds"]:
                with job.lock:
                    job.stop_asked = "MaxRuntimeExceeded"
                    self._move(job, "Stopping", "Stopping", "Stopping: the job ran past MaxRuntimeInSeconds")
            if not job.stop_asked and "MaxWaitTimeInSeconds" in limits and time.time() - job.created > limits["MaxWaitTimeInSeconds"]:
                with job.lock:
                    job.stop_asked = "MaxWaitTimeExceeded"
                    self._move(job, "Stopping", "Stopping", "Stopping: the job waited and ran past MaxWaitTimeInSeconds")
            if job.stop_asked:
                self._stop_instances(job)
                self._account(job, begun)
                return "stopped"
            time.sleep(0.2)

    def _interrupted(self, job: Job, begun: float) -> str:
        for inst in job.instances:
            _kill(inst.proc, signal.SIGKILL)
        self._pump(job)
        job.trained += time.monotonic() - begun
        job.instances = []
        job.interrupted = False
        self._move(job, "InProgress", "Interrupted", "Insufficient capacity: the spot instances were taken back")
        self._release(job)
        return "interrupted"

    def _account(self, job: Job, begun: float) -> None:
        with job.lock:
            job.trained += time.monotonic() - begun

    def _stop_instances(self, job: Job) -> None:
        for inst in job.instances:
            _kill(inst.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        while time.monotonic() < deadline and any(i.proc.poll() is None for i in job.instances):
            self._pump(job)
            time.sleep(0.1)
        for inst in job.instances:
            _kill(inst.proc, signal.SIGKILL)
            inst.proc.wait()
        self._pump(job)

    def _stopping(self, job: Job) -> bool:
        with job.lock:
            return job.stop_asked is not None

    def _finish(self, job: Job, outcome: str) -> None:
        codes = [i.proc.returncode for i in job.instances]
        self._pump(job)
        if job.instances:
            self._sync_checkpoints(job, {})
        with job.lock:
            if job.stop_asked:
                stopped = job.stop_asked
            elif any(codes):
                bad = job.first_failed or next(i for i, c in zip(job.instances, codes) if c)
                failure = bad.root / "opt/ml/output/failure"
                code = bad.proc.returncode
                job.failure = (failure.read_text()[:1024] if failure.exists() else
                               f"AlgorithmError: the container of {bad.host} exited with code {code}")
                stopped = None
            else:
                stopped = None
                self._move(job, "InProgress", "Uploading", "Uploading generated training model")
        self._upload_artifacts(job)
        with job.lock:
            job.ended = time.time()
            if stopped:
                self._move(job, "Stopped", stopped, f"Training job ended: {stopped}")
            elif job.failure:
                self._move(job, "Failed", "Failed", f"Training job failed. Reason: {job.failure[:200]}")
            else:
                self._move(job, "Completed", "Completed", "Training job completed")

    # -- helpers -----------------------------------------------------------------------------------------

    def _move(self, job: Job, status: str, secondary: str, message: str) -> None:
        now = time.time()
        if job.transitions and "EndTime" not in job.transitions[-1]:
            job.transitions[-1]["EndTime"] = now
        job.status, job.secondary = status, secondary
        job.transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": message})

    def _job(self, name: str) -> Job:
        with self.lock:
            job = self.jobs.get(name)
        if job is None:
            raise ApiError("ValidationException", "Requested resource not found.")
        return job

    def _arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:123456789012:training-job/{name.lower()}"

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()
        for job in list(self.jobs.values()):
            for inst in job.instances:
                _kill(inst.proc, signal.SIGKILL)


def _kill(proc: subprocess.Popen, sig: int) -> None:
    """SIGTERM to the container's main process, as ``docker stop`` does; SIGKILL to all of it."""
    try:
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
