"""Reaching the API server the way kubectl does, against a FAKE API server: kubeconfig files
merged, contexts, certificate authorities and client certificates over real TLS, exec
credential plugins, a pod's service account; and the server's refusals as one-line errors."""

from __future__ import annotations

import os
import shutil
import ssl
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from phalanx.backends.kubernetes import kubeconfig
from phalanx.backends.kubernetes.client import ApiError, Client
from phalanx.errors import UsageError

from .fakeapi import FakeApiServer, Store


def _config(server: str, **user) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "ci",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": user or {"token": "t0k"}}],
            "contexts": [{"name": "ci", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}]}


@pytest.fixture
def api():
    server = FakeApiServer(Store())
    server.store.namespaces.add("team-a")
    yield server
    server.close()


def test_k8s_client_kubeconfig_token_namespace_and_verbs(api, tmp_path, monkeypatch):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(_config(api.url)))
    monkeypatch.setenv("KUBECONFIG", str(path))
    client = Client(kubeconfig.load())
    assert client.namespace == "team-a" and client.creds.context == "ci"
    made = client.create("ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "1"}}})
    assert made["metadata"]["namespace"] == "team-a" and made["metadata"]["uid"]
    client.create("ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}})
    assert [o["metadata"]["name"] for o in client.list("ConfigMap", labels="x=1")] == ["a"]
    assert [o["metadata"]["name"] for o in client.list("ConfigMap", labels="!x")] == ["b"]
    patched = client.patch("ConfigMap", "a", {"metadata": {"labels": {"y": "2", "x": None}}})
    assert patched["metadata"]["labels"] == {"y": "2"}
    assert int(patched["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as err:
        client.create("ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
    assert err.value.code == 409 and 'configmaps "a" already exists' in str(err.value)
    assert client.delete("ConfigMap", "a") and not client.delete("ConfigMap", "a")  # idempotent
    assert set(api.store.auth) == {"Bearer t0k"}


def test_k8s_client_merges_kubeconfig_files_as_kubectl_does(api, tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    (tmp_path / "ca").mkdir()
    one = _config(api.url)
    one.pop("current-context")
    two = _config("https://elsewhere:6443")
    two["current-context"] = "other"
    two["contexts"].append({"name": "other", "context": {"cluster": "c", "user": "u"}})
    first.write_text(yaml.safe_dump(one))
    second.write_text(yaml.safe_dump(two))
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}{os.pathsep}{tmp_path / 'missing'}")
    creds = kubeconfig.load()
    assert creds.context == "other" and creds.server == api.url  # the first file's cluster "c" wins
    with pytest.raises(UsageError, match="context 'nope' is not in the kubeconfig") as err:
        kubeconfig.load("nope")
    assert "contexts there: ci, other" in str(err.value)


def test_k8s_client_exec_credential_plugin_is_run_and_cached(api, tmp_path, monkeypatch):
    plugin = tmp_path / "get-token"
    calls = tmp_path / "calls"
    plugin.write_text(f"""#!/bin/sh
echo call >> {calls}
test "$(echo "$KUBERNETES_EXEC_INFO" | grep -c ExecCredential)" = 1 || exit 3
echo '{{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
  "status": {{"token": "from-plugin-'$1'", "expirationTimestamp": "2099-01-01T00:00:00Z"}}}}'
""")
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(_config(api.url, exec={"apiVersion": "client.authentication.k8s.io/v1",
                                                          "command": str(plugin), "args": ["x"]})))
    monkeypatch.setenv("KUBECONFIG", str(path))
    client = Client(kubeconfig.load())
    client.get("Namespace", "team-a")
    client.get("Namespace", "team-a")
    assert api.store.auth[-2:] == ["Bearer from-plugin-x"] * 2
    assert calls.read_text().count("call") == 1, "the credential is cached until it expires"


def test_k8s_client_a_failing_plugin_says_to_log_in_again(api, tmp_path, monkeypatch):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(_config(api.url, exec={"command": "sh", "args": ["-c", "echo 'token expired' >&2; exit 1"]})))
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(UsageError, match="the credential plugin 'sh' of context ci failed: token expired; log in"):
        Client(kubeconfig.load()).get("Namespace", "team-a")


def test_k8s_client_in_a_pod_uses_its_service_account(api, tmp_path, monkeypatch):
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("sa-token\n")
    (account / "namespace").write_text("team-a")
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    creds = kubeconfig.load()
    assert creds.context == "in-cluster" and creds.namespace == "team-a" and creds.server.startswith("https://127.0.0.1:")
    assert creds.bearer_token() == "sa-token"
    (account / "token").write_text("rotated\n")
    assert creds.bearer_token() == "rotated"  # the kubelet rotates it: read every time


def test_k8s_client_no_configuration_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT", tmp_path / "no-sa")
    with pytest.raises(UsageError, match="no Kubernetes configuration: the files in KUBECONFIG do not exist"):
        kubeconfig.load()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=fake-ca", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "phalanx")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
        extra = ["-extfile", "san.cnf"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", *extra, cwd=d)
    return d


def test_k8s_client_tls_with_a_cluster_ca_and_a_client_certificate(pki, tmp_path, monkeypatch):
    # The key pair's temporary file goes to a directory of this test's, so the check below sees
    # this client's files only (not those of a test running beside it).
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki / "server.crt", pki / "server.key")
    tls.load_verify_locations(pki / "ca.crt")
    tls.verify_mode = ssl.CERT_REQUIRED  # the API server asks for the client's certificate
    api = FakeApiServer(Store(), tls=tls)
    api.store.namespaces.add("team-a")
    try:
        config = _config(api.url, **{"client-certificate": "pki/client.crt", "client-key": "pki/client.key"})
        config["clusters"][0]["cluster"]["certificate-authority"] = "pki/ca.crt"  # relative to the file
        path = tmp_path / "config"
        path.write_text(yaml.safe_dump(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        assert Client(kubeconfig.load()).get("Namespace", "team-a")["metadata"]["name"] == "team-a"
        config["clusters"][0]["cluster"]["certificate-authority"] = str(pki / "server.crt")  # not the issuer
        path.write_text(yaml.safe_dump(config))
        with pytest.raises(ApiError, match="its certificate is not trusted") as err:
            Client(kubeconfig.load(), timeout=5).get("Namespace", "team-a")
        assert err.value.code == 0 and "kubeconfig's server address" in str(err.value)
    finally:
        api.close()
    assert not list(private_tmp.glob("phx-kube-*")), "the client's key pair never stays on disk"


def test_k8s_client_unreachable_server_says_so(tmp_path, monkeypatch):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(_config("http://127.0.0.1:9")))
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(ApiError, match=r"cannot reach the API server http://127.0.0.1:9: Connection refused") as err:
        Client(kubeconfig.load(), timeout=5).get("Namespace", "x")
    assert err.value.code == 0
