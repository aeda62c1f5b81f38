"""The objects of ``--in-cluster`` (``supobjects.py``): the supervisor Job, its Secret and the Role
its service account needs, as golden files, every object strictly valid against the real schemas
(``schemas.py``), and the contract the supervisor pod relies on."""

from __future__ import annotations

from phalanx.backends.kubernetes import manifests, supobjects

from . import schemas
from .golden import assert_golden

SECTION = {"service_account": "trainer", "image_pull_secrets": ["regcred"], "priority_class": "high",
           "node_selector": {"pool": "gpu"}}


def render(job_id: str = "3f2a9c1d") -> list[dict]:
    return supobjects.render(job_id, "train", "train.py --lr 0.01", "2x4", "registry.example.com/ml/train:v3",
                             "s3://bucket/phalanx/phalanx-home/3f2a9c1d", SECTION)


def test_k8s_supervisor_objects_match_golden_and_the_real_schemas():
    objects = render()
    assert_golden("supervisor.yaml", manifests.to_yaml(objects), "the supervisor's objects")
    rbac = supobjects.role("team-a", "trainer", supobjects.supervisor_verbs("job"))
    assert_golden("supervisor_rbac.yaml", manifests.to_yaml(rbac), "the supervisor's Role")
    for obj in [*objects, *rbac]:
        schemas.validate(obj)


def test_k8s_supervisor_pod_contract():
    secret, job = render()
    pod = job["spec"]["template"]["spec"]
    assert [o["kind"] for o in (secret, job)] == ["Secret", "Job"], "the Job last: it becomes the Secret's owner"
    assert job["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "phalanx", "phalanx.dev/job-id": "3f2a9c1d",
                                         "phalanx.dev/role": "supervisor"}
    assert "phalanx.dev/attempt" not in job["metadata"]["labels"], "an attempt's selector must never match it"
    assert pod["serviceAccountName"] == "trainer" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert "nodeSelector" not in pod and "priorityClassName" not in pod, "the GPU pods' placement is not the supervisor's"
    container = pod["containers"][0]
    assert container["command"] == ["python3", "-m", "phalanx.supervise.remote", "3f2a9c1d"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PHALANX_HOME"]["value"] == supobjects.HOME and env["PYTHONPATH"]["value"] == "/phx/lib"
    for var, key in (("PHX_RECORD_GET", "record-get"), ("PHX_RECORD_PUT", "record-put"), ("PHX_STATE_PUT", "state-put")):
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": job["metadata"]["name"], "key": key}
    assert set(secret["stringData"]) == {"bundle-url", "record-get", "record-put", "state-get", "state-put"}
    rules = supobjects.role("ns", "sa", supobjects.supervisor_verbs("pytorchjob"))[0]["rules"]
    assert {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create", "delete", "get"]} in rules
    assert {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]} in rules


def test_k8s_supervisor_name_is_a_dns_label_for_any_job_id():
    assert supobjects.name("3f2a9c1d") == "phx-3f2a9c1d-sup"
    odd = supobjects.name("My_Job.With.Dots")
    assert schemas.DNS_1123_LABEL.match(odd) and len(odd) <= 63, odd


def test_k8s_supervisor_dry_run_shows_the_role_to_apply(tmp_path):
    """``--dry-run --in-cluster`` (no cluster needed) names the supervisor and prints its Role."""
    from tests.conftest import phalanx

    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = phalanx("run", "--backend", "k8s", "--in-cluster", "--namespace", "team-a", "--code-uri", "s3://bucket/p",
                   "--dry-run", "-n", "1x1", "train.py", cwd=tmp_path, env={"PHALANX_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# --in-cluster: the supervisor runs in the cluster as Job phx-"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# Each node's part"))
    rbac = manifests.from_yaml("\n".join(line[2:] for line in lines[start + 1:end]))
    assert [o["kind"] for o in rbac] == ["Role", "RoleBinding"] and rbac[0]["metadata"]["namespace"] == "team-a"
    for obj in rbac:
        schemas.validate(obj)
