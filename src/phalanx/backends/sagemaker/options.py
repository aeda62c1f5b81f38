"""The SageMaker backend's options, declared once as data, and the job file's ``sagemaker:`` section
(``SECTIONS``: validated by ``section_options``). What each value must be is said here (``kind``),
so ``--max-run 0`` or ``sagemaker: {spot: "yes"}`` fails before anything is planned.

Standard library only: ``phalanx run --help`` shows these without importing boto3.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ...core.optiontypes import BadValue, Choice, Custom, Int
from ...errors import UsageError
from ..options import BackendOption, BackendSection

ROLE_ARN = re.compile(r"arn:aws[a-z\-]*:iam::(\d{12}):role/?[a-zA-Z_0-9+=,.@\-_/]+")


def _role(text: str) -> str:
    if not ROLE_ARN.fullmatch(text.strip()):
        raise BadValue("an IAM role ARN", "e.g. arn:aws:iam::123456789012:role/NAME")
    return text.strip()


def _s3_prefix(text: str) -> str:
    if not text.startswith("s3://") or not text[len("s3://"):].strip("/"):
        raise BadValue("an s3:// URI", "e.g. s3://my-bucket/phalanx")
    return text


def _tag(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise BadValue("KEY=VALUE", "e.g. --tag team=ml")
    return text

# SageMaker sends SIGTERM on StopTrainingJob and SIGKILL 120 s later ("docker stop -t120",
# https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo.html). phalanx's
# grace period must end before that, with time left for the node agent to report.
STOP_TIMEOUT = 120
MAX_GRACE = 110

OPTIONS: tuple[BackendOption, ...] = (
    BackendOption("instance_type", str, "ml.m5.xlarge", "SageMaker instance type of every node, e.g. ml.g5.12xlarge."),
    BackendOption("role", str, None, "IAM role ARN the training job runs as (or `role:` in the job file's sagemaker: section).",
                  kind=Custom(expected="an IAM role ARN", parser=_role), metavar="ARN"),
    BackendOption("region", str, None, "AWS region (default: AWS_REGION, AWS_DEFAULT_REGION or the profile's)."),
    BackendOption("profile", str, None, "AWS profile of ~/.aws/config (default: AWS_PROFILE)."),
    BackendOption("s3_prefix", str, None,
                  "s3://bucket/prefix for the job's code, uploads, state and outputs (default: s3://sagemaker-REGION-ACCOUNT/phalanx).",
                  kind=Custom(expected="an s3:// URI", parser=_s3_prefix), metavar="URI"),
    BackendOption("image", str, None, "Training image URI (default: AWS's framework image for --framework, the instance and the region)."),
    BackendOption("framework_version", str, None, "Version of the default framework image (default: the newest phalanx knows)."),
    BackendOption("spot", bool, False, "Managed spot training; SageMaker restarts interrupted instances from the checkpoint."),
    BackendOption("max_run", int, 86400, "Seconds the job may train (MaxRuntimeInSeconds).",
                  kind=Int(low=1, expected="a number of seconds"), metavar="SECONDS"),
    BackendOption("max_wait", int, None, "Seconds a spot job may wait and train in all (MaxWaitTimeInSeconds; default 2x --max-run).",
                  kind=Int(low=1, expected="a number of seconds"), metavar="SECONDS"),
    BackendOption("volume_size", int, 30, "Storage volume per instance in GB (VolumeSizeInGB).",
                  kind=Int(low=1, expected="a size in GB"), metavar="GB"),
    BackendOption("subnets", str, None, "VPC subnets, comma-separated (with --security-groups)."),
    BackendOption("security_groups", str, None, "VPC security groups, comma-separated (with --subnets)."),
    # The job file's ``sagemaker: {tags: ...}``; the flag ``--tag`` is every backend's (the job's
    # labels, ``JobSpec.tags``), which SageMaker puts on the training job as well.
    BackendOption("tag", str, None, "Tags KEY=VALUE on the training job only (job file: sagemaker: {tags: ...}).",
                  multiple=True, kind=Custom(expected="KEY=VALUE", parser=_tag), cli=False, metavar="KEY=VALUE"),
    BackendOption("secrets_from", str, None, "Where the instances read the job's secrets (--secret VAR=NAME): aws, "
                  "AWS Secrets Manager, NAME a secret's name or ARN there, read at instance start by the training "
                  "job's role. Without it a job with secrets is refused (see docs/secrets.md).",
                  kind=Choice(choices=("aws",)), metavar="aws"),
    BackendOption("volume_kms_key", str, None, "KMS key for the instances' storage volumes."),
    BackendOption("output_kms_key", str, None, "KMS key for the model and output archives."),
)

# The job file's ``sagemaker:`` section: the options above by name, plus two nested spellings.
SECTION_KEYS = tuple(o.name for o in OPTIONS if o.name != "tag") + ("tags", "vpc", "kms")


def section_options(section: Any) -> dict[str, Any]:
    """The job file's ``sagemaker:`` mapping -> backend options (validated; CLI flags win later).

    ::

        sagemaker:
          role: arn:aws:iam::123456789012:role/sm
          instance_type: ml.g5.12xlarge
          volume_size: 100
          max_run: 86400
          max_wait: 172800
          vpc: {subnets: [subnet-1], security_groups: [sg-1]}
          tags: {team: ml}
          kms: {volume: KEY, output: KEY}
    """
    if not isinstance(section, Mapping):
        raise UsageError("the job file's 'sagemaker' section must be a mapping", "e.g. sagemaker: {role: arn:aws:iam::123456789012:role/sm}")
    unknown = sorted(set(map(str, section)) - set(SECTION_KEYS))
    if unknown:
        raise UsageError(f"unknown key(s) {', '.join(unknown)} in the job file's 'sagemaker' section", f"valid keys: {', '.join(SECTION_KEYS)}")
    out: dict[str, Any] = {k: v for k, v in section.items() if k not in ("tags", "vpc", "kms")}
    for key in ("max_run", "max_wait", "volume_size"):
        if key in out and (isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < 1):
            raise UsageError(f"sagemaker: {key} must be a positive whole number of {'GB' if key == 'volume_size' else 'seconds'}",
                             f"e.g. {key}: {30 if key == 'volume_size' else 86400}")
    tags = section.get("tags") or {}
    if not isinstance(tags, Mapping):
        raise UsageError("sagemaker: tags must be a mapping of key to value", "e.g. tags: {team: ml}")
    if tags:
        out["tag"] = [f"{k}={v}" for k, v in tags.items()]
    vpc = section.get("vpc") or {}
    if not isinstance(vpc, Mapping) or set(vpc) - {"subnets", "security_groups"}:
        raise UsageError("sagemaker: vpc must be a mapping with subnets and security_groups", "e.g. vpc: {subnets: [subnet-1], security_groups: [sg-1]}")
    for key in ("subnets", "security_groups"):
        if key in vpc:
            value = vpc[key]
            out[key] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    kms = section.get("kms") or {}
    if not isinstance(kms, Mapping) or set(kms) - {"volume", "output"}:
        raise UsageError("sagemaker: kms must be a mapping with volume and/or output", "e.g. kms: {volume: KEY_ID, output: KEY_ID}")
    for key in ("volume", "output"):
        if key in kms:
            out[f"{key}_kms_key"] = str(kms[key])
    return out


SECTIONS = (
    BackendSection("sagemaker", "SageMaker settings: the options above by name (role, instance_type, spot, "
                   "max_run...), plus vpc: {subnets, security_groups}, tags: {KEY: VALUE}, kms: {volume, output} "
                   "(a mapping; backend_options and flags win over it).", section_options),
)


def effective_grace(grace: float) -> float:
    """The grace period a SageMaker job can honour: at most ``MAX_GRACE`` seconds."""
    return min(float(grace), float(MAX_GRACE))
