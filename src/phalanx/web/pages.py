"""HTML shells of the dashboard's pages; the scripts in ``static/`` fill them from the JSON API.

No inline script runs (the Content-Security-Policy forbids it): a page's settings travel in a
``<script type="application/json">`` element, which is data, never code.
"""

from __future__ import annotations

import html
import json
from typing import Any

CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


def _config(value: dict[str, Any]) -> str:
    return html.escape(json.dumps(value), quote=False).replace("</", "<\\/")


def _layout(title: str, body: str, config: dict[str, Any], csrf: str, scripts: tuple[str, ...], active: str = "",
            user: str | None = None) -> str:
    tags = "\n".join(f'<script src="/static/{name}" defer></script>' for name in ("plotly.min.js", "common.js", *scripts))
    nav = "".join(f'<a href="{href}" class="{"on" if key == active else ""}"{hide}>{label}</a>'
                  for key, href, label, hide in (("jobs", "/", "Jobs", ""), ("sweeps", "/?view=sweeps", "Sweeps", ""),
                                                 ("events", "/events", "Events", ' id="nav-events" hidden')))
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="phalanx-csrf" content="{html.escape(csrf)}">
<title>{html.escape(title)} · phalanx</title>
<link rel="stylesheet" href="/static/app.css">
<script type="application/json" id="phx-config">{_config(config)}</script>
{tags}
</head>
<body>
<header class="top"><a class="brand" href="/">phalanx</a><nav>{nav}</nav><span class="sub">{html.escape(title)}</span>
<span class="grow"></span><label class="project-switch" title="the project this dashboard shows">project
<select id="project-switch"><option value="">all of mine</option></select></label>
<span id="live" class="live" title="refreshing while something runs"></span>{_account(user, csrf)}</header>
<div id="toast" class="toast" hidden></div>
<div id="modal" class="modal" hidden><div class="box"><h3 id="modal-title"></h3><p id="modal-text"></p>
<div class="modal-buttons"><button id="modal-cancel" type="button">Cancel</button><button id="modal-ok" type="button" class="danger"></button></div></div></div>
<main>
{body}
</main>
</body>
</html>
"""


def _account(user: str | None, csrf: str) -> str:
    """A team server's header: who is logged in, and a way out (a POST, with the page's CSRF token)."""
    if user is None:
        return ""
    return (f'<form class="account" method="post" action="/logout"><span id="user">{html.escape(user)}</span> '
            f'<input type="hidden" name="csrf" value="{html.escape(csrf)}"><button id="logout" type="submit" class="link">log out</button></form>')


def list_page(view: str, csrf: str, user: str | None = None) -> str:
    sweeps = view == "sweeps"
    body = f"""
<section class="listing">
  <div class="bar"><h1>{"Sweeps" if sweeps else "Jobs"}</h1><span id="count" class="muted"></span><span class="grow"></span>
    <button id="compare" type="button" {"hidden" if sweeps else ""} disabled>Compare selected</button></div>
  <form id="filters" class="filters" autocomplete="off">
    <input id="f-q" name="q" type="search" placeholder="search id, name, command">
    <select id="f-state" name="state"><option value="">any state</option></select>
    <input id="f-name" name="name" placeholder="name (glob: resnet*)">
    <select id="f-backend" name="backend" {"hidden" if sweeps else ""}><option value="">any backend</option></select>
    <input id="f-user" name="user" placeholder="user" size="10"{"" if user else " hidden"}>
    <label{"" if user else " hidden"}><input id="f-mine" name="mine" type="checkbox" value="1"> mine</label>
    <input id="f-tag" name="tag" placeholder="tag: key=value" list="tag-keys"><datalist id="tag-keys"></datalist>
    <select id="f-since" name="since"><option value="">any time</option><option value="1h">last hour</option>
      <option value="1d">last day</option><option value="7d">last week</option><option value="30d">last 30 days</option></select>
    <span class="cols" {"hidden" if sweeps else ""}><input id="f-col" placeholder="+ metric column (loss, acc:max)" list="metric-names">
      <datalist id="metric-names"></datalist></span>
    <button type="submit">Apply</button><button id="f-clear" type="button" class="link">clear</button>
  </form>
  <div id="error" class="error" hidden></div>
  <div class="table-wrap"><table class="list" id="list"><thead><tr id="list-head"></tr></thead>
    <tbody id="list-body"><tr><td class="muted">loading…</td></tr></tbody></table></div>
  <div class="pager"><button id="prev" type="button" disabled>‹ newer</button><span id="page-no" class="muted"></span>
    <button id="next" type="button" disabled>older ›</button></div>
