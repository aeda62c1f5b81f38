"""SageMaker requests: golden CreateTrainingJob requests for a table of jobs, every one checked by
the strict validator built from botocore's service model, and the bad input that must fail
before anything is created (one line, the fix, exit 2).

Refresh the golden files after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/backends
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.backends.registry import get_backend
from phalanx.backends.sagemaker import layout, schema
from phalanx.backends.sagemaker.options import section_options
from phalanx.backends.sagemaker.plan import request_of
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, Framework, JobSpec, MetricDef, Resources
from phalanx.errors import UsageError

from ..golden_files import assert_golden

ROOT = Path(__file__).resolve().parents[3]
TRAIN = Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--lr", "0.01"))
ROLE = "arn:aws:iam::123456789012:role/sm"


def _data(tmp: Path) -> str:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub").mkdir(exist_ok=True)
    (data / "sub" / "b.bin").write_bytes(bytes(range(256)))
    return str(data)


def cases(tmp: Path) -> dict[str, JobSpec]:
    return {
        "sagemaker_torch_2x4_spot": JobSpec(TRAIN, Resources(2, 4), name="train", backend="sagemaker", metrics=(
            MetricDef("loss", r"loss=([0-9.eE+-]+)"), MetricDef("acc", r"acc: ([0-9.]+)")), backend_options={
            "role": ROLE, "instance_type": "ml.g5.12xlarge", "spot": True, "max_run": 3600, "s3_prefix": "s3://bkt/phx"}),
        "sagemaker_tf_2x1_channels": JobSpec(TRAIN, Resources(2, 1), name="tf job", framework=Framework.TF, backend="sagemaker",
            state_uri="s3://bkt/state/exp1", channels=(Channel("train", "s3://bkt/data/train", "s3://bkt/data/train"),
                                                       Channel("local", "data", _data(tmp))),
            backend_options={"role": ROLE, "region": "eu-west-1", "framework_version": "2.19", "s3_prefix": "s3://bkt/phx/"}),
        "sagemaker_single_vpc_kms": JobSpec(TRAIN, Resources(1, 1), name="one", backend="sagemaker", grace=300, backend_options={
            "role": ROLE, "image": "111122223333.dkr.ecr.us-west-2.amazonaws.com/mine:1", "subnets": "subnet-1,subnet-2",
            "security_groups": "sg-1", "tag": ["team=ml", "cost center=42"], "volume_kms_key": "alias/vol",
            "output_kms_key": "alias/out", "volume_size": 200, "max_run": 600, "max_wait": None}),
    }


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch, tmp_path):
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask the instance metadata service
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def _plan(spec: JobSpec, tmp: Path, attempt: int = 0):
    spec = spec.with_(python="python3", workdir="/work")
    backend = get_backend("sagemaker")
    return backend.plan(spec, "job1234", attempt, HomePaths(tmp / "home"), backend.facts(spec))


@pytest.mark.parametrize("case", ["sagemaker_torch_2x4_spot", "sagemaker_tf_2x1_channels", "sagemaker_single_vpc_kms"])
def test_request_matches_golden_and_the_service_model(case, tmp_path):
    plan = _plan(cases(tmp_path)[case], tmp_path)
    request = request_of(plan)
    schema.check("CreateTrainingJob", request)  # the plan checked it too; this proves the round trip
    assert_golden(f"{case}.json", json.dumps(request, indent=2, sort_keys=True) + "\n", f"request for {case}")


def test_attempts_are_new_training_jobs_with_the_same_checkpoint(tmp_path):
    spec = cases(tmp_path)["sagemaker_torch_2x4_spot"]
    first, second = request_of(_plan(spec, tmp_path, 0)), request_of(_plan(spec, tmp_path, 1))
    assert (first["TrainingJobName"], second["TrainingJobName"]) == ("phx-job1234-a0", "phx-job1234-a1")
    assert first["CheckpointConfig"] == second["CheckpointConfig"] == {"S3Uri": "s3://bkt/phx/state/train/", "LocalPath": "/opt/ml/checkpoints"}
    assert first["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] != second["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]


def test_nodes_are_the_algo_hosts_with_the_containers_paths(tmp_path):
    plan = _plan(cases(tmp_path)["sagemaker_torch_2x4_spot"], tmp_path)
    n0, n1 = plan.nodes
    assert (n0.host, n1.host) == ("algo-1", "algo-2")
    assert "--rdzv-endpoint=algo-1:7777" in n1.torchrun_argv and "--local-addr=algo-2" in n1.torchrun_argv
    assert n0.env["PHALANX_STATE_DIR"] == "/opt/ml/checkpoints" and n0.env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert n0.env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data" and json.loads(n0.env["SM_HOSTS"]) == ["algo-1", "algo-2"]
    assert "SM_NUM_GPUS" not in n0.env  # counted on the instance
    # the shipped copy is the working directory; the script goes as typed there (fidelity: in_snapshot(shipped=True))
    assert n0.worker_argv[:2] == ("--script", "train.py") and n0.cwd == "/opt/ml/phalanx/code"


def test_grace_is_capped_below_sagemakers_sigkill(tmp_path):
    plan = _plan(cases(tmp_path)["sagemaker_single_vpc_kms"], tmp_path)
    assert plan.grace == 110
    assert "capped to 110 s" in plan.submission


def test_an_unchanged_local_input_keeps_its_prefix_and_a_changed_one_moves(tmp_path):
    spec = cases(tmp_path)["sagemaker_tf_2x1_channels"]
    uri = lambda: request_of(_plan(spec, tmp_path))["InputDataConfig"][2]["DataSource"]["S3DataSource"]["S3Uri"]  # noqa: E731
    before = uri()
    assert before == uri() and before.startswith("s3://bkt/phx/channels/")
    (tmp_path / "data" / "a.txt").write_text("beta\n")
    assert uri() != before


def test_facts_look_up_the_plan_is_pure_and_names_what_start_uploads(tmp_path, monkeypatch):
    """Region and input digests are facts (read once); the plan from the same facts is the same,
    whatever the world does meanwhile, and its context says what start uploads and where."""
    spec = cases(tmp_path)["sagemaker_tf_2x1_channels"].with_(python="python3", workdir="/work")
    backend, home = get_backend("sagemaker"), HomePaths(tmp_path / "home")
    facts = backend.facts(spec)
    plan = backend.plan(spec, "job1234", 0, home, facts)
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    (tmp_path / "data" / "a.txt").write_text("changed after the facts\n")
    assert backend.plan(spec, "job1234", 0, home, facts) == plan
    (name, source, digest), = plan.context["inputs"]
    assert plan.context["region"] == facts.region and source == str(tmp_path / "data")
    assert request_of(plan)["InputDataConfig"][2]["DataSource"]["S3DataSource"]["S3Uri"].endswith(f"/channels/{digest}/")
    assert plan.context["code"] == "/work"  # --no-snapshot: the bundle carries the working directory
    snapped = backend.plan(spec.with_(snapshot=True), "job1234", 0, home, facts)
    assert snapped.context["code"] == str(home.job("job1234").code_dir)  # else the job's snapshot


# -- the strict validator ------------------------------------------------------------------------


def _valid(tmp_path) -> dict:
    return request_of(_plan(cases(tmp_path)["sagemaker_torch_2x4_spot"], tmp_path))


@pytest.mark.parametrize("path, value, expect", [
    (("ResourceConfig", "InstanceType"), "ml.foo", "is not one of"),
    (("AlgorithmSpecification", "TrainingInputMode"), "Fil", "is not one of"),
    (("TrainingJobName",), "phx_bad_name", "does not match the pattern"),
    (("TrainingJobName",), "p" * 64, "at most 63"),
    (("AlgorithmSpecification", "MetricDefinitions", 0, "Regex"), "x" * 501, "at most 500"),
    (("AlgorithmSpecification", "ContainerArguments", 0), "y" * 257, "at most 256"),
    (("ResourceConfig", "InstanceCount"), "2", "expected a whole number"),
    (("RoleArn",), "arn:aws:iam::12:role/sm", "does not match the pattern"),
    (("Tags", 0, "Key"), "a\tb", "does not match the pattern"),
    (("ResourceConfg",), {}, "unknown member"),
])
def test_the_validator_rejects_what_botocore_lets_through(tmp_path, path, value, expect):
    request = _valid(tmp_path)
    target = request
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(schema.Invalid) as err:
        schema.check("CreateTrainingJob", request)
    assert expect in str(err.value)


def test_botocore_alone_accepts_enum_pattern_and_length_mistakes(tmp_path):
    """Why the strict validator exists: botocore's own check passes these (research [V])."""
    from botocore.validate import ParamValidator

    request = _valid(tmp_path)
    request["ResourceConfig"]["InstanceType"] = "ml.foo"
    request["TrainingJobName"] = "phx_bad_name"
    shape = schema._model("sagemaker").operation_model("CreateTrainingJob").input_shape
    assert not ParamValidator().validate(request, shape).has_errors()
    with pytest.raises(schema.Invalid):
        schema.check("CreateTrainingJob", request)


