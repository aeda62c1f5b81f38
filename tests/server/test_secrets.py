"""Secrets kept by a team server (docs/secrets.md, "On a team server"): per user and per project,
AES-256-GCM at rest under a key the operator gives (``--secrets-key-file``). A real PostgreSQL, real
``phalanx server`` processes and a real CLI per person: a project admin sets ``vision/hf``, a member
sets her own, her job gets both (the ranks see the values, the logs ``********``); a non-member's job
naming the project's is refused in one line with nothing created; the canaries' bytes are nowhere
in a dump of the database, the server's log, the homes' files or the API's answers; a server
started with another key cannot read them, and one with none keeps none (one line each)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.server.conftest import Person, cli

CANARY = "srv-canary-9f3b7c1d2e"  # the server user's own (local) secret: must reach no one
PROJECT_CANARY = "srv-canary-proj-4a8e0c6b71"
OWN_CANARY = "srv-canary-own-d15b93e27f"
NO_KEY = "this server keeps no secrets: its operator has not given it a key (--secrets-key-file)"

SHOW = """import hashlib, os
for var in ("HF", "MINE"):
    value = os.environ.get(var, "")
    print(var, hashlib.sha256(value.encode()).hexdigest(), value)
"""


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _one_line(done) -> bool:
    return len(done.stderr.strip().splitlines()) == 1


def _key(where: Path) -> Path:
    done = cli(["server", "secrets-key"], {**os.environ}, cwd=where.parent)
    assert done.returncode == 0, done.stderr
    where.write_text(done.stdout)
    where.chmod(0o600)
    return where


def _hits(root: Path, needles: tuple[str, ...]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def test_a_server_without_a_key_refuses_a_job_that_asks_for_a_secret_and_hands_out_none_of_its_own(sqlite_server, tmp_path):
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
        assert NO_KEY in done.stderr and _one_line(done) and CANARY not in done.stdout + done.stderr, done.stderr
    assert json.loads(mia.run("ps", "--all", "--json").stdout) == [], "nothing was created"

    for args in (["secret", "list"], ["secret", "rm", "HF_TOKEN"], ["secret", "set", "X"]):
        done = mia.run(*args, input="some-value")
        assert done.returncode == 2 and NO_KEY in done.stderr and _one_line(done), done.stderr
    mine = mia.run("--local", "secret", "list")  # her own machine's store still answers
    assert mine.returncode == 0 and "no secrets" in mine.stdout, mine.stderr
    assert CANARY not in (server.log.read_text() if server.log else "")


def test_a_servers_secrets_reach_the_ranks_of_who_may_use_them_and_nothing_else(server, postgres, tmp_path):
    key = _key(server.root / "secrets.key")
    tokens = {name: server.add_user(name) for name in ("alice", "bob", "carol")}
    for args in (("add", "vision"), ("member", "add", "vision", "alice"),
                 ("member", "add", "vision", "bob", "--role", "admin")):
        done = server.admin("project", *args)
        assert done.returncode == 0, done.stderr
    server.start("--secrets-key-file", str(key))
    people = {name: Person(name, tmp_path / name, token) for name, token in tokens.items()}
    answers: list[str] = []  # every API answer the CLI printed
    for person in people.values():
        (person.root / "p").mkdir(parents=True)
        (person.root / "p" / "show.py").write_text(SHOW)
        assert person.login(server.url).returncode == 0
    alice, bob, carol = people["alice"], people["bob"], people["carol"]

    def said(done):
        answers.append(done.stdout + done.stderr)
        return done

    set_own = said(alice.run("secret", "set", "MINE", input=OWN_CANARY + "\n"))
    assert set_own.returncode == 0 and "secret MINE set in the team server" in set_own.stdout, set_own.stderr
    set_proj = said(bob.run("secret", "set", "vision/hf", input=PROJECT_CANARY))
    assert set_proj.returncode == 0, set_proj.stderr
    refused = said(alice.run("secret", "set", "vision/hf", input="not-an-admin-value"))
    assert refused.returncode != 0 and "only an admin of project 'vision'" in refused.stderr and _one_line(refused)

    listed = said(alice.run("secret", "list", "--json"))
    assert listed.returncode == 0, listed.stderr
    assert [(s["name"], s["owner"]) for s in json.loads(listed.stdout)] == [("MINE", "alice"), ("vision/hf", "vision")]
    assert [s["name"] for s in json.loads(said(carol.run("secret", "list", "--json")).stdout)] == []

    ran = said(alice.run("run", "--secret", "HF=vision/hf", "--secret", "MINE", "show.py", cwd=alice.root / "p"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"HF {_sha(PROJECT_CANARY)} ********" in ran.stdout and f"MINE {_sha(OWN_CANARY)} ********" in ran.stdout, ran.stdout
    job = json.loads(said(alice.run("ps", "--all", "--json")).stdout)[0]["id"]
    logs = said(alice.run("logs", job))
    assert f"HF {_sha(PROJECT_CANARY)} ********" in logs.stdout, logs.stdout + logs.stderr
    said(alice.run("status", job, "--json"))
    planned = said(alice.run("run", "--dry-run", "--secret", "HF=vision/hf", "show.py", cwd=alice.root / "p"))
    assert planned.returncode == 0 and "HF=<secret>" in planned.stdout, planned.stdout + planned.stderr
    audited = said(bob.run("events", "--json", "--project", "vision"))
    rows = [(e["user"], e["action"], e["target"], e["outcome"]) for e in json.loads(audited.stdout)]
    assert ("bob", "secret.set", "vision/hf", "ok") in rows and ("alice", "secret.set", "vision/hf", "denied") in rows, rows

    for args in (["run", "--secret", "HF=vision/hf", "show.py"], ["run", "-d", "--secret", "HF=vision/hf", "show.py"]):
        done = said(carol.run(*args, cwd=carol.root / "p"))
        assert done.returncode == 2 and "no secret 'vision/hf' you may read" in done.stderr and _one_line(done), done.stderr
    assert [j["id"] for j in json.loads(carol.run("ps", "--all", "--json").stdout)] == [job], "nothing was created"
    stolen = said(carol.run("run", "--secret", "MINE", "show.py", cwd=carol.root / "p"))  # alice's own is not hers
    assert stolen.returncode == 2 and "no secret 'MINE'" in stolen.stderr, stolen.stderr

    assert postgres.pid() is not None
    db = server.store.rsplit("/", 1)[1]
    dump = postgres._run("pg_dump", "-h", str(postgres.dir), "-p", str(postgres.port), "-U", "postgres", db)
    assert "CREATE TABLE" in dump and "secrets" in dump
    needles = (OWN_CANARY, PROJECT_CANARY)
    assert not [n for n in needles if n in dump], "the database holds ciphertext only"
    assert not [n for n in needles if n in "\n".join(answers).replace("********", "")], "no answer carries a value"
    assert not _hits(server.root, needles) and not _hits(tmp_path, needles), "no file anywhere holds a value"

    server.stop()  # the same store, another key: nothing can be read
    server.start("--secrets-key-file", str(_key(server.root / "other.key")))
    assert alice.login(server.url).returncode == 0  # (a new port)
    other = said(alice.run("run", "--secret", "MINE", "show.py", cwd=alice.root / "p"))
    assert other.returncode == 2 and "cannot be decrypted with this server's key" in other.stderr and _one_line(other), other.stderr
    assert len(json.loads(alice.run("ps", "--all", "--json").stdout)) == 1, "nothing more was created"
