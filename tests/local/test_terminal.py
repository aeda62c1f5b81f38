"""What the person at the terminal sees from a foreground run: one start line and one end line on
stderr (-q: neither), the script's output as under python (one process: its stdout on stdout, its
stderr on stderr; several ranks: every rank's lines on stdout, prefixed), and with --json nothing but JSON on stdout."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import phalanx

pytestmark = pytest.mark.local


@pytest.fixture
def proj(tmp_path):
    (tmp_path / "ok.py").write_text("import sys\nprint('out', sys.argv[1:])\nprint('err', file=sys.stderr)\n")
    (tmp_path / "bad.py").write_text("raise ValueError('the real problem')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("import sys\nprint('module args', sys.argv[1:])\n")
    return tmp_path


def test_start_and_end_lines(phx_home, proj):
    proc = phalanx("run", "ok.py", "--x", "1", cwd=proj, check=True)
    lines = proc.stderr.strip().splitlines()
    assert re.fullmatch(r"phalanx: job (\w+) \(ok\) started: 1x1 on local; logs: phalanx logs \1 \(in .+\)", lines[0])
    assert re.fullmatch(r"phalanx: job \w+ \(ok\) succeeded in [\d.]+s", lines[-1])
    # One process is python's: its stdout to stdout, its stderr to stderr, between the two lines.
    assert lines[1:-1] == ["err"]
    assert proc.stdout.splitlines() == ["out ['--x', '1']"]


def test_failure_is_one_end_line(phx_home, proj):
    proc = phalanx("run", "bad.py", cwd=proj)
    assert proc.returncode == 1
    end = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"phalanx: job \w+ failed after [\d.]+s: rank 0 on node 0 \(exit code 1\): "
                        r"ValueError: the real problem; see `phalanx logs \w+ --rank 0` and `phalanx status \w+`", end)


def test_quiet_silences_both(phx_home, proj):
    proc = phalanx("run", "-q", "ok.py", cwd=proj, check=True)
    assert proc.stderr == "err\n" and proc.stdout == "out []\n"  # the script's own streams only
    proc = phalanx("run", "-q", "bad.py", cwd=proj)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.rstrip().endswith("ValueError: the real problem")


def test_json_keeps_stdout_for_json(phx_home, proj):
    proc = phalanx("run", "--json", "-n", "2", "ok.py", cwd=proj, check=True)
    record = json.loads(proc.stdout)
    assert record["state"] == "SUCCEEDED" and record["name"] == "ok"
    assert proc.stderr.count("out []") == 2 and "started" in proc.stderr


def test_everything_after_the_module_is_the_modules(phx_home, proj):
    proc = phalanx("run", "-q", "-m", "pkg.train", "--seed", "3", "-n", "4", "--dry-run", cwd=proj, check=True)
    assert proc.stdout == "module args ['--seed', '3', '-n', '4', '--dry-run']\n"
    assert json.loads(phalanx("ps", "--all", "--json", check=True).stdout)[0]["topology"] == "1x1"
