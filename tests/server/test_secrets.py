"""Secrets and a team server (docs/secrets.md, "On a team server"): the server keeps none yet, so
it refuses a job that asks for one (exit 2, one line, nothing created) rather than reading the
store of whoever runs the server; ``phalanx secret ...`` while logged in says the same and points
at ``--local``. A real server (``phalanx server`` on loopback, the SQLite file in its home) and a
real CLI; the server's own user holds a secret of the asked name, which must reach no one."""

from __future__ import annotations

import json

from tests.server.conftest import Person, cli

CANARY = "srv-canary-9f3b7c1d2e"


def test_a_server_refuses_a_job_that_asks_for_a_secret_and_hands_out_none_of_its_own(sqlite_server, tmp_path):
    server = sqlite_server
    kept = cli(["secret", "set", "HF_TOKEN"], server.env, cwd=server.root, input=CANARY)  # the server user's own
    assert kept.returncode == 0, kept.stderr
    token = server.add_user("mia")
    server.start()
    mia = Person("mia", tmp_path / "mia", token)
    (mia.root / "p").mkdir(parents=True)
    (mia.root / "p" / "show.py").write_text("import os\nprint('got', os.environ.get('HF_TOKEN'))\n")
    assert mia.login(server.url).returncode == 0

    for args in (["run", "--secret", "HF_TOKEN", "show.py"], ["run", "-d", "--secret", "HF_TOKEN", "show.py"],
                 ["run", "--dry-run", "--secret", "HF_TOKEN", "show.py"], ["run", "--secret", "HF_TOKEN", "show.py", "--lr", "[1, 2]"]):
        done = mia.run(*args, cwd=mia.root / "p")
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "this server keeps no secrets yet" in done.stderr and "phalanx --local run" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and CANARY not in done.stdout + done.stderr
    assert json.loads(mia.run("ps", "--all", "--json").stdout) == [], "nothing was created"

    for args in (["secret", "list"], ["secret", "rm", "HF_TOKEN"]):
        done = mia.run(*args)
        assert done.returncode == 2 and "keeps no secrets yet" in done.stderr, done.stderr
        assert f"phalanx --local secret {args[1]}" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    mine = mia.run("--local", "secret", "list")  # her own machine's store still answers
    assert mine.returncode == 0 and "no secrets" in mine.stdout, mine.stderr
    assert CANARY not in (server.log.read_text() if server.log else "")
