"""Projects, roles, quotas, budgets and the audit log at the store and the face's team part
(api/projects.py, supervise/admission.py, supervise/budget.py, api/audit.py), in process: every
bad input is one line and changes nothing, who may change what, the admission decisions and the
queue's order, lookups that never see another project's jobs (ids, prefixes, names), the audit
log's rows and its append-only table. Real jobs and a real server: tests/local/test_teams_face.py,
tests/server/test_teams.py."""

from __future__ import annotations

import threading
import time

import pytest

from phalanx import config
from phalanx.api import audit, projects, users
from phalanx.core.identity import Principal
from phalanx.core.spec import Entrypoint, JobSpec, Resources
from phalanx.core.state import JobState
from phalanx.errors import JobNotFound, NotAllowed, OverBudget, UsageError
from phalanx.store import Store
from phalanx.supervise import admission, budget

ROOT = Principal.here(config.user())


@pytest.fixture
def store(store_at, tmp_path, monkeypatch):
    """A store of each engine (SQLite, the private PostgreSQL) with three users and two projects."""
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    found = Store(store_at)
    for name, admin in (("alice", True), ("bob", False), ("carol", False)):
        users.add_user(found, name, admin)
    projects.add_project(found, ROOT, "vision")
    projects.add_project(found, ROOT, "nlp")
    return found


def who(store: Store, name: str) -> Principal:
    return users_principal(store, name)


def users_principal(store: Store, name: str) -> Principal:
    user = store.users.get(name)
    assert user is not None
    return Principal(user=name, admin=user.admin, projects=store.projects.roles_of(name), address="10.0.0.7")


def events(store: Store) -> list[dict]:
    return audit.events(store, ROOT, limit=1000)


def job(store: Store, job_id: str, project: str, user: str, state: JobState = JobState.SUCCEEDED, name: str = "train",
        gpus: int = 0, cpus: int = 1, priority: int = 0, admitted: float | None = None, created: float | None = None) -> str:
    store.insert_job(id=job_id, name=name, backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                     job_dir=f"/nonexistent/{job_id}", spec_json="{}", state=state.value, project=project,
                     user_name=user, gpus=gpus, cpus=cpus, priority=priority, admitted_at=admitted,
                     created_at=created if created is not None else time.time())
    return job_id


# -- bad input: one line, exit 2, nothing created -----------------------------------------------


@pytest.mark.parametrize("call, says", [
    (lambda s: projects.set_member(s, ROOT, "nope", "bob", "member"), "no project 'nope'; list yours with"),
    (lambda s: projects.set_member(s, ROOT, "vision", "zed", "member"), "no user 'zed'; list them with"),
    (lambda s: projects.set_member(s, ROOT, "vision", "bob", "memebr"), "unknown role 'memebr'; use one of: viewer, member, admin"),
    (lambda s: projects.set_limits(s, ROOT, "vision", max_gpus="eight"), "--max-gpus 'eight' is not a number"),
    (lambda s: projects.set_limits(s, ROOT, "vision", max_jobs="-1"), "--max-jobs '-1' is not a number"),
    (lambda s: projects.set_limits(s, ROOT, "vision", budget="500xyz"), "unknown currency or unit 'xyz'"),
    (lambda s: projects.set_limits(s, ROOT, "vision", budget="lots"), "is not an amount with its unit"),
    (lambda s: projects.set_limits(s, ROOT, "nope", max_gpus="8"), "no project 'nope'"),
    (lambda s: projects.add_project(s, ROOT, "Vision!"), "invalid project name 'Vision!'"),
    (lambda s: projects.add_project(s, ROOT, "vision"), "project 'vision' exists"),
    (lambda s: projects.remove_member(s, ROOT, "vision", "carol"), "carol is not in project 'vision'"),
    (lambda s: projects.remove_project(s, ROOT, "default"), "the project 'default' cannot be removed"),
])
def test_bad_input_is_one_line_and_changes_nothing(store, call, says):
    before = (store.projects.all(), store.projects.members(), store.users.list())
    with pytest.raises(UsageError) as raised:
        call(store)
    assert raised.value.exit_code == 2 and says in str(raised.value) and "\n" not in str(raised.value)
    assert (store.projects.all(), store.projects.members(), store.users.list()) == before
    last = events(store)[0]
    assert last["outcome"] == "error" and says in last["detail"]["message"], "a refused change is audited too"


