"""Where the cluster is and who we are, found the way kubectl finds them.

In order: the files in ``$KUBECONFIG`` (colon-separated, merged: the first file to name a
context, cluster or user wins, as kubectl merges them), else ``~/.kube/config``, else, inside a
pod, its service account (``/var/run/secrets/kubernetes.io/serviceaccount``). ``--context``
picks a context, else the current one. Credentials: a token or token file, client
certificates, basic auth, an ``exec`` plugin (``aws eks get-token``,
``gke-gcloud-auth-plugin``: run through ``backends/commands.py`` and cached until the
credential expires) or an OIDC ``auth-provider``'s id-token.

Problems are UsageErrors naming the file and the fix: they are the user's to correct.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import UsageError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER = "in-cluster"  # the context name of a pod's service account
EXEC_INFO = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "spec": {"interactive": False}}


@dataclass
class Credentials:
    server: str
    context: str
    namespace: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    token_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    basic_auth: str | None = None  # user:password
    exec_spec: dict[str, Any] | None = None
    source: str = ""  # where this came from, for messages
    _exec_token: tuple[str, float] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bearer_token(self) -> str | None:
        if self.exec_spec is not None:
            return self._from_exec()
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()  # rotated by the kubelet: read every time
            except OSError:
                return self.token
        return self.token

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_data.decode() if self.ca_data else None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_data and self.key_data:
            # ssl reads key pairs from files only: a private file, removed at once.
            with tempfile.NamedTemporaryFile("wb", prefix="phx-kube-", delete=True) as pair:
                os.chmod(pair.name, 0o600)
                pair.write(self.cert_data + b"\n" + self.key_data)
                pair.flush()
                ctx.load_cert_chain(pair.name)
        return ctx

    def _from_exec(self) -> str:
        with self._lock:
            if self._exec_token and self._exec_token[1] > time.time() + 30:
                return self._exec_token[0]
            from ..commands import run

            spec = self.exec_spec or {}
            env = {str(e["name"]): str(e["value"]) for e in spec.get("env") or []}
            env["KUBERNETES_EXEC_INFO"] = json.dumps({**EXEC_INFO, "apiVersion": spec.get("apiVersion", EXEC_INFO["apiVersion"])})
            proc = run([str(spec.get("command")), *[str(a) for a in spec.get("args") or []]], env=env, timeout=60)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
                raise UsageError(f"the credential plugin '{spec.get('command')}' of context {self.context} failed: {last}",
                                 "log in to the cluster again (its CLI), then retry")
            try:
                status = json.loads(proc.stdout)["status"]
            except (ValueError, KeyError, TypeError):
                raise UsageError(f"the credential plugin '{spec.get('command')}' printed no ExecCredential",
                                 "check the users[].user.exec entry of your kubeconfig") from None
            if status.get("clientCertificateData") and not status.get("token"):
                self.cert_data, self.key_data = status["clientCertificateData"].encode(), status["clientKeyData"].encode()
                self._exec_token = ("", float("inf"))
                return ""
            from .node import parse_time

            expires = parse_time(status.get("expirationTimestamp")) or time.time() + 300
            self._exec_token = (str(status["token"]), expires)
            return self._exec_token[0]


def load(context: str | None = None, namespace: str | None = None) -> Credentials:
    """The credentials for ``context`` (or the current one). Raises UsageError."""
    files = _config_files()
    if not files:
        inside = in_cluster()
        if inside is not None and context is None:
            inside.namespace = namespace or inside.namespace
            return inside
        where = "the files in KUBECONFIG do not exist" if os.environ.get("KUBECONFIG") else "~/.kube/config does not exist"
        raise UsageError(f"no Kubernetes configuration: {where}" + ("" if inside is None else f" (context '{context}' asked for)"),
                         "point KUBECONFIG at your cluster's kubeconfig, or run phalanx inside the cluster")
    merged = _merge(files)
    names = sorted(merged["contexts"])
    chosen = context or merged.get("current-context")
    shown = ", ".join(map(str, files))
    if not chosen:
        raise UsageError(f"the kubeconfig ({shown}) names no current context", f"pass --context NAME (contexts: {', '.join(names) or 'none'})")
    if chosen not in merged["contexts"]:
        raise UsageError(f"context '{chosen}' is not in the kubeconfig ({shown})", f"contexts there: {', '.join(names) or 'none'}")
    ctx, base = merged["contexts"][chosen]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in merged["clusters"]:
        raise UsageError(f"context '{chosen}' names cluster '{cluster_name}', which the kubeconfig does not define", f"fix {shown}")
    cluster, cbase = merged["clusters"][cluster_name]
    user, ubase = merged["users"].get(user_name, ({}, base))
    creds = Credentials(server=str(cluster.get("server") or ""), context=str(chosen), source=shown,
                        namespace=namespace or ctx.get("namespace"))
    if not creds.server:
        raise UsageError(f"cluster '{cluster_name}' has no server address in the kubeconfig", f"fix {shown}")
    creds.ca_data = _data(cluster, "certificate-authority", cbase)
    creds.insecure = bool(cluster.get("insecure-skip-tls-verify"))
    creds.cert_data = _data(user, "client-certificate", ubase)
    creds.key_data = _data(user, "client-key", ubase)
    creds.token = user.get("token")
    if user.get("tokenFile"):
        creds.token_file = str(_path(user["tokenFile"], ubase))
    if user.get("username"):
        creds.basic_auth = f"{user['username']}:{user.get('password', '')}"
    if user.get("exec"):
        creds.exec_spec = dict(user["exec"])
    provider = user.get("auth-provider")
    if provider:
        config = provider.get("config") or {}
        if not config.get("id-token"):
            raise UsageError(f"user '{user_name}' uses the '{provider.get('name')}' auth-provider, which phalanx cannot run",
                             "switch the kubeconfig to an exec credential plugin (kubectl does the same since 1.26)")
        creds.token = str(config["id-token"])
    return creds


def in_cluster() -> Credentials | None:
    """The pod's service account, when phalanx runs in a pod; None elsewhere."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = SERVICE_ACCOUNT / "token"
    if not host or not token.exists():
        return None
    ns_file = SERVICE_ACCOUNT / "namespace"
    ca = SERVICE_ACCOUNT / "ca.crt"
    address = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{address}:{port}", context=IN_CLUSTER, token_file=str(token),
                       namespace=ns_file.read_text().strip() if ns_file.exists() else None,
                       ca_data=ca.read_bytes() if ca.exists() else None, source=str(SERVICE_ACCOUNT))


