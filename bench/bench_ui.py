"""The dashboard with 1,000 and 100,000 jobs in the store: time to first render in a real
headless Chromium, this tree against main's dashboard in the same run.

    .venv/bin/python bench/bench_ui.py [--sizes 1000,100000] [--repeats 5] [--dir /tmp/phalanx-bench-ui]
        [--main-ref main | --main-src PATH | --no-main] [--json OUT]

Each code gets its own home, filled through its own store code with the same jobs
(``bench_store.rows``: 8-hex ids, 5,000 names, every tenth job a trial, specs as ``phalanx run``
records them); this tree's home also gets every finished job's metric summary (``loss``,
``acc``: what the metric columns read) and a tag on every tenth job. One real job, run by each
code's own ``phalanx run`` (a script printing metrics for a few seconds), is the job page opened.

Measured (median of ``--repeats`` page loads after a warm-up, each in a fresh tab state):

- **list**: from navigation start to the first job row in the table (a MutationObserver set
  before the page's own scripts records ``performance.now()`` when a row with a link to a job
  appears): the default list; this tree also a filtered list (``state=failed``), a list sorted
  by a metric column (``sort=loss``) and a tag filter;
- **job**: from navigation start to the first chart drawn (plotly's first ``.main-svg``);
- **api**: the JSON behind them from a plain HTTP client: the first page, a page 1,000 pages
  deep (by cursor), the count, a metric sort.

Ratio = this tree / main. Needs Debian's chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SCRIPT = """
import time
for step in range(1, 41):
    print(f"step={step} loss={1 / step:.5f} acc={step / 40:.4f}", flush=True)
    time.sleep(0.05)
"""

# Records when the first job row and the first chart appear, before the page's scripts run.
OBSERVER = """
(() => {
  const seen = () => {
    if (!window.__phxRow && document.querySelector('tbody a[href^="/jobs/"]')) window.__phxRow = performance.now();
    if (!window.__phxChart && document.querySelector('.main-svg')) window.__phxChart = performance.now();
  };
  new MutationObserver(seen).observe(document, { childList: true, subtree: true });
})();
"""


def fill(src: str, home: Path, n: int, extras: bool) -> None:
    """Fill ``home`` with ``n`` jobs through the store code in ``src`` (a subprocess)."""
    code = f"""
import sys, json, random
sys.path.insert(0, {src!r}); sys.path.insert(0, {str(ROOT / 'bench')!r})
from pathlib import Path
from bench_store import rows
from phalanx.store import Store
home = Path({str(home)!r}); home.mkdir(parents=True, exist_ok=True)
jobs, sweeps = rows({n}, home)
for j in jobs:
    if j["state"] == "RUNNING":
        j.update(state="SUCCEEDED", ended_at=j["started_at"] + 4, exit_code=0)
store = Store(home / "phalanx.db")
store.insert_jobs(jobs)
store._conn.execute("BEGIN")
for s in sweeps:
    store.sweeps.insert(**s)
store._conn.execute("COMMIT")
if {extras!r}:
    rnd = random.Random(1)
    metrics, tags = [], []
    for i, j in enumerate(jobs):
        loss = rnd.random()
        metrics += [(j["id"], "loss", loss, loss * 0.9, 2.0, 100, 100), (j["id"], "acc", 1 - loss, 0.1, 1 - loss, 100, 100)]
        if i % 10 == 0:
            tags.append((j["id"], "team", "vision" if i % 20 == 0 else "audio"))
    store._conn.execute("BEGIN")
    store._conn.executemany("INSERT INTO job_metrics (id, name, last, min, max, count, step) VALUES (?, ?, ?, ?, ?, ?, ?)", metrics)
    store._conn.executemany("INSERT INTO tags (id, key, value) VALUES (?, ?, ?)", tags)
    store._conn.execute("COMMIT")