def test_the_validator_counts_list_members_and_requires_members(tmp_path):
    request = _valid(tmp_path)
    request["InputDataConfig"] = request["InputDataConfig"] * 21
    with pytest.raises(schema.Invalid, match="at most 20 items"):
        schema.check("CreateTrainingJob", request)
    request = _valid(tmp_path)
    del request["OutputDataConfig"]
    with pytest.raises(schema.Invalid, match="missing required member"):
        schema.check("CreateTrainingJob", request)


# -- bad input: UsageError before anything exists ---------------------------------------------


def test_the_jobs_labels_tag_the_training_job_beside_the_sections_tags(tmp_path):
    """``--tag`` (``JobSpec.tags``, every backend's label) and ``sagemaker: {tags: ...}``
    (``backend_options.tag``, the training job only) both end up in the request's Tags."""
    spec = cases(tmp_path)["sagemaker_single_vpc_kms"].with_(tags={"team": "vision", "run": ""})
    tags = {t["Key"]: t["Value"] for t in request_of(_plan(spec, tmp_path))["Tags"]}
    assert {k: tags[k] for k in ("team", "run", "cost center")} == {"team": "vision", "run": "", "cost center": "42"}
    assert tags["phalanx:job"] == "job1234"


@pytest.mark.parametrize("change, expect", [
    ({"role": None}, "needs an IAM role"),
    ({"role": "sm-role"}, "invalid --role 'sm-role'; use an IAM role ARN"),  # the option's own rule
    ({"instance_type": "ml.g5.13xlarge"}, "offers no instance type 'ml.g5.13xlarge'"),
    ({"max_wait": 60}, "shorter than --max-run"),
    ({"spot": False, "max_wait": 7200}, "--max-wait applies to spot training only"),
    ({"subnets": "subnet-1"}, "needs both --subnets and --security-groups"),
    ({"s3_prefix": "bkt/phx"}, "invalid --s3-prefix 'bkt/phx'; use an s3:// URI"),
    ({"max_run": 0}, "invalid --max-run 0; use a number of seconds of at least 1"),
    ({"tag": ["novalue"]}, "invalid --tag"),
])
def test_bad_options_are_usage_errors(tmp_path, change, expect):
    spec = cases(tmp_path)["sagemaker_torch_2x4_spot"]
    spec = spec.with_(backend_options={**spec.backend_options, **change})
    with pytest.raises(UsageError, match=expect):
        _plan(spec, tmp_path)


