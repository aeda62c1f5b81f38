"""The objects one attempt creates: golden files for a table of topologies and options, every
object strictly valid against the real schemas (``schemas.py``), and the pod contract each kind
relies on (node rank variable, node 0's name, restart policy, grace)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phalanx.backends.base import Facts
from phalanx.backends.kubernetes import manifests
from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources
from phalanx.errors import UsageError
from phalanx.launch.host import HostFacts

from . import schemas
from .golden import assert_golden

SECTION = {
    "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "priority_class": "high",
    "service_account": "trainer",
    "image_pull_secrets": ["regcred"],
    "volumes": [{"name": "data", "mountPath": "/data", "readOnly": True, "persistentVolumeClaim": {"claimName": "data"}}],
    "env": [{"name": "HF_HOME", "value": "/data/hf"},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}}],
    "annotations": {"example.com/owner": "ml team"},
    "labels": {"team": "ml"},
    "resources": {"requests": {"cpu": "30", "memory": "200Gi"}, "limits": {"memory": "200Gi"}},
}
# The submitting machine as the plans see it (the pods' environment is not this machine's).
facts = Facts(HostFacts(gpus=0, cpus=8, env={}))
CASES = {
    "job_2x4_gpus": (Resources(2, 4), {"gpus_per_node": 4}),
    "job_1x1_object_store": (Resources(1, 1), {"code_uri": "s3://bucket/phalanx"}),
    "job_4x8_queue_section": (Resources(4, 8), {"queue": "team-a", "keep_failed": True, "gpus_per_node": 8,
                                                "pod": SECTION, "image": "registry.example.com:5000/ml/train:v3"}),
    "pytorchjob_2x4": (Resources(2, 4), {"k8s_kind": "pytorchjob", "code_uri": "s3://bucket/phalanx"}),
    "pytorchjob_1x2": (Resources(1, 2), {"k8s_kind": "pytorchjob"}),
    "trainjob_2x4": (Resources(2, 4), {"k8s_kind": "trainjob", "code_uri": "s3://bucket/phalanx", "gpus_per_node": 4,
                                       "queue": "team-a"}),
    "trainjob_section": (Resources(2, 1), {"k8s_kind": "trainjob", "pod": {
        k: v for k, v in SECTION.items() if k != "priority_class"} | {"runtime": "torch-cuda"}}),
    "jobset_3x2": (Resources(3, 2), {"k8s_kind": "jobset", "queue": "team-a"}),
}


def spec_for(resources: Resources, options: dict) -> JobSpec:
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/work/train.py", ("--lr", "0.01")), resources, name="train",
                   backend="k8s", workdir="/work", snapshot=True, backend_options=options)


@pytest.fixture
def plan_of(monkeypatch, tmp_path):
    """Plans independent of this machine (its core count and environment)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    for name in ("OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        monkeypatch.delenv(name, raising=False)

    def plan(resources: Resources, options: dict, job_id: str = "3f2a9c1d", attempt: int = 0):
        spec = spec_for(resources, options)
        return get_backend("k8s").plan(spec, job_id, attempt, HomePaths(tmp_path), facts)

    return plan


@pytest.mark.parametrize("case", sorted(CASES))
def test_k8s_manifests_match_golden_and_the_real_schemas(plan_of, case):
    resources, options = CASES[case]
    plan = plan_of(resources, options)
    assert_golden(f"{case}.yaml", plan.submission, f"the manifests of {case}")
    objects = manifests.from_yaml(plan.submission)
    for obj in objects:
        schemas.validate(obj)
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)


