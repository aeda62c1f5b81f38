"""What a person sees of a team server: a real headless Chromium (``tests/web/cdp.py``) against a
real ``phalanx server``. Bob logs in on the login page with his token, sees everyone's jobs with
who submitted them, filters to his own, stops his own running job from its page, is offered
nothing on alice's, and a forged POST (no CSRF token; or on alice's job) is refused; a page on
another site cannot act with his cookie either."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.server.conftest import Person
from tests.web.cdp import CHROMIUM, Browser

pytestmark = [pytest.mark.local, pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")]

RENDERED = "!!(document.body && document.body.dataset.rendered)"  # safe while a form's answer loads
SLOW = "import time\nprint('working', flush=True)\nfor i in range(1200):\n    time.sleep(0.1)\n"


def test_login_see_everyone_stop_ones_own_and_forged_posts_refused(server, tmp_path):
    alice = Person("alice", tmp_path / "alice", server.add_user("alice", admin=True))
    bob = Person("bob", tmp_path / "bob", server.add_user("bob"))
    server.start()
    for person in (alice, bob):
        (person.root / "p").mkdir(parents=True)
        (person.root / "p" / "slow.py").write_text(SLOW)
        assert person.login(server.url).returncode == 0
    hers = alice.run("run", "-d", "--name", "hers", "slow.py", cwd=alice.root / "p").stdout.strip()
    his = bob.run("run", "-d", "--name", "his", "slow.py", cwd=bob.root / "p").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", hers) and re.fullmatch(r"[0-9a-f]{8}", his)
    try:
        with Browser() as b:
            b.open(server.url + "/")
            b.wait_for("location.pathname === '/login'", what="the login page")
            b.evaluate(f"document.getElementById('token').value = {json.dumps(bob.token[:-3] + 'xyz')}; "
                       "document.getElementById('login').submit()")
            b.wait_for("location.pathname === '/login' && !!document.getElementById('message')", what="a wrong token said")
            assert "not valid on this server" in b.text("#message")
            b.evaluate(f"document.getElementById('token').value = {json.dumps(bob.token)}; "
                       "document.getElementById('login').submit()")
            b.wait_for(RENDERED, what="the jobs list")
            assert b.text("#user") == "bob"
            b.wait_for("document.querySelectorAll('#list-body tr').length === 2", what="everyone's two jobs")
            rows = b.text("#list-body")
            assert hers in rows and his in rows and "alice" in rows and "bob" in rows
            b.evaluate("const m = document.getElementById('f-mine'); m.checked = true; m.dispatchEvent(new Event('change'))")
            b.wait_for("location.search.includes('mine=1') && document.querySelectorAll('#list-body tr').length === 1",
                       what="only his own")
            assert his in b.text("#list-body") and hers not in b.text("#list-body")

            b.open(f"{server.url}/jobs/{hers}")
            b.wait_for(RENDERED)
            assert b.evaluate("document.querySelectorAll('#actions button').length") == 0, "nothing offered on hers"
            csrf = b.evaluate("document.querySelector('meta[name=phalanx-csrf]').content")
            forged = b.evaluate(f"fetch('/api/jobs/{hers}/stop', {{method: 'POST'}}).then(r => r.status)")
            assert forged == 403, "no CSRF token"
            not_his = b.evaluate(f"fetch('/api/jobs/{hers}/stop', {{method: 'POST', headers: {{'X-Phalanx-CSRF': "
                                 f"{json.dumps(csrf)}}}}}).then(async r => [r.status, await r.text()])")
            assert not_his[0] == 403 and f"job {hers} belongs to alice; only alice or an admin may stop it" in not_his[1]

            b.open(f"{server.url}/jobs/{his}")
            b.wait_for("!!document.querySelector('#actions .act-stop')", what="his Stop button")
            b.wait_for("document.getElementById('log').textContent.includes('working')", what="his log, followed")
            b.click("#actions .act-stop")
            b.wait_for("!document.getElementById('modal').hidden", what="the confirmation")
            b.click("#modal-ok")
            b.wait_for("document.getElementById('job-state').textContent === 'CANCELLED'", timeout=90, what="cancelled")

            with _other_site(server.url, hers) as evil:
                b.open(evil)
                b.wait_for("document.title === 'posted'", what="the other site's form sent")
        states = {r["id"]: r["state"] for r in json.loads(alice.run("ps", "--all", "--json").stdout)}
        assert states == {his: "CANCELLED", hers: "RUNNING"}, "only bob's own job stopped"
    finally:
        alice.run("stop", hers)


class _other_site:  # noqa: N801 - a context manager serving a page of another origin
    """A page on another origin whose form posts to the server: the browser sends no SameSite=Strict
    cookie with it, and the server refuses it whatever it carries."""

    def __init__(self, url: str, job: str) -> None:
        page = (f'<html><body><form id="f" method="post" action="{url}/api/jobs/{job}/stop"></form>'
                '<iframe name="t" onload="if (window.sent) document.title = \'posted\'"></iframe></body></html>')
        script = "<script>window.sent = true; document.getElementById('f').target = 't'; document.getElementById('f').submit();</script>"

        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = (page.replace("</body>", script + "</body>")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = HTTPServer(("127.0.0.2", 0), Page)

    def __enter__(self) -> str:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.2:{self.httpd.server_address[1]}/"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
