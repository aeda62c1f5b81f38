"""What a person sees and does: a real headless Chromium (driven through the DevTools protocol,
``cdp.py``) against a real ``phalanx ui`` server. Screenshots of the job list, a job, a sweep
and a stop go to ``tmp_path`` (and to ``$PHALANX_SCREENSHOTS`` when set, to look at them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, phalanx
from tests.web.cdp import CHROMIUM, Browser
from tests.web.conftest import UiServer

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")

RENDERED = "document.body.dataset.rendered"
CHARTS = "document.body.dataset.charts"


@pytest.fixture(scope="module")
def ui(demo):
    server = UiServer(demo.home)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def shot(b: Browser, tmp_path: Path, name: str) -> Path:
    path = b.screenshot(tmp_path / f"{name}.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000, "a screenshot with content"
    keep = os.environ.get("PHALANX_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def test_jobs_list_filters_columns_and_sorting(ui, demo, browser, tmp_path):
    b = browser
    b.open(ui.url)
    b.wait_for(RENDERED, what="the list")
    b.wait_for("document.querySelectorAll('#list-body tr').length === 3", what="three jobs")
    text = b.text("#list")
    for job in (demo.ok, demo.failed, demo.outputs):
        assert job in text
    assert "SUCCEEDED" in text and "FAILED" in text and "train_ddp.py --epochs 2" in text and "team=vision" in text
    assert b.wait_for("document.getElementById('count').textContent") == "1–3 of 3 jobs"
    # A metric column, added the way a person does it, then sorted by.
    b.evaluate("document.getElementById('f-col').value = 'loss'; document.getElementById('filters').requestSubmit()")
    b.wait_for("[...document.querySelectorAll('#list-head th')].some(th => th.textContent.startsWith('LOSS'))", what="the LOSS column")
    b.wait_for("document.querySelectorAll('#list-body tr td.metric, #list-body td.num.mono').length >= 3")
    b.evaluate("[...document.querySelectorAll('#list-head th')].find(th => th.textContent.startsWith('LOSS')).click()")
    b.wait_for("location.search.includes('sort=loss')", what="the sort in the URL")
    column = "[...document.querySelectorAll('#list-body tr')].map(tr => parseFloat(tr.querySelectorAll('td.mono')[1].textContent))"
    b.wait_for(f"(v => v.length === 3 && v.every((x, i) => i === 0 || v[i - 1] <= x))({column})", what="rows sorted by loss")
    assert b.evaluate("[...document.querySelectorAll('#list-head th')].find(th => th.textContent.startsWith('LOSS')).className").count("sorted")
    shot(b, tmp_path, "jobs")
    # Filtered by a URL a person can share: one failed job.
    b.open(ui.url + "?state=failed")
    b.wait_for(RENDERED)
    b.wait_for("document.querySelectorAll('#list-body tr').length === 1")
    assert demo.failed in b.text("#list-body") and demo.ok not in b.text("#list-body")
    b.open(ui.url + "?columns=nosuchmetric")
    b.wait_for(RENDERED)
    assert "no job has a metric 'nosuchmetric'" in b.wait_for("document.getElementById('error').textContent")
    b.open(ui.url + "?view=sweeps")
    b.wait_for(RENDERED)
    b.wait_for("document.querySelectorAll('#list-body tr').length === 1")
    assert "4/4 done, 2 pruned, best loss=0.125 (trial 0)" in b.text("#list-body")


def test_job_page_charts_logs_and_controls(ui, demo, browser, tmp_path):
    b = browser
    b.open(f"{ui.url}jobs/{demo.ok}")
    b.wait_for(CHARTS, timeout=60, what="the charts")
    charts = b.evaluate("[...document.querySelectorAll('[data-chart]')].map(d => d.dataset.chart)")
    assert {"metric:loss", "cpu:0", "mem:0", "disk:0", "net:0"} <= set(charts)
    assert b.evaluate("document.querySelectorAll('.main-svg').length") >= 6, "plotly drew them"
    b.wait_for("document.getElementById('log').textContent.includes('epoch=2 step=40 loss=')", what="the rank's log")
    assert "rank 1" in b.text("#topology") and "succeeded" in b.text("#attempts")
    facts = b.text("#job-facts")
    assert "CPU-hours" in facts and "1x2 (2 ranks) on local" in facts
    assert b.evaluate("[...document.querySelectorAll('#actions button')].map(x => x.textContent)") == ["Run again", "Delete"]
    traces = "document.querySelector('[data-chart=\"metric:loss\"]').data.length"
    before = b.evaluate(traces)
    b.evaluate("const s = document.getElementById('m-smooth'); s.value = 0.8; s.dispatchEvent(new Event('input'))")
    assert b.wait_for(f"{traces} === {2 * before} && {traces}", what="a smoothed and a faint raw line per rank")
    b.evaluate("const c = document.getElementById('m-log'); c.checked = true; c.dispatchEvent(new Event('change'))")
    b.wait_for("document.querySelector('[data-chart=\"metric:loss\"]').layout.yaxis.type === 'log'", what="log scale")
    b.evaluate("const x = document.getElementById('m-x'); x.value = 'wall'; x.dispatchEvent(new Event('change'))")
    b.wait_for("document.querySelector('[data-chart=\"metric:loss\"]').layout.xaxis.type === 'date'", what="a time axis")
    b.evaluate("document.getElementById('overlay-job').value = 'broken'; document.getElementById('overlay').requestSubmit()")
    b.wait_for(f"document.querySelector('[data-chart=\"metric:loss\"]').data.some(t => (t.name || '').startsWith('{demo.failed}'))",
               what="the failed job overlaid")
    shot(b, tmp_path, "job")
    b.evaluate("document.getElementById('log-query').value = 'step=12 '; document.getElementById('log-search').requestSubmit()")
    assert "1 lines match" in b.wait_for("document.getElementById('log-matches').textContent")


def test_failed_job_page_shows_root_cause_and_attempt_outcome(ui, demo, browser, tmp_path):
    b = browser
    b.open(f"{ui.url}jobs/{demo.failed}")
    b.wait_for(RENDERED)
    b.wait_for("!document.getElementById('cause-box').hidden", what="the root cause")
    cause = b.text("#cause-box")
    assert "rank 1 on node 0" in cause and "injected failure at step 3" in cause and "Traceback" in cause
    assert "failed" in b.text("#attempts") and "injected failure" in b.text("#attempts")
    assert b.evaluate("[...document.querySelectorAll('#actions button')].map(x => x.textContent)") == ["Resume", "Run again", "Delete"]


def test_artifacts_are_previewed(ui, demo, browser, tmp_path):
    b = browser
    b.open(f"{ui.url}jobs/{demo.outputs}")
    b.wait_for(CHARTS, timeout=60)
    b.wait_for("document.querySelector('.gallery img') && document.querySelector('.gallery img').naturalWidth === 64",
               what="the image shown")
    b.evaluate("[...document.querySelectorAll('#artifacts button')].find(x => x.textContent === 'preview').click()")
    assert '"accuracy": 0.91' in b.wait_for("[...document.querySelectorAll('pre.artifact-text')].map(p => p.textContent).join('')")
    links = b.evaluate("[...document.querySelectorAll('#artifacts a[download]')].map(a => a.getAttribute('download'))")
    assert set(links) == {"model.bin", "curve.png", "report.html", "summary.json"}
    assert b.evaluate("document.title") != "pwned"
    assert "team=vision" in b.text("#job-facts")


def test_sweep_page_table_and_plots(ui, demo, browser, tmp_path):
    b = browser
    b.open(f"{ui.url}sweeps/{demo.sweep}")
    b.wait_for(CHARTS, what="the sweep's plots")
    rows = b.evaluate("[...document.querySelectorAll('#trials-body tr')].map(tr => [tr.className, tr.innerText])")
    assert len(rows) == 4
    assert "best" in rows[0][0] and "★ 0.125" in rows[0][1]
    for cls, text in rows[2:]:
        assert "PRUNED" in text and "at step" in text and "row-PRUNED" in cls
    assert "median rule" in b.evaluate("document.querySelectorAll('#trials-body tr')[2].title")
    assert "4/4 done, 2 pruned, best loss=0.125 (trial 0)" in b.text("#sweep-progress")
    b.wait_for("document.querySelectorAll('#parcoords .scatterlayer .trace').length >= 2", what="the parallel coordinates")
    assert b.evaluate("document.querySelector('[data-chart=\"scatter:lr\"]') !== null")
    assert b.evaluate("document.querySelector('[data-chart=\"scatter:width\"]') === null"), "a parameter with one value is not plotted"
    assert b.evaluate("document.querySelector('[data-chart=\"scatter:lr\"]').data.some(t => t.name === 'pruned')")
    shot(b, tmp_path, "sweep")


def test_failed_job_page_opens_its_logs_at_the_cause_and_folds_the_peer(ui, demo, browser, tmp_path):
    """The 2-rank gloo DDP job whose rank 1 raised: the log panel opens on rank 1 and says why;
    rank 0's "Connection closed by peer" trace is folded under one line until opened."""
    b = browser
    b.open(f"{ui.url}jobs/{demo.failed}")
    b.wait_for(RENDERED)
    b.wait_for("document.getElementById('log').textContent.includes('injected failure at step 3')", what="rank 1's log")
    assert b.evaluate("document.getElementById('log-rank').value") == "1"
    assert b.text("#log-note") == ("rank 1 failed first: its log is shown; "
                                   "rank 0: lost its peer after rank 1 failed (folded in its log)")
    assert "rank 0: lost its peer after rank 1 failed (RuntimeError: Connection closed by peer" in b.text("#cause-box")
    assert "RuntimeError: injected failure at step 3" in b.text("#cause-box p")
    assert "lost its peer" in b.text("#topology") and "root cause" in b.text("#topology")
    b.evaluate("const r = document.getElementById('log-rank'); r.value = '0'; r.dispatchEvent(new Event('change'))")
    b.wait_for("!!document.querySelector('#log details.fold')", what="rank 0's folded trace")
    shown = b.evaluate("document.getElementById('log').innerText")
    assert "epoch=1 step=3 loss=" in shown and "Traceback" not in shown, shown
    assert shown.rstrip().splitlines()[-1].startswith("rank 0: lost its peer after rank 1 failed (RuntimeError: "
                                                      "Connection closed by peer")
    assert b.text("#log-note") == ""
    b.click("#log details.fold summary")
    opened = b.wait_for("document.getElementById('log').innerText.includes('Traceback') && document.getElementById('log').innerText")
    assert "Connection closed by peer" in opened.split("Traceback", 1)[1]
    shot(b, tmp_path, "failed-folded")


