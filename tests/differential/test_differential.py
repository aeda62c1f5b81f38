"""The same scripts under python/torchrun and under ``phalanx run``: what they saw and left must
match, except what phalanx adds on purpose (harness.ALLOWED_EXTRA). Real processes only.

Every case runs twice on the phalanx side: warm (the default: its processes forked from a warm
pool, which a first, unobserved run of the same command starts) and ``--cold``. A last test runs
the same probe under ``phalanx run --cold`` and warm and asks for everything a script can find out
about how it was started to be equal."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter

import pytest

from phalanx.launch.warm import plan as warm

from ..conftest import stop_pools
from . import pools
from .cases import CASES
from .harness import BIN, Case, env_differences, run_both

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


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pools")
    os.chmod(directory, 0o700)
    yield str(directory)
    stop_pools(warm, str(directory))


def _env(pool_dir: str) -> dict[str, str]:
    """A user in an activated venv (`python` and `torchrun` on PATH are this venv's), with
    phalanx's own default for warm starts (on), its pools in this module's directory."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PHALANX_WARM_DIR": pool_dir}
    env.pop("PHALANX_WARM", None)  # the suite's conftest turns warm starts off elsewhere
    return env


def _run(case: Case, tmp_path, pool_dir: str, start: str):
    """Both runs of ``case``; phalanx's warm (every process forked from the pool: proven by the
    pool's count and by its log, where every cold start is noted) or ``--cold`` (none forked)."""
    env = _env(pool_dir)
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


@pytest.mark.parametrize("start", ["warm", "cold"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.name in SLOW else [])
                                  for c in CASES])
def test_script_sees_and_leaves_the_same(case, start, tmp_path, phx_home, pool_dir):
    for module in case.needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -c constraints.txt -e '.[test]')")
    reference, phalanx = _run(case, tmp_path, pool_dir, start)
    _check_common(case, reference, phalanx, case.reference[0])
    assert not list(phx_home.rglob("*.pt")) and not list(phx_home.rglob("done.txt")), "outputs landed in $PHALANX_HOME"
    for name, seen in reference.seen.items():
        theirs = phalanx.seen[name]
        for key in ("argv", "cwd", "file", "path0", "name", "globals", "spec", "package", "loader"):
            assert theirs[key] == seen[key], f"{name}: {key} is {theirs[key]!r} under phalanx, {seen[key]!r} under {case.reference[0]}"
        if case.by_hand is None:  # processes started by hand carry variables of their own
            assert env_differences(seen["env"], theirs["env"], case.multi) == []


def _same_job(seen: dict) -> dict:
    """A record with its job's id (in PHALANX_JOB_ID, the job directory, the rank's log...) as JOB."""
    return json.loads(json.dumps(seen).replace(seen["env"]["PHALANX_JOB_ID"], "JOB"))


def test_a_warm_run_and_a_cold_run_look_the_same_to_the_script(tmp_path, phx_home, pool_dir):
    """The same probe (projects/warm/proj/probe.py: it imports torch where installed, prints to
    both streams and exits 3) under ``phalanx run --cold`` and ``phalanx run`` warm: exit code,
    output, files, and every record equal: argv, ``sys.orig_argv``, ``sys.path``, cwd, ``__file__``,
    the main module's globals, ``sys.modules``, the whole environment (``os.environ`` and
    ``/proc/self/environ``), ``/proc/self/cmdline``, signal dispositions and mask, umask, the
    descriptors and where they point, session and group, the Python stack and the standard
    streams. Frozen code (the default snapshot) in both."""
    case = Case("warm_vs_cold", "warm", "proj", ("phalanx", "run", "--cold", "probe.py", "x", "--y", "z"),
                ("probe.py", "x", "--y", "z"))
    cold, warm_run = _run(case, tmp_path, pool_dir, "warm")
    assert cold.code == 3 and "to stdout ['x', '--y', 'z']" in cold.lines
    _check_common(case, cold, warm_run, "phalanx run --cold")
    (name,) = cold.seen
    seen_cold, seen_warm = _same_job(cold.seen[name]), _same_job(warm_run.seen[name])
    assert seen_cold["modules"] and seen_cold["stack"][-1][1] == "<module>"
    assert seen_cold["torch"] or importlib.util.find_spec("torch") is None
    for key in sorted(seen_cold):
        assert seen_warm[key] == seen_cold[key], f"{key} differs:\n" + "\n".join(_differences(seen_cold[key], seen_warm[key]))


def _differences(cold: object, warm: object) -> list[str]:
    if isinstance(cold, dict) and isinstance(warm, dict):
        return [f"{k}: cold {cold.get(k, '(absent)')!r:.200} | warm {warm.get(k, '(absent)')!r:.200}"
                for k in sorted(set(cold) | set(warm)) if cold.get(k, ()) != warm.get(k, ())]
    if isinstance(cold, list) and isinstance(warm, list):
        return [f"only cold: {[i for i in cold if i not in warm]!r:.500}", f"only warm: {[i for i in warm if i not in cold]!r:.500}"]
    return [f"cold {cold!r:.500}", f"warm {warm!r:.500}"]
