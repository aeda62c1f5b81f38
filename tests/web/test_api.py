"""The dashboard's JSON API and pages through an in-process client, over real job directories
(the ``demo`` home: two DDP jobs, a pruned sweep, a tagged job with outputs)."""

from __future__ import annotations

import json
import os
import re
import socket
import time

import pytest

from phalanx.core.paths import JobPaths
from phalanx.store import Store

starlette_testclient = pytest.importorskip("starlette.testclient")
BASE = "http://127.0.0.1:8000"


def client(token: str | None = None, loopback: bool = True, **kwargs):
    from phalanx.web.app import create_app

    return starlette_testclient.TestClient(create_app(token=token, loopback=loopback), base_url=BASE, **kwargs)


def test_jobs_list_shows_live_states(demo_env):
    jobs = client().get("/api/jobs").json()
    states = {j["id"]: j["state"] for j in jobs}
    assert states == {demo_env.ok: "SUCCEEDED", demo_env.failed: "FAILED", demo_env.outputs: "SUCCEEDED"}
    assert all(j["sweep_id"] is None for j in jobs), "a sweep's trials are on the sweeps list, not here"
    ok = next(j for j in jobs if j["id"] == demo_env.ok)
    assert ok["world_size"] == 2 and ok["command_short"].startswith("train_ddp.py --epochs 2")
    assert ok["cpu_hours"] > 0 and ok["gpu_hours"] == 0, "usage is recorded when a job ends"


def test_jobs_list_pages_by_cursor(demo_env):
    c = client()
    seen, after, pages = [], None, 0
    while True:
        r = c.get("/api/jobs", params={"limit": 1, **({"after": after} if after else {})})
        seen += [j["id"] for j in r.json()]
        pages += 1
        after = r.headers.get("X-Next-Page")
        if not after:
            break
    assert pages == 3 and seen == [j["id"] for j in c.get("/api/jobs").json()] and len(set(seen)) == 3
    assert c.get("/api/jobs", params={"after": "junk"}).status_code == 400
    assert c.get("/api/jobs/count").json() == {"count": 3}


@pytest.mark.parametrize("params, expect", [
    ({"state": "failed"}, {"failed"}),
    ({"state": "succeeded,failed"}, {"ok", "failed", "outputs"}),
    ({"state": "active"}, set()),
    ({"name": "dd*"}, {"ok"}),
    ({"name": "broken"}, {"failed"}),
    ({"tag": "team=vision"}, {"outputs"}),
    ({"tag": "stage"}, {"outputs"}),
    ({"tag": "team=audio"}, set()),
    ({"q": "OUTPUTS.PY"}, {"outputs"}),
    ({"backend": "local"}, {"ok", "failed", "outputs"}),
    ({"backend": "slurm"}, set()),
    ({"since": "1h"}, {"ok", "failed", "outputs"}),
    ({"since": "2999-01-01"}, set()),
])
def test_jobs_list_filters(demo_env, params, expect):
    c = client()
    ids = {j["id"] for j in c.get("/api/jobs", params=params).json()}
    assert ids == {getattr(demo_env, name) for name in expect}
    assert c.get("/api/jobs/count", params=params).json()["count"] == len(expect)


def test_metric_columns_and_sorting_by_them(demo_env):
    c = client()
    rows = c.get("/api/jobs", params={"columns": "loss,acc:max", "sort": "loss"}).json()
    # Sorting by a metric lists the jobs that have it, smallest last value first.
    losses = [r["columns"]["loss"] for r in rows]
    assert losses == sorted(losses) and len(rows) == 3
    outputs = next(r for r in rows if r["id"] == demo_env.outputs)
    assert outputs["columns"] == {"loss": 0.2, "acc:max": 0.75}
    assert [r["id"] for r in c.get("/api/jobs", params={"columns": "loss", "sort": "-loss"}).json()] == [r["id"] for r in rows][::-1]
    acc_only = c.get("/api/jobs", params={"sort": "acc:max"}).json()
    assert [r["id"] for r in acc_only] == [demo_env.outputs], "only the outputs job printed acc"
    by_name = [r["name"] for r in c.get("/api/jobs", params={"sort": "name"}).json()]
    assert by_name == sorted(by_name)
    paged = c.get("/api/jobs", params={"sort": "loss", "columns": "loss", "limit": 2})
    rest = c.get("/api/jobs", params={"sort": "loss", "columns": "loss", "limit": 2, "after": paged.headers["X-Next-Page"]})
    assert [r["id"] for r in paged.json() + rest.json()] == [r["id"] for r in rows]