DEEP = """
import time
print("loading the config", flush=True)
time.sleep(2)
config = {"lr": 0.1}
""" + "".join(f"def f{i}(c):\n    return f{i + 1}(c) + 1\n" for i in range(30)) + """
def f30(c):
    return c["batch_size"] * 2
f0(config)
"""

LOG_TRIAL = """
import argparse, math
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
a = p.parse_args()
print(f"loss={abs(math.log10(a.lr) + 2.5):.4f}", flush=True)
"""


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """A home with a 2-second job that raised a KeyError 31 frames deep and printed no metric,
    and a sweep over a log-spaced learning rate (loguniform(0.001, 0.1, 3): 0.001, 0.01, 0.1)."""
    home = tmp_path_factory.mktemp("phx-failures") / "home"
    scripts = home.parent / "scripts"
    scripts.mkdir()
    (scripts / "deep.py").write_text(DEEP)
    (scripts / "log_trial.py").write_text(LOG_TRIAL)
    env = {"PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    assert phalanx("run", "--name", "deep", str(scripts / "deep.py"), env=env).returncode == 1
    phalanx("run", "--name", "logsweep", "--objective", "loss:min", "--parallel", "1", str(scripts / "log_trial.py"),
            "--lr", "loguniform(0.001, 0.1, 3)", check=True, env=env)
    server = UiServer(home)
    try:
        yield server, env
    finally:
        server.stop()


def test_short_failed_job_page_summary_row_metrics_note_and_traceback_end(failures, browser, tmp_path):
    server, env = failures
    job = json.loads(phalanx("status", "deep", "--json", env=env, check=True).stdout)
    b = browser
    b.open(f"{server.url}jobs/{job['id']}")
    b.wait_for(CHARTS, timeout=60, what="the page drawn")
    assert "KeyError: 'batch_size'" in b.text("#cause-box p")
    # The box scrolls, and opens on its end: the frame that raised, its ~~~^^^ line, the exception.
    box = "document.querySelector('#cause pre.trace')"
    assert b.evaluate(f"{box}.scrollHeight > {box}.clientHeight"), "a trace taller than its box"
    assert b.evaluate(f"getComputedStyle({box}).overflowY") in ("auto", "scroll")
    visible = b.evaluate(f"""(() => {{
        const pre = {box}, text = pre.firstChild, box = pre.getBoundingClientRect();
        const carets = text.data.split("\\n").filter((line) => /^ *[~^]*\\^[~^]* *$/.test(line)).pop().trim();
        const want = [carets, "KeyError: 'batch_size'"];
        return want.map((w) => {{
            const at = text.data.lastIndexOf(w), range = document.createRange();
            range.setStart(text, at); range.setEnd(text, at + w.length);
            const r = range.getBoundingClientRect();
            return at >= 0 && r.top >= box.top && r.bottom <= box.bottom && r.left >= box.left && r.right <= box.right;
        }});
    }})()""")
    assert visible == [True, True], "the last frame's ~~~^^^ line and the exception are in view"
    # Too short to chart: one row, not four charts of a sample or two.
    b.wait_for("!!document.querySelector('#resources .resource-summary')", what="the summary row")
    assert b.evaluate("document.querySelectorAll('#resources [data-chart]').length") == 0
    row = b.text("#resources .resource-summary tbody tr")
    assert row.startswith("node 0") and "sample" in row and "cores" in row, row
    assert b.text("#metrics") == ("no metrics were reported: print name=value pairs (loss=0.42) or declare one with "
                                  "--metric NAME=REGEX")
    shot(b, tmp_path, "short-failed")


def _axis_labels(b: Browser, axis: int) -> list[tuple[str, float]]:
    """The tick labels plotly rendered beside parallel-coordinates axis ``axis`` (its title
    left out), each with its height on the page."""
    return b.evaluate(f"""(() => {{
        const div = document.getElementById('parcoords'), notes = div.layout.annotations;
        return [...div.querySelectorAll('.annotation')].filter((g) => {{
            const n = notes[Number(g.dataset.index)];
            return n.x === {axis} && n.y <= 1;
        }}).map((g) => {{ const r = g.querySelector('.annotation-text').getBoundingClientRect();
            return [g.querySelector('.annotation-text').textContent, (r.top + r.bottom) / 2]; }})
          .sort((a, b) => b[1] - a[1]);
    }})()""")


def test_sweep_axes_use_the_parameters_scale(failures, ui, demo, browser, tmp_path):
    """A loguniform parameter gets a log axis labelled by decades, each trial's line crossing it
    at its own label; a list gets one tick per value."""
    server, env = failures
    sweep = json.loads(phalanx("sweep", "show", "logsweep", "--json", env=env, check=True).stdout)
    b = browser
    b.open(f"{server.url}sweeps/{sweep['id']}")
    b.wait_for(CHARTS, what="the sweep's plots")
    b.wait_for("document.querySelectorAll('#parcoords .scatterlayer .trace').length >= 3", what="the parallel coordinates")
    labels = _axis_labels(b, 0)
    assert [text for text, _ in labels] == ["0.001", "0.01", "0.1"], labels
    heights = dict(labels)
    # Where each trial's line meets the lr axis, on the page, against the label of its value.
    points = b.evaluate("""(() => {
        const div = document.getElementById('parcoords');
        return [...div.querySelectorAll('.scatterlayer .trace')].map((g, i) => [div.data[i].text && div.data[i].text[0],
            (() => { const p = g.querySelector('.point'); if (!p) return null; const r = p.getBoundingClientRect(); return (r.top + r.bottom) / 2; })()])
          .filter(([t, y]) => t && y !== null);
    })()""")
    assert len(points) == 3, points
    for text, y in points:
        assert abs(y - heights[text.split("=", 1)[1]]) < 3, (text, y, labels)
    assert "(log)" in b.text("#parcoords")
    shot(b, tmp_path, "sweep-log-axis")
    b.open(f"{ui.url}sweeps/{demo.sweep}")
    b.wait_for(CHARTS)
    b.wait_for("document.querySelectorAll('#parcoords .scatterlayer .trace').length >= 2")
    assert [text for text, _ in _axis_labels(b, 0)] == ["0.1", "0.2", "3", "5"]


LONG_JOB = """
import time
for step in range(1, 100000):
    print(f"step={step} loss={1 / step:.5f}", flush=True)
    time.sleep(0.2)
"""


def test_stop_a_running_job_from_its_page(browser, tmp_path):
    """The action a person takes: Stop, a confirmation, and the page shows the job cancelled."""
    home = tmp_path / "home"
    script = tmp_path / "long.py"
    script.write_text(LONG_JOB)
    env = {"PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    job = json.loads(phalanx("run", "-d", "--json", "--name", "long", "--grace", "5", str(script), check=True, env=env).stdout)["id"]
    server = UiServer(home)
    b = browser
    try:
        b.open(f"{server.url}jobs/{job}")
        b.wait_for("document.getElementById('job-state').textContent === 'RUNNING'", timeout=60, what="the job running")
        b.wait_for("!!document.querySelector('#actions .act-stop')", what="the Stop button")
        b.wait_for("document.getElementById('log').textContent.includes('step=3 ')", what="live logs")
        b.click("#actions .act-stop")
        b.wait_for("!document.getElementById('modal').hidden", what="the confirmation")
        assert "Stop job " + job in b.text("#modal") and "SIGTERM" in b.text("#modal")
        shot(b, tmp_path, "stop-confirm")
        b.click("#modal-cancel")
        time.sleep(1.0)
        assert phalanx("status", job, "--json", env=env, check=True).stdout.count('"RUNNING"') >= 1, "Cancel changes nothing"
        b.click("#actions .act-stop")
        b.wait_for("!document.getElementById('modal').hidden")
        b.click("#modal-ok")
        b.wait_for("document.getElementById('job-state').textContent === 'CANCELLED'", timeout=60, what="the job cancelled")
        b.wait_for("[...document.querySelectorAll('#actions button')].map(x => x.textContent).join() === 'Resume,Run again,Delete'")
        assert "stopping job" in b.text("#toast") or b.evaluate("document.getElementById('toast').hidden")
        assert "cancelled" in b.text("#attempts")
        shot(b, tmp_path, "stopped")
        assert json.loads(phalanx("status", job, "--json", env=env, check=True).stdout)["state"] == "CANCELLED"
    finally:
        server.stop()
        subprocess.run([sys.executable, "-m", "phalanx", "stop", job], env={**os.environ, **env}, capture_output=True, cwd=ROOT)


def test_token_protected_server_works_in_the_browser(demo, tmp_path):
    token = "t0ken-" + "9f8e7d6c5b4a3210"
    server = UiServer(demo.home, "--token", token)
    try:
        assert server.url.endswith(f"?token={token}")
        base = server.url.split("?")[0]
        with Browser() as b:
            b.open(f"{base}jobs/{demo.ok}?token={token}")
            b.wait_for(CHARTS, timeout=60)
            assert token not in b.evaluate("location.href"), "the token left the address bar"
            assert b.evaluate("document.cookie") == "", "the cookie is HttpOnly: no script reads it"
            assert "epoch=2 step=40" in b.wait_for("document.getElementById('log').textContent")
        with Browser() as fresh:
            fresh.open(f"{base}jobs/{demo.ok}")
            denied = fresh.text()
            assert "token is required" in denied and "epoch=" not in denied
    finally:
        server.stop()
