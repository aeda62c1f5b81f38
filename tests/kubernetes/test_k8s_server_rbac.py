"""The Role ``phalanx server manifests`` prints is enough for the Kubernetes backend, checked
against a FAKE API server (fakeapi.py) that grants exactly that Role's rules and refuses
everything else with RBAC's 403, as the API server would for the server's service account: a job
runs to its end, its objects are cleaned up, and the backend's own RBAC preflight agrees. With
one rule taken away the preflight names what is missing (so the fake does enforce the grants).
A real cluster's RBAC is not exercised here (docs/kubernetes.md, "what the tests prove")."""

from __future__ import annotations

import pytest

from phalanx.api import jobs
from phalanx.core.state import JobState
from phalanx.errors import UsageError
from phalanx.server.deploy import Deploy, kubernetes


def grants(namespace: str) -> set[tuple[str, str, str]]:
    """(verb, resource as RBAC names it, namespace) of the printed Role."""
    [role] = [o for o in kubernetes(Deploy("phalanx:test", namespace=namespace)) if o["kind"] == "Role"]
    return {(verb, f"{resource}.{group}" if group else resource, namespace)
            for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_k8s_fakeapi_server_role_is_enough_for_a_job_and_its_cleanup(k8s):
    k8s.cluster.store.granted = grants("default")
    record, code = jobs.run(k8s.spec(2))
    assert code == 0 and record.state is JobState.SUCCEEDED, record.root_cause_dict()
    assert ("POST", "/apis/batch/v1/namespaces/default/jobs") in k8s.cluster.store.requests
    k8s.cluster.wait_for(lambda: not [p for p in ("jobs", "pods", "services", "configmaps", "secrets")
                                      if k8s.cluster.store.list(p, None)], text="every object to be deleted")


@pytest.mark.parametrize("taken", [("get", "pods/log"), ("create", "jobs.batch"), ("list", "events")])
def test_k8s_fakeapi_server_role_without_a_rule_is_named_by_the_preflight(k8s, taken):
    k8s.cluster.store.granted = grants("default") - {(*taken, "default")}
    with pytest.raises(UsageError) as caught:
        jobs.run(k8s.spec(1))
    assert "not allowed" in caught.value.message and f"{taken[0]} {taken[1]}" in caught.value.message, caught.value.message
    assert not k8s.cluster.store.list("jobs", None)
