"""``phalanx doctor`` while logged in to a team server: the server runs no doctor yet, so the
command says so in one line and points at ``--local`` (exit 2), and creates no job there. A real
server (``phalanx server`` on loopback) and a real CLI."""

from __future__ import annotations

import json

from tests.server.conftest import Person


def test_doctor_through_a_server_points_at_local(sqlite_server, tmp_path):
    server = sqlite_server
    token = server.add_user("ada")
    server.start()
    ada = Person("ada", tmp_path / "ada", token)
    ada.root.mkdir(parents=True)
    assert ada.login(server.url).returncode == 0
    done = ada.run("doctor", "-n", "2x1", cwd=ada.root)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "runs no doctor yet" in done.stderr and "phalanx --local doctor" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert json.loads(ada.run("ps", "--all", "--json").stdout) == [], "nothing was created"
