"""One differential case, run and compared: the reference (python, torchrun or processes started by
hand) and ``phalanx run``, warm (the default: every process forked from a warm pool, which a first,
unobserved run of the same command starts) or ``--cold``. Used by every test file here that runs
cases of the table (``cases.py``)."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from typing import Iterable

import pytest

from . import pools
from .harness import BIN, Case, env_differences, portless, run_both


def params(cases: Iterable[Case], slow: frozenset[str] | set[str] = frozenset()) -> list:
    """``(case, start)`` parameters: each case under each of its starts, the slow ones marked."""
    cases = list(cases)
    return [pytest.param(c, start, id=f"{c.name}-{start}", marks=[pytest.mark.slow] if c.name in slow else [])
            for start in ("warm", "cold") for c in cases if start in c.starts]


def compare(case: Case, start: str, tmp_path, phx_home, pool_dir: str) -> None:
    """Run ``case`` both ways and assert that the script saw and left the same (and, with
    ``case.check``, what the case promises besides)."""
    for module in case.needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -c constraints.txt -e '.[test]')")
    reference, phalanx = _run(case, tmp_path, pool_dir, start)
    _check_common(case, reference, phalanx, case.reference[0])
    assert not list(phx_home.rglob("*.pt")) and not list(phx_home.rglob("done.txt")), "outputs landed in $PHALANX_HOME"
    for name, seen in reference.seen.items():
        theirs = phalanx.seen[name]
        assert portless(theirs["argv"]) == portless(seen["argv"]), f"{name}: argv {theirs['argv']} under phalanx, {seen['argv']}"
        for key in ("cwd", "file", "path0", "name", "globals", "spec", "package", "loader"):
            assert theirs[key] == seen[key], f"{name}: {key} is {theirs[key]!r} under phalanx, {seen[key]!r} under {case.reference[0]}"
        if case.by_hand is None:  # processes started by hand carry variables of their own
            assert env_differences(seen["env"], theirs["env"], case.multi) == []
    if case.check is not None:
        case.check(reference, phalanx)


def unglued(lines: Counter[str], other: Counter[str]) -> Counter[str]:
    """``lines`` with each line the other run lacks split in two where both halves are lines of the
    other run. Processes that share one stdout unbuffered (a script and the workers it starts itself,
    under python as under phalanx) write a line's text and its newline separately, so two lines may
    land glued together in either run; the words and their count must still be the same."""
    out: Counter[str] = Counter()
    for line, count in lines.items():
        if line not in other:
            cut = next((i for i in range(1, len(line)) if line[:i] in other and line[i:] in other), None)
            if cut is not None:
                out.update({line[:cut]: count})
                out.update({line[cut:]: count})
                continue
        out[line] += count
    return out


def env_for(pool_dir: str) -> dict[str, str]:
    """A user in an activated venv (`python` and `torchrun` on PATH are this venv's), with
    phalanx's own default for warm starts (on), its pools in this module's directory."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PHALANX_WARM_DIR": pool_dir}
    env.pop("PHALANX_WARM", None)  # the suite's conftest turns warm starts off elsewhere
    return env


def _run(case: Case, tmp_path, pool_dir: str, start: str) -> tuple:
    """Both runs of ``case``; phalanx's warm (every process forked from the pool: proven by the
    pool's count and by its log, where every cold start is noted) or ``--cold`` (none forked)."""
    env = env_for(pool_dir)
    before: dict[str, object] = {}

    def settle() -> None:
        pools.settle(pool_dir)
        before.update(served=pools.served(pool_dir), cold=pools.cold_starts(pool_dir))

    if start == "warm":
        reference, phalanx = run_both(case, tmp_path, env, settle=settle)
        assert pools.cold_starts(pool_dir) == before["cold"], "a process of the warm run started cold"
        assert pools.served(pool_dir) > before["served"], "the warm run was not forked from the pool"
    else:
        served = pools.served(pool_dir)
        reference, phalanx = run_both(case, tmp_path, env, options=("--cold",))
        assert pools.served(pool_dir) == served, "--cold forked from the pool"
    return reference, phalanx


def _check_common(case: Case, reference, phalanx, name: str) -> None:
    assert not reference.timed_out, f"the reference run hung:\n{reference.raw}"
    assert not phalanx.timed_out, f"phalanx run hung where {name} did not:\n{phalanx.raw}"
    assert phalanx.code == reference.code, f"exit code {phalanx.code}, {name} {reference.code}:\n{phalanx.raw}"
    ours, theirs = unglued(phalanx.lines, reference.lines), unglued(reference.lines, phalanx.lines)
    assert ours == theirs, (
        f"output differs:\nonly {name}: {sorted((theirs - ours).elements())}\n"
        f"only phalanx: {sorted((ours - theirs).elements())}")
    assert phalanx.files == reference.files, "files written differ (path -> sha256)"
    assert sorted(phalanx.seen) == sorted(reference.seen)
