"""The docs site builds strictly (a broken link, a broken anchor or a page left out of the navigation
fails it), and CI runs the README's test command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
QUIET = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2 (not a warning)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="the docs extra (in test) builds the site")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, capture_output=True, text=True,
                          timeout=300, env=QUIET)


def test_the_site_builds_strictly(tmp_path):
    proc = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, f"mkdocs build --strict failed (see docs/contributing.md):\n{proc.stderr[-4000:]}"
    assert (tmp_path / "site" / "getting-started" / "index.html").exists()


def test_the_strict_build_fails_on_a_broken_link_an_anchor_and_a_page_out_of_the_nav(tmp_path):
    """The configuration's validation settings, on a small site of their own."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["nav"] = [{"Home": "index.md"}, {"Other": "other.md"}]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    docs = tmp_path / config["docs_dir"]
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](gone.md), [no such heading](other.md#nowhere), [fine](other.md#there)\n")
    (docs / "other.md").write_text("# Other\n\n## There\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    proc = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0, proc.stderr
    assert "'gone.md'" in proc.stderr and "not found" in proc.stderr, proc.stderr
    assert "'#nowhere'" in proc.stderr, proc.stderr
    assert "orphan.md" in proc.stderr and "not included in the \"nav\"" in proc.stderr, proc.stderr
    assert "#there" not in proc.stderr, proc.stderr


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return blocks[:2]


def test_the_readme_starts_with_its_two_commands():
    run, tests = _readme_commands()
    assert run == ("python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[torch]' && "
                   ".venv/bin/phalanx run -n 2 examples/train_ddp.py --epochs 2")
    assert tests.startswith("python3 -m venv .venv && ") and tests.endswith(" && .venv/bin/python -m pytest -q")


def test_ci_runs_the_readme_test_command():
    """Every step of the README's test command is a line of .ci/run, in the same order (`-q`
    aside: pip is quiet there)."""
    def words(text: str) -> list[str]:
        try:
            return [w for w in shlex.split(text) if w != "-q"]
        except ValueError:  # a shell line continued with a backslash: not one of these steps
            return []

    steps = [words(step) for step in _readme_commands()[1].split(" && ")]
    lines = [words(line) for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    found = []
    for step in steps:
        matches = [i for i, line in enumerate(lines) if line == step]
        assert matches, f".ci/run does not run the README's {' '.join(step)!r}"
        found.append(matches[-1])
    assert found == sorted(found), ".ci/run runs the README's steps in another order"