@pytest.mark.parametrize("params, message", [
    ({"columns": "los"}, "no job has a metric 'los'; metrics jobs have: "),
    ({"sort": "nosuch:min"}, "no job has a metric 'nosuch'"),
    ({"columns": "loss:avg"}, "invalid column 'loss:avg'"),
    ({"state": "finishedd"}, "unknown state 'finishedd'"),
    ({"backend": "kubernetess"}, "unknown backend 'kubernetess'"),
    ({"tag": "=x"}, "invalid --tag '=x'"),
    ({"since": "yesterday"}, "invalid --since 'yesterday'"),
    ({"owner": "me"}, "unknown filter 'owner'"),
    ({"limit": "ten"}, "'limit' must be a whole number"),
])
def test_bad_list_input_is_a_400_naming_the_fix(demo_env, params, message):
    r = client().get("/api/jobs", params=params)
    assert r.status_code == 400 and message in r.json()["error"]


def test_meta_lists_what_the_filters_offer(demo_env):
    meta = client().get("/api/meta").json()
    assert "FAILED" in meta["states"] and "local" in meta["backends"]
    assert {"loss", "acc"} <= set(meta["metrics"]) and meta["tag_keys"] == ["stage", "team"]


def test_job_detail_has_ranks_attempts_usage_and_root_cause(demo_env):
    c = client()
    ok = c.get(f"/api/jobs/{demo_env.ok}").json()
    assert [(r["rank"], r["state"]) for r in ok["ranks"]] == [(0, "succeeded"), (1, "succeeded")]
    (attempt,) = ok["attempts"]
    assert attempt["attempt"] == 0 and attempt["exitcode"] == 0 and attempt["outcome"] == "succeeded"
    assert attempt["start"] <= attempt["end"]
    assert ok["root_cause"] is None and ok["terminal"] is True and ok["actions"] == ["retry", "delete"]
    assert ok["usage"]["cpu_hours"] == pytest.approx(2 * ok["usage"]["wall_hours"]) and ok["usage"]["gpu_hours"] == 0
    failed = c.get("/api/jobs/broken").json()  # names resolve like on the CLI
    assert failed["id"] == demo_env.failed and failed["actions"] == ["resume", "retry", "delete"]
    cause = failed["root_cause"]
    assert cause["rank"] == 1 and cause["type"] == "RuntimeError" and "injected failure at step 3" in cause["message"]
    assert failed["attempts"][0]["outcome"] == "failed" and "injected failure" in failed["attempts"][0]["message"]
    assert {r["rank"]: r["state"] for r in failed["ranks"]}[1] == "failed"
    # The view the page and `phalanx status` share: the cause's error as Python prints it, its
    # rank (the log panel opens on it), and rank 0 that only lost its peer, folded in its log.
    assert failed["root_cause_error"] == "RuntimeError: injected failure at step 3" and failed["root_cause_rank"] == 1
    assert [(p["rank"], p["line"]) for p in failed["peer_lost"]] == [(0, "rank 0: lost its peer after rank 1 failed")]
    log = c.get(f"/api/jobs/{demo_env.failed}/logs", params={"rank": 0}).json()
    assert "step=3" in log["text"] and "Traceback" not in log["text"] and log["fold"]["text"].startswith("Traceback")
    assert "Connection closed by peer" in log["fold"]["text"] and log["fold"]["line"] == failed["peer_lost"][0]["line"]
    assert c.get(f"/api/jobs/{demo_env.failed}/logs", params={"rank": 1}).json()["fold"] is None
    assert ok["root_cause_rank"] is None and ok["peer_lost"] == [] and ok["resources_summary"] is None
    assert ok["metrics_note"] is None
    tagged = c.get(f"/api/jobs/{demo_env.outputs}").json()
    assert tagged["tags"] == {"team": "vision", "stage": "eval"}


