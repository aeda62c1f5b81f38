"""The SageMaker backend: one training job per attempt, one node per instance.

``phalanx run --backend sagemaker --role ARN --instance-type ml.g5.12xlarge -n 2x4 --spot train.py``.
A thin adapter to ``backends/base.py``; the work is in the modules beside it (see ``__init__``):

- ``check`` (before anything is recorded): credentials, region, the bucket and every S3 input;
- ``facts``: the region (AWS's configuration) and the content digest of every local input;
- ``plan`` (pure): the CreateTrainingJob request, strictly validated, and each instance's part;
  ``Plan.context`` holds what ``start`` uploads and where;
- ``start``: uploads the code bundle, the plan and changed local inputs, then CreateTrainingJob;
  if SageMaker refuses the job, the attempt's uploads are removed again;
- the node handles follow the job (``watch``): logs and results arrive through CloudWatch, and
  ``collect`` writes them into the job directory;
  ``signal`` is StopTrainingJob (SageMaker's own 120 s grace, so phalanx's ``--grace`` is capped
  at 110 s); the supervisor never stages inputs or syncs state here: SageMaker brings the
  channels to the instances and syncs ``/opt/ml/checkpoints`` with the state URI itself;
- ``attach``: a job whose supervisor vanished is found by the training job name recorded in
  the attempt's ``scheduler.json`` (``contracts.SchedulerRecord``) and watched again while
  SageMaker still runs it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...core.contracts import NodeResult, SchedulerRecord, read_launch, read_scheduler, write_scheduler
from ...core.paths import HomePaths, JobPaths
from ...core.plan import Plan
from ...core.spec import JobSpec
from ...errors import BackendError, PhalanxError, UsageError
from ...launch.host import HostFacts
from ..base import Backend, Facts, NodeHandle
from ..options import validate
from . import layout
from .options import OPTIONS, STOP_TIMEOUT
from .plan import SageMakerFacts, check_options, plan_attempt, request_of, s3_prefix


class SageMakerBackend(Backend):
    name = "sagemaker"
    leaves_out = "new"  # see Backend.leaves_out
    options = OPTIONS
    local_slots = False  # SageMaker places each trial on its own instances
    remote_data = True  # SageMaker stages the channels and syncs the checkpoints itself
    stop_margin = float(STOP_TIMEOUT) + 240.0  # SIGKILL after 120 s, then the upload and the final status

    def _facts(self, spec: JobSpec, host: HostFacts) -> SageMakerFacts:
        """The region (``--region``, else AWS's configuration: no network) and each local input's
        content digest (files already seen, by path, size and mtime, are not read again)."""
        from . import client, uploads

        cache = HomePaths(host.home).sagemaker_digests if host.home else None
        digests = tuple((c.name, uploads.local_digest(c.source, cache, remember=True))
                        for c in spec.channels if not c.is_remote)
        return SageMakerFacts(host, region=client.region(dict(spec.backend_options)), channel_digests=digests)

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        assert isinstance(facts, SageMakerFacts), "the sagemaker backend plans from SageMakerBackend.facts"
        opts = dict(spec.backend_options)
        plan = plan_attempt(spec, job_id, attempt, opts, facts)
        digests = dict(facts.channel_digests)
        context = {
            "region": facts.region, "profile": opts.get("profile"), "grace": spec.grace,
            # The code bundle's source: the job's snapshot, a sweep's shared one, or (--no-snapshot) the workdir.
            "code": spec.code_dir or (str(paths.code_dir) if spec.snapshot else spec.workdir),
            # Local inputs, uploaded to the prefix of their content (the digest the request names).
            "inputs": [[c.name, c.source, digests[c.name]] for c in spec.channels if not c.is_remote],
        }
        return replace(plan, context=context)

    def shares_files(self, spec: JobSpec) -> bool:
        return False  # the instances run a shipped copy of the code (the phalanx channel's bundle)

    def check(self, spec: JobSpec) -> None:
        """Everything that can be known before the job is recorded: region and credentials, the
        role and instance type, the bucket, every S3 input. Raises UsageError; creates nothing."""
        from . import client

        facts = self.facts(spec)
        home = HomePaths(facts.host.home or Path(".phalanx"))  # the plan only names paths under it
        self.plan(spec, "check", 0, home, facts)  # every pure check first, offline
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

    def check_secrets(self, spec: JobSpec, online: bool = True) -> None:
        """``--secrets-from aws``: every secret exists in AWS Secrets Manager (asked only online:
        a dry run plans offline). The local store is not asked: the names are AWS's."""
        opts = validate(self.name, self.options, spec.backend_options)
        if not spec.secrets or opts.get("secrets_from") != "aws":
            return  # none, or the plan refuses them (check_secrets in plan.py)
        if online:
            from . import client

            aws = client.Aws(client.region(opts), opts.get("profile"))
            for var, name in sorted(spec.secrets.items()):
                aws.check_secret(name, var)

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        from . import client, uploads
        from .plan import launch_data

        context = plan.context
        request = request_of(plan)
        name = request["TrainingJobName"]
        aws = client.Aws(str(context["region"]), context.get("profile"))
        s3 = layout.JobS3(request["OutputDataConfig"]["S3OutputPath"].rsplit("/jobs/", 1)[0], plan.job_id)
        say = _say(paths, plan.attempt)
        launch = read_launch(paths.node_launch(plan.attempt, plan.nodes[0].node_rank))
        try:
            for input_name, source, digest in context["inputs"]:
                uploads.upload_channel(aws, s3, input_name, source, digest, say)
            uploads.upload_code(aws, s3, plan.attempt, Path(context["code"]),
                                launch_data(plan, launch.sample_interval if launch else 5.0))
            arn = aws.create_training_job(request)
        except Exception as exc:
            _remove(aws, s3.code(plan.attempt))  # nothing of an attempt that did not start is left behind
            if isinstance(exc, PhalanxError):
                raise
            raise BackendError(f"could not start training job {name}: {type(exc).__name__}: {exc}",
                               "check the credentials, the bucket and the network, then `phalanx resume` the job") from None
        record = SchedulerRecord(self.name, name, time.time(), details={"arn": arn, "region": aws.region, "s3_prefix": s3.prefix})
        write_scheduler(paths.scheduler_job(plan.attempt), record)
        asked = float(context.get("grace", plan.grace))
        if plan.grace < asked:
            say(f"--grace {asked:g} capped to {plan.grace:g} s: SageMaker kills a stopped job's containers "
                f"{STOP_TIMEOUT} s after SIGTERM")
        return self._handles(aws, record, paths, plan, s3)

    def _attach(self, plan: Plan, paths: JobPaths) -> list[NodeHandle] | None:
        from . import client

        record = read_scheduler(paths.scheduler_job(plan.attempt))
        if record is None or record.scheduler != self.name or not record.job_id:
            return None
        region = record.details.get("region") or plan.context.get("region")
        if not region:
            return None  # nowhere to ask
        aws = client.Aws(str(region), plan.context.get("profile"))
        found = aws.describe(record.job_id)
        if found is None or found.get("TrainingJobStatus") in ("Completed", "Failed", "Stopped"):
            return None
        s3 = layout.JobS3(str(record.details.get("s3_prefix")), plan.job_id)
        return self._handles(aws, record, paths, plan, s3, again=True)

    @staticmethod
    def _handles(aws: Any, record: SchedulerRecord, paths: JobPaths, plan: Plan, s3: layout.JobS3,
                 again: bool = False) -> list[NodeHandle]:
        from .follow import TrainingJobWatch

        # ``again``: the logs arrive again from the start of the instances' streams (follow.py)
        watch = TrainingJobWatch(aws, record.job_id, paths, plan.attempt, len(plan.nodes), s3, again=again)
        handles: list[NodeHandle] = []
        for node in plan.nodes:
            handle = SageMakerNode(watch, node.node_rank)
            handle.where, handle.submitted = f"SageMaker training job {record.job_id}", record.submitted
            handles.append(handle)
        return handles


class SageMakerNode(NodeHandle):
    """One instance of a training job, as the supervisor sees it."""

    # After the grace period, SageMaker's own SIGKILL comes at 120 s; then the upload of the
    # outputs and the final status take a while more.
    kill_margin = float(STOP_TIMEOUT) + 60.0

    def __init__(self, watch: Any, node_rank: int) -> None:
        self.watch = watch
        self.node_rank = node_rank

    def poll(self) -> NodeResult | None:
        return self.watch.result(self.node_rank)  # type: ignore[no-any-return]

    def collect(self, final: bool = False) -> None:
        self.watch.collect(final)

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
