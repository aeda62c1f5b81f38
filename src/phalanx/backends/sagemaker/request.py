"""The CreateTrainingJob request of one attempt. Pure: what ``--dry-run`` prints, golden-tested.

Field shapes follow the API reference (API_CreateTrainingJob) and botocore's service model,
which ``schema.check`` enforces strictly on every request built here.

- No image is built: the code and phalanx travel in the ``phalanx`` channel and the container's
  command unpacks them (``layout.COMMAND``); the image is AWS's framework image or ``--image``.
- ``CheckpointConfig`` is the job's state: ``/opt/ml/checkpoints`` (PHALANX_STATE_DIR) synced
  with the state URI, so a spot restart or a phalanx retry resumes from the last checkpoint.
- phalanx's ``--metric`` regexes become the job's MetricDefinitions (the console graphs them).
- SageMaker's own RetryStrategy is left unset: retries are phalanx's (``--max-retries``), one
  training job per attempt; spot interruptions are restarted by SageMaker inside the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.spec import JobSpec
from ...errors import UsageError
from . import layout

MAX_WAIT_FACTOR = 2  # --spot without --max-wait: wait (and train) at most twice --max-run


@dataclass(frozen=True)
class Request:
    """What one attempt's request is made of, besides the spec: decided by the adapter."""

    job_id: str
    attempt: int
    region: str
    role: str
    image: str
    s3: layout.JobS3
    checkpoint_uri: str
    channels: tuple[tuple[str, str], ...]  # (name, s3 uri) of each user channel, in spec order


def stopping(opts: dict[str, Any]) -> dict[str, int]:
    """StoppingCondition; raises UsageError for a spot job without a sensible wait."""
    max_run = int(opts["max_run"])
    if max_run < 1:
        raise UsageError(f"--max-run {max_run} is not a positive number of seconds", "e.g. --max-run 86400")
    condition = {"MaxRuntimeInSeconds": max_run}
    if opts.get("max_wait") is not None and not opts["spot"]:
        raise UsageError("--max-wait applies to spot training only", "add --spot, or drop --max-wait")
    if opts["spot"]:
        wait = int(opts["max_wait"]) if opts.get("max_wait") is not None else MAX_WAIT_FACTOR * max_run
        if wait < max_run:
            raise UsageError(f"--max-wait {wait} is shorter than --max-run {max_run}",
                             "a spot job's wait includes its run time: give --max-wait of at least --max-run")
        condition["MaxWaitTimeInSeconds"] = wait
    return condition


def tags(spec: JobSpec, job_id: str, attempt: int, given: list[str] | None) -> list[dict[str, str]]:
    """phalanx's own tags, then ``given`` (KEY=VALUE), one per key: a later one wins (SageMaker
    refuses a key given twice)."""
    out = {"phalanx:job": job_id, "phalanx:attempt": str(attempt), "phalanx:name": spec.name[:256]}
    for item in given or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"invalid --tag '{item}'", "use --tag KEY=VALUE")
        out[key] = value
    return [{"Key": k, "Value": v} for k, v in out.items()]


def _s3_channel(name: str, uri: str) -> dict[str, Any]:
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}},
        "InputMode": "File",
    }


def training_request(spec: JobSpec, opts: dict[str, Any], req: Request) -> dict[str, Any]:
    """The CreateTrainingJob request (a dict ready for boto3's ``create_training_job(**request)``)."""
    algorithm: dict[str, Any] = {
        "TrainingImage": req.image,
        "TrainingInputMode": "File",
        "ContainerEntrypoint": list(layout.ENTRYPOINT),
        "ContainerArguments": [layout.COMMAND],
    }
    if spec.metrics:
        algorithm["MetricDefinitions"] = [{"Name": m.name, "Regex": m.regex} for m in spec.metrics]
        algorithm["EnableSageMakerMetricsTimeSeries"] = True
    output: dict[str, Any] = {"S3OutputPath": req.s3.output}
    if opts.get("output_kms_key"):
        output["KmsKeyId"] = opts["output_kms_key"]
    resources: dict[str, Any] = {
        "InstanceType": opts["instance_type"],
        "InstanceCount": spec.resources.nnodes,
        "VolumeSizeInGB": int(opts["volume_size"]),
    }
    if opts.get("volume_kms_key"):
        resources["VolumeKmsKeyId"] = opts["volume_kms_key"]
    request: dict[str, Any] = {
        "TrainingJobName": layout.training_job_name(req.job_id, req.attempt),
        "RoleArn": req.role,
        "AlgorithmSpecification": algorithm,
        "InputDataConfig": [_s3_channel(layout.CHANNEL, req.s3.code(req.attempt))]
        + [_s3_channel(name, uri) for name, uri in req.channels],
        "OutputDataConfig": output,
        "ResourceConfig": resources,
        "StoppingCondition": stopping(opts),
        "CheckpointConfig": {"S3Uri": req.checkpoint_uri, "LocalPath": layout.CHECKPOINTS},
        "Environment": {"PHALANX_JOB_ID": req.job_id, "PHALANX_ATTEMPT": str(req.attempt)},
        # the section's tags (the training job's only), then the job's labels (--tag), which win
        "Tags": tags(spec, req.job_id, req.attempt, [*(opts.get("tag") or []), *(f"{k}={v}" for k, v in spec.tags.items())]),
    }
    if opts["spot"]:
        request["EnableManagedSpotTraining"] = True
    subnets = _split(opts.get("subnets"))
    groups = _split(opts.get("security_groups"))
    if bool(subnets) != bool(groups):
        raise UsageError("a VPC needs both --subnets and --security-groups", "give both, or neither")
    if subnets:
        request["VpcConfig"] = {"Subnets": subnets, "SecurityGroupIds": groups}
    return request


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]
