"""The same scripts under python/torchrun and under ``phalanx run``: what they saw and left must
match, except what phalanx adds on purpose (harness.ALLOWED_EXTRA). Real processes only."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

from .cases import CASES
from .harness import BIN, env_differences, run_both

pytestmark = pytest.mark.local

SLOW = {"lightning_starts_its_own_workers", "public_mnist_style_example", "jax_initialize_no_arguments",
        "jax_initialize_own_arguments", "jax_initialize_in_a_helper_after_phalanx"}


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


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.name in SLOW else [])
                                  for c in CASES])
def test_script_sees_and_leaves_the_same(case, tmp_path, phx_home):
    for module in case.needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -c constraints.txt -e '.[test]')")
    import os

    # A user in an activated venv: `python` and `torchrun` on PATH are this venv's.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    reference, phalanx = run_both(case, tmp_path, env)
    assert not reference.timed_out, f"the reference run hung:\n{reference.raw}"
    assert not phalanx.timed_out, f"phalanx run hung where {case.reference[0]} did not:\n{phalanx.raw}"
    assert phalanx.code == reference.code, f"exit code {phalanx.code}, {case.reference[0]} {reference.code}:\n{phalanx.raw}"
    ours, theirs = unglued(phalanx.lines, reference.lines), unglued(reference.lines, phalanx.lines)
    assert ours == theirs, (
        f"output differs:\nonly {case.reference[0]}: {sorted((theirs - ours).elements())}\n"
        f"only phalanx: {sorted((ours - theirs).elements())}")
    assert phalanx.files == reference.files, "files written differ (path -> sha256)"
    assert not list(phx_home.rglob("*.pt")) and not list(phx_home.rglob("done.txt")), "outputs landed in $PHALANX_HOME"
    assert sorted(phalanx.seen) == sorted(reference.seen)
    for name, seen in reference.seen.items():
        theirs = phalanx.seen[name]
        for key in ("argv", "cwd", "file", "path0", "name", "globals", "spec", "package", "loader"):
            assert theirs[key] == seen[key], f"{name}: {key} is {theirs[key]!r} under phalanx, {seen[key]!r} under {case.reference[0]}"
        if case.by_hand is None:  # processes started by hand carry variables of their own
            assert env_differences(seen["env"], theirs["env"], case.multi) == []