def test_metrics_are_series_by_step_and_time(demo_env):
    data = client().get(f"/api/jobs/{demo_env.ok}/metrics", params={"rank": 0}).json()
    (loss,) = data["metrics"]["loss"]
    assert loss["x_kind"] == "step" and loss["x"] == list(range(1, 41)) and loss["count"] == 40
    assert len(loss["t"]) == 40 and loss["t"] == sorted(loss["t"]) and loss["t"][-1] - loss["t"][0] > 1, "read while it ran"
    log = (JobPaths(demo_env.home / "jobs" / demo_env.ok).rank_log(0, 0)).read_text()
    assert f"step=40 loss={loss['y'][-1]:.4f}" in log
    assert data["metrics"]["final"][0]["count"] == 1
    thin = client().get(f"/api/jobs/{demo_env.ok}/metrics", params={"rank": 0, "points": 10}).json()
    xs = thin["metrics"]["loss"][0]["x"]
    assert len(xs) <= 11 and xs[0] == 1 and xs[-1] == 40  # thinned, the last point kept


def test_resources_stay_after_the_job_ended(demo_env):
    data = client().get(f"/api/jobs/{demo_env.ok}/resources").json()
    node = data["nodes"]["0"]
    assert len(node["time"]) >= 5 and node["mem_total"] > 0 and data["starts"][0]["attempt"] == 0
    assert set(node["ranks"]) == {"0", "1"}
    assert max(v for v in node["ranks"]["0"]["rss"] if v) > 10 * 2**20  # a torch process
    assert node["gpus"] == {} and any(v is not None for v in node["net_recv_rate"])
    # A job shorter than the sampling interval still has a sample (the first comes within 1 s).
    short = client().get(f"/api/jobs/{demo_env.outputs}/resources").json()
    assert short["nodes"]["0"]["time"], "a job of well under 5 s has its resource sample"


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


def test_sweeps_list_and_a_sweeps_trial_table(demo_env):
    c = client()
    (sweep,) = c.get("/api/sweeps").json()
    assert sweep["id"] == demo_env.sweep and sweep["progress_text"].startswith("4/4 done, 2 pruned, best loss=0.125 (trial 0)")
    assert sweep["best_trial"] == 0 and sweep["cpu_hours"] > 0
    detail = c.get(f"/api/sweeps/{demo_env.sweep}").json()
    table = detail["table"]
    assert table["params"] == ["lr", "width"] and table["objective"] == "loss" and "acc" in table["metrics"]
    rows = table["rows"]
    assert [r["trial"] for r in rows] == [0, 1, 2, 3] and rows[0]["best"] and not any(r["best"] for r in rows[1:])
    assert rows[0]["objective"] == pytest.approx(0.125) and rows[1]["objective"] == pytest.approx(0.25)
    for pruned in rows[2:]:
        assert pruned["state"] == "PRUNED" and pruned["objective"] is None and pruned["last_value"] > 1
        assert pruned["pruned"]["step"] >= 1 and "median" in pruned["pruned"]["reason"]
    assert detail["actions"] == ["delete"] and detail["settings"]["early_stop"] == "median"
    assert c.get("/api/sweeps", params={"state": "failed"}).json() == []
    assert c.get("/api/sweeps/nosuch").status_code == 404


