"""The server's small parts, in process: request bodies checked against a schema with one-line
errors, errors that travel over HTTP as their own class, Prometheus labels that stay few, the
login file (mode 0600; the environment wins), and the API in process (Starlette's test client)
with the real store: who may see and act, the dashboard's login and CSRF rules."""

from __future__ import annotations

import json
import os

import pytest

from phalanx import errors
from phalanx.api import wire
from phalanx.server import schema


def test_bodies_are_checked_field_by_field_in_one_line():
    shape = schema.obj(("spec",), spec=schema.obj(("n",), n={"type": "integer", "min": 1}), tags={"type": "array", "max": 2})
    assert schema.check({"spec": {"n": 2}}, shape) == {"spec": {"n": 2}}
    cases = [({}, "request: 'spec' is missing"), ({"spec": {"n": "two"}}, 'request.spec.n: expected an integer, not "two"'),
             ({"spec": {"n": True}}, "request.spec.n: expected an integer, not a boolean"),
             ({"spec": {"n": 0}}, "request.spec.n: must be at least 1, not 0"),
             ({"spec": {"n": 1}, "tags": [1, 2, 3]}, "request.tags: longer than 2"),
             ({"spec": {"n": 1}, "x": 1}, "request: unknown field 'x'"), ([], "request: expected an object, not a list")]
    for body, message in cases:
        with pytest.raises(errors.UsageError) as caught:
            schema.check(body, shape)
        assert caught.value.message == message and "\n" not in str(caught.value)


def test_an_error_travels_as_its_own_class_with_its_words_and_exit_code():
    for exc, status in ((errors.NotAllowed("job 1 belongs to bob; only bob or an admin may stop it"), 403),
                        (errors.JobNotFound("no job 'x'", "list jobs with: phalanx ps --all"), 404),
                        (errors.NotAuthenticated("no API token given", "log in"), 401), (errors.TooLarge("big"), 413),
                        (errors.PhalanxError("job 1 did not stop within 3s", "try again"), 409)):
        assert wire.status_of(exc) == status
        body = json.loads(json.dumps(wire.error_body(exc)))
        with pytest.raises(type(exc)) as caught:
            wire.raise_error(body, status)
        assert str(caught.value) == str(exc) and caught.value.exit_code == exc.exit_code
    timeout = {"type": "WaitTimeout", "message": "job 1 still RUNNING after 1s", "hint": None, "exit_code": 124}
    with pytest.raises(errors.PhalanxError) as caught:
        wire.raise_error(timeout, 409)
    assert caught.value.exit_code == 124


def test_metric_labels_name_routes_not_jobs():
    from phalanx.server.metrics import Requests, route_of

    assert route_of("/api/v1/jobs/3f2a1b2c/logs") == "/api/v1/jobs/{ref}/logs"
    assert route_of("/api/v1/objects/" + "a" * 64) == "/api/v1/objects/{ref}"
    assert route_of("/jobs/abc") == "/jobs/{ref}" and route_of("/api/v1/jobs") == "/api/v1/jobs"
    requests = Requests()
    requests.observe("GET", "/api/v1/jobs/a/logs", 200, 0.02)
    requests.observe("GET", "/api/v1/jobs/b/logs", 404, 3.0)
    text = "\n".join(requests.lines())
    assert 'phalanx_http_request_duration_seconds_count{method="GET",route="/api/v1/jobs/{ref}/logs"} 2' in text
    assert 'le="0.025"} 1' in text and 'le="+Inf"} 2' in text and 'phalanx_http_requests_total{code="404"} 1' in text


