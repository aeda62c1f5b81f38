"""Issue 22's "Done when": a second person, given only a URL and a token, logs in and runs the
README's own command unchanged; the first person sees that job in their ``ps`` and on the
dashboard. And the README's command still works for one person with no server at all.

Everything real: a ``phalanx server`` process, ``phalanx`` CLI processes of two people with
their own config directory and home, the README's DDP example (2 ranks, torchrun, gloo).
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest

from tests.conftest import EXAMPLES
from tests.server.conftest import Person

pytestmark = [pytest.mark.local]

README = ["run", "-n", "2", "examples/train_ddp.py", "--epochs", "2"]


def test_a_second_person_with_a_url_and_a_token_runs_the_readme_and_the_first_sees_it(server, tmp_path):
    alice_token = server.add_user("alice", admin=True)
    server.start()
    token = server.add_user("bob")  # what the admin hands over, with the URL
    alice, bob = Person("alice", tmp_path / "alice", alice_token), Person("bob", tmp_path / "bob", token)
    for person in (alice, bob):
        (person.root / "project").mkdir(parents=True)
        shutil.copytree(EXAMPLES, person.root / "project" / "examples")
    assert alice.login(server.url).returncode == 0

    logged = bob.login(server.url)
    assert logged.returncode == 0, logged.stderr
    assert logged.stdout.startswith(f"logged in to {server.url} as bob;")
    ran = bob.run(*README, cwd=bob.root / "project", timeout=400)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "[0] epoch=2 step=40 loss=" in ran.stdout, "the ranks' output, prefixed, as it was written"
    started = next(line for line in ran.stderr.splitlines() if " started: " in line)
    job = started.split()[2]
    assert f"phalanx: job {job} (train_ddp) succeeded in " in ran.stderr
    assert not (bob.root / "home" / "phalanx.db").exists(), "nothing went to bob's own store"

    seen = alice.run("ps", "--all", "--json")
    assert seen.returncode == 0, seen.stderr
    rows = {r["id"]: r for r in json.loads(seen.stdout)}
    assert rows[job]["user_name"] == "bob" and rows[job]["state"] == "SUCCEEDED"
    assert job in alice.run("ps", "--all", "--user", "bob").stdout
    assert job not in alice.run("ps", "--all", "--mine").stdout

    secret = server.env.get("PGPASSWORD")
    if secret:  # the store is PostgreSQL: its password is in no output, log or job file
        said = ran.stdout + ran.stderr + seen.stdout + alice.run("status", job).stdout + server.log.read_text()
        assert secret not in said
        assert all(secret not in p.read_text(errors="replace") for p in server.home.rglob("*") if p.is_file())

    # The dashboard, as alice (her token in a bearer header, as a script would): bob's job listed.
    request = urllib.request.Request(f"{server.url}/api/jobs?user=bob", headers={"Authorization": f"Bearer {alice_token}"})
    listed = json.loads(urllib.request.urlopen(request, timeout=30).read())
    assert [r["id"] for r in listed] == [job] and listed[0]["user_name"] == "bob"

    # One person, no server, no PostgreSQL: the README's command on this machine's own store.
    assert bob.run("logout").stdout.strip() == f"logged out of {server.url}"
    local = bob.run(*README, cwd=bob.root / "project", timeout=400)
    assert local.returncode == 0, local.stderr
    assert (bob.root / "home" / "phalanx.db").exists()
    mine = json.loads(bob.run("ps", "--all", "--json").stdout)
    assert len(mine) == 1 and mine[0]["id"] != job, "the local store has bob's local job only"
    assert local.stdout == ran.stdout, "the same command prints the same, with a server or without"
    assert _words(local.stderr, mine[0]["id"]) == _words(ran.stderr, job)


def _words(stderr: str, job: str) -> list[str]:
    """phalanx's own lines without what differs between two runs: the id, the paths, the time."""
    import re

    out = []
    for line in stderr.splitlines():
        line = line.replace(job, "JOB")
        line = re.sub(r"\(in /\S+\)", "(in DIR)", line)
        out.append(re.sub(r"in [0-9.]+s$", "in TIME", line))
    return out
