"""One attempt of a job on SageMaker as a phalanx Plan: the request plus each instance's part. Pure.

Every instance runs the same container command; the in-container entry (``entry``) reads which
host it is from ``resourceconfig.json`` and runs that node's part of the plan (``launch.json`` in
the phalanx channel). Node i is ``algo-<i+1>``: SageMaker names the hosts, so every address is
known at plan time and node 0 (``algo-1``) hosts the rendezvous.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...core.env import Topology
from ...core.paths import JobPaths
from ...core.spec import Framework, JobSpec, in_snapshot
from ...errors import UsageError
from ...core.plan import NodePlan, Plan
from ...launch.nodes import RESTART_SAFE_ENV, build_nodes
from ..base import Facts
from . import images, layout, schema
from .options import MAX_GRACE, ROLE_ARN, effective_grace
from .request import Request, training_request

# Filled in on the instance at start (entry.py), unless the job sets them itself.
RUNTIME_ENV = ("SM_NUM_GPUS", "SM_NUM_CPUS")


@dataclass(frozen=True)
class SageMakerFacts(Facts):
    """What the plan needs from outside, looked up once per submission (``SageMakerBackend._facts``):
    the region, and the content digest of every local input (its S3 prefix)."""

    region: str = ""
    channel_digests: tuple[tuple[str, str], ...] = ()  # (name, content digest) of each local input


def check_options(opts: dict[str, Any]) -> str:
    """The role ARN; raises UsageError for a missing or malformed role or an unknown instance type."""
    role = opts.get("role")
    if not role:
        raise UsageError("the sagemaker backend needs an IAM role for the training job",
                         "give --role arn:aws:iam::ACCOUNT:role/NAME, or role: in the job file's sagemaker: section")
    if not ROLE_ARN.fullmatch(role):
        raise UsageError(f"--role '{role}' is not an IAM role ARN", "give it as arn:aws:iam::123456789012:role/NAME")
    offered = schema.enum("ResourceConfig.InstanceType")
    if opts["instance_type"] not in offered:
        close = difflib.get_close_matches(opts["instance_type"], offered, n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else "see the instance types SageMaker offers for training"
        raise UsageError(f"SageMaker offers no instance type '{opts['instance_type']}'", hint)
    return str(role)


def s3_prefix(opts: dict[str, Any], region: str, role: str) -> str:
    """``--s3-prefix``, or the SageMaker SDK's default bucket ``sagemaker-<region>-<account>``
    (the account is the role's) with prefix ``phalanx``."""
    given = opts.get("s3_prefix")
    if given:
        if not given.startswith("s3://") or not given[len("s3://"):].strip("/"):
            raise UsageError(f"--s3-prefix '{given}' is not an s3:// URI", "e.g. --s3-prefix s3://my-bucket/phalanx")
        return str(given).rstrip("/")
    match = ROLE_ARN.fullmatch(role)
    assert match is not None
    return f"s3://sagemaker-{region}-{match.group(1)}/phalanx"


def channel_uris(spec: JobSpec, s3: layout.JobS3, digests: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """(name, S3 URI) per input: s3:// sources as they are, local ones at their content's prefix."""
    out = []
    for channel in spec.channels:
        if channel.name == layout.CHANNEL:
            raise UsageError(f"the input name '{layout.CHANNEL}' is phalanx's own on SageMaker", "give the input another name")
        if channel.extract:
            raise UsageError(f"input '{channel.name}': #extract is not supported on SageMaker", "upload the unpacked data, or unpack it in the script")
        if channel.is_remote:
            if not channel.source.startswith("s3://"):
                raise UsageError(f"input '{channel.name}': SageMaker reads input channels from S3, not {channel.source.split('://')[0]}://",
                                 "copy the data to S3 and give its s3:// URI")
            out.append((channel.name, channel.source))  # an S3 prefix, as SageMaker reads it
        else:
            out.append((channel.name, s3.channel(digests[channel.name])))
    return tuple(out)


def checkpoint_uri(spec: JobSpec, s3: layout.JobS3) -> str:
    if spec.state_uri is None:
        return s3.state(spec.name)
    if not spec.state_uri.startswith("s3://"):
        raise UsageError(f"--state '{spec.state_uri}': SageMaker keeps the state directory in S3", "give --state s3://bucket/prefix")
    return spec.state_uri.rstrip("/") + "/"


def container_nodes(spec: JobSpec, job_id: str, attempt: int, opts: dict[str, Any], region: str = "") -> tuple[NodePlan, ...]:
    """Each instance's part, with the container's paths and hosts ``algo-1..N``."""
    nnodes = spec.resources.nnodes
    hosts = tuple(f"algo-{i + 1}" for i in range(nnodes))
    # The bundle always carries the code (the snapshot, or the working directory itself).
    spec = in_snapshot(spec.with_(python="python3"), layout.CODE, shipped=True)
    nworkers = nnodes * spec.procs_per_node_started
    topo = Topology(
        job_id=job_id, attempt=attempt, node_addrs=hosts, master_port=layout.RDZV_PORT,
        worker_ports=tuple(layout.RDZV_PORT + 1 + i for i in range(nworkers)) if spec.framework is Framework.TF else (),
        state_dir=layout.CHECKPOINTS, output_dir=layout.MODEL, job_dir=layout.JOB_DIR,
        channels=tuple((c.name, layout.channel_dir(c.name)) for c in spec.channels),
    )
    nodes = build_nodes(spec, topo, JobPaths(Path(layout.JOB_DIR)), hosts, hosts, dict(RESTART_SAFE_ENV))
    extra = {
        **({SECRETS_FROM_ENV: "aws", SECRETS_REGION_ENV: region} if spec.secrets else {}),
        "SM_OUTPUT_DATA_DIR": layout.OUTPUT_DATA, "SM_INPUT_DIR": f"{layout.ML}/input",
        "SM_INPUT_CONFIG_DIR": f"{layout.ML}/input/config", "SM_OUTPUT_DIR": f"{layout.ML}/output",
        "SM_CURRENT_INSTANCE_TYPE": opts["instance_type"],
    }
    out = []
    for node in nodes:
        env = {k: v for k, v in node.env.items() if k not in RUNTIME_ENV or k in spec.env}
        env.update({k: v for k, v in extra.items() if k not in spec.env})
        out.append(replace(node, env=env))
    return tuple(out)


# On each instance (``entry.py``): where the node's secrets are read from, and the region.
SECRETS_FROM_ENV = "PHALANX_SECRETS_FROM"
SECRETS_REGION_ENV = "PHALANX_SECRETS_REGION"


def check_secrets(spec: JobSpec, opts: dict[str, Any]) -> None:
    """A job with secrets needs ``--secrets-from aws``: the values never pass through phalanx or
    the CreateTrainingJob request, whose Environment SageMaker shows in DescribeTrainingJob."""
    if not spec.secrets:
        return
    if opts.get("secrets_from") != "aws":
        raise UsageError(
            f"the sagemaker backend does not carry secret values ({', '.join(sorted(spec.secrets))}): SageMaker keeps a "
            "training job's Environment in its description (DescribeTrainingJob, the console) for anyone with read access",
            "keep each value in AWS Secrets Manager and add --secrets-from aws: every instance reads --secret VAR=NAME "
            "(NAME a secret's name or ARN there) at start, with the training job's role")


def plan_attempt(spec: JobSpec, job_id: str, attempt: int, opts: dict[str, Any], facts: SageMakerFacts) -> Plan:
    """The Plan of one attempt; ``submission`` is the validated CreateTrainingJob request (JSON)."""
    check_secrets(spec, opts)
    role = check_options(opts)
    s3 = layout.JobS3(s3_prefix(opts, facts.region, role), job_id)
    image = opts.get("image") or images.default_image(spec.framework.value, opts.get("framework_version"),
                                                       opts["instance_type"], facts.region)
    req = Request(job_id=job_id, attempt=attempt, region=facts.region, role=role, image=image, s3=s3,
                  checkpoint_uri=checkpoint_uri(spec, s3), channels=channel_uris(spec, s3, dict(facts.channel_digests)))
    request = training_request(spec, opts, req)
    try:
        schema.check("CreateTrainingJob", request)
    except schema.Invalid as exc:
        raise UsageError(f"SageMaker would refuse this job: {exc}", "fix the option behind that field") from None
    grace = effective_grace(spec.grace)
    note = "" if grace == spec.grace else (
        f"# --grace {spec.grace:g} is capped to {MAX_GRACE} s: SageMaker kills a stopped job's containers 120 s after SIGTERM\n")
    return Plan(job_id=job_id, attempt=attempt, backend="sagemaker", nodes=container_nodes(spec, job_id, attempt, opts, facts.region),
                grace=grace, submission=note + render_request(request))


def render_request(request: dict[str, Any]) -> str:
    return "# CreateTrainingJob request (region's SageMaker API):\n" + json.dumps(request, indent=2, sort_keys=True) + "\n"


def request_of(plan: Plan) -> dict[str, Any]:
    """The request a plan's submission holds (``render_request``'s inverse)."""
    body = "\n".join(line for line in plan.submission.splitlines() if not line.startswith("#"))
    return dict(json.loads(body))


def launch_data(plan: Plan, sample_interval: float) -> dict[str, Any]:
    """``launch.json`` of the phalanx channel: every node's part, read by ``entry`` on each instance."""
    return {"format": 1, "job_id": plan.job_id, "attempt": plan.attempt, "grace": plan.grace, "job_dir": layout.JOB_DIR,
            "sample_interval": sample_interval, "runtime_env": [k for k in RUNTIME_ENV if k not in plan.nodes[0].env],
            "nodes": [n.to_dict() for n in plan.nodes]}