def test_the_login_file_is_private_and_the_environment_wins(tmp_path, monkeypatch):
    from phalanx.remote import login

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("PHALANX_SERVER", raising=False)
    monkeypatch.delenv("PHALANX_TOKEN", raising=False)
    assert login.current() is None
    saved = login.save(login.Login("https://a.example:8443", "phx_tok", None, "alice"))
    assert saved.stat().st_mode & 0o777 == 0o600 and saved.parent.stat().st_mode & 0o777 == 0o700
    assert login.current() == login.Login("https://a.example:8443", "phx_tok", None, "alice")
    monkeypatch.setenv("PHALANX_SERVER", "https://a.example:8443/")
    assert login.current().token == "phx_tok", "the saved token of that very server"
    monkeypatch.setenv("PHALANX_TOKEN", "phx_ci")
    assert (login.current().url, login.current().token, login.current().source) == ("https://a.example:8443", "phx_ci", "environment")
    monkeypatch.setenv("PHALANX_SERVER", "https://b.example")
    monkeypatch.delenv("PHALANX_TOKEN")
    assert login.current().token is None, "another server's token is never sent"
    assert login.forget().url == "https://a.example:8443" and not saved.exists()


@pytest.fixture
def api(tmp_path, monkeypatch):
    """The server's application in process on a fresh store, with alice (admin) and bob."""
    from starlette.testclient import TestClient

    from phalanx.api import query, users
    from phalanx.server.app import create_app

    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    store = query.open_store()
    tokens = {name: users.add_user(store, name, admin=name == "alice")[1] for name in ("alice", "bob")}
    client = TestClient(create_app(), base_url="http://127.0.0.1:8080")
    return client, tokens, store


def _job(store, job_id: str, user: str, state: str = "SUCCEEDED") -> None:
    store.insert_job(id=job_id, name="t", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                     job_dir=f"/nonexistent/{job_id}", spec_json=json.dumps({"entrypoint": {"kind": "script", "target": "t.py"}}),
                     state=state, user_name=user)


def test_the_api_in_process_who_sees_and_who_acts(api):
    client, tokens, store = api
    _job(store, "aaaa0001", "alice")
    _job(store, "bbbb0001", "bob")
    bearer = {"Authorization": f"Bearer {tokens['bob']}"}
    assert client.get("/api/v1/whoami").status_code == 401
    assert client.get("/api/v1/whoami", headers=bearer).json()["result"]["user"] == "bob"
    lines = [json.loads(x) for x in client.get("/api/v1/jobs?all=1", headers=bearer).text.splitlines() if x.strip()]
    assert {line["row"]["id"] for line in lines if "row" in line} == {"aaaa0001", "bbbb0001"}
    mine = [json.loads(x) for x in client.get("/api/v1/jobs?mine=1", headers=bearer).text.splitlines() if x.strip()]
    assert [line["row"]["id"] for line in mine if "row" in line] == ["bbbb0001"]
    refused = client.delete("/api/v1/jobs?ref=aaaa0001", headers=bearer)
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == "job aaaa0001 belongs to alice; only alice or an admin may remove it"
    assert client.post("/api/v1/prune", json={"older_than": "1d"}, headers=bearer).status_code == 403
    assert client.get("/api/v1/jobs/nope0000", headers=bearer).status_code == 404
    view = client.get("/api/jobs/aaaa0001", headers=bearer).json()
    assert view["actions"] == [], "the page offers bob nothing on alice's job"
    assert client.get("/api/jobs/bbbb0001", headers=bearer).json()["actions"] == ["resume", "retry", "delete"] or \
        client.get("/api/jobs/bbbb0001", headers=bearer).json()["actions"] == ["retry", "delete"]
    assert "phalanx_jobs{state=\"SUCCEEDED\"} 2" in client.get("/metrics").text
    assert client.get("/healthz").text == "ok\n"


