"""Projects as a person sees them on a team server's dashboard: a real headless Chromium
(``tests/web/cdp.py``) against a real ``phalanx server``. Bob is a viewer of project vision and a
member of project nlp: the header's switcher offers those two with his role in each, and narrows
the job list to the one picked; on carol's job in vision he is offered no button, and a POST
forged with his session's CSRF token is refused as a viewer's; on his own job in nlp he is
offered Stop. Nobody's job stopped but by its owner."""

from __future__ import annotations

import json
import re

import pytest

from tests.server.conftest import Person
from tests.web.cdp import CHROMIUM, Browser

pytestmark = [pytest.mark.local, pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")]

RENDERED = "!!(document.body && document.body.dataset.rendered)"
SLOW = "import time\nprint('working', flush=True)\nfor i in range(1200):\n    time.sleep(0.1)\n"


def switch_to(b: Browser, project: str, job: str) -> None:
    """Pick ``project`` in the header's switcher (once it is filled) and wait for its one job,
    ``job`` (the page reloads: the list before it may have one row too)."""
    b.wait_for(RENDERED + " && document.body.dataset.projects === 'ready'", what="the switcher filled")
    b.evaluate(f"const s = document.getElementById('project-switch'); s.value = {json.dumps(project)}; "
               "s.dispatchEvent(new Event('change'))")
    b.wait_for(RENDERED + f" && document.getElementById('project-switch').value === {json.dumps(project)} && "
               "document.querySelectorAll('#list-body tr').length === 1 && "
               f"document.getElementById('list-body').textContent.includes({json.dumps(job)})", what=f"{project}'s jobs only")


def test_the_project_switcher_a_viewer_offered_no_stop_and_a_forged_post_refused(server, tmp_path):
    people = {name: Person(name, tmp_path / name, server.add_user(name, admin=name == "alice"))
              for name in ("alice", "bob", "carol")}
    server.start()
    for person in people.values():
        (person.root / "p").mkdir(parents=True)
        (person.root / "p" / "slow.py").write_text(SLOW)
        assert person.login(server.url).returncode == 0
    alice, bob, carol = people["alice"], people["bob"], people["carol"]
    for args in (("add", "vision"), ("add", "nlp"), ("member", "add", "vision", "bob", "--role", "viewer"),
                 ("member", "add", "vision", "carol"), ("member", "add", "nlp", "bob")):
        done = alice.run("server", "project", *args)
        assert done.returncode == 0, done.stderr
    hers = carol.run("run", "-d", "--project", "vision", "--name", "hers", "slow.py", cwd=carol.root / "p").stdout.strip()
    his = bob.run("run", "-d", "--project", "nlp", "--name", "his", "slow.py", cwd=bob.root / "p").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", hers) and re.fullmatch(r"[0-9a-f]{8}", his)
    try:
        with Browser() as b:
            b.open(server.url + "/")
            b.wait_for("location.pathname === '/login'", what="the login page")
            b.evaluate(f"document.getElementById('token').value = {json.dumps(bob.token)}; "
                       "document.getElementById('login').submit()")
            b.wait_for(RENDERED + " && document.body.dataset.projects === 'ready'", what="the jobs list and switcher")
            offered = b.evaluate("[...document.querySelectorAll('#project-switch option')].map(o => o.textContent)")
            assert sorted(offered) == sorted(["all of mine", "default (member)", "nlp (member)", "vision (viewer)"])
            b.wait_for("document.querySelectorAll('#list-body tr').length === 2", what="both projects' jobs")
            assert hers in b.text("#list-body") and his in b.text("#list-body")
            assert b.evaluate("document.getElementById('nav-events').hidden"), "no audit log for a non-admin"

            switch_to(b, "vision", hers)
            assert hers in b.text("#list-body") and his not in b.text("#list-body")

            b.open(f"{server.url}/jobs/{hers}")
            b.wait_for(RENDERED + " && document.getElementById('log').textContent.includes('working')",
                       what="her job's page, its log")
            assert b.evaluate("document.querySelectorAll('#actions button').length") == 0, "a viewer is offered nothing"
            csrf = b.evaluate("document.querySelector('meta[name=phalanx-csrf]').content")
            forged = b.evaluate(f"fetch('/api/jobs/{hers}/stop', {{method: 'POST', headers: {{'X-Phalanx-CSRF': "
                                f"{json.dumps(csrf)}}}}}).then(async r => [r.status, await r.text()])")
            assert forged[0] == 403 and "where you are a viewer: viewers may only look, not stop" in forged[1]

            b.open(f"{server.url}/")
            switch_to(b, "nlp", his)
            assert his in b.text("#list-body") and hers not in b.text("#list-body")
            b.open(f"{server.url}/jobs/{his}")
            b.wait_for("!!document.querySelector('#actions .act-stop')", what="his own job's Stop button")
        states = {r["id"]: r["state"] for r in json.loads(alice.run("ps", "--all", "--json").stdout)}
        assert states == {his: "RUNNING", hers: "RUNNING"}, "the forged stop stopped nothing"
        denied = [e for e in json.loads(alice.run("events", "--json", "--user", "bob").stdout)
                  if e["action"] == "stop" and e["outcome"] == "denied"]
        assert denied and denied[0]["target"] == hers and denied[0]["project"] == "vision"
    finally:
        for person, job in ((carol, hers), (bob, his)):
            person.run("stop", "--now", job)
