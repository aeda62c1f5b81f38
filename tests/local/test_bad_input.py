"""Bad input to the control-room commands: one line naming the problem and the fix, exit 2, no
traceback, and nothing changed (a running job, a finished one and their files stay)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import phalanx

pytestmark = pytest.mark.local

SCRIPT = """
import sys, time
n = int(sys.argv[1])
for step in range(1, n + 1):
    print(f"step={step} loss={1 / step:.4f}", flush=True)
    time.sleep(0.2 if n > 100 else 0)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("bad-input") / "home"
    script = home.parent / "steps.py"
    script.write_text(SCRIPT)
    env = {"PHALANX_HOME": str(home)}
    phalanx("run", "--name", "done", str(script), "5", check=True, env=env)
    running = phalanx("run", "-d", "--name", "busy", str(script), "100000", check=True, env=env).stdout.strip()
    phalanx("run", "--name", "swept", str(script), "[3, 4]", check=True, env=env)
    yield home, script, running
    phalanx("stop", running, env=env)


CASES = [
    # (arguments; {running} and {script} are filled in), what stderr says, the fix it names
    (["ps", "--columns", "los"], "no job has a metric 'los'", "metrics jobs have: loss"),
    (["ps", "--sort", "loss:avg"], "invalid column 'loss:avg'", "AGG one of last, min, max"),
    (["ps", "--state", "finishd"], "unknown state 'finishd'", "use one of: pending, queued, running"),
    (["ps", "--backend", "kubernetess"], "unknown backend 'kubernetess'", "backends: k8s, local"),
    (["ps", "--since", "yesterday"], "invalid --since 'yesterday'", "10m, 2h, 30d"),
    (["ps", "--tag", "=vision"], "invalid --tag '=vision'", "KEY=VALUE"),
    (["ps", "--limit", "0"], "invalid --limit 0", "at least 1"),
    (["ps", "--trials", "nosuchsweep"], "no sweep with id or name 'nosuchsweep'", "phalanx ps --all"),
    (["rm", "{running}"], "is RUNNING: phalanx removes only jobs that ended", "stop it first: phalanx stop"),
    (["rm", "done", "{running}"], "is RUNNING", "stop it first"),
    (["rm", "nosuchjob"], "no job with id or name 'nosuchjob'", "phalanx ps --all"),
    (["prune", "--older-than", "30x"], "invalid --older-than '30x'", "30d or 10m"),
    (["prune", "--older-than", "1d", "--state", "running"], "--state running is not an end state", "use one of: cancelled"),
    (["prune", "--older-than", "1d", "--state", "gone"], "unknown state 'gone'", "use one of"),
    (["usage", "--by", "colour"], "unknown --by 'colour'", "group by one of: name"),
    (["logs", "done", "--tail", "-3"], "invalid --tail -3", "a number of lines"),
    (["logs", "done", "--since", "later"], "invalid --since 'later'", "10m, 2h, 30d"),
    (["sweep", "show", "swept", "--json", "--csv"], "--json and --csv both given", "pick one"),
    (["run", "--notify", "ftp://example.org/x", "{script}", "1"], "invalid --notify 'ftp://example.org/x'", "mailto:ADDR or desktop"),
    (["run", "--notify", "mailto:nobody", "{script}", "1"], "'nobody' is not an email address", "mailto:you@example.com"),
    (["run", "--notify", "https://:443/x", "{script}", "1"], "no host in the URL", "e.g. --notify https://"),
    (["run", "--tag", "team", "{script}", "1"], "invalid --tag 'team'", "KEY=VALUE"),
    (["ui", "--token", "short"], "--token is too weak", "openssl rand"),
    # (a name that is no host name: refused without a DNS query, which would leave this machine)
    (["ui", "--host", "no_such!host"], "cannot resolve --host 'no_such!host'", "127.0.0.1"),
]


@pytest.mark.parametrize("args, problem, fix", CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_bad_input_is_one_line_with_the_fix(home, args, problem, fix):
    phx, script, running = home
    env = {"PHALANX_HOME": str(phx)}
    before = sorted(p.name for p in (phx / "jobs").iterdir())
    words = [a.format(running=running, script=script) for a in args]
    proc = phalanx(*words, env=env)
    assert proc.returncode == 2, (words, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phalanx: error: "), proc.stderr
    assert problem in lines[0] and fix in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in (phx / "jobs").iterdir()) == before, "nothing deleted, nothing added"
    state = json.loads(phalanx("status", running, "--json", env=env, check=True).stdout)["state"]
    assert state == "RUNNING"