def test_a_metric_regex_sagemaker_would_refuse_fails_at_plan_time(tmp_path):
    spec = cases(tmp_path)["sagemaker_torch_2x4_spot"].with_(metrics=(MetricDef("loss", "(" + "x" * 600 + ")"),))
    with pytest.raises(UsageError, match=r"SageMaker would refuse this job: .*MetricDefinitions\[0\]\.Regex.*at most 500"):
        _plan(spec, tmp_path)


def test_no_region_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(UsageError, match="no AWS region"):
        _plan(cases(tmp_path)["sagemaker_torch_2x4_spot"], tmp_path)


def test_inputs_sagemaker_cannot_read(tmp_path):
    spec = cases(tmp_path)["sagemaker_torch_2x4_spot"]
    for channel, expect in ((Channel("x", "gs://b/x", "gs://b/x"), "reads input channels from S3"),
                            (Channel("phalanx", "s3://b/x", "s3://b/x"), "phalanx's own"),
                            (Channel("x", "a.tar", str(tmp_path / "a.tar"), extract=True), "#extract is not supported")):
        with pytest.raises(UsageError, match=expect):
            _plan(spec.with_(channels=(channel,)), tmp_path)
    with pytest.raises(UsageError, match="keeps the state directory in S3"):
        _plan(spec.with_(state_uri="/tmp/state"), tmp_path)


def test_the_default_bucket_is_the_sdks_for_the_roles_account(tmp_path):
    spec = cases(tmp_path)["sagemaker_torch_2x4_spot"]
    spec = spec.with_(backend_options={**spec.backend_options, "s3_prefix": None})
    assert request_of(_plan(spec, tmp_path))["OutputDataConfig"]["S3OutputPath"] == \
        "s3://sagemaker-us-east-1-123456789012/phalanx/jobs/job1234/output"


def test_the_container_command_fits_one_argument():
    assert len(layout.COMMAND) <= 256


