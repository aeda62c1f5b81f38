"""The Kubernetes backend's decisions, against a FAKE API server whose pods play lifecycles
recorded from real clusters (fakecluster.py, scripted.py): a test of what phalanx does given
those observations, not evidence that a cluster produces them (docs/kubernetes.md).

Each test runs ``jobs.run`` in this process: the preflight, the plan, the supervisor, the
backend and its pod watcher, exactly as ``phalanx run --backend k8s`` does."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from phalanx.api import jobs, query
from phalanx.core.paths import JobPaths, read_json
from phalanx.core.state import JobState

from tests.conftest import phalanx

from .fakecluster import INDEX, UNSCHEDULABLE

LEFT = ("jobs", "pods", "services", "configmaps", "secrets")


def _attempt_of(pod) -> int:
    return int(pod["metadata"]["labels"]["phalanx.dev/attempt"])


def _index_of(pod) -> int:
    return int(pod["metadata"]["labels"][INDEX])


def _left(k8s) -> list[str]:
    return [f"{p}/{o['metadata']['name']}" for p in LEFT for o in k8s.cluster.store.list(p, None)]


def _while_running(k8s, action, delay: float = 0.0):
    """Run ``action`` in a thread once the job shows RUNNING (after ``delay``)."""
    seen: dict = {}

    def run():
        store = jobs.open_store()
        k8s.cluster.wait_for(lambda: [r for r in store.list() if r.state is JobState.RUNNING], text="the job to run")
        time.sleep(delay)
        seen["value"] = action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen


def test_k8s_fakeapi_unschedulable_is_queued_then_runs_and_succeeds(k8s):
    k8s.cluster.holds[1] = UNSCHEDULABLE

    def look_then_release():
        record = jobs.open_store().list()[0]
        path = JobPaths(Path(record.job_dir)).scheduler_job(0)
        note = k8s.cluster.wait_for(lambda: (read_json(path) or {}).get("queued"), text="the queue note")
        shown = phalanx("status", record.id, check=True).stdout
        del k8s.cluster.holds[1]
        return note, shown

    thread, seen = _while_running(k8s, look_then_release, delay=0.5)
    record, code = jobs.run(k8s.spec(2))
    thread.join(5)
    assert code == 0 and record.state is JobState.SUCCEEDED, record.root_cause_dict()
    note, shown = seen["value"]
    assert note == f"Unschedulable: {UNSCHEDULABLE}"
    assert f"\nqueued    QUEUED: Unschedulable: {UNSCHEDULABLE}\n" in shown, shown
    paths = JobPaths(Path(record.job_dir))
    assert "step=1 loss=0.5" in paths.rank_log(0, 1).read_text()  # the pod's log, rebuilt here
    assert read_json(paths.node_result(0, 1))["exitcode"] == 0
    assert (read_json(paths.scheduler_job(0)) or {}).get("queued") is None
    assert paths.manifests(0).read_text().count("kind: ") >= 3
    k8s.cluster.wait_for(lambda: not _left(k8s), text="every object to be deleted")


def test_k8s_fakeapi_oom_killed_node_is_the_root_cause_with_its_limit(k8s):
    k8s.kubelet.choose = lambda pod: "oom" if _index_of(pod) == 1 else "run"
    spec = k8s.spec(2, pod={"resources": {"limits": {"memory": "200Gi"}}})
    record, code = jobs.run(spec)
    assert record.state is JobState.FAILED and code == 137
    cause = record.root_cause_dict()
    assert cause["node_rank"] == 1 and cause["rank"] == 1
    assert "node 1 (pod phx-" in cause["message"] and "was OOM-killed (limit 200Gi)" in cause["message"]
    k8s.cluster.wait_for(lambda: not _left(k8s), text="every object to be deleted")


def test_k8s_fakeapi_preemption_is_retried_as_a_new_job(k8s):
    k8s.kubelet.choose = lambda pod: "preempt" if (_attempt_of(pod), _index_of(pod)) == (0, 0) else \
        ("run" if _attempt_of(pod) == 0 else "succeed")
    record, code = jobs.run(k8s.spec(2).with_(max_retries=1))
    assert code == 0 and record.state is JobState.SUCCEEDED and record.attempt == 1
    attempts = query.attempt_history(record)
    assert [(a["outcome"], a["retry"]) for a in attempts] == [("preempted", True), ("succeeded", False)]
    names = {m.split("name: ")[1].split("\n")[0] for m in
             [JobPaths(Path(record.job_dir)).manifests(a).read_text() for a in (0, 1)]}
    assert names == {"phx-" + record.id + "-a0", "phx-" + record.id + "-a1"}


def test_k8s_fakeapi_kubelet_eviction_without_retries_is_preempted(k8s):
    k8s.kubelet.choose = lambda pod: "evict" if _index_of(pod) == 0 else "run"
    record, code = jobs.run(k8s.spec(2))
    assert record.state is JobState.PREEMPTED and code == 143
    result = read_json(JobPaths(Path(record.job_dir)).node_result(0, 0))
    assert result["stopped_by"] == "SIGTERM" and result["k8s_taken"].startswith("TerminationByKubelet: The node was low")
    assert "phalanx resume" in record.root_cause_dict()["message"]


def test_k8s_fakeapi_image_pull_backoff_fails_fast_naming_the_image(k8s):
    k8s.kubelet.choose = lambda pod: "pull"
    record, code = jobs.run(k8s.spec(2, image="pytorh"))
    assert record.state is JobState.FAILED and code == 1
    assert all(p.name == "pull" and p.step < 2 for p in k8s.kubelet.plays.values()), "failed while pulling, no timeout waited"
    cause = record.root_cause_dict()
    assert cause["message"].startswith("cannot pull the image 'pytorh' (ErrImagePull")
    log = JobPaths(Path(record.job_dir)).agent_log(0, cause["node_rank"]).read_text()
    assert "event: Failed: Failed to pull image \"pytorh\"" in log
    k8s.cluster.wait_for(lambda: not _left(k8s), text="every object to be deleted")


def test_k8s_fakeapi_failed_code_fetch_says_why(k8s):
    k8s.kubelet.choose = lambda pod: "fetch"
    record, code = jobs.run(k8s.spec(1))
    assert record.state is JobState.FAILED
    assert "fetching the code failed (init container phx-fetch exited 1): urllib.error.HTTPError: HTTP Error 403" in \
        record.root_cause_dict()["message"]


def test_k8s_fakeapi_rank_failure_is_the_root_cause_and_kept_with_keep_failed(k8s):
    k8s.kubelet.choose = lambda pod: "fail" if _index_of(pod) == 1 else "run"
    record, code = jobs.run(k8s.spec(2, keep_failed=True))
    assert record.state is JobState.FAILED and code == 1
    cause = record.root_cause_dict()
    assert (cause["rank"], cause["type"], cause["message"]) == (1, "ValueError", "boom")
    left = _left(k8s)
    assert f"jobs/phx-{record.id}-a0" in left and f"configmaps/phx-{record.id}-a0" in left
    failed = [p for p in k8s.cluster.pods() if (p.get("status") or {}).get("phase") == "Failed"]
    assert [_index_of(p) for p in failed] == [1], "the failed pod stays for debugging"
    job = k8s.cluster.store.get("jobs", "default", f"phx-{record.id}-a0")
    assert "ttlSecondsAfterFinished" not in job["spec"]


def _kueue_admits(k8s):
    """What Kueue does to a suspended job of its queue: admits it; returns its queue label and
    the note phalanx kept while it waited."""
    record = jobs.open_store().list()[0]
    name = f"phx-{record.id}-a0"
    job = k8s.cluster.wait_for(lambda: [j for j in k8s.cluster.store.list("jobs", None)
                                        if any(c["type"] == "Suspended" for c in j.get("status", {}).get("conditions", []))],
                               text="Kueue to suspend the job")
    path = JobPaths(Path(record.job_dir)).scheduler_job(0)
    note = k8s.cluster.wait_for(lambda: (read_json(path) or {}).get("queued"), text="the queue note")
    k8s.cluster.admit("default", name)
    return job[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], note


def test_k8s_fakeapi_kueue_suspended_job_waits_then_runs(k8s):
    thread, seen = _while_running(k8s, lambda: _kueue_admits(k8s), delay=0.5)
    record, code = jobs.run(k8s.spec(2, queue="team-a").with_(stall_timeout=1.0))
    thread.join(5)
    assert code == 0 and record.state is JobState.SUCCEEDED, record.root_cause_dict()
    queue, note = seen["value"]
    assert queue == "team-a" and note == "suspended, waiting for admission to queue team-a"


def test_k8s_fakeapi_a_projects_jobs_go_to_its_kueue_queue_which_enforces_its_quota(k8s):
    """Issue 27: a project mapped to a Kueue LocalQueue. Its Kubernetes job names no queue and goes
    to the project's; its 1-GPU quota is Kueue's to enforce (the job asks for 2 and is not
    refused or queued by phalanx), and phalanx shows Kueue's admission state while it waits."""
    import io

    from phalanx.api import projects
    from phalanx.api.face import LocalFace

    face = LocalFace()
    store = jobs.open_store()
    projects.add_project(store, face.principal, "vision")
    said = projects.set_limits(store, face.principal, "vision", max_gpus="1", kueue_queue="team-a")
    assert said["enforced_by"][1].startswith("kubernetes: Kueue LocalQueue team-a")
    thread, seen = _while_running(k8s, lambda: _kueue_admits(k8s), delay=0.5)
    view, code = face.run(k8s.spec(2).with_(project="vision", stall_timeout=1.0), io.StringIO())
    thread.join(5)
    assert code == 0 and view["state"] == "SUCCEEDED" and view["project"] == "vision"
    assert seen["value"] == ("team-a", "suspended, waiting for admission to queue team-a")