(home / "filled.json").write_text(json.dumps({{"jobs": {n}}}))
"""
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": src})


def run_job(src: str, home: Path, script: Path) -> str:
    env = {**os.environ, "PYTHONPATH": src, "PHALANX_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "phalanx", "run", "--name", "bench-real", "--sample-interval", "0.5", str(script)],
                   check=True, env=env, capture_output=True, cwd=script.parent)
    conn = sqlite3.connect(home / "phalanx.db")
    return conn.execute("SELECT id FROM jobs WHERE name = 'bench-real' ORDER BY created_at DESC LIMIT 1").fetchone()[0]


class Server:
    def __init__(self, src: str, home: Path) -> None:
        env = {**os.environ, "PYTHONPATH": src, "PHALANX_HOME": str(home)}
        self.proc = subprocess.Popen([sys.executable, "-m", "phalanx", "ui", "--port", "0"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=src)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if "http://" not in line:
            self.stop()
            raise RuntimeError(f"phalanx ui did not start: {line}")
        self.url = line.split()[2].rstrip("/")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def page_times(browser, url: str, marker: str, repeats: int) -> float:
    samples = []
    for i in range(repeats + 1):
        browser.open(url)
        value = browser.wait_for(f"window.{marker}", timeout=120, what=f"{marker} on {url}")
        if i:  # the first load warms the server's caches and the browser's
            samples.append(float(value))
    return statistics.median(samples)


def api_time(url: str, repeats: int) -> float:
    samples = []
    for i in range(repeats + 1):
        began = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            r.read()
        if i:
            samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def cursor_deep(base: str, pages: int) -> str | None:
    """The cursor of a page ``pages`` pages deep, found by walking them (untimed)."""
    after = None
    for _ in range(pages):
        url = base + "/api/jobs?limit=50" + (f"&after={urllib.parse.quote(after)}" if after else "")
        with urllib.request.urlopen(url, timeout=120) as r:
            after = r.headers.get("X-Next-Page")
        if not after:
            return None
    return after


def measure(src: str, home: Path, job: str, repeats: int, ours: bool) -> dict[str, float]:
    from tests.web.cdp import Browser

    server = Server(src, home)
    out: dict[str, float] = {}
    try:
        with Browser() as b:
            b.call("Page.addScriptToEvaluateOnNewDocument", source=OBSERVER)
            out["list"] = page_times(b, server.url + "/", "__phxRow", repeats)
            out["job page (first chart)"] = page_times(b, f"{server.url}/jobs/{job}", "__phxChart", repeats)
            if ours:
                out["list state=failed"] = page_times(b, server.url + "/?state=failed", "__phxRow", repeats)
                out["list sort=loss"] = page_times(b, server.url + "/?columns=loss&sort=loss", "__phxRow", repeats)
                out["list tag=team=vision"] = page_times(b, server.url + "/?tag=team%3Dvision", "__phxRow", repeats)
        out["api first page"] = api_time(server.url + "/api/jobs" + ("?limit=50" if ours else ""), repeats)
        if ours:
            deep = cursor_deep(server.url, 1000)
            if deep:
                out["api page 1000"] = api_time(server.url + "/api/jobs?limit=50&after=" + urllib.parse.quote(deep), repeats)
            out["api count"] = api_time(server.url + "/api/jobs/count", repeats)
            out["api sort=loss"] = api_time(server.url + "/api/jobs?limit=50&columns=loss&sort=loss", repeats)
    finally:
        server.stop()
    return out


def main() -> None:
    import urllib.parse  # noqa: F401 - used through urllib.parse above

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,100000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "phalanx-bench-ui"))
    parser.add_argument("--main-ref", default="main")
    parser.add_argument("--main-src", default=None)
    parser.add_argument("--no-main", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    script = work / "real.py"
    script.write_text(SCRIPT)
    codes = {"this tree": str(ROOT / "src")}
    if not args.no_main:
        main_src = args.main_src
        if main_src is None:
            dest = work / f"main-src-{args.main_ref}"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.main_ref], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
            main_src = str(dest / "src")
        codes["main"] = main_src
    results: dict[str, dict[str, dict[str, float]]] = {}
    for n in [int(s) for s in args.sizes.split(",")]:
        for label, src in codes.items():
            home = work / f"{'tree' if label == 'this tree' else 'main'}-{n}"
            filled = home / "filled.json"
            if not filled.exists() or json.loads(filled.read_text())["jobs"] != n:
                shutil.rmtree(home, ignore_errors=True)
                began = time.perf_counter()
                fill(src, home, n, extras=label == "this tree")
                print(f"filled {label} home with {n:,} jobs in {time.perf_counter() - began:.0f}s", file=sys.stderr)
            conn = sqlite3.connect(home / "phalanx.db")
            row = conn.execute("SELECT id FROM jobs WHERE name = 'bench-real' ORDER BY created_at DESC LIMIT 1").fetchone()
            job = row[0] if row else run_job(src, home, script)
            results.setdefault(str(n), {})[label] = measure(src, home, job, args.repeats, label == "this tree")
            print(f"{n:>7,} jobs  {label:<9}  " + "  ".join(f"{k} {v:.0f} ms" for k, v in results[str(n)][label].items()),
                  file=sys.stderr)
    print("\n| jobs | what | this tree (ms) | main (ms) | ratio |\n|---:|---|---:|---:|---:|")
    for n, by_code in results.items():
        ours = by_code["this tree"]
        theirs = by_code.get("main", {})
        for what, value in ours.items():
            other = theirs.get(what)
            ratio = f"{value / other:.2f}" if other else "-"
            print(f"| {int(n):,} | {what} | {value:.0f} | {other:.0f} | {ratio} |" if other else f"| {int(n):,} | {what} | {value:.0f} | - | - |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