</section>"""
    return _layout("sweeps" if sweeps else "jobs", body, {"page": "list", "view": view}, csrf, ("list.js",),
                   "sweeps" if sweeps else "jobs", user)


def job_page(job_id: str, name: str, state: str, csrf: str, user: str | None = None) -> str:
    body = f"""
<section id="head" class="head">
  <div class="bar"><h1><span id="job-id">{html.escape(job_id)}</span> <span id="job-name" class="muted">{html.escape(name)}</span>
    <span id="job-state" class="state {html.escape(state)}">{html.escape(state)}</span></h1>
    <span class="grow"></span><span id="actions" class="actions"></span></div>
  <div id="job-facts" class="facts"></div>
</section>
<section id="cause-box" class="cause" hidden><h2>Root cause</h2><div id="cause"></div></section>
<section id="hints-box" class="hints" hidden><h2>Hints</h2><ul id="hints"></ul></section>
<div class="two">
  <section><h2>Topology</h2><div id="topology" class="topology"></div></section>
  <section><h2>Attempts</h2><div id="attempts" class="attempts"></div></section>
</div>
<section>
  <div class="bar"><h2>Metrics</h2><span class="grow"></span>
    <label>x <select id="m-x"><option value="step">step</option><option value="rel">time (relative)</option><option value="wall">time (wall clock)</option></select></label>
    <label>smoothing <input id="m-smooth" type="range" min="0" max="0.99" step="0.01" value="0"> <span id="m-smooth-v">0</span></label>
    <label><input id="m-log" type="checkbox"> log y</label>
    <label>rank <select id="metric-rank"><option value="all">all</option></select></label>
    <form id="overlay"><input id="overlay-job" placeholder="overlay job (id or name)" size="22"><button>Overlay</button></form>
  </div>
  <div id="overlays" class="overlays"></div>
  <div id="metrics" class="charts big"><p class="muted">no metrics yet</p></div>
</section>
<section>
  <div class="bar"><h2>Resources</h2><span class="grow"></span><span id="res-note" class="muted"></span></div>
  <div id="resources" class="charts"><p class="muted">loading…</p></div>
</section>
<section>
  <div class="bar"><h2>Logs</h2><span class="grow"></span>
    <label>attempt <select id="log-attempt"></select></label>
    <label>rank <select id="log-rank"></select></label>
    <form id="log-search"><input id="log-query" type="search" placeholder="search this rank's whole log"><button>Search</button></form>
    <label><input id="log-follow" type="checkbox" checked> follow</label>
  </div>
  <div id="log-note" class="log-note"></div>
  <div id="log-matches" class="matches" hidden></div>
  <pre id="log" class="log"></pre>
</section>
<section>
  <div class="bar"><h2>Artifacts</h2><span class="grow"></span><span id="art-where" class="muted"></span></div>
  <div id="artifacts"><p class="muted">loading…</p></div>
</section>"""
    return _layout(f"job {job_id}", body, {"page": "job", "job": job_id}, csrf, ("jobparts.js", "job.js"), user=user)


def sweep_page(sweep_id: str, name: str, state: str, csrf: str, user: str | None = None) -> str:
    body = f"""
<section class="head">
  <div class="bar"><h1><span id="sweep-id">{html.escape(sweep_id)}</span> <span class="muted">{html.escape(name)}</span>
    <span id="sweep-state" class="state {html.escape(state)}">{html.escape(state)}</span></h1>
    <span class="grow"></span><span id="actions" class="actions"></span></div>
  <div id="sweep-progress" class="progress-line"></div>
  <div id="sweep-facts" class="facts"></div>