def test_k8s_fakeapi_pending_timeout_fails_with_the_schedulers_message(k8s):
    k8s.cluster.holds[0] = UNSCHEDULABLE
    record, code = jobs.run(k8s.spec(2, pending_timeout=1.0))
    assert record.state is JobState.FAILED
    assert record.root_cause_dict()["message"] == (
        f"no node took the pod within --pending-timeout 1s (Unschedulable: {UNSCHEDULABLE})")
    k8s.cluster.wait_for(lambda: not _left(k8s), text="every object to be deleted")


def test_k8s_fakeapi_stop_deletes_pods_with_grace_and_leaves_nothing(k8s):
    k8s.kubelet.choose = lambda pod: "run"
    thread, seen = _while_running(k8s, lambda: jobs.stop(jobs.open_store().list()[0].id, timeout=30), delay=1.5)
    record, code = jobs.run(k8s.spec(2))
    thread.join(30)
    assert record.state is JobState.CANCELLED
    deletes = [path for method, path in k8s.cluster.store.requests if method == "DELETE" and "/pods/" in path]
    assert len(deletes) >= 2
    results = [read_json(JobPaths(Path(record.job_dir)).node_result(0, n)) for n in (0, 1)]
    assert [r["stopped_by"] for r in results] == ["SIGTERM", "SIGTERM"]
    k8s.cluster.wait_for(lambda: not _left(k8s), text="every object to be deleted")


