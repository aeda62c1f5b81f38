"""The dashboard's JSON API and pages through an in-process client, over real job directories."""

from __future__ import annotations

import json
import os
import time

import pytest

from phalanx.core.paths import JobPaths
from phalanx.store import Store

starlette_testclient = pytest.importorskip("starlette.testclient")


def client(token: str | None = None, check_host: bool = True, **kwargs):
    from phalanx.web.app import create_app

    return starlette_testclient.TestClient(create_app(token=token, check_host=check_host), base_url="http://127.0.0.1:8000", **kwargs)


def test_jobs_list_shows_live_states(demo_env):
    jobs = client().get("/api/jobs").json()
    states = {j["id"]: j["state"] for j in jobs}
    assert states == {demo_env.ok: "SUCCEEDED", demo_env.failed: "FAILED"}
    assert {j["world_size"] for j in jobs} == {2}


def test_jobs_list_pages_by_cursor(demo_env):
    c = client()
    first = c.get("/api/jobs", params={"limit": 1})
    assert len(first.json()) == 1 and first.headers["X-Next-Page"]
    second = c.get("/api/jobs", params={"limit": 1, "after": first.headers["X-Next-Page"]})
    assert "X-Next-Page" not in second.headers, "two jobs: the second page is the last"
    ids = [j["id"] for j in first.json() + second.json()]
    assert ids == [j["id"] for j in c.get("/api/jobs").json()] and len(set(ids)) == 2
    assert c.get("/api/jobs", params={"after": "junk"}).status_code == 400


def test_job_detail_has_ranks_attempts_and_root_cause(demo_env):
    c = client()
    ok = c.get(f"/api/jobs/{demo_env.ok}").json()
    assert [(r["rank"], r["state"]) for r in ok["ranks"]] == [(0, "succeeded"), (1, "succeeded")]
    assert ok["attempts"][0]["attempt"] == 0 and ok["attempts"][0]["exitcode"] == 0
    assert ok["attempts"][0]["start"] <= ok["attempts"][0]["end"]
    assert ok["root_cause"] is None and ok["terminal"] is True
    failed = c.get("/api/jobs/broken").json()  # names resolve like on the CLI
    assert failed["id"] == demo_env.failed
    cause = failed["root_cause"]
    assert cause["rank"] == 1 and cause["type"] == "RuntimeError" and "injected failure at step 3" in cause["message"]
    assert {r["rank"]: r["state"] for r in failed["ranks"]}[1] == "failed"


def test_metrics_are_series_by_step(demo_env):
    data = client().get(f"/api/jobs/{demo_env.ok}/metrics", params={"rank": 0}).json()
    (loss,) = data["metrics"]["loss"]
    assert loss["x_kind"] == "step" and loss["x"] == list(range(1, 41)) and loss["count"] == 40
    log = (JobPaths(demo_env.home / "jobs" / demo_env.ok).rank_log(0, 0)).read_text()
    assert f"step=40 loss={loss['y'][-1]:.4f}" in log
    assert data["metrics"]["final"][0]["count"] == 1
    thin = client().get(f"/api/jobs/{demo_env.ok}/metrics", params={"rank": 0, "points": 10}).json()
    xs = thin["metrics"]["loss"][0]["x"]
    assert len(xs) <= 11 and xs[0] == 1 and xs[-1] == 40  # thinned, the last point kept


def test_resources_per_node_and_rank(demo_env):
    data = client().get(f"/api/jobs/{demo_env.ok}/resources").json()
    node = data["nodes"]["0"]
    assert len(node["time"]) >= 5 and node["mem_total"] > 0
    assert set(node["ranks"]) == {"0", "1"}
    assert max(v for v in node["ranks"]["0"]["rss"] if v) > 10 * 2**20  # a torch process
    assert node["gpus"] == {}


def test_logs_tail_follow_and_search(demo_env):
    c = client()
    url = f"/api/jobs/{demo_env.ok}/logs"
    first = c.get(url, params={"rank": 0}).json()
    assert first["offset"] == 0 and "epoch=1 step=1 " in first["text"] and first["next"] == first["size"]
    again = c.get(url, params={"rank": 0, "offset": first["next"]}).json()
    assert again["text"] == "" and again["next"] == first["next"]
    tail = c.get(url, params={"rank": 0, "limit": 100}).json()
    assert tail["offset"] > 0 and tail["text"].endswith("done\n") and "\n" not in tail["text"][:1]
    found = c.get(url, params={"rank": 0, "q": "STEP=12 "}).json()
    assert [m["line"] for m in found["matches"]] == [12] and found["matches"][0]["text"].startswith("epoch=1 step=12 ")


