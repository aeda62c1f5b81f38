"""What a person sees: a real headless Chromium against a real ``phalanx ui`` server."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.web.conftest import UiServer

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")


def chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=8000", *args, url],
        capture_output=True, text=True, timeout=120,
    )


@pytest.fixture
def ui(demo):
    server = UiServer(demo.home)
    try:
        yield server
    finally:
        server.stop()


def test_job_page_shows_charts_and_logs(ui, demo, tmp_path):
    dom = chromium(tmp_path, f"{ui.url}jobs/{demo.ok}", "--dump-dom").stdout
    assert dom.count('class="main-svg"') >= 4, "metric and resource charts are drawn by plotly"
    assert 'data-chart="metric:loss"' in dom and 'data-chart="cpu:0"' in dom and 'data-chart="mem:0"' in dom
    assert "epoch=2 step=40 loss=" in dom, "the rank's log is shown"
    assert "rank 1" in dom and "SUCCEEDED" in dom and "attempt 0" in dom
    shot = tmp_path / "job.png"
    chromium(tmp_path, f"{ui.url}jobs/{demo.ok}", f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.exists() and shot.stat().st_size > 50_000, "a screenshot with content (charts, log)"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failed_job_page_shows_root_cause(ui, demo, tmp_path):
    dom = chromium(tmp_path, f"{ui.url}jobs/{demo.failed}", "--dump-dom").stdout
    assert "Root cause" in dom and "rank 1 on node 0" in dom and "injected failure at step 3" in dom
    assert 'id="cause-box" class="cause" hidden' not in dom


def test_jobs_list_and_compare(ui, demo, tmp_path):
    dom = chromium(tmp_path, ui.url, "--dump-dom").stdout
    assert f'href="/jobs/{demo.ok}"' in dom and "SUCCEEDED" in dom and "FAILED" in dom
    dom = chromium(tmp_path, f"{ui.url}compare?jobs={demo.ok},{demo.failed}", "--dump-dom").stdout
    assert 'data-chart="loss"' in dom and 'class="main-svg"' in dom
    assert f"{demo.ok} ddp" in dom and f"{demo.failed} broken" in dom


def test_token_protected_server_works_in_the_browser(demo, tmp_path):
    server = UiServer(demo.home, "--token", "t0ken")
    try:
        assert server.url.endswith("?token=t0ken")
        base = server.url.split("?")[0]
        dom = chromium(tmp_path, f"{base}jobs/{demo.ok}?token=t0ken", "--dump-dom").stdout
        assert 'class="main-svg"' in dom and "epoch=2 step=40" in dom
        denied = chromium(tmp_path, f"{base}jobs/{demo.ok}", "--dump-dom").stdout
        assert "token is required" in denied and "epoch=" not in denied
    finally:
        server.stop()