def test_artifacts_listed_previewed_and_downloaded_never_run_as_pages(demo_env):
    c = client()
    job = demo_env.outputs
    listing = c.get(f"/api/jobs/{job}/artifacts").json()
    kinds = {f["path"]: f["preview"] for f in listing["files"]}
    assert kinds == {"model.bin": None, "plots/curve.png": "image", "report.html": None, "summary.json": "text"}
    url = f"/api/jobs/{job}/artifacts/file"
    image = c.get(url, params={"path": "plots/curve.png"})
    assert image.headers["content-type"] == "image/png" and image.content[:8] == b"\x89PNG\r\n\x1a\n"
    text = c.get(url, params={"path": "summary.json", "preview": 1})
    assert text.headers["content-type"].startswith("text/plain") and json.loads(text.text)["accuracy"] == 0.91
    page = c.get(url, params={"path": "report.html"})
    assert page.headers["content-type"] == "application/octet-stream" and "attachment" in page.headers["content-disposition"]
    assert page.headers["content-security-policy"] == "sandbox"
    download = c.get(url, params={"path": "model.bin", "download": 1})
    assert len(download.content) == 2048 and "attachment" in download.headers["content-disposition"]
    for bad, status in (("../spec.json", 403), ("/etc/passwd", 400), ("plots/../../plan.json", 403), ("nosuch.txt", 403)):
        r = c.get(url, params={"path": bad})
        assert r.status_code == status, bad
        assert "entrypoint" not in r.text and "root:" not in r.text


def test_pages_render_with_local_assets_and_no_inline_script(demo_env):
    c = client()
    for path in ("/", "/?view=sweeps", f"/jobs/{demo_env.ok}", f"/sweeps/{demo_env.sweep}",
                 f"/compare?jobs={demo_env.ok},{demo_env.failed}"):
        page = c.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), path
        assert "/static/plotly.min.js" in page.text and "https://" not in page.text and "cdn" not in page.text.lower()
        assert "script-src 'self'" in page.headers["content-security-policy"] and page.headers["x-frame-options"] == "DENY"
        for tag in re.findall(r"<script[^>]*>", page.text):  # every script is a file, or data
            assert "src=" in tag or 'type="application/json"' in tag, tag
    js = c.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000 and b"plotly" in js.content[:2000].lower()
    for name in ("common.js", "list.js", "job.js", "jobparts.js", "sweep.js", "app.css"):
        assert c.get(f"/static/{name}").status_code == 200, name
    compare = c.get("/api/compare", params={"jobs": f"{demo_env.ok},{demo_env.failed}"}).json()
    assert [t["job"] for t in compare["metrics"]["loss"]] == [demo_env.ok, demo_env.failed]


def test_errors_are_json_with_status(demo_env):
    c = client()
    assert c.get("/api/jobs/nosuchjob").status_code == 404
    missing = c.get("/jobs/nosuchjob")
    assert missing.status_code == 404 and "no job with id or name" in missing.text
    bad = c.get(f"/api/jobs/{demo_env.ok}/logs", params={"rank": "1; rm -rf /"})
    assert bad.status_code == 400 and "whole number" in bad.json()["error"]
    assert c.get(f"/api/jobs/{demo_env.ok}/logs", params={"rank": -1}).status_code == 400
    assert c.get(f"/api/jobs/{demo_env.ok}/logs", params={"rank": 7}).json()["exists"] is False
    assert c.get("/api/compare").status_code == 400


# -- changes: POST only, same origin, CSRF token ------------------------------------------------


def test_a_get_never_changes_anything(demo_env):
    from starlette.routing import Route

    from phalanx.web.app import create_app

    app = create_app().app
    changing = [r for r in app.routes if isinstance(r, Route) and "{action}" in r.path]
    assert changing and all(r.methods == {"POST"} for r in changing)
    c = client()
    for path in (f"/api/jobs/{demo_env.failed}/resume", f"/api/jobs/{demo_env.failed}/delete", f"/api/sweeps/{demo_env.sweep}/delete"):
        assert c.get(path).status_code == 405
    assert c.get(f"/api/jobs/{demo_env.failed}").json()["state"] == "FAILED"


