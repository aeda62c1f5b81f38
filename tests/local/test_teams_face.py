"""The role matrix against the face (``LocalFace``, one rule set for this machine, ``phalanx ui``
and a team server): every verb x role (viewer, member, project admin) x whose job (their own,
another member's, another project's), generated from the table in ``roles.expected`` and checked
on real jobs. Another project's job answers exactly as a job that does not exist. The same matrix
runs over HTTP with the CLI in tests/server/test_teams.py."""

from __future__ import annotations

import pytest

from phalanx import config
from phalanx.api import audit, projects, users
from phalanx.api.face import LocalFace
from phalanx.api.ps import PsRequest
from phalanx.core.identity import Principal
from phalanx.errors import JobNotFound, NotAllowed, UsageError
from phalanx.store import Store
from tests.conftest import phalanx
from tests.roles import ROLES, TARGETS, VERBS, expected

pytestmark = pytest.mark.local

SCRIPT = "import sys\nprint('step=1 loss=0.5', flush=True)\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """alice (a server admin), bob and carol; projects vision (bob, alice) and nlp (carol); one
    finished job each: bob's and alice's in vision, carol's in nlp."""
    import os

    root = tmp_path_factory.mktemp("teams")
    saved = os.environ.get("PHALANX_HOME")
    os.environ["PHALANX_HOME"] = str(root / "home")
    script = root / "job.py"
    script.write_text(SCRIPT)
    store = Store(root / "home" / "phalanx.db")
    here = Principal.here(config.user())
    for name in ("alice", "bob", "carol"):
        users.add_user(store, name, admin=name == "alice")
    for name in ("vision", "nlp"):
        projects.add_project(store, here, name)
    projects.set_member(store, here, "vision", "bob", "member")
    projects.set_member(store, here, "nlp", "carol", "member")
    jobs = {}
    for owner, project in (("bob", "vision"), ("alice", "vision"), ("carol", "nlp")):
        done = phalanx("run", "--cold", "--project", project, "--name", f"{owner}-job", str(script), check=True)
        job_id = done.stderr.split("job ", 1)[1].split()[0]
        store.update(job_id, user_name=owner)
        jobs[owner] = job_id
    yield store, jobs, script
    if saved is None:
        os.environ.pop("PHALANX_HOME", None)
    else:
        os.environ["PHALANX_HOME"] = saved


def as_bob(store: Store, role: str) -> LocalFace:
    projects.set_member(store, Principal.here(config.user()), "vision", "bob", role, new=False)
    return LocalFace(Principal(user="bob", projects=store.projects.roles_of("bob"), address="10.1.2.3"))


def outcome(call) -> str:
    """ok | denied (NotAllowed) | hidden (as a job that does not exist) | the unexpected error"""
    try:
        call()
    except JobNotFound:
        return "hidden"
    except NotAllowed:
        return "denied"
    except UsageError as exc:
        # the verb was allowed and answered on its own terms (resuming a job that succeeded)
        return "ok" if "nothing to resume" in str(exc) else f"error: {exc}"
    return "ok"


def act(face: LocalFace, verb: str, ref: str, script) -> object:
    calls = {
        "status": lambda: face.status(ref),
        "logs": lambda: face.logs(ref, lambda text: None),
        "metrics": lambda: face.metrics(ref),
        "artifacts": lambda: face.artifacts(ref),
        "wait": lambda: face.wait(ref, timeout=5),
        "stop": lambda: face.stop(ref),
        "resume": lambda: face.resume(ref, detach=True),
        "rm": lambda: face.rm([ref], dry_run=True),
        "interrupt": lambda: face.interrupt(ref),
    }
    return calls[verb]()


@pytest.mark.parametrize("role", ROLES)
def test_every_verb_role_and_job_as_the_table_says(world, role):
    store, jobs, script = world
    face = as_bob(store, role)
    ids = {"own": jobs["bob"], "other": jobs["alice"], "foreign": jobs["carol"]}
    seen = {}
    for verb in VERBS:
        for target in TARGETS:
            seen[(verb, target)] = outcome(lambda v=verb, t=target: act(face, v, ids[t], script))
    wanted = {(verb, target): expected(verb, role, target) for verb in VERBS for target in TARGETS}
    assert seen == wanted
    listed = {r["id"] for r in face.ps(PsRequest(all=True)).rows}
    assert listed == {jobs["bob"], jobs["alice"]}, "ps lists the projects they are in, nothing else"
    denied = [e for e in audit.events(store, Principal.here(config.user()), user="bob", limit=500) if e["outcome"] == "denied"]
    assert denied and all(e["address"] == "10.1.2.3" for e in denied), "refusals are audited with where they came from"


def test_another_projects_job_answers_as_one_that_does_not_exist(world):
    store, jobs, _ = world
    face = as_bob(store, "member")
    hidden, missing = jobs["carol"], "0123abcd"
    for verb in ("status", "logs", "stop", "rm"):
        with pytest.raises(JobNotFound) as a:
            act(face, verb, hidden, None)
        with pytest.raises(JobNotFound) as b:
            act(face, verb, missing, None)
        assert str(a.value).replace(hidden, "X") == str(b.value).replace(missing, "X")
    with pytest.raises(JobNotFound):
        face.status("carol-job")  # by name too
    with pytest.raises(UsageError, match="no project 'nlp' that you are in"):
        face.ps(PsRequest(project="nlp"))


@pytest.mark.parametrize("role, project, says", [
    ("viewer", "vision", "denied"), ("member", "vision", "ok"), ("admin", "vision", "ok"), ("admin", "nlp", "hidden")])
def test_who_may_submit_where(world, role, project, says):
    from phalanx.jobfile.build import build_spec
    from phalanx.jobfile.values import RunOptions

    store, _, script = world
    face = as_bob(store, role)
    spec = build_spec(RunOptions(words=[str(script)], project=project, warm=False))
    try:
        record, code = face.run(spec, None)
        got = "ok" if code == 0 and record["project"] == project and record["user_name"] == "bob" else f"ran: {record}"
    except NotAllowed:
        got = "denied"
    except UsageError as exc:
        got = "hidden" if f"no project '{project}' that you are in" in str(exc) else str(exc)
    assert got == says
