"""The same scripts under python/torchrun and under ``phalanx run``: what they saw and left must
match, except what phalanx adds on purpose (harness.ALLOWED_EXTRA). Real processes only.

Every case runs twice on the phalanx side: warm (the default: its processes forked from a warm
pool, which a first, unobserved run of the same command starts) and ``--cold``. A last test runs
the same probe under ``phalanx run --cold`` and warm and asks for everything a script can find out
about how it was started to be equal."""

from __future__ import annotations

import importlib.util
import json

import pytest

from .cases import CASES
from .compare import _check_common, _run, compare, params
from .harness import Case

pytestmark = pytest.mark.local

SLOW = {"lightning_starts_its_own_workers", "public_mnist_style_example", "jax_initialize_no_arguments",
        "jax_initialize_own_arguments", "jax_initialize_in_a_helper_after_phalanx"}


@pytest.mark.parametrize("case,start", params(CASES, SLOW))
def test_script_sees_and_leaves_the_same(case, start, tmp_path, phx_home, pool_dir):
    compare(case, start, tmp_path, phx_home, pool_dir)


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
