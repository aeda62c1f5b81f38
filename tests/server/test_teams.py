"""Projects on a real team server, with real CLI processes: alice (a server admin), bob and carol
in two projects. The role matrix of tests/roles.py over HTTP (every verb x role x whose job, the
same table as against the face); a project's quota queuing jobs and starting them in priority then
submission order as others end; a budget refusing a job in one line; a queued job cancelled with
its project; bad input in one line, exit 2, nothing created; two admins changing one quota at once;
and the audit log's rows for each of these, with where they came from."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.roles import ROLES, TARGETS, VERBS, expected
from tests.server.conftest import Person, cli, new_server, _end_jobs

pytestmark = [pytest.mark.local]

JOB = "import sys, time\nprint('step=1 loss=0.5', flush=True)\ntime.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)\n"


@pytest.fixture(scope="module")
def teams(tmp_path_factory):
    """A server (prices: 100 an hour per CPU), alice (server admin), bob and carol logged in;
    projects vision (bob) and nlp (carol), each person with a project directory holding job.py."""
    root = tmp_path_factory.mktemp("teams")
    srv = new_server(root / "srv")
    srv.root.mkdir()
    srv.env["PHALANX_PRICES"] = "{cpu: 100}"
    people = {name: Person(name, root / name) for name in ("alice", "bob", "carol")}
    for name, person in people.items():
        person.token = srv.add_user(name, admin=name == "alice")
    srv.start()
    try:
        for person in people.values():
            person.root.mkdir()
            (person.root / "job.py").write_text(JOB)
            assert person.login(srv.url).returncode == 0
        alice = people["alice"]
        for args in (("add", "vision"), ("add", "nlp"), ("member", "add", "vision", "bob"),
                     ("member", "add", "nlp", "carol")):
            done = alice.run("server", "project", *args)
            assert done.returncode == 0, done.stderr
        yield srv, people
    finally:
        srv.stop()
        _end_jobs(srv)


def submit(person: Person, *args: str, script: tuple[str, ...] = ("job.py",)) -> str:
    done = person.run("run", "-d", *args, *script)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def events(person: Person, *args: str) -> list[dict]:
    done = person.run("events", "--json", "--limit", "10000", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout or "[]")


def wait(person: Person, job: str) -> dict:
    done = person.run("wait", job)
    assert done.returncode in (0, 1, 143), done.stderr
    return json.loads(person.run("status", job, "--json").stdout)


# -- the role matrix over HTTP ------------------------------------------------------------------


def cli_outcome(person: Person, verb: str, job: str, srv) -> str:
    if verb == "interrupt":  # no command of its own: what a remote foreground run's Ctrl-C sends
        request = urllib.request.Request(f"{srv.url}/api/v1/jobs/{job}/interrupt", method="POST",
                                         headers={"Authorization": f"Bearer {person.token}"})
        try:
            urllib.request.urlopen(request, timeout=30)
            return "ok"
        except urllib.error.HTTPError as exc:
            return {403: "denied", 404: "hidden"}.get(exc.code, f"http {exc.code}")
    args = {"status": ["status", job], "logs": ["logs", job], "metrics": ["metrics", job], "artifacts": ["artifacts", job],
            "wait": ["wait", job], "stop": ["stop", job], "resume": ["resume", "-d", job],
            "rm": ["rm", "--dry-run", job]}[verb]
    done = person.run(*args)
    err = done.stderr
    if done.returncode == 0 or "nothing to resume" in err:
        return "ok"
    if done.returncode == 2 and f"no job with id or name '{job}'" in err:
        return "hidden"
    if done.returncode == 2 and ("or an admin may" in err or "viewers may only look" in err):
        return "denied"
    return f"exit {done.returncode}: {err.strip()}"


def test_the_role_matrix_over_http_with_the_cli(teams):
    srv, people = teams
    alice, bob, carol = people["alice"], people["bob"], people["carol"]
    jobs = {"own": submit(bob, "--project", "vision"), "other": submit(alice, "--project", "vision"),
            "foreign": submit(carol, "--project", "nlp")}
    for job in jobs.values():
        wait(alice, job)
    for role in ROLES:
        changed = alice.run("server", "project", "member", "role", "vision", "bob", role)
        assert changed.returncode == 0 and changed.stdout.strip() == f"bob is now {'an' if role == 'admin' else 'a'} {role} of project vision"
        seen = {(v, t): cli_outcome(bob, v, jobs[t], srv) for v in VERBS for t in TARGETS}
        assert seen == {(v, t): expected(v, role, t) for v in VERBS for t in TARGETS}, role
        listed = {r["id"] for r in json.loads(bob.run("ps", "--all", "--json").stdout)}
        assert jobs["foreign"] not in listed and {jobs["own"], jobs["other"]} <= listed
    hidden = bob.run("status", jobs["foreign"])
    missing = bob.run("status", "0bad0bad")
    assert hidden.stderr.replace(jobs["foreign"], "X") == missing.stderr.replace("0bad0bad", "X")
    prefix = bob.run("status", jobs["foreign"][:5])
    assert prefix.returncode == 2 and "no job with id or name" in prefix.stderr, "nor by a prefix of its id"
    denied = [e for e in events(alice, "--user", "bob") if e["outcome"] == "denied"]
    assert denied and all(e["address"] == "127.0.0.1" and e["project"] == "vision" for e in denied)


# -- quotas and the queue -----------------------------------------------------------------------


def test_a_quota_queues_jobs_and_starts_them_by_priority_then_submission(teams):
    srv, people = teams
    alice, bob = people["alice"], people["bob"]
    used = bob.run("server", "project", "use", "vision")  # his default: no --project from here on
    assert used.returncode == 0 and used.stdout.strip() == "your jobs go to project vision unless they name another"
    alice.run("server", "project", "member", "role", "vision", "bob", "member")
    limited = alice.run("server", "project", "set", "vision", "--max-jobs", "1")
    assert limited.returncode == 0 and "1 jobs: phalanx's admission on local" in limited.stdout
    go = bob.root / "go"  # "first" runs until the queue has been looked at (no race with a sleep)
    (bob.root / "gate.py").write_text("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n"
                                      "    time.sleep(0.1)\n")
    first = submit(bob, "--name", "first", script=("gate.py", str(go)))
    second = submit(bob, "--name", "second")
    urgent = submit(bob, "--name", "urgent", "--priority", "5")
    shown = bob.run("ps")
    assert re.search(rf"{urgent}\s+urgent\s+QUEUED #1", shown.stdout), shown.stdout
    assert re.search(rf"{second}\s+second\s+QUEUED #2", shown.stdout), shown.stdout
    status = bob.run("status", second).stdout
    assert "queued    QUEUED: waiting for quota: 1/1 jobs of project vision in use; place 2 of 2" in status, status
    go.touch()
    ended = {job: wait(bob, job) for job in (first, second, urgent)}
    assert all(v["state"] == "SUCCEEDED" and v["project"] == "vision" for v in ended.values())
    order = sorted(ended, key=lambda j: ended[j]["started_at"])
    assert order == [first, urgent, second], "priority first, then submission"
    assert ended[urgent]["started_at"] >= ended[first]["ended_at"] - 0.5, "one at a time (max-jobs 1)"
    assert ended[second]["started_at"] >= ended[urgent]["ended_at"] - 0.5
    submits = [e for e in events(alice, "--project", "vision") if e["action"] == "submit" and e["target"] in ended]
    assert len(submits) == 3 and {e["user"] for e in submits} == {"bob"}
    alice.run("server", "project", "set", "vision", "--max-jobs", "none")


def test_a_budget_refuses_a_job_in_one_line(teams):
    srv, people = teams
    alice, carol = people["alice"], people["carol"]
    refused = carol.run("server", "project", "set", "nlp", "--budget", "1000usd")
    assert refused.returncode == 2 and "only an admin of project 'nlp' may change its quotas" in refused.stderr
    assert alice.run("server", "project", "set", "nlp", "--budget", "50usd").returncode == 0
    before = json.loads(alice.run("ps", "--all", "--json", "--project", "nlp").stdout)
    over = carol.run("run", "--project", "nlp", "--name", "fresh", "job.py")  # never ran: 1 hour assumed
    assert over.returncode == 2 and over.stdout == ""
    # what is left: 50, less the little the earlier (sub-second) jobs of nlp cost
    assert re.fullmatch(r"phalanx: error: project nlp's budget is 50 usd this month and (50|49\.\d+) usd is left; "
                        r"this job would cost about 100 usd \(1 h\); alice may raise it: phalanx server project set nlp "
                        r"--budget AMOUNTusd\n", over.stderr), over.stderr
    assert json.loads(alice.run("ps", "--all", "--json", "--project", "nlp").stdout) == before, "nothing created"
    assert alice.run("server", "project", "set", "nlp", "--budget", "500usd").returncode == 0
    ran = carol.run("run", "--project", "nlp", "--name", "fresh", "job.py")
    assert ran.returncode == 0, ran.stderr
    usage = json.loads(alice.run("usage", "--by", "project", "--json").stdout)
    nlp = next(r for r in usage if r["group"] == "nlp")
    assert nlp["budget"]["amount"] == 500 and nlp["budget"]["unit"] == "usd" and nlp["budget"]["used"] > 0
    table = alice.run("usage", "--by", "project").stdout
    assert re.search(r"nlp\s+\d+\s+.*\s+of 500 usd", table), table
    refusal = [e for e in events(alice, "--project", "nlp") if e["action"] == "submit" and e["outcome"] == "denied"]
    assert refusal and "budget is 50 usd" in refusal[0]["detail"]["message"]
    alice.run("server", "project", "set", "nlp", "--budget", "none")


def test_a_queued_job_whose_project_is_removed_is_cancelled_saying_why(teams):
    srv, people = teams
    alice, carol = people["alice"], people["carol"]
    for args in (("add", "tmp"), ("member", "add", "tmp", "carol"), ("set", "tmp", "--max-jobs", "1")):
        assert alice.run("server", "project", *args).returncode == 0
    running = submit(carol, "--project", "tmp", "--name", "long", script=("job.py", "600"))
    queued = submit(carol, "--project", "tmp", "--name", "waits")
    assert json.loads(carol.run("status", queued, "--json").stdout)["state"] == "QUEUED"
    removed = alice.run("server", "project", "rm", "tmp")
    assert removed.returncode == 0 and removed.stdout.strip() == "project tmp removed; 1 queued job(s) cancelled"
    view = json.loads(alice.run("status", queued, "--json").stdout)
    assert view["state"] == "CANCELLED"
    assert view["root_cause"]["message"] == "cancelled while queued: its project 'tmp' was removed by alice"
    assert carol.run("status", queued).returncode == 2, "its project is gone: carol sees it no more"
    assert json.loads(alice.run("status", running, "--json").stdout)["state"] == "RUNNING", \
        "a running job is never stopped by it"
    assert alice.run("stop", running).returncode == 0


# -- bad input, concurrency, the audit log ---------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (("member", "add", "nope", "bob"), "no project 'nope'"),
    (("member", "add", "vision", "zed"), "no user 'zed'"),
    (("member", "add", "nlp", "bob", "--role", "memebr"), "unknown role 'memebr'; use one of: viewer, member, admin"),
    (("set", "vision", "--max-gpus", "eight"), "--max-gpus 'eight' is not a number"),
    (("set", "vision", "--budget", "500xyz"), "--budget '500xyz': unknown currency or unit 'xyz'"),
])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(teams, args, says):
    srv, people = teams
    alice = people["alice"]
    before = alice.run("server", "project", "list", "--json").stdout
    done = alice.run("server", "project", *args)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"phalanx: error: {says}"), done.stderr
    assert alice.run("server", "project", "list", "--json").stdout == before
    run = alice.run("run", "--project", "nope", "job.py")
    assert run.returncode == 2 and run.stderr == ("phalanx: error: no project 'nope'; list yours with: phalanx server "
                                                  "project list\n")


def test_two_admins_change_one_quota_at_once_one_wins_both_audited(teams):
    srv, people = teams
    alice = people["alice"]
    procs = [subprocess.Popen([sys.executable, "-m", "phalanx", "server", "project", "set", "vision", "--max-gpus", n],
                              env=alice.env, cwd=alice.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in ("4", "16")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    changes = [e for e in events(alice, "--project", "vision")
               if e["action"] == "project.set" and "max_gpus" in (e["detail"] or {}).get("to", {})][:2]
    assert sorted(e["detail"]["to"]["max_gpus"] for e in changes) == [4, 16]
    newest = max(changes, key=lambda e: e["id"])
    listed = {p["name"]: p for p in json.loads(alice.run("server", "project", "list", "--json").stdout)}
    assert listed["vision"]["max_gpus"] == newest["detail"]["to"]["max_gpus"], "the later change wins"


def test_the_audit_log_says_who_did_what_from_where(teams):
    srv, people = teams
    alice, bob, carol = people["alice"], people["bob"], people["carol"]
    bad = Person("mallory", carol.root.parent / "mallory")
    bad.root.mkdir(exist_ok=True)
    assert bad.login(srv.url, token="phx_0123456789ab_" + "x" * 43).returncode == 2
    rows = events(alice)
    actions = {e["action"] for e in rows}
    assert {"login", "project.add", "member.add", "member.role", "project.set", "submit", "stop", "rm"} <= actions, actions
    failed = [e for e in rows if e["action"] == "login" and e["outcome"] == "denied"]
    assert failed and failed[0]["address"] == "127.0.0.1" and "not valid on this server" in failed[0]["detail"]["message"]
    assert all(e["address"] in ("127.0.0.1", "local") for e in rows)
    assert "phx_" not in json.dumps(rows), "no token in the audit log"
    refused = bob.run("events")
    assert refused.returncode == 2 and "only project admins and server admins may read the audit log" in refused.stderr
    alice.run("server", "project", "member", "role", "nlp", "carol", "admin")
    theirs = events(carol)
    assert theirs and {e["project"] for e in theirs} == {"nlp"}, "a project admin reads their project's events only"
    table = alice.run("events", "--limit", "5").stdout.splitlines()
    assert table[0].split() == ["WHEN", "USER", "FROM", "ACTION", "TARGET", "PROJECT", "OUTCOME"] and len(table) == 6


def test_phalanx_server_project_commands_work_on_the_store_directly(tmp_path):
    srv = new_server(tmp_path / "srv")
    srv.root.mkdir()
    assert srv.admin("project", "add", "ops").returncode == 0
    srv.add_user("dora")
    assert srv.admin("project", "member", "add", "ops", "dora", "--role", "admin").returncode == 0
    listed = json.loads(srv.admin("project", "list", "--json").stdout)
    assert {p["name"] for p in listed} == {"default", "ops"}
    members = srv.admin("project", "member", "list", "ops").stdout.split()
    assert members[:3] == ["USER", "ROLE", "ADDED"] and "dora" in members and "admin" in members
    assert cli(["events", "--json"], srv.env).returncode == 0
    assert Path(srv.home, "phalanx.db").exists()