def test_the_dashboard_login_cookie_and_csrf(api):
    client, tokens, store = api
    _job(store, "aaaa0002", "alice", state="RUNNING")
    page = client.get("/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login?next=%2F"
    origin = {"Origin": "http://127.0.0.1:8080"}
    wrong = client.post("/login", content=f"token=phx_0123456789ab_{'x' * 43}&next=/",
                        headers={**origin, "Content-Type": "application/x-www-form-urlencoded"})
    assert wrong.status_code == 401 and "not valid on this server" in wrong.text
    forged = client.post("/login", content=f"token={tokens['bob']}", headers={"Origin": "http://evil.example",
                                                                           "Content-Type": "application/x-www-form-urlencoded"})
    assert forged.status_code == 403
    ok = client.post("/login", content=f"token={tokens['bob']}&next=/jobs/aaaa0002", follow_redirects=False,
                     headers={**origin, "Content-Type": "application/x-www-form-urlencoded"})
    assert ok.status_code == 303 and ok.headers["location"] == "/jobs/aaaa0002"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/" in cookie
    page = client.get("/jobs/aaaa0002")
    assert page.status_code == 200 and ">bob</span>" in page.text and "log out" in page.text
    csrf = page.text.split('name="phalanx-csrf" content="')[1].split('"')[0]
    no_csrf = client.post("/api/jobs/aaaa0002/stop", headers=origin)
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
    not_his = client.post("/api/jobs/aaaa0002/stop", headers={**origin, "X-Phalanx-CSRF": csrf})
    assert not_his.status_code == 403 and "belongs to alice" in not_his.json()["error"]
    out = client.post("/logout", content=f"csrf={csrf}", follow_redirects=False,
                      headers={**origin, "Content-Type": "application/x-www-form-urlencoded"})
    assert out.status_code == 303 and 'phalanx_token=""' in out.headers["set-cookie"]
    assert os.environ.get("PHALANX_HOME")


def test_the_job_page_follows_a_log_over_one_stream_of_events(api, tmp_path):
    """``/api/jobs/ID/logs/stream``: what is in the log, each write as it comes (the file
    changing wakes the server), then ``end`` once the job has ended; one request throughout."""
    import threading
    import time

    import psutil

    from phalanx.core.state import JobState

    client, tokens, store = api
    job_dir = tmp_path / "jobdir"
    log = job_dir / "attempt_0" / "rank_0" / "output.log"
    log.parent.mkdir(parents=True)
    log.write_text("first\n")
    store.insert_job(id="cccc0001", name="t", backend="local", nnodes=1, nproc_per_node=1, command="t.py",
                     job_dir=str(job_dir), spec_json=json.dumps({"entrypoint": {"kind": "script", "target": "t.py"}}),
                     state="RUNNING", user_name="bob", supervisor_pid=os.getpid(),
                     supervisor_started=psutil.Process().create_time())

    def later() -> None:
        time.sleep(0.5)
        with open(log, "a") as fh:
            fh.write("second\n")
        time.sleep(0.5)
        store.transition("cccc0001", JobState.SUCCEEDED)

    threading.Thread(target=later, daemon=True).start()
    pieces = []
    with client.stream("GET", "/api/jobs/cccc0001/logs/stream?rank=0&offset=0",
                       headers={"Authorization": f"Bearer {tokens['bob']}"}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("data: "):
                pieces.append(json.loads(line[6:]))
                if pieces[-1].get("end"):
                    break
    texts = "".join(p.get("text", "") for p in pieces)
    assert texts == "first\nsecond\n" and pieces[-1] == {"end": True, "state": "SUCCEEDED"}


def test_a_stream_delivers_every_line_in_order_and_a_departed_client_ends_the_call():
    """``server.stream``: more lines than the queue's room all arrive, in order, in fewer chunks
    than lines (what waits goes out together); a client that stops reading ends the call's thread
    with ``Disconnected`` instead of leaving it blocked."""
    import asyncio
    import threading

    from phalanx.server.stream import Disconnected, stream

    ended: list[str] = []
    leaving = threading.Event()

    def many(sink):
        for n in range(500):
            sink.send({"row": n})
        return "done"

    def forever(sink):
        try:
            n = 0
            while True:
                sink.send({"row": n})
                n += 1
        except Disconnected:
            ended.append("disconnected")
            leaving.set()
            raise

    async def read_all():
        return [chunk async for chunk in stream(many)]

    async def read_some():
        lines = stream(forever)
        got = [await lines.__anext__() for _ in range(3)]
        await lines.aclose()  # the client goes away
        await asyncio.get_running_loop().run_in_executor(None, leaving.wait, 10.0)
        return got

    chunks = asyncio.run(read_all())
    lines = [json.loads(line) for chunk in chunks for line in chunk.splitlines() if line]
    assert [one["row"] for one in lines[:-1]] == list(range(500))
    assert lines[-1] == {"result": "done"}
    assert len(chunks) < len(lines)
    assert asyncio.run(read_some()) and ended == ["disconnected"]