def test_budgets_and_quotas_parse_every_way_they_are_written(store):
    assert projects.parse_budget("500usd") == (500.0, "usd")
    assert projects.parse_budget(" 2000 GPU-H ") == (2000.0, "gpu-h")
    assert projects.parse_budget("12.5eur") == (12.5, "eur")
    assert projects.parse_budget("none") == (None, None)
    assert projects.parse_quota("--max-gpus", "8") == 8 and projects.parse_quota("--max-gpus", "none") is None
    done = projects.set_limits(store, ROOT, "vision", max_gpus="8", max_jobs=3, budget="2000gpu-h")
    assert (done["max_gpus"], done["max_jobs"], done["budget"], done["budget_unit"]) == (8, 3, 2000.0, "gpu-h")
    assert any("budget 2000 gpu-h per calendar month: phalanx" in line for line in done["enforced_by"])
    queues = projects.set_limits(store, ROOT, "vision", kueue_queue="vision-q", slurm_account="vis")
    assert any(line.startswith("kubernetes: Kueue LocalQueue vision-q") for line in queues["enforced_by"])
    assert any(line.startswith("slurm: account vis") for line in queues["enforced_by"])
    assert "kubernetes" not in queues["enforced_by"][0], "phalanx's own admission no longer claims Kubernetes jobs"


# -- who may change what --------------------------------------------------------------------------


def test_roles_decide_who_manages_a_project(store):
    projects.set_member(store, ROOT, "vision", "bob", "admin")
    projects.set_member(store, ROOT, "vision", "carol", "member")
    bob, carol = who(store, "bob"), who(store, "carol")
    projects.set_limits(store, bob, "vision", max_gpus="4")  # a project admin sets quotas
    with pytest.raises(NotAllowed, match="only a server admin may set a project's budget"):
        projects.set_limits(store, bob, "vision", budget="100usd")
    with pytest.raises(NotAllowed, match="only an admin of project 'vision' may change its quotas"):
        projects.set_limits(store, carol, "vision", max_gpus="64")
    with pytest.raises(NotAllowed, match="only an admin of project 'vision' may change its members"):
        projects.set_member(store, carol, "vision", "alice", "viewer")
    with pytest.raises(NotAllowed, match="only a server admin may add projects"):
        projects.add_project(store, bob, "mine")
    # a project they are not in does not exist for them: the same line as one that does not exist
    with pytest.raises(UsageError) as hidden:
        projects.set_limits(store, carol, "nlp", max_gpus="1")
    with pytest.raises(UsageError) as missing:
        projects.set_limits(store, carol, "nlq", max_gpus="1")
    assert str(hidden.value).replace("nlp", "X") == str(missing.value).replace("nlq", "X")
    assert [p["name"] for p in projects.list_projects(store, carol)] == ["default", "vision"]
    assert [p["name"] for p in projects.list_projects(store, who(store, "alice"))] == ["default", "nlp", "vision"]
    assert store.projects.get("vision").max_gpus == 4  # type: ignore[union-attr]


def test_two_admins_changing_one_quota_at_once_one_wins_both_audited(store, store_at):
    where = store_at
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def change(value: str) -> None:
        barrier.wait()
        try:
            projects.set_limits(Store(where), ROOT, "vision", max_gpus=value)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=change, args=(v,)) for v in ("4", "16")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    changes = [e for e in events(store) if e["action"] == "project.set" and e["outcome"] == "ok"]
    assert len(changes) == 2, "both changes are in the audit log"
    first, second = sorted(changes, key=lambda e: e["id"])
    assert first["detail"]["from"]["max_gpus"] is None and second["detail"]["from"]["max_gpus"] == first["detail"]["to"]["max_gpus"]
    assert store.projects.get("vision").max_gpus == second["detail"]["to"]["max_gpus"], "the later one wins"  # type: ignore[union-attr]
    assert {first["detail"]["version"], second["detail"]["version"]} == {1, 2}


def test_the_audit_log_is_append_only_and_expires(store, monkeypatch):
    with pytest.raises(Exception, match="append-only"):
        store.engine.write("UPDATE events SET outcome = 'ok'")
    rows = events(store)
    assert [e["action"] for e in rows[-3:]] == ["user.add", "user.add", "user.add"][::-1][:3]
    assert rows[0]["action"] == "project.add" and rows[0]["user"] == ROOT.user and rows[0]["address"] == "local"
    with pytest.raises(NotAllowed, match="only project admins and server admins may read the audit log"):
        audit.events(store, who(store, "bob"))
    projects.set_member(store, ROOT, "vision", "bob", "admin")
    projects.set_member(store, ROOT, "nlp", "carol", "member")
    mine = audit.events(store, who(store, "bob"))
    assert mine and {e["project"] for e in mine} == {"vision"}, "a project admin reads their projects' events"
    with pytest.raises(NotAllowed, match="you are not an admin of a project 'nlp'"):
        audit.events(store, who(store, "bob"), project="nlp")
    monkeypatch.setattr(audit, "EXPIRE_EVERY", 1)
    monkeypatch.setenv("PHALANX_AUDIT_RETENTION_DAYS", "1")
    store.engine.write("INSERT INTO events (at, user_name, action, outcome) VALUES (?, 'old', 'x', 'ok')",
                       (time.time() - 3 * 86400,))
    audit.record(store, ROOT, "probe")
    assert all(e["user"] != "old" for e in events(store)), "older than the retention: gone"


