"""The SageMaker backend: one training job per attempt, one node per instance.

``phalanx run --backend sagemaker --role ARN --instance-type ml.g5.12xlarge -n 2x4 --spot train.py``.
A thin adapter to ``backends/base.py``; the work is in the modules beside it (see ``__init__``):

- ``check`` (before anything is recorded): credentials, region, the bucket and every S3 input;
- ``plan``: the CreateTrainingJob request, strictly validated, and each instance's part;
- ``start``: uploads the code bundle, the plan and changed local inputs, then CreateTrainingJob;
  if SageMaker refuses the job, the attempt's uploads are removed again;
- the node handles follow the job (``watch``): logs and results arrive through CloudWatch;
  ``signal`` is StopTrainingJob (SageMaker's own 120 s grace, so phalanx's ``--grace`` is capped
  at 110 s); the supervisor never stages inputs or syncs state here: SageMaker brings the
  channels to the instances and syncs ``/opt/ml/checkpoints`` with the state URI itself;
- ``attach``: a job whose supervisor vanished is found by the training job name recorded in
  the attempt's ``scheduler.json`` and watched again while SageMaker still runs it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ...core.paths import HomePaths, JobPaths, read_json, write_json
from ...core.spec import JobSpec
from ...errors import BackendError, PhalanxError, UsageError
from ...core.contracts import NodeResult
from ...core.plan import Plan
from ..base import Backend, Facts, NodeHandle, synthesize
from ..options import validate
from . import layout
from .options import OPTIONS, STOP_TIMEOUT
from .plan import SageMakerFacts, check_options, plan_attempt, request_of, s3_prefix


class SageMakerBackend(Backend):
    name = "sagemaker"
    options = OPTIONS
    local_slots = False  # SageMaker places each trial on its own instances
    remote_data = True  # SageMaker stages the channels and syncs the checkpoints itself
    stop_margin = float(STOP_TIMEOUT) + 240.0  # SIGKILL after 120 s, then the upload and the final status

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        from . import client, uploads

        opts = dict(spec.backend_options)
        region = client.region(opts)
        digests = tuple((c.name, uploads.local_digest(c.source, home)) for c in spec.channels if not c.is_remote)
        return plan_attempt(spec, job_id, attempt, opts, SageMakerFacts(facts.host, region=region, channel_digests=digests))

    def shares_files(self, spec: JobSpec) -> bool:
        return False  # the instances run a shipped copy of the code (the phalanx channel's bundle)

    def check(self, spec: JobSpec) -> None:
        """Everything that can be known before the job is recorded: region and credentials, the
        role and instance type, the bucket, every S3 input. Raises UsageError; creates nothing."""
        from ... import config
        from . import client

        self.plan(spec, "check", 0, HomePaths(config.home()), self.facts(spec))  # every pure check first, offline
        opts = validate(self.name, self.options, spec.backend_options)
        role = check_options(opts)
        aws = client.Aws(client.region(opts), opts.get("profile"))
        aws.check_credentials()
        prefix = s3_prefix(opts, aws.region, role)
        aws.check_bucket(layout.split_s3(prefix)[0], "--s3-prefix")
        for channel in spec.channels:
            if channel.is_remote and channel.source.startswith("s3://"):
                aws.check_bucket(layout.split_s3(channel.source)[0], f"input '{channel.name}'")
                if not aws.prefix_exists(channel.source):
                    raise UsageError(f"input '{channel.name}': nothing at {channel.source}", "check the URI, or upload the data first")

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        from ... import config
        from . import client, uploads
        from .plan import launch_data

        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = validate(self.name, self.options, spec.backend_options)
        request = request_of(plan)
        name = request["TrainingJobName"]
        aws = client.Aws(client.region(opts), opts.get("profile"))
        s3 = layout.JobS3(request["OutputDataConfig"]["S3OutputPath"].rsplit("/jobs/", 1)[0], plan.job_id)
        home = HomePaths(config.home())
        say = _say(paths, plan.attempt)
        try:
            for channel in spec.channels:
                if not channel.is_remote:
                    digest = uploads.local_digest(channel.source, home, remember=True)
                    uploads.upload_channel(aws, s3, channel.name, channel.source, digest, say)
            code = paths.code_dir if spec.snapshot else Path(spec.workdir)
            uploads.upload_code(aws, s3, plan.attempt, code, launch_data(plan, spec.sample_interval))
            arn = aws.create_training_job(request)
        except Exception as exc:
            _remove(aws, s3.code(plan.attempt))  # nothing of an attempt that did not start is left behind
            if isinstance(exc, PhalanxError):
                raise
            raise BackendError(f"could not start training job {name}: {type(exc).__name__}: {exc}",
                               "check the credentials, the bucket and the network, then `phalanx resume` the job") from None
        write_json(paths.scheduler_job(plan.attempt), {
            "scheduler": self.name, "job_id": name, "arn": arn, "region": aws.region, "submitted": time.time(),
            "s3_prefix": s3.prefix,
        })
        if plan.grace < spec.grace:
            say(f"--grace {spec.grace:g} capped to {plan.grace:g} s: SageMaker kills a stopped job's containers "
                f"{STOP_TIMEOUT} s after SIGTERM")
        return self._handles(aws, name, paths, plan, s3)

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        from . import client

        record = read_json(paths.scheduler_job(plan.attempt)) or {}
        if record.get("scheduler") != self.name or not record.get("job_id"):
            return None
        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = validate(self.name, self.options, spec.backend_options)
        aws = client.Aws(str(record.get("region") or client.region(opts)), opts.get("profile"))
        found = aws.describe(record["job_id"])
        if found is None or found.get("TrainingJobStatus") in ("Completed", "Failed", "Stopped"):
            return None
        # What the instances printed arrives again from the start of their streams.
        for rank in paths.ranks(plan.attempt):
            paths.rank_log(plan.attempt, rank).unlink(missing_ok=True)
        for node in plan.nodes:
            paths.agent_log(plan.attempt, node.node_rank).unlink(missing_ok=True)
        s3 = layout.JobS3(str(record.get("s3_prefix")), plan.job_id)
        return self._handles(aws, record["job_id"], paths, plan, s3)

    @staticmethod
    def _handles(aws: Any, name: str, paths: JobPaths, plan: Plan, s3: layout.JobS3) -> list[NodeHandle]:
        from .watch import TrainingJobWatch

        watch = TrainingJobWatch(aws, name, paths, plan.attempt, len(plan.nodes), s3)
        return [SageMakerNode(watch, node.node_rank) for node in plan.nodes]


class SageMakerNode(NodeHandle):
    """One instance of a training job, as the supervisor sees it."""

    # After the grace period, SageMaker's own SIGKILL comes at 120 s; then the upload of the
    # outputs and the final status take a while more.
    kill_margin = float(STOP_TIMEOUT) + 60.0

    def __init__(self, watch: Any, node_rank: int) -> None:
        self.watch = watch
        self.node_rank = node_rank

    def poll(self) -> NodeResult | None:
        code = self.watch.exit_code(self.node_rank)
        if code is None:
            return None
        return synthesize(self.watch.paths, self.watch.attempt, NodeResult.synthesize(
            self.node_rank, int(code), f"training job {self.watch.name}: node {self.node_rank} ended without a report"))

    def signal(self, signum: int) -> None:
        self.watch.stop(signum)

    def kill(self) -> None:
        self.watch.kill()

    def running(self) -> bool:
        return bool(self.watch.running())


def _remove(aws: Any, prefix: str) -> None:
    try:
        aws.delete_prefix(prefix)
    except Exception:  # noqa: BLE001 - the cause of the failure matters more than this clean-up
        pass


def _say(paths: JobPaths, attempt: int) -> Any:
    def say(text: str) -> None:
        log = paths.agent_log(attempt, 0)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            fh.write(f"phalanx: {text}\n")

    return say
