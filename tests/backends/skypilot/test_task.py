"""SkyPilot: golden task YAML for a table of jobs, each validated against SkyPilot 0.14.1's own
task schema (vendored: skypilot cannot be installed with the pinned packages; see data/README.md).

Refresh the golden files after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/backends
"""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Channel, Entrypoint, EntrypointKind, Framework, JobSpec, Resources
from phalanx.errors import UsageError

from ..golden_files import assert_golden

SCHEMA = json.loads((Path(__file__).parent / "data" / "skypilot_task_schema_0.14.1.json").read_text())
TRAIN = Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--lr", "0.01"))
CASES = {
    "skypilot_h100_2x8_spot": JobSpec(TRAIN, Resources(2, 8), name="train", backend="skypilot",
                                      backend_options={"gpus": "H100:8", "spot": True, "infra": "aws"}),
    "skypilot_managed_k8s": JobSpec(TRAIN, Resources(4, 1), name="train", backend="skypilot", backend_options={
        "gpus": "A100-80GB:1", "infra": "k8s/my-ctx", "managed": True, "disk_size": 200, "image": "docker:nvcr.io/nvidia/pytorch:24.07-py3",
        "setup": "pip install -r requirements.txt"}),
    "skypilot_cpu_tf": JobSpec(TRAIN, Resources(2, 1), name="tf", framework=Framework.TF, backend="skypilot",
                               backend_options={"cpus": "8+", "memory": "32+", "instance_type": "m6i.2xlarge"}),
}


def _plan(spec, tmp_path, attempt=0):
    backend, spec = get_backend("skypilot"), spec.with_(workdir="/work")
    return backend.plan(spec, "job1234", attempt, HomePaths(Path("/home/u/.phalanx")), backend.facts(spec))


def _task(plan):
    return yaml.safe_load("\n".join(line for line in plan.submission.splitlines() if not line.startswith("#")))


@pytest.mark.parametrize("case", sorted(CASES))
def test_task_matches_golden_and_skypilots_schema(case, tmp_path):
    task = _task(_plan(CASES[case], tmp_path))
    jsonschema.validate(task["resources"], SCHEMA["properties"]["resources"])
    jsonschema.validate(task, {**SCHEMA, "properties": {**SCHEMA["properties"], "resources": {"type": "object"}}})
    assert_golden(f"{case}.yaml", yaml.safe_dump(task, sort_keys=True), f"SkyPilot task for {case}")


def test_the_schema_catches_what_skypilot_would_refuse(tmp_path):
    task = _task(_plan(CASES["skypilot_h100_2x8_spot"], tmp_path))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**task, "num_node": 2}, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**task["resources"], "use_spot": "yes"}, SCHEMA["properties"]["resources"])


def test_nodes_learn_rank_and_addresses_from_skypilot(tmp_path):
    plan = _plan(CASES["skypilot_h100_2x8_spot"], tmp_path)
    n0, n1 = plan.nodes
    assert any(a.startswith("--rdzv-endpoint=@NODE_ADDR_0@:") for a in n1.torchrun_argv)
    assert n0.env["PHALANX_NODE_ADDRS"] == "@NODE_ADDR_0@,@NODE_ADDR_1@" and n0.env["SM_NUM_GPUS"] == "8"
    # the shipped copy is the working directory; the script goes as typed there (fidelity: in_snapshot(shipped=True))
    assert n0.worker_argv[:2] == ("--script", "train.py") and n0.cwd == "@SKY_WORKDIR@/code"


def test_managed_recovery_and_phalanx_retries_do_not_both_retry(tmp_path):
    spec = CASES["skypilot_managed_k8s"].with_(max_retries=2)
    with pytest.raises(UsageError, match="--managed lets SkyPilot recover the job"):
        _plan(spec, tmp_path)


def test_inputs_are_refused_until_supported(tmp_path):
    spec = CASES["skypilot_cpu_tf"].with_(channels=(Channel("d", "s3://b/d", "s3://b/d"),))
    with pytest.raises(UsageError, match="--input is not supported on the skypilot backend"):
        _plan(spec, tmp_path)