# -- nothing of another project is found, even by prefix ---------------------------------------


def test_lookups_never_find_another_projects_jobs(store):
    job(store, "abcd0001", "vision", "bob")
    job(store, "abcd0002", "nlp", "carol")
    job(store, "ffff0003", "nlp", "carol", name="secret-run")
    with pytest.raises(JobNotFound, match="ambiguous"):
        store.find("abcd")  # the store's owner sees both
    assert store.find("abcd", ("vision",)).id == "abcd0001", "the other project's twin is not even counted"
    for ref in ("abcd0002", "ffff", "secret-run"):
        with pytest.raises(JobNotFound) as hidden:
            store.find(ref, ("vision", "default"))
        with pytest.raises(JobNotFound) as missing:
            store.find("0" * len(ref) if ref[0] != "s" else "no-such-run", ("vision", "default"))
        assert str(hidden.value).replace(ref, "R") == str(missing.value).replace("0" * len(ref), "R").replace("no-such-run", "R")
    assert store.find("ffff", None).id == "ffff0003"
    with pytest.raises(JobNotFound):
        store.find("abcd0001", ())  # in no project: nothing exists


# -- admission ------------------------------------------------------------------------------------


def _spec(n: int = 1, backend: str = "local", **options: object) -> JobSpec:
    return JobSpec(entrypoint=Entrypoint("script", "t.py"), resources=Resources(nnodes=1, nproc_per_node=n, explicit=True),
                   backend=backend, backend_options=options)