def _csrf(c) -> str:
    return re.search(r'name="phalanx-csrf" content="([^"]+)"', c.get("/").text).group(1)


def test_changes_need_the_pages_csrf_token_and_this_origin(demo_env):
    c = client()
    url = f"/api/jobs/{demo_env.failed}/delete"
    csrf = _csrf(c)
    cases = [
        ({}, "needs an Origin header"),
        ({"Origin": BASE}, "CSRF token is missing"),
        ({"Origin": BASE, "X-Phalanx-CSRF": "forged"}, "CSRF token is missing"),
        ({"Origin": "http://evil.example", "X-Phalanx-CSRF": csrf}, "another site"),
        ({"Referer": "http://evil.example/page", "X-Phalanx-CSRF": csrf}, "another site"),
    ]
    for headers, message in cases:
        r = c.post(url, headers=headers)
        assert r.status_code == 403 and message in r.text, headers
    assert (demo_env.home / "jobs" / demo_env.failed).is_dir(), "nothing was deleted"
    unknown = c.post(f"/api/jobs/{demo_env.failed}/explode", headers={"Origin": BASE, "X-Phalanx-CSRF": csrf})
    assert unknown.status_code == 400 and "unknown action 'explode'" in unknown.json()["error"]
    ended = c.post(f"/api/jobs/{demo_env.ok}/stop", headers={"Origin": BASE, "X-Phalanx-CSRF": csrf})
    assert ended.status_code == 409 and "already ended (SUCCEEDED): there is nothing to stop" in ended.json()["error"]
    trial = Store(demo_env.home / "phalanx.db").trials(demo_env.sweep)[0]
    refused = c.post(f"/api/jobs/{trial.id}/delete", headers={"Origin": BASE, "X-Phalanx-CSRF": csrf})
    assert refused.status_code == 409 and f"remove the whole sweep: phalanx rm {demo_env.sweep}" in refused.json()["error"]


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
    try:
        os.symlink(secret, paths.rank_log(0, 0))
        os.symlink(secret, paths.rank_metrics(0, 0))
        paths.output_dir.mkdir()
        os.symlink(secret, paths.output_dir / "leak.txt")
        c = client()
        for params in ({"rank": 0}, {"rank": 0, "q": "SECRET"}):
            r = c.get("/api/jobs/evil0001/logs", params=params)
            assert r.status_code == 403 and "SECRET" not in r.text
        assert c.get("/api/jobs/evil0001/metrics").status_code == 403
        leak = c.get("/api/jobs/evil0001/artifacts/file", params={"path": "leak.txt"})
        assert leak.status_code == 403 and "SECRET" not in leak.text
        assert [f["path"] for f in c.get("/api/jobs/evil0001/artifacts").json()["files"]] == [], "a symlink is no artifact"
        for path in ("/static/../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "/api/jobs/..%2F..%2Fetc/logs",
                     "/static/..%2fapp.py", "/api/jobs/%2e%2e/logs?rank=0"):
            r = c.get(path)
            assert r.status_code in (400, 404, 405), path
            assert "root:" not in r.text and "import" not in r.text
    finally:
        from phalanx.store.listing import delete_jobs

        delete_jobs(Store(demo_env.home / "phalanx.db"), ["evil0001"])


TOKEN = "tok-" + "0123456789abcdef"


