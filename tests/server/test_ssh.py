"""A job submitted to the team server that runs on the ssh backend: the server ships the code it
received to the hosts (real sshd daemons on loopback addresses, ``tests/cluster/sshd.py``) with
its own ssh credentials, and the laptop sees the ranks' output as if it had run it there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.conftest import EXAMPLES
from tests.server.conftest import Person

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    from tests.cluster import sshd

    try:
        found = sshd.start(tmp_path_factory.mktemp("sshd-team"))
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start sshd here: {exc}")
    try:
        probe = found.ssh("node1", "true")
        if probe.returncode != 0:
            pytest.skip(f"sshd started but ssh fails: {probe.stderr.strip()}")
        yield found
    finally:
        sshd.stop(found)


def test_a_remote_run_on_the_ssh_backend(server, hosts, tmp_path):
    token = server.add_user("lee")
    server.start()
    lee = Person("lee", tmp_path / "lee", token)
    project = lee.root / "project"
    shutil.copytree(EXAMPLES, project / "examples")
    assert lee.login(server.url).returncode == 0
    ran = lee.run("run", "--backend", "ssh", "--ssh-config", str(hosts.config), "--hosts", ",".join(hosts.names),
                  "-n", "2x1", "examples/train_ddp.py", "--epochs", "1", "--steps-per-epoch", "3",
                  "--print-grad-checksum", cwd=project, timeout=400)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    grads = dict(re.findall(r"grad_checksum rank=(\d) value=(\S+)", ran.stdout))
    assert set(grads) == {"0", "1"} and grads["0"] == grads["1"], ran.stdout
    job = re.search(r"phalanx: job ([0-9a-f]{8}) \(train_ddp\) started: 2x1 on ssh", ran.stderr).group(1)  # type: ignore[union-attr]
    status = json.loads(lee.run("status", job, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["user_name"] == "lee"
    assert {r["node_rank"] for r in status["ranks"]} == {0, 1}
    shipped = [h / ".phalanx" / "remote" / "jobs" / job / "code" / "examples" / "train_ddp.py" for h in hosts.homes]
    assert all(p.is_file() for p in shipped), "the code the laptop sent reached every host"
    assert "done" in lee.run("logs", job, "--rank", "0").stdout
