"""HTML shells of the dashboard pages; ``static/app.js`` fills them from the JSON API."""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote

from ..store import JobRecord


def _query(token: str | None) -> str:
    return f"?token={quote(token)}" if token else ""


def _config(value: dict[str, Any]) -> str:
    return json.dumps(value).replace("</", "<\\/")  # safe inside <script>


def _layout(title: str, body: str, token: str | None, config: dict[str, Any]) -> str:
    q = _query(token)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · phalanx</title>
<link rel="stylesheet" href="/static/app.css{q}">
<script src="/static/plotly.min.js{q}"></script>
</head>
<body>
<header class="top"><a class="brand" href="/{q}">phalanx</a><span class="sub">{html.escape(title)}</span></header>
<main>
{body}
</main>
<script>window.PHX_CONFIG = {_config({**config, "token": token})};</script>
<script src="/static/app.js{q}"></script>
</body>
</html>
"""


def jobs_page(token: str | None) -> str:
    body = """
<section>
  <div class="bar"><h1>Jobs</h1>
    <span class="grow"></span>
    <button id="compare" disabled>Compare metrics of selected</button>
  </div>
  <table class="jobs">
    <thead><tr><th></th><th>ID</th><th>NAME</th><th>STATE</th><th>TOPOLOGY</th><th>CREATED</th><th>DURATION</th><th>COMMAND</th></tr></thead>
    <tbody id="jobs"><tr><td colspan="8" class="muted">loading…</td></tr></tbody>
  </table>
</section>"""
    return _layout("jobs", body, token, {"page": "jobs"})


def job_page(record: JobRecord, token: str | None) -> str:
    job = html.escape(record.id)
    body = f"""
<section id="head" class="head">
  <h1><span id="job-id">{job}</span> <span id="job-name" class="muted">{html.escape(record.name)}</span>
      <span id="job-state" class="state">{html.escape(record.state.value)}</span></h1>
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
    <label>rank <select id="metric-rank"><option value="all">all</option></select></label></div>
  <div id="metrics" class="charts"><p class="muted">no metrics yet</p></div>
</section>
<section>
  <div class="bar"><h2>Resources</h2></div>
  <div id="resources" class="charts"><p class="muted">no resource samples yet</p></div>
</section>
<section>
  <div class="bar"><h2>Logs</h2><span class="grow"></span>
    <label>attempt <select id="log-attempt"></select></label>
    <label>rank <select id="log-rank"></select></label>
    <form id="log-search"><input id="log-query" type="search" placeholder="search this rank's whole log"><button>Search</button></form>
    <label><input id="log-follow" type="checkbox" checked> follow</label>
  </div>
  <div id="log-matches" class="matches" hidden></div>
  <pre id="log" class="log"></pre>
</section>"""
    return _layout(f"job {record.id}", body, token, {"page": "job", "job": record.id})


def compare_page(job_ids: list[str], token: str | None) -> str:
    body = """
<section>
  <div class="bar"><h1>Compare metrics</h1></div>
  <div id="compare-jobs" class="facts"></div>
  <div id="compare" class="charts"><p class="muted">loading…</p></div>
</section>"""
    return _layout("compare", body, token, {"page": "compare", "jobs": job_ids})


def error_page(status: int, message: str) -> str:
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status} · phalanx</title></head>
<body><h1>{status}</h1><p>{html.escape(message)}</p><p><a href="/">all jobs</a></p></body></html>"""