# -- the job file's sagemaker: section ---------------------------------------------------------------


def test_section_options_map_to_backend_options():
    opts = section_options({"role": ROLE, "vpc": {"subnets": ["s-1", "s-2"], "security_groups": ["sg-1"]},
                            "tags": {"team": "ml"}, "kms": {"volume": "k1", "output": "k2"}, "max_run": 600, "volume_size": 50})
    assert opts == {"role": ROLE, "subnets": "s-1,s-2", "security_groups": "sg-1", "tag": ["team=ml"],
                    "volume_kms_key": "k1", "output_kms_key": "k2", "max_run": 600, "volume_size": 50}
    for bad, expect in (({"rol": ROLE}, "unknown key"), ({"max_run": "1h"}, "positive whole number"),
                        ({"vpc": {"subnet": "x"}}, "vpc must be a mapping"), ({"tags": ["a"]}, "tags must be a mapping"), ("x", "must be a mapping")):
        with pytest.raises(UsageError, match=expect):
            section_options(bad)


def _cli(args, tmp_path, env=None):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base.update({"PHALANX_HOME": str(tmp_path / "home"), "AWS_CONFIG_FILE": str(tmp_path / "nocfg"),
                 "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "nocred"), "AWS_EC2_METADATA_DISABLED": "true", **(env or {})})
    return subprocess.run([sys.executable, "-m", "phalanx", "run", "--backend", "sagemaker", *args, str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=base)


def test_cli_dry_run_prints_the_request_and_the_job_file_section_applies(tmp_path):
    jobfile = tmp_path / "job.yaml"
    jobfile.write_text(f"sagemaker:\n  role: {ROLE}\n  instance_type: ml.c5.xlarge\n  tags: {{team: ml}}\n")
    proc = _cli(["-f", str(jobfile), "--region", "eu-central-1", "--s3-prefix", "s3://b/p", "-n", "2x1", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    request = json.loads("\n".join(line for line in proc.stdout.split("\n# Each node")[0].splitlines() if not line.startswith("#")))
    assert request["ResourceConfig"] == {"InstanceCount": 2, "InstanceType": "ml.c5.xlarge", "VolumeSizeInGB": 30}
    assert {"Key": "team", "Value": "ml"} in request["Tags"]
    assert request["AlgorithmSpecification"]["TrainingImage"].startswith("763104351884.dkr.ecr.eu-central-1.amazonaws.com/pytorch-training:")


@pytest.mark.parametrize("args, expect", [
    (["--role", "not-an-arn", "--region", "us-east-1"], "invalid --role 'not-an-arn'; use an IAM role ARN (e.g. arn:aws:iam::"),
    (["--role", ROLE, "--region", "us-east-1", "--instance-type", "ml.p9.huge"], "SageMaker offers no instance type"),
    (["--role", ROLE], "no AWS region is configured"),
    (["--role", ROLE, "--region", "us-east-1", "--spot", "--max-run", "100", "--max-wait", "50"], "shorter than --max-run"),
    (["--role", ROLE, "--region", "us-east-1"], "no AWS credentials found"),
])
def test_cli_bad_input_is_one_line_and_exit_2_with_nothing_created(tmp_path, args, expect):
    proc = _cli(args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


def test_default_images_follow_framework_instance_and_region(tmp_path):
    from phalanx.backends.sagemaker.images import default_image

    assert default_image("torch", None, "ml.p4d.24xlarge", "us-west-2").startswith("763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:")
    assert "-gpu-" in default_image("torch", "2.9", "ml.g5.xlarge", "eu-west-1")
    assert ":2.9.0-cpu-" in default_image("torch", "2.9", "ml.c5.xlarge", "eu-west-1")
    assert default_image("tf", None, "ml.m5.large", "ap-east-1").startswith("871362719292.dkr.ecr.ap-east-1.amazonaws.com/tensorflow-training:")
    for args, expect in ((("jax", None, "ml.g5.xlarge", "us-east-1"), "no SageMaker training image for --framework jax"),
                         (("torch", "1.0", "ml.g5.xlarge", "us-east-1"), "no torch training image of version 1.0"),
                         (("torch", None, "ml.trn1.2xlarge", "us-east-1"), "no default torch image for ml.trn1.2xlarge"),
                         (("torch", None, "ml.g5.xlarge", "xx-nowhere-1"), "no registry phalanx knows for region xx-nowhere-1")):
        with pytest.raises(UsageError, match=expect):
            default_image(*args)