def test_a_token_is_accepted_once_in_the_url_then_kept_in_a_cookie(demo_env):
    c = client(token=TOKEN, follow_redirects=False)
    for path in ("/", "/api/jobs", f"/api/jobs/{demo_env.ok}/logs?rank=0", "/static/plotly.min.js", "/static/common.js"):
        r = c.get(path)
        assert r.status_code == 401, path
        assert "epoch=" not in r.text
    assert c.get("/api/jobs", params={"token": "wrong"}).status_code == 401
    assert c.get("/api/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    first = c.get(f"/jobs/{demo_env.ok}", params={"token": TOKEN, "x": "1"})
    assert first.status_code == 303 and first.headers["location"] == f"/jobs/{demo_env.ok}?x=1", "the token leaves the URL"
    cookie = first.headers["set-cookie"]
    assert f"phalanx_token={TOKEN}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    page = c.get(f"/jobs/{demo_env.ok}", cookies={"phalanx_token": TOKEN})
    assert page.status_code == 200 and TOKEN not in page.text, "the page never carries the token"
    assert c.get("/api/jobs", cookies={"phalanx_token": TOKEN}).status_code == 200
    assert c.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # A script with the bearer token needs no CSRF token (no browser sends that header for a page).
    r = c.post(f"/api/jobs/{demo_env.ok}/stop", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 409


def test_loopback_server_accepts_loopback_names_only(demo_env):
    """DNS rebinding: a web page on evil.example resolving to 127.0.0.1 must not read jobs;
    127.0.0.2 (any of 127/8) is loopback too (issue 17)."""
    c = client()
    assert c.get("/api/jobs", headers={"Host": "evil.example"}).status_code == 400
    assert c.get("/api/jobs", headers={"Host": "evil.example:8000"}).status_code == 400
    assert c.get("/api/jobs", headers={"Host": "10.0.0.1:8000"}).status_code == 400
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "127.0.0.2:8000", "127.1.2.3"):
        assert c.get("/api/jobs", headers={"Host": host}).status_code == 200, host


def test_tokens_and_hosts_of_phalanx_ui():
    from phalanx.errors import UsageError
    from phalanx.web.server import access, is_loopback

    with pytest.raises(UsageError, match="--token is too weak: it has 1 characters, fewer than 16"):
        access("127.0.0.1", "x")
    with pytest.raises(UsageError, match="repeats too few different characters"):
        access("0.0.0.0", "a" * 32)
    with pytest.raises(UsageError, match="cannot resolve --host 'no such host'"):
        access("no such host", None)
    loopback, token = access("0.0.0.0", None)
    assert not loopback and token is not None and len(token) >= 32, "a strong token is made for a public address"
    assert access("0.0.0.0", None)[1] != token
    assert access("127.0.0.2", None) == (True, None) and access("localhost", None) == (True, None)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")


def test_a_name_dns_does_not_know_is_said_so(monkeypatch):
    """Resolution itself failing (DNS answers NXDOMAIN): stood in for by getaddrinfo raising
    what it raises then, so no query leaves this machine."""
    from phalanx.errors import UsageError
    from phalanx.web import guard

    def nxdomain(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(guard.socket, "getaddrinfo", nxdomain)
    with pytest.raises(UsageError, match="cannot resolve --host 'dashboard.example.org'; give an address"):
        guard.resolve("dashboard.example.org")


def test_the_peer_of_a_loopback_connection_is_known_by_its_uid():
    from phalanx.web.guard import peer_uid

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client_sock = socket.create_connection(server.getsockname())
    accepted, peer = server.accept()
    try:
        assert peer_uid(peer, server.getsockname()) == os.getuid()
        assert peer_uid(("127.0.0.1", 1), server.getsockname()) is None, "no such connection"
    finally:
        for s in (accepted, client_sock, server):
            s.close()


def test_ui_command_refuses_a_weak_token_and_an_unresolvable_host(demo_env):
    import typer
    from typer.testing import CliRunner

    from phalanx.cli.observe import register

    app = typer.Typer()
    register(app)
    weak = CliRunner().invoke(app, ["ui", "--token", "abc"])
    assert weak.exit_code != 0 and "too weak" in str(weak.exception)
    lost = CliRunner().invoke(app, ["ui", "--host", "no such host"])
    assert lost.exit_code != 0 and "cannot resolve" in str(lost.exception)
