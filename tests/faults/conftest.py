"""Real fault injection (issue 17, "Faults"): a small tmpfs that fills up, a read-only bind mount,
SIGKILL at random instants. Needs root (mount); skipped without it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs / bind mount: needs root")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs in a test-made directory, unmounted in teardown."""
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(writable home, the same home through a read-only bind mount); unmounted in teardown."""
    home, view = tmp_path / "home", tmp_path / "ro"
    home.mkdir()
    view.mkdir()
    subprocess.run(["mount", "--bind", str(home), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield home, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