@pytest.mark.parametrize("case", ["job_2x4_gpus", "pytorchjob_2x4", "trainjob_2x4", "jobset_3x2"])
def test_k8s_strict_validation_refuses_a_typo(plan_of, case):
    """The checks can fail: a misspelt field anywhere is refused, as the API server's strict
    field validation refuses it."""
    import jsonschema

    workload = manifests.from_yaml(plan_of(*CASES[case]).submission)[-1]
    spec = workload["spec"]
    if workload["kind"] == "PyTorchJob":
        spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    elif workload["kind"] == "TrainJob":
        spec["trainer"]["numNode"] = 2
    elif workload["kind"] == "JobSet":
        spec["replicatedJobs"][0]["template"]["spec"]["completionz"] = 3
    else:
        spec["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises((jsonschema.ValidationError, AssertionError), match="comand|numNode|completionz"):
        schemas.validate(workload)


def test_k8s_rules_catch_what_schemas_miss(plan_of):
    trainjob = manifests.from_yaml(plan_of(*CASES["trainjob_2x4"]).submission)[-1]
    trainjob["spec"]["trainer"]["env"].append({"name": "PET_NODE_RANK", "value": "0"})
    with pytest.raises(AssertionError, match="PET_"):
        schemas.validate(trainjob)
    job = manifests.from_yaml(plan_of(*CASES["job_2x4_gpus"]).submission)[-1]
    job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(AssertionError):
        schemas.validate(job)


def _launch(objects: list[dict]) -> dict:
    config = objects[0]
    assert config["kind"] == "ConfigMap"
    return json.loads(config["data"]["launch.json"])


@pytest.mark.parametrize("kind, rank_var, node0", [
    ("job", "JOB_COMPLETION_INDEX", "phx-3f2a9c1d-a0-0.phx-3f2a9c1d-a0"),
    ("jobset", "JOB_COMPLETION_INDEX", "phx-3f2a9c1d-a0-node-0-0.phx-3f2a9c1d-a0"),
    ("trainjob", "PET_NODE_RANK", "phx-3f2a9c1d-a0-node-0-0.phx-3f2a9c1d-a0"),
    ("pytorchjob", "RANK", "phx-3f2a9c1d-a0-master-0"),
])
def test_k8s_every_kind_finds_its_rank_and_node_zero_as_its_controller_names_them(plan_of, kind, rank_var, node0):
    plan = plan_of(Resources(3, 2), {"k8s_kind": kind})
    text = plan.submission
    assert "--node-rank-from\n" in text or "'--node-rank-from'" in text or "--node-rank-from" in text
    assert rank_var in text and "--wait-for" in text
    launch = _launch(manifests.from_yaml(text))
    assert [n["node_rank"] for n in launch["nodes"]] == [0, 1, 2]
    for node in launch["nodes"]:
        assert node["env"]["PHALANX_NODE_ADDRS"].split(",")[0] == node0
        assert f"--rdzv-endpoint={node0}:29500" in node["torchrun_argv"]
        assert node["cwd"] == "/phx/code" and node["worker_argv"][:2] == ["--script", "train.py"]
    assert "restartPolicy: OnFailure" not in text


def test_k8s_pod_grace_covers_the_jobs_grace(plan_of):
    plan = get_backend("k8s").plan(spec_for(Resources(2, 1), {}).with_(grace=100.5), "j", 0, HomePaths(Path("/tmp")), facts)
    job = manifests.from_yaml(plan.submission)[-1]
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 101 + 15


@pytest.mark.parametrize("kind", ["job", "trainjob"])
def test_k8s_memory_is_each_pods_request_and_limit_over_the_section(plan_of, kind):
    section = {"resources": {"requests": {"cpu": "8", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}}
    objects = manifests.from_yaml(plan_of(Resources(2, 1), {"k8s_kind": kind, "memory": "64Gi", "pod": section}).submission)
    for obj in objects:
        schemas.validate(obj)
    spec = objects[-1]["spec"]
    res = spec["trainer"]["resourcesPerNode"] if kind == "trainjob" else spec["template"]["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}


def test_k8s_names_are_dns_labels_for_any_job_id():
    assert manifests.object_name("3f2a9c1d", 2) == "phx-3f2a9c1d-a2"
    odd = manifests.object_name("Sweep_7/Trial.3", 0)
    assert schemas.DNS_LABEL.match(odd) and odd != manifests.object_name("sweep-7-trial-3", 0)
    assert manifests.label_value("Sweep_7/Trial.3").startswith("h-")


def test_k8s_too_many_nodes_for_a_dns_label_is_refused(plan_of):
    with pytest.raises(UsageError, match="63"):
        manifests.node_hosts("pytorchjob", "phx-" + "a" * 50 + "-a0", 10)


def test_k8s_large_launch_plans_travel_gzipped(plan_of):
    objects = manifests.from_yaml(plan_of(Resources(64, 8), {}).submission)
    config = objects[0]
    assert "launch.json.gz" in config["binaryData"] and "data" not in config
    schemas.validate(config)
    assert "/phx-launch/launch.json.gz" in objects[-1]["spec"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("kind", ["job", "pytorchjob", "trainjob", "jobset"])
def test_k8s_secrets_are_referenced_by_the_node_container_never_rendered(plan_of, kind):
    """--secret on k8s: the attempt's Secret holds a placeholder per variable (start fills the value
    into what it sends to the API server only), the node container takes it by secretKeyRef; every
    object stays strictly valid against the real schemas, with the bundle in the ConfigMap (the
    Secret is then only for the job's secrets) and with an object store."""
    for code_uri in (None, "s3://bucket/phalanx"):
        options = {"k8s_kind": kind, **({"code_uri": code_uri} if code_uri else {})}
        spec = spec_for(Resources(2, 1), options).with_(secrets={"HF_TOKEN": "hf_org", "DB_PASSWORD": "DB_PASSWORD"})
        plan = get_backend("k8s").plan(spec, "3f2a9c1d", 0, HomePaths(Path("/h")), facts)
        objects = manifests.from_yaml(plan.submission)
        for obj in objects:
            schemas.validate(obj)
        (secret,) = [o for o in objects if o["kind"] == "Secret"]
        assert secret["metadata"]["name"] == "phx-3f2a9c1d-a0"
        held = {k: v for k, v in secret["stringData"].items() if k.startswith("env.")}
        assert held == {"env.DB_PASSWORD": "@SECRET:DB_PASSWORD@", "env.HF_TOKEN": "@SECRET:HF_TOKEN@"}
        text = json.dumps(objects[-1])
        for var in ("HF_TOKEN", "DB_PASSWORD"):
            ref = {"name": var, "valueFrom": {"secretKeyRef": {"name": "phx-3f2a9c1d-a0", "key": f"env.{var}"}}}
            assert json.dumps(ref) in text, f"{kind}: the node container takes {var} from the Secret"
        assert plan.to_dict()["nodes"][0]["secrets"] == {"DB_PASSWORD": "DB_PASSWORD", "HF_TOKEN": "hf_org"}


def test_k8s_secrets_with_an_in_cluster_supervisor_are_refused(plan_of):
    spec = spec_for(Resources(1, 1), {"in_cluster": True, "code_uri": "s3://b/p"}).with_(secrets={"HF_TOKEN": "HF_TOKEN"})
    with pytest.raises(UsageError, match="secrets .--secret. do not reach a supervisor that runs in the cluster yet"):
        get_backend("k8s").plan(spec, "3f2a9c1d", 0, HomePaths(Path("/h")), facts)
