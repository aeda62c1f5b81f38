"""Where a rank's cgroup goes (launch/strays.locate), for the layouts machines have: a pure cgroup
v2 host (systemd), a hybrid host (v2 beside v1, as this machine), a container or cgroup namespace
whose mount shows a subtree, and none at all; and how leftovers are told (monitor/report)."""

from __future__ import annotations

from phalanx.core.contracts import NodeResult, Stray
from phalanx.launch.strays import leaf_name, locate
from phalanx.monitor.report import stray_lines

PURE_V2 = "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID = ("33 25 0:29 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
          "34 33 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n"
          "36 33 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n")
SUBTREE = "40 30 0:23 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
SPACE = "41 30 0:23 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n"


def test_the_rank_cgroup_is_found_under_the_process_own_cgroup():
    session = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n"
    assert locate(session, PURE_V2) == "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope"
    assert locate("12:memory:/x\n0::/\n", HYBRID) == "/sys/fs/cgroup/unified/"
    assert locate("0::/kubepods/pod1/c1\n", SUBTREE) == "/sys/fs/cgroup"
    assert locate("0::/\n", SPACE) == "/mnt/cg two/"


def test_no_cgroup_v2_means_the_environment_marks_the_ranks():
    assert locate("4:memory:/x\n1:cpu:/x\n", HYBRID) is None  # cgroup v1 only
    assert locate("0::/gone (deleted)\n", PURE_V2) is None
    assert locate("0::/a\n", "36 33 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None
    assert locate("0::/elsewhere\n", SUBTREE) is None  # not under the mount's root
    assert leaf_name("ab12cd34", 2, 7) == "phalanx-ab12cd34.2.7"


def test_status_names_each_rank_leftovers_and_how_they_left():
    strays = (Stray(0, 1234, "python helper.py", "setsid"), Stray(1, 7, "sleep 600", None, killed=True),
              Stray(1, 8, "sleep 601", "own process group"))
    assert stray_lines(strays) == [
        "ended 1 leftover process of rank 0: pid 1234 `python helper.py` (setsid)",
        "ended 2 leftover processes of rank 1: pid 7 `sleep 600` (SIGKILL after the grace period), "
        "pid 8 `sleep 601` (own process group)",
    ]
    result = NodeResult(0, 0, strays=strays)
    assert NodeResult.from_dict(result.to_dict()) == result  # result.json keeps them