def test_k8s_fakeapi_objects_are_owned_by_the_job(k8s):
    k8s.kubelet.choose = lambda pod: "run"
    seen: dict = {}

    def look():
        record = jobs.open_store().list()[0]
        name = f"phx-{record.id}-a0"
        job = k8s.cluster.wait_for(lambda: k8s.cluster.store.list("jobs", None), text="the job")[0]

        def owned() -> dict | None:  # phalanx makes the Job their owner once it exists (backend.apply)
            refs = {p: k8s.cluster.store.get(p, "default", name)["metadata"].get("ownerReferences") for p in ("configmaps", "services")}
            return refs if all(refs.values()) else None

        seen["owners"], seen["uid"] = k8s.cluster.wait_for(owned, text="owners on the ConfigMap and the Service"), job["metadata"]["uid"]
        jobs.stop(record.id, timeout=30)

    thread, _ = _while_running(k8s, look, delay=1.0)
    record, _ = jobs.run(k8s.spec(1))
    thread.join(40)
    assert record.state is JobState.CANCELLED
    for refs in seen["owners"].values():
        assert [(r["kind"], r["uid"], r["blockOwnerDeletion"]) for r in refs] == [("Job", seen["uid"], True)]


def test_k8s_fakeapi_lost_supervisor_its_job_is_found_by_labels_and_stopped(k8s):
    """The supervisor dies (SIGKILL): the pods run on, the job shows LOST and what still runs;
    `stop` finds the Job by its labels (its scheduler.json gone too) and stops it, creating nothing."""
    import os
    import signal

    k8s.kubelet.choose = lambda pod: "run"
    job_id = phalanx("run", "-d", "--backend", "k8s", "-n", "2x1", "--grace", "3", "train.py", cwd=k8s.workdir,
                     check=True).stdout.strip()
    k8s.cluster.wait_for(lambda: len([p for p in k8s.cluster.pods() if p["status"].get("phase") == "Running"]) == 2,
                         text="both pods to run")
    status = json.loads(phalanx("status", job_id, "--json", check=True).stdout)
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    k8s.cluster.wait_for(lambda: json.loads(phalanx("status", job_id, "--json").stdout)["state"] == "LOST", text="LOST")
    JobPaths(Path(status["job_dir"])).scheduler_job(0).unlink()
    shown = phalanx("status", job_id, check=True).stdout
    assert f"left      Job phx-{job_id}-a0 in namespace default still runs without a supervisor" in shown, shown
    assert len([p for m, p in k8s.cluster.store.requests if m == "POST" and p.endswith("/jobs")]) == 1
    k8s.cluster.store.requests.clear()
    shown = phalanx("status", job_id, check=True).stdout  # again, from a clean request log
    assert not [p for m, p in k8s.cluster.store.requests if m != "GET" or p.endswith("/log")], "status only looks"
    stopped = phalanx("stop", job_id, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert json.loads(phalanx("status", job_id, "--json", check=True).stdout)["state"] == "LOST"
    k8s.cluster.wait_for(lambda: not _left(k8s), text="every object to be deleted")
    assert not [p for m, p in k8s.cluster.store.requests if m == "POST" and p.endswith("/jobs")], "stop created nothing"
    results = [read_json(JobPaths(Path(status["job_dir"])).node_result(0, n)) for n in (0, 1)]
    assert [r["stopped_by"] for r in results] == ["SIGTERM", "SIGTERM"]


def test_k8s_fakeapi_jobset_runs_through_its_child_job_and_is_cleaned_up(k8s):
    k8s.cluster.store.groups.add("jobset.x-k8s.io/v1alpha2")
    record, code = jobs.run(k8s.spec(2, k8s_kind="jobset"))
    assert code == 0 and record.state is JobState.SUCCEEDED, record.root_cause_dict()
    created = [p for m, p in k8s.cluster.store.requests if m == "POST" and p.endswith("/jobsets")]
    assert len(created) == 1
    results = [read_json(JobPaths(Path(record.job_dir)).node_result(0, n)) for n in (0, 1)]
    assert [r["host"] for r in results] == [f"phx-{record.id}-a0-node-0-{n}" for n in (0, 1)]  # the pods' hostnames
    k8s.cluster.wait_for(lambda: not _left(k8s) and not k8s.cluster.store.list("jobsets", None),
                         text="the JobSet, its Job and pods to be deleted")


def test_k8s_fakeapi_pytorchjob_failure_names_the_worker_rank(k8s):
    from .fakecluster import node_of

    k8s.cluster.store.groups.add("kubeflow.org/v1")
    k8s.kubelet.choose = lambda pod: "fail" if node_of(pod) == 1 else "run"
    record, code = jobs.run(k8s.spec(2, k8s_kind="pytorchjob"))
    assert record.state is JobState.FAILED and code == 1
    cause = record.root_cause_dict()
    assert (cause["rank"], cause["node_rank"], cause["message"]) == (1, 1, "boom")
    assert {p["metadata"]["name"] for p in k8s.cluster.store.list("pods", None)} <= {
        f"phx-{record.id}-a0-master-0", f"phx-{record.id}-a0-worker-0"}
    k8s.cluster.wait_for(lambda: not _left(k8s) and not k8s.cluster.store.list("pytorchjobs", None),
                         text="the PyTorchJob, its pods and Services to be deleted")


def test_k8s_fakeapi_a_secret_lives_in_the_attempts_secret_owned_by_its_workload(k8s, tmp_path, monkeypatch):
    """--secret on k8s (the FAKE API server): the value reaches the cluster only as the data of the
    attempt's Secret, which the workload owns (deleted with it); the pods take it by secretKeyRef;
    the manifests phalanx keeps hold the placeholder; nothing of the job holds the value."""
    import base64

    monkeypatch.setenv("PHALANX_SECRETS_FILE", str(tmp_path / "cfg" / "secrets.json"))
    monkeypatch.setenv("PHALANX_SECRETS_STORE", "file")
    from phalanx.secrets.local import open_store

    canary = f"k8s-canary-{time.monotonic_ns()}"
    open_store().set("hf_org", canary, owner="test")

    def named(plural: str, name: str):
        found = [o for o in k8s.cluster.store.list(plural, None) if o["metadata"]["name"] == name]
        return found[0] if found else None

    def look():
        record = jobs.open_store().list()[0]
        name = f"phx-{record.id}-a0"
        owned = lambda: (named("secrets", name) or {}).get("metadata", {}).get("ownerReferences")  # noqa: E731
        k8s.cluster.wait_for(owned, text="the Secret, owned by its workload")
        secret = named("secrets", name)
        workload = k8s.cluster.wait_for(lambda: named("jobs", name), text="the Job")
        pods = k8s.cluster.wait_for(lambda: k8s.cluster.pods(), text="the pods")
        return secret, workload, pods

    thread, seen = _while_running(k8s, look)
    record, code = jobs.run(k8s.spec(2).with_(secrets={"HF_TOKEN": "hf_org"}))
    thread.join(10)
    assert code == 0 and record.state is JobState.SUCCEEDED, record.root_cause_dict()
    secret, workload, pods = seen["value"]
    assert base64.b64decode(secret["data"]["env.HF_TOKEN"]).decode() == canary
    owners = secret["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("Job", workload["metadata"]["name"], workload["metadata"]["uid"])]
    env = pods[0]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": workload["metadata"]["name"], "key": "env.HF_TOKEN"}}} in env
    assert canary not in json.dumps(workload) and canary not in json.dumps(pods)
    paths = JobPaths(Path(record.job_dir))
    assert "env.HF_TOKEN: '@SECRET:HF_TOKEN@'" in paths.manifests(0).read_text()
    for path in Path(record.job_dir).parent.parent.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
    k8s.cluster.wait_for(lambda: not _left(k8s), text="the Secret to go with its workload")