def _config_files() -> list[Path]:
    env = os.environ.get("KUBECONFIG")
    candidates = [Path(p).expanduser() for p in env.split(os.pathsep) if p] if env else [Path("~/.kube/config").expanduser()]
    return [p for p in candidates if p.is_file()]


def _merge(files: list[Path]) -> dict[str, Any]:
    import yaml

    merged: dict[str, Any] = {"contexts": {}, "clusters": {}, "users": {}}
    for path in files:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read the kubeconfig {path}: {str(exc).splitlines()[0]}", "fix or replace that file") from None
        if not isinstance(data, dict):
            raise UsageError(f"the kubeconfig {path} is not a mapping", "fix or replace that file")
        merged.setdefault("current-context", data.get("current-context") or None)
        if merged["current-context"] is None:
            merged["current-context"] = data.get("current-context") or None
        for section, key in (("contexts", "context"), ("clusters", "cluster"), ("users", "user")):
            for entry in data.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") not in merged[section]:
                    merged[section][entry.get("name")] = (entry.get(key) or {}, path.parent)
    return merged


def _path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _data(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    """``key-data`` (base64) or the file ``key`` names (relative to its kubeconfig)."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        path = _path(str(entry[key]), base)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {key} {path}: {exc.strerror}", "fix the path in your kubeconfig") from None
    return None
