"""Bad input and faults against a real server: unreachable, TLS wrong, a token wrong, revoked or
missing (one line naming the URL and the fix, exit 2, nothing saved or half-made); plain HTTP
off loopback refused; request size limits; the rate limit on failed logins; request bodies
checked with one-line errors; manifests that would write outside their tree."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from tests.server.conftest import OPENSSL, Person, make_ca


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, token: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_unreachable_server_is_one_line_naming_it_and_nothing_is_saved(tmp_path):
    person = Person("dan", tmp_path / "dan", "phx_000000000000_" + "a" * 43)
    person.root.mkdir()
    url = f"http://127.0.0.1:{_free_port()}"
    done = person.login(url)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"phalanx: error: cannot reach the phalanx server at {url}: ")
    assert done.stderr.count("\n") == 1 and "--local" in done.stderr
    assert not (person.root / "config" / "phalanx" / "login.json").exists()
    ps = person.run("ps", env={"PHALANX_SERVER": url, "PHALANX_TOKEN": person.token})
    assert ps.returncode == 2 and ps.stderr.startswith(f"phalanx: error: cannot reach the phalanx server at {url}")
    local = person.run("--local", "ps", env={"PHALANX_SERVER": url})
    assert local.returncode == 0 and local.stdout.startswith("no running jobs")


def test_tokens_wrong_revoked_rotated_or_missing(server, tmp_path):
    token = server.add_user("erin")
    server.start()
    erin = Person("erin", tmp_path / "erin", token)
    erin.root.mkdir()
    wrong = erin.login(server.url, token=token[:-4] + "AAAA")
    assert wrong.returncode == 2
    assert wrong.stderr == (f"phalanx: error: the API token is not valid on this server ({server.url}); "
                            f"log in again with: phalanx login {server.url} (or set PHALANX_TOKEN)\n")
    assert not (erin.root / "config" / "phalanx" / "login.json").exists(), "a failed login saves nothing"
    assert erin.login(server.url).returncode == 0
    saved = erin.root / "config" / "phalanx" / "login.json"
    assert saved.stat().st_mode & 0o777 == 0o600 and token in saved.read_text()
    assert erin.run("ps").returncode == 0
    missing = erin.run("ps", env={"PHALANX_SERVER": server.url + "/", "XDG_CONFIG_HOME": str(tmp_path / "nowhere")})
    assert missing.returncode == 2 and missing.stderr.startswith(f"phalanx: error: no API token given ({server.url})")

    rotated = server.admin("token", "rotate", "erin")
    assert rotated.returncode == 0
    old = erin.run("ps")
    assert old.returncode == 2 and "the API token was revoked" in old.stderr and server.url in old.stderr
    new_token = rotated.stdout.strip()
    assert erin.login(server.url, token=new_token).returncode == 0 and erin.run("ps").returncode == 0

    assert server.admin("user", "revoke", "erin").stdout.strip() == "user erin revoked"
    revoked = erin.run("ps")
    assert revoked.returncode == 2 and revoked.stderr.count("\n") == 1
    assert f"the API token was revoked ({server.url}); " in revoked.stderr
    listed = server.admin("user", "list").stdout
    assert "erin" in listed and new_token not in listed and token not in listed
    assert new_token not in (server.root / "server.err").read_text()


def test_failed_logins_are_rate_limited_per_address(server, tmp_path):
    token = server.add_user("frank")
    server.start()
    frank = Person("frank", tmp_path / "frank", token)
    frank.root.mkdir()
    for _ in range(10):
        assert frank.login(server.url, token="phx_0123456789ab_" + "x" * 43).returncode == 2
    limited = frank.login(server.url)  # even the right token, from this address, for a while
    assert limited.returncode == 2
    assert f"too many failed logins from 127.0.0.1 ({server.url}); try again in " in limited.stderr


@pytest.mark.skipif(OPENSSL is None, reason="openssl makes the test CA (apt-get install openssl)")
def test_tls_from_a_test_ca_and_a_certificate_not_trusted(server, tmp_path):
    ca, cert, key = make_ca(tmp_path / "ca")
    token = server.add_user("gina")
    server.start("--tls-cert", str(cert), "--tls-key", str(key))
    assert server.url.startswith("https://127.0.0.1:")
    gina = Person("gina", tmp_path / "gina", token)
    gina.root.mkdir()
    untrusted = gina.login(server.url)
    assert untrusted.returncode == 2 and untrusted.stderr.count("\n") == 1
    assert untrusted.stderr.startswith(f"phalanx: error: the TLS certificate of {server.url} is not trusted")
    assert "--ca-cert" in untrusted.stderr
    plain = gina.login(server.url.replace("https://", "http://"))
    assert plain.returncode == 2 and "cannot reach the phalanx server at http://" in plain.stderr
    trusted = gina.login(server.url, ca=ca)
    assert trusted.returncode == 0, trusted.stderr
    (gina.root / "hello.py").write_text("print('hello over TLS')\n")
    ran = gina.run("run", "hello.py")
    assert ran.returncode == 0 and ran.stdout == "hello over TLS\n", ran.stderr


def test_plain_http_off_loopback_is_refused_unless_a_proxy_is_said(server, tmp_path):
    proc = server.start("--host", "0.0.0.0", expect_fail=True)
    err = (server.root / "server.err").read_text()
    assert proc.returncode == 2 and err.count("\n") == 1
    assert err.startswith("phalanx: error: refusing to serve on 0.0.0.0 over plain HTTP")
    assert "--tls-cert" in err and "--insecure-http" in err
    server.add_user("hank", admin=True)
    server.start("--host", "0.0.0.0", "--insecure-http")
    with urllib.request.urlopen(server.url.replace("0.0.0.0", "127.0.0.1") + "/healthz", timeout=30) as answer:
        assert answer.read() == b"ok\n"


def test_requests_are_bounded_checked_and_a_bad_submit_leaves_nothing(server, tmp_path):
    token = server.add_user("ivy")
    server.start()
    api = server.url + "/api/v1"
    status, body = _announced(server.url, token, 40 * 1024 * 1024)  # the body is refused before it is sent
    assert status == 413 and "over the limit" in body["error"]["message"]
    status, body = _post(f"{api}/jobs", token, b"not json")
    assert status == 400 and body["error"]["message"].startswith("the request body is not JSON")
    status, body = _post(f"{api}/jobs", token, json.dumps({"spec": {"entrypoint": {"kind": 3, "target": "t.py"}}}).encode())
    assert (status, body["error"]["message"]) == (400, "request.spec.entrypoint.kind: expected a string, not 3")
    status, body = _post(f"{api}/jobs", token, json.dumps({"spec": {"entrypoint": {"kind": "script", "target": "t"}},
                                                           "colour": "red"}).encode())
    assert status == 400 and body["error"]["message"] == "request: unknown field 'colour'"
    sha = "0" * 64
    escape = {"spec": {"entrypoint": {"kind": "script", "target": "/x/t.py", "typed": "t.py"}, "workdir": "/x"},
              "code": {"root": "/x", "files": [["../../outside.py", sha, 0, 3]]}}
    lines = _lines(f"{api}/jobs", token, escape)
    assert lines[-1]["error"]["message"].startswith("the manifest names '../../outside.py', which is not a path inside")
    lacking = {**escape, "code": {"root": "/x", "files": [["t.py", sha, 0, 3]]}}
    assert "the server lacks 1 file(s) of the code" in _lines(f"{api}/jobs", token, lacking)[-1]["error"]["message"]
    assert not (server.home / "jobs").exists() or not any((server.home / "jobs").iterdir())
    assert not (server.home / "shipped").exists() or not any((server.home / "shipped").iterdir()), "nothing half-made"
    assert not (server.root.parent / "outside.py").exists()


def _lines(url: str, token: str, body: dict) -> list[dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return [json.loads(line) for line in answer.read().splitlines() if line.strip()]


def _announced(url: str, token: str, length: int) -> tuple[int, dict]:
    """A submit announcing ``length`` bytes of body, answered before any of it is sent."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.putrequest("POST", "/api/v1/jobs")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    answer = conn.getresponse()
    try:
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_a_restart_of_the_server_restarts_nothing_and_loses_nothing(sqlite_server, tmp_path):
    server = sqlite_server  # a store of one's own (the SQLite file in the server's home) serves a team too
    token = server.add_user("nora")
    server.start()
    nora = Person("nora", tmp_path / "nora", token)
    (nora.root / "p").mkdir(parents=True)
    (nora.root / "p" / "slow.py").write_text("import time\nfor i in range(30):\n    print('beat', i, flush=True)\n"
                                             "    time.sleep(0.2)\n")
    assert nora.login(server.url).returncode == 0
    job = nora.run("run", "-d", "slow.py", cwd=nora.root / "p").stdout.strip()
    supervisor = json.loads(nora.run("status", job, "--json").stdout)["supervisor"]["pid"]
    server.stop()
    down = nora.run("ps")
    assert down.returncode == 2 and "cannot reach the phalanx server" in down.stderr
    import os

    os.kill(supervisor, 0)  # the job's supervisor runs on without the server
    server.start()
    nora.login(server.url)  # a new port; the same store and token
    followed = nora.run("logs", "-f", job)
    assert followed.returncode == 0 and followed.stdout.splitlines()[-1] == "beat 29"
    status = json.loads(nora.run("status", job, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["attempt"] == 0, "ran once, to its end"


def test_the_admin_commands_refuse_bad_input_in_one_line(server, tmp_path):
    server.add_user("olga")
    again = server.admin("user", "add", "olga")
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr == ("phalanx: error: user 'olga' exists; give them a new token with: "
                            "phalanx server token rotate olga\n")
    assert server.admin("user", "add", "Olga Smith").stderr.startswith("phalanx: error: invalid user name 'Olga Smith'")
    assert server.admin("user", "revoke", "nobody").stderr == \
        "phalanx: error: no user 'nobody'; list them with: phalanx server user list\n"
    lonely = server.start("--tls-cert", str(tmp_path / "cert.pem"), expect_fail=True)
    assert lonely.returncode == 2
    assert (server.root / "server.err").read_text() == \
        "phalanx: error: --tls-cert and --tls-key go together; give both (the certificate and its private key)\n"
    listed = json.loads(server.admin("user", "list", "--json").stdout)
    assert [(u["name"], u["admin"], u["tokens"]) for u in listed] == [("olga", False, 1)]
