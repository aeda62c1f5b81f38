"""A retry keeps off the Kubernetes nodes an attempt found bad: node anti-affinity by node name
in every kind's pod template, strictly valid against the real schemas (``schemas.py``), and,
against the FAKE API server (``fakecluster.py``: its scheduler ignores affinity, so this tests
what phalanx asks for, not where a cluster would place it), a rank killed by SIGBUS on one node
making the retry's Job name that node."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.api import jobs, query
from phalanx.backends.kubernetes import manifests
from phalanx.core.paths import JobPaths
from phalanx.core.spec import Resources
from phalanx.core.state import JobState

from . import schemas
from .fakecluster import INDEX
from .test_k8s_manifests import plan_of, spec_for  # noqa: F401 - plan_of is a fixture

AVOID = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gke-pool-7", "gke-pool-9"]}]}]}}}


def pod_specs(obj):
    """Every pod spec (or pod spec patch) inside ``obj``."""
    if isinstance(obj, dict):
        if "containers" in obj and ("volumes" in obj or "restartPolicy" in obj):
            yield obj
        for value in obj.values():
            yield from pod_specs(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from pod_specs(value)


@pytest.mark.parametrize("kind", ["job", "pytorchjob", "trainjob", "jobset"])
def test_k8s_retry_keeps_off_the_nodes_left_out_in_every_kind(plan_of, tmp_path, kind):  # noqa: F811 - the imported fixture
    from phalanx.backends.registry import get_backend
    from phalanx.core.paths import HomePaths

    from .test_k8s_manifests import facts

    spec = spec_for(Resources(2, 4), {"k8s_kind": kind}).with_(left_out=("gke-pool-7", "gke-pool-9"))
    plan = get_backend("k8s").plan(spec, "3f2a9c1d", 1, HomePaths(tmp_path), facts)
    objects = manifests.from_yaml(plan.submission)
    for obj in objects:
        schemas.validate(obj)
    found = [p for o in objects for p in pod_specs(o)]
    assert found and all(p.get("affinity") == AVOID for p in found), found
    first = plan_of(Resources(2, 4), {"k8s_kind": kind})  # a first attempt asks for nothing of the kind
    assert "nodeAffinity" not in first.submission


def test_k8s_fakeapi_sigbus_on_a_node_makes_the_retry_avoid_it(k8s):
    k8s.kubelet.choose = lambda pod: "sigbus" if (int(pod["metadata"]["labels"]["phalanx.dev/attempt"]),
                                                  int(pod["metadata"]["labels"][INDEX])) == (0, 1) else "succeed"
    record, code = jobs.run(k8s.spec(2).with_(max_retries=1))
    assert code == 0 and record.state is JobState.SUCCEEDED and record.attempt == 1
    attempts = query.attempt_history(record)
    (entry,) = attempts[0]["left_out"]
    assert entry["node"] == "node-1" and entry["left_out"] and "SIGBUS" in entry["why"]
    paths = JobPaths(Path(record.job_dir))  # what was submitted (the Jobs are gone once they succeeded)
    retry = next(o for o in manifests.from_yaml(paths.manifests(1).read_text()) if o["kind"] == "Job")
    affinity = retry["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]
    schemas.validate(retry)
    first = next(o for o in manifests.from_yaml(paths.manifests(0).read_text()) if o["kind"] == "Job")
    assert "affinity" not in first["spec"]["template"]["spec"]
