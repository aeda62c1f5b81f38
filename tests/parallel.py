"""How the suite runs on several processes (pytest-xdist), and why it is safe to.

The suite mostly waits: on daemons it starts (Ray in network namespaces, sshd, slurmd, moto), on
real torchrun and gloo runs, on warm pools. So ``python -m pytest`` (the whole suite, no paths
named) runs on ``WORKERS`` processes even on a 2-core machine; naming files or directories runs
in this one process, unless ``-n N`` is given. ``-n0`` or ``-p no:xdist`` always run in one.

What goes to which worker (``FileScheduling``, which serves ``--dist loadfile``):

- a whole test file, so module fixtures (a fake API server, a pool directory) start once;
- files that share an expensive session fixture (``GROUPS``: a daemon, a set of real jobs) go
  together, so it starts once per run, as on one process;
- the heaviest of these units first (``WEIGHT``), so that a long one does not start last and
  keep the run going while the other workers idle.

Each worker has its own base temporary directory (``popen-gwN``) and so its own warm pools,
phalanx homes and daemons' files; namespaces and subnets are claimed under a machine-wide lock
(``tests/cluster/netns.py``); every test-started daemon listens on a port the kernel chose.
"""

from __future__ import annotations

import os

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# Two cores, and most of the time is spent waiting: 3 workers (4 measured fastest, but add load
# that load-sensitive tests feel; docs/contributing.md). PHALANX_TEST_WORKERS overrides it.
WORKERS = 3

# Expensive session fixtures (a daemon, a set of real jobs) used by more than one file, and those
# files: they run on one worker, so the fixture starts once per run, as on one process. A fixture
# used by one file needs no entry (a file is never split). ``check_groups`` fails the run when a
# file uses one of these fixtures and is not listed.
GROUPS: dict[str, tuple[str, ...]] = {
    "s3_server": ("tests/cluster/test_channels_s3.py", "tests/cluster/test_sagemaker_fakeplane.py",
                  "tests/cluster/test_sagemaker_moto.py", "tests/cluster/test_state_s3.py"),
    "demo": ("tests/web/test_api.py", "tests/web/test_browser.py"),
    "ssh_hosts": ("tests/cluster/test_ssh.py", "tests/cluster/test_secrets_canary.py"),
    # a private PostgreSQL (tests/pgserver.py): the store's tests on its second engine
    "pg_server": ("tests/unit/test_store.py", "tests/unit/test_store_plans.py", "tests/unit/test_store_engines.py",
                  "tests/unit/test_store_concurrency.py", "tests/unit/test_store_listing.py",
                  "tests/local/test_pgstore_cli.py", "tests/unit/test_store_leases.py", "tests/unit/test_teams.py",
                  "tests/unit/test_server_secrets.py"),
}
SHARED = ("ray_cluster", "slurm_cluster", "netns_hosts", *GROUPS)
SCOPE = {path: name for name, paths in GROUPS.items() for path in paths}

# Rough cost of the longest scopes (seconds their tests took in a run of 4 workers on 2 busy
# cores, --durations=0); the rest count as 0 and keep their collection order after these.
WEIGHT: dict[str, float] = {
    "s3_server": 800, "tests/differential/test_differential.py": 470, "tests/cluster/test_ray.py": 450,
    "tests/cluster/test_slurm.py": 300, "ssh_hosts": 260, "tests/kubernetes/test_k8s_inpod_netns.py": 230,
    "tests/differential/test_contracts.py": 260, "tests/local/test_run.py": 210, "tests/local/test_survival.py": 210, "tests/local/test_torchrun_cli.py": 210,
    "tests/terminal/test_ctrl_c.py": 180, "tests/cluster/test_track_mlflow.py": 200,
    "tests/kubernetes/test_k8s_fakeapi_lifecycles.py": 120, "demo": 100,
    "tests/local/test_health.py": 200, "pg_server": 300,
}


def default_workers(config: pytest.Config) -> None:
    """``-n WORKERS --dist loadfile`` when the whole suite runs (no paths on the command line) and
    no ``-n`` was given; a run of named files stays in this process."""
    if hasattr(config, "workerinput") or config.option.numprocesses is not None:
        return
    if config.getoption("collectonly") or config.getoption("usepdb"):
        return
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return
    config.option.numprocesses = int(os.environ.get("PHALANX_TEST_WORKERS", WORKERS))
    if config.option.dist == "no":
        config.option.dist = "loadfile"


def check_groups(items: list[pytest.Item]) -> None:
    """Every file that uses a fixture of ``SHARED`` is in the scope of the others that do."""
    users: dict[str, set[str]] = {}
    for item in items:
        used = getattr(item, "fixturenames", ())
        for name in SHARED:
            if name in used:
                users.setdefault(name, set()).add(item.nodeid.split("::", 1)[0])
    for name, files in users.items():
        scopes = {scope(f) for f in files}
        if len(scopes) > 1:
            raise pytest.UsageError(f"{', '.join(sorted(files))} use the session fixture {name}; list them together "
                                    f"in GROUPS[{name!r}] in tests/parallel.py, so that parallel runs start it once")


def scope(path: str) -> str:
    """The unit of scheduling ``path`` (a test file) belongs to: its group, or itself."""
    return SCOPE.get(path, path)


class FileScheduling(LoadScopeScheduling):
    """xdist's ``loadfile`` with ``GROUPS`` of files, the heaviest handed out first. (Not xdist's
    ``xdist_group`` marks: pytest-xdist 3.8 tags a marked test by rewriting ``item._nodeid``,
    which pytest 9.2 no longer reads, so marked tests would be scheduled one by one.)"""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the parent's order (most tests first) is replaced
        self._ranked = False

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ranked:  # the first assignment: the queue holds every unit, in collection order
            self._ranked = True
            units = list(self.workqueue.items())
            units.sort(key=lambda unit: -WEIGHT.get(unit[0], 0.0))  # stable: ties keep their order
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        return scope(nodeid.split("::", 1)[0])