def test_what_a_job_asks_for(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert admission.needs(_spec(4)) == (2, 4), "on this machine at most the GPUs it has"
    assert admission.needs(_spec(4, "slurm", gpus_per_node=8)) == (8, 4)
    assert admission.needs(_spec(2, "k8s", gpus_per_node=1)) == (1, 2)
    assert admission.needs(_spec(2, "ssh")) == (2, 2), "elsewhere one GPU per process"
    assert admission.needs(_spec(1, "sagemaker", instance_type="ml.p4d.24xlarge")) == (8, 1)


def test_a_projects_cluster_queues_take_its_jobs_and_their_quota(tmp_path, monkeypatch):
    """A project mapped to a SLURM account and QOS: its SLURM jobs are charged to them (unless
    they name their own) and SLURM, not phalanx, enforces their limits; its other jobs still go
    through phalanx's admission (the Kueue side: tests/kubernetes, on the fake API server)."""
    from phalanx.api.face import LocalFace
    from phalanx.api.query import open_store

    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    face = LocalFace()
    projects.add_project(open_store(), face.principal, "vision")
    projects.set_limits(open_store(), face.principal, "vision", max_gpus="1", slurm_account="vis", slurm_qos="high")
    big = _spec(4, "slurm", gpus_per_node=8, sbatch=("--mem=0",)).with_(project="vision")
    ready = face._admit_spec(big)  # 8 GPUs in a 1-GPU quota: SLURM's to decide, not refused here
    assert ready.backend_options["account"] == "vis"
    assert tuple(ready.backend_options["sbatch"]) == ("--mem=0", "--qos=high")
    own = face._admit_spec(big.with_(backend_options={"account": "mine", "sbatch": ("--qos=low",)}))
    assert own.backend_options["account"] == "mine" and tuple(own.backend_options["sbatch"]) == ("--qos=low",)
    with pytest.raises(UsageError, match="the job needs 4 GPUs and project vision allows at most 1"):
        face._admit_spec(_spec(4, "ssh").with_(project="vision"))


def test_admission_queues_in_priority_then_submission_order(store, monkeypatch):
    projects.set_limits(store, ROOT, "vision", max_gpus="8")
    now = time.time()
    job(store, "run00001", "vision", "bob", JobState.RUNNING, gpus=8, admitted=now - 10)
    store.update("run00001", supervisor_pid=__import__("os").getpid(),
                 supervisor_started=__import__("psutil").Process().create_time())
    first = job(store, "que00001", "vision", "bob", JobState.PENDING, gpus=4, created=now)
    second = job(store, "que00002", "vision", "bob", JobState.PENDING, gpus=4, created=now + 1)
    urgent = job(store, "que00003", "vision", "bob", JobState.PENDING, gpus=8, priority=5, created=now + 2)
    decisions = {i: admission.admit(store, store.get(i)) for i in (first, second, urgent)}
    assert decisions[first].reason == "waiting for quota: 8/8 GPUs of project vision in use (it needs 4)"
    assert not any(d.admitted for d in decisions.values())
    assert admission.places(store, ["vision"]) == {urgent: (1, 3), first: (2, 3), second: (3, 3)}
    assert admission.waiting_line(store, store.get(first)).endswith("place 2 of 3")  # type: ignore[union-attr]
    store.transition("run00001", JobState.SUCCEEDED)
    spawned: list[str] = []
    monkeypatch.setattr(admission, "_start_supervisor", lambda s, i: spawned.append(i))
    assert admission.advance(store, ["vision"]) == [urgent], "higher priority first, and it fills the quota"
    store.transition(urgent, JobState.RUNNING)
    store.transition(urgent, JobState.SUCCEEDED)
    assert admission.advance(store, ["vision"]) == [first, second], "then in the order they were submitted"
    assert spawned == [urgent, first, second], "nobody waited for them: a supervisor is started for each"


def test_a_share_freed_unseen_goes_to_the_head_of_the_queue_at_the_next_submit(store, monkeypatch):
    """The holder's supervisor was killed (-9): nothing ended it, nothing moved the queue. The next
    submit to the project finds it LOST and gives its share to the head of the queue, not to itself."""
    import subprocess

    from phalanx.api import jobs

    projects.set_limits(store, ROOT, "vision", max_jobs="1")
    gone = subprocess.Popen(["true"])
    gone.wait()
    now = time.time()
    held = job(store, "run00009", "vision", "bob", JobState.RUNNING, admitted=now - 60, created=now - 60)
    store.update(held, supervisor_pid=gone.pid, supervisor_started=now - 60)
    head = job(store, "que00009", "vision", "bob", JobState.QUEUED, created=now - 30)
    spawned: list[str] = []
    monkeypatch.setattr(admission, "_start_supervisor", lambda s, i: spawned.append(i))
    said: list[str] = []
    late = job(store, "new00009", "vision", "bob", JobState.PENDING, created=now)
    assert jobs._queued(store, store.get(late), said.append), "it waits behind the head"
    assert store.get(held).state is JobState.LOST
    assert spawned == [head] and store.get(head).admitted_at is not None, "the head starts (a supervisor for it)"
    assert said == ["queued: waiting for quota: 1/1 jobs of project vision in use (place 1); it starts by itself "
                    "when capacity frees"]


def test_a_job_too_big_for_its_quota_never_waits(store):
    projects.set_limits(store, ROOT, "vision", max_gpus="4")
    big = job(store, "big00001", "vision", "bob", JobState.PENDING, gpus=8)
    decision = admission.admit(store, store.get(big))
    assert decision.never and decision.reason == "the job needs 8 GPUs and project vision allows at most 4 at once"


def test_removing_a_project_cancels_its_queued_jobs_and_nothing_else(store):
    projects.set_limits(store, ROOT, "nlp", max_jobs="1")
    running = job(store, "run00002", "nlp", "carol", JobState.RUNNING, admitted=time.time())
    queued = job(store, "que00004", "nlp", "carol", JobState.QUEUED)
    done = projects.remove_project(store, ROOT, "nlp")
    assert done["cancelled"] == [queued]
    record = store.get(queued)
    assert record.state is JobState.CANCELLED and "its project 'nlp' was removed by" in record.root_cause_dict()["message"]  # type: ignore[index]
    assert store.get(running).state is JobState.RUNNING, "a running job is never stopped by it"
    assert store.projects.get("nlp") is None and not store.projects.members("nlp")


def test_a_budget_refuses_what_would_cross_it(store, monkeypatch):
    monkeypatch.setenv("PHALANX_BUDGET_ESTIMATE_HOURS", "2")
    projects.set_limits(store, ROOT, "vision", budget="10gpu-h")
    spent = job(store, "old00001", "vision", "bob", JobState.SUCCEEDED, gpus=4)
    store.update(spent, gpu_hours=7.0, ended_at=time.time())
    project = store.projects.get("vision")
    assert project is not None
    budget.check(store, _spec(1), project, 1, 1, ["alice"])  # 2 GPU-hours fit in the 3 left
    with pytest.raises(OverBudget) as refused:
        budget.check(store, _spec(2), project, 2, 2, ["alice"])
    assert str(refused.value) == ("project vision's budget is 10 gpu-h this month and 3 gpu-h is left; this job would "
                                  "cost about 4 gpu-h (2 h); alice may raise it: phalanx server project set vision "
                                  "--budget AMOUNTgpu-h")
    assert refused.value.exit_code == 2
    last_month = job(store, "old00002", "vision", "bob", JobState.SUCCEEDED, gpus=4)
    store.update(last_month, gpu_hours=100.0, ended_at=budget.month_start() - 60)
    budget.check(store, _spec(1), project, 1, 1, ["alice"])  # last month's spending does not count