</section>
<section>
  <div class="bar"><h2>Trials</h2><span class="grow"></span><span class="muted">best first · click a row for the trial</span></div>
  <div class="table-wrap"><table class="list" id="trials"><thead><tr id="trials-head"></tr></thead><tbody id="trials-body"></tbody></table></div>
</section>
<section>
  <div class="bar"><h2>Parameters and objective</h2></div>
  <div id="parcoords" class="chart wide-chart"></div>
  <div id="scatters" class="charts"></div>
</section>"""
    return _layout(f"sweep {sweep_id}", body, {"page": "sweep", "sweep": sweep_id}, csrf, ("sweep.js",), "sweeps", user)


def compare_page(job_ids: list[str], csrf: str, user: str | None = None) -> str:
    body = """
<section>
  <div class="bar"><h1>Compare metrics</h1><span class="grow"></span>
    <label>x <select id="m-x"><option value="step">step</option><option value="rel">time (relative)</option></select></label>
    <label>smoothing <input id="m-smooth" type="range" min="0" max="0.99" step="0.01" value="0"> <span id="m-smooth-v">0</span></label>
    <label><input id="m-log" type="checkbox"> log y</label></div>
  <div id="compare-jobs" class="facts"></div>
  <div id="compare" class="charts big"><p class="muted">loading…</p></div>
</section>"""
    return _layout("compare", body, {"page": "compare", "jobs": job_ids}, csrf, ("job.js",), user=user)


def events_page(csrf: str, user: str | None = None) -> str:
    """The audit log (project admins: their projects; server admins: all)."""
    body = """
<section class="listing">
  <div class="bar"><h1>Events</h1><span class="grow"></span></div>
  <form id="ev-filters" class="filters" autocomplete="off">
    <input id="ev-user" name="user" placeholder="user" size="12">
    <select id="ev-since" name="since"><option value="">any time</option><option value="1h">last hour</option>
      <option value="1d">last day</option><option value="7d">last week</option><option value="30d">last 30 days</option></select>
    <button type="submit">Apply</button></form>
  <div id="error" class="error" hidden></div>
  <div class="table-wrap"><table class="list" id="events"><thead><tr><th>WHEN</th><th>USER</th><th>FROM</th><th>ACTION</th>
    <th>TARGET</th><th>PROJECT</th><th>OUTCOME</th></tr></thead><tbody id="events-body"><tr><td class="muted">loading…</td></tr>
    </tbody></table></div>
  <div class="pager"><button id="older" type="button" disabled>older ›</button></div>
</section>"""
    return _layout("events", body, {"page": "events"}, csrf, ("events.js",), "events", user)


def error_page(status: int, message: str) -> str:
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status} · phalanx</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body><header class="top"><a class="brand" href="/">phalanx</a></header><main><section class="cause">
<h1>{status}</h1><p id="message">{html.escape(message)}</p><p><a href="/">all jobs</a></p></section></main></body></html>"""


def login_page(message: str = "", next_path: str = "/") -> str:
    """A team server's way in: the API token (``phalanx server user add`` printed it) becomes an
    HttpOnly, SameSite=Strict cookie (``server/auth.py``)."""
    note = f'<p id="message" class="error">{html.escape(message)}</p>' if message else ""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>log in · phalanx</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/app.css"></head>
<body><header class="top"><a class="brand" href="/">phalanx</a></header><main><section class="login">
<h1>Log in</h1>{note}
<form id="login" method="post" action="/login" autocomplete="off">
<input type="hidden" name="next" value="{html.escape(next_path)}">
<label>API token <input id="token" name="token" type="password" size="60" placeholder="phx_..." required autofocus></label>
<button id="login-button" type="submit">Log in</button></form>
<p class="muted">An admin gives you a token with <code>phalanx server user add NAME</code>; the CLI logs in with
<code>phalanx login URL</code>.</p></section></main></body></html>"""