def test_pages_render_and_assets_are_local(demo_env):
    c = client()
    for path in ("/", f"/jobs/{demo_env.ok}", f"/compare?jobs={demo_env.ok},{demo_env.failed}"):
        page = c.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/static/plotly.min.js" in page.text and "https://" not in page.text and "cdn" not in page.text.lower()
    js = c.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000 and b"plotly" in js.content[:2000].lower()
    assert c.get("/static/app.js").status_code == 200 and c.get("/static/app.css").status_code == 200
    compare = c.get("/api/compare", params={"jobs": f"{demo_env.ok},{demo_env.failed}"}).json()
    assert [t["job"] for t in compare["metrics"]["loss"]] == [demo_env.ok, demo_env.failed]


def test_errors_are_json_with_status(demo_env):
    c = client()
    assert c.get("/api/jobs/nosuchjob").status_code == 404
    assert c.get("/jobs/nosuchjob").status_code == 404
    bad = c.get(f"/api/jobs/{demo_env.ok}/logs", params={"rank": "1; rm -rf /"})
    assert bad.status_code == 400 and "whole number" in bad.json()["error"]
    assert c.get(f"/api/jobs/{demo_env.ok}/logs", params={"rank": -1}).status_code == 400
    assert c.get(f"/api/jobs/{demo_env.ok}/logs", params={"rank": 7}).json()["exists"] is False
    assert c.get("/api/compare").status_code == 400


# -- security ------------------------------------------------------------------------------------


def _fake_job(home, job_id: str) -> JobPaths:
    """A job record whose directory holds what an attacker could plant: symlinks out of it."""
    paths = JobPaths(home / "jobs" / job_id)
    paths.rank_dir(0, 0).mkdir(parents=True)
    store = Store(home / "phalanx.db")
    store.insert_job(id=job_id, name="evil", backend="local", nnodes=1, nproc_per_node=1, command="x.py",
                     job_dir=str(paths.root), spec_json="{}", state="SUCCEEDED", created_at=time.time())
    store.close()
    return paths


def test_never_serves_files_outside_the_job_directory(demo_env, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    paths = _fake_job(demo_env.home, "evil0001")
    os.symlink(secret, paths.rank_log(0, 0))
    os.symlink(secret, paths.rank_metrics(0, 0))
    c = client()
    for params in ({"rank": 0}, {"rank": 0, "q": "SECRET"}):
        r = c.get("/api/jobs/evil0001/logs", params=params)
        assert r.status_code == 403 and "SECRET" not in r.text
    assert c.get("/api/jobs/evil0001/metrics").status_code == 403
    for path in ("/static/../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "/api/jobs/..%2F..%2Fetc/logs",
                 "/static/..%2fapp.py", "/api/jobs/%2e%2e/logs?rank=0"):
        r = c.get(path)
        assert r.status_code in (400, 404), path
        assert "root:" not in r.text and "import" not in r.text


def test_token_is_required_on_every_request(demo_env):
    c = client(token="s3cret")
    for path in ("/", "/api/jobs", f"/api/jobs/{demo_env.ok}/logs?rank=0", "/static/plotly.min.js", "/static/app.js"):
        r = c.get(path)
        assert r.status_code == 401, path
        assert "epoch=" not in r.text
    assert c.get("/api/jobs?token=wrong").status_code == 401
    assert c.get("/api/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/api/jobs?token=s3cret").status_code == 200
    assert c.get("/api/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    page = c.get(f"/jobs/{demo_env.ok}?token=s3cret").text
    # the page's own asset and API requests carry the token
    assert "/static/plotly.min.js?token=s3cret" in page and json.dumps("s3cret") in page


def test_loopback_server_rejects_foreign_host_headers(demo_env):
    """DNS rebinding: a web page on evil.example resolving to 127.0.0.1 must not read jobs."""
    c = client()
    assert c.get("/api/jobs", headers={"Host": "evil.example"}).status_code == 400
    assert c.get("/api/jobs", headers={"Host": "evil.example:8000"}).status_code == 400
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
        assert c.get("/api/jobs", headers={"Host": host}).status_code == 200, host


def test_serving_beyond_loopback_needs_a_token():
    from phalanx.errors import UsageError
    from phalanx.web.server import is_loopback, serve

    with pytest.raises(UsageError, match="--token"):
        serve(host="0.0.0.0", port=0)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")


def test_ui_command_refuses_public_address_without_token(demo_env):
    from typer.testing import CliRunner

    import typer
    from phalanx.cli.observe import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["ui", "--host", "0.0.0.0"])
    assert result.exit_code != 0
    assert "--token" in str(result.exception)
