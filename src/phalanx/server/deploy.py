"""What a team applies to run the server: Kubernetes objects and a systemd unit (``phalanx server
manifests``). Pure: text in, text out; nothing here talks to a cluster.

- The Deployment runs ``phalanx server`` with the store's URL and its password from a Secret
  (``secretKeyRef``, keys ``url`` and ``password``: as ``docs/store.md`` says, the password never
  sits in the URL, and neither is in the process's argv, where ``ps`` in the pod would show it).
- Readiness is ``/healthz`` (503 while the store does not answer: the Service stops sending
  requests); liveness is the port alone, so a database outage does not restart the server and its
  supervisors with it.
- One replica: the job directories live on one ReadWriteOnce volume (``$PHALANX_HOME``).
- The Role is what the Kubernetes backend does, derived from its own code (``rbac_verbs``), so
  the server's service account may start, watch and clean up the jobs submitted to it in its
  namespace, and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

NAME = "phalanx-server"
PORT = 8080
HOME = "/var/lib/phalanx"
UID = 10001  # any non-root uid; the image need not know it (HOME is a volume)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
POSTGRES_IMAGE = "postgres:17"


@dataclass(frozen=True)
class Deploy:
    image: str
    namespace: str = "phalanx"
    store_secret: str = "phalanx-store"
    tls_secret: str | None = None  # a kubernetes.io/tls Secret: HTTPS in the pod; else a TLS proxy in front
    with_postgres: bool = False


def check(d: Deploy) -> None:
    """Raises UsageError naming the bad value and the fix."""
    if not DNS_LABEL.match(d.namespace):
        raise UsageError(f"invalid --namespace {d.namespace!r}", "use a DNS label: lower-case letters, digits and '-', "
                         "starting with a letter, at most 63 characters")
    for flag, value in (("--store-secret", d.store_secret), ("--tls-secret", d.tls_secret)):
        if value is not None and not SECRET_NAME.match(value):
            raise UsageError(f"invalid {flag} {value!r}", "name a Secret: lower-case letters, digits, '-' and '.'")
    if not d.image or not IMAGE.match(d.image):
        raise UsageError(f"invalid --image {d.image!r}", "give an image reference such as registry.example.com/phalanx:1.0")


def rbac_verbs() -> list[tuple[str, str, str]]:
    """(verb, kind, subresource) the Kubernetes backend uses, in any of its kinds and ways:

    - an attempt's life, as its preflight checks them (``preflight.needed``, with the object-store
      delivery: its Secret);
    - re-attaching after a restart lists the attempt's workload by label (``backend._attach``);
    - stopping deletes the workload and the ConfigMap, Secret and Service beside it
      (``follow.delete_objects``);
    - ``--in-cluster`` creates a supervisor Job and its Secret, reads the Secret back, lists and
      deletes supervisor Jobs and lists their pods (``hosted``).

    Namespaces, nodes and ClusterTrainingRuntimes (cluster-scoped, which a Role cannot grant) are
    only looked at by the preflight, which goes on when it may not."""
    from ..backends.kubernetes.preflight import KIND_OF, needed

    verbs: set[tuple[str, str, str]] = set()
    for kind, top in KIND_OF.items():
        verbs.update(needed(kind, True))
        verbs.update({("list", top, ""), ("delete", "ConfigMap", ""), ("delete", "Secret", ""), ("delete", "Service", "")})
    verbs.update({("create", "Job", ""), ("list", "Job", ""), ("delete", "Job", ""), ("create", "Secret", ""),
                  ("get", "Secret", ""), ("list", "Pod", "")})
    return sorted(verbs)


def kubernetes(d: Deploy) -> list[dict[str, Any]]:
    """The objects in the order ``kubectl apply -f`` wants them."""
    from ..backends.kubernetes.supobjects import role

    check(d)
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "phalanx"}
    ns = d.namespace

    def meta(name: str, **more: Any) -> dict[str, Any]:
        return {"name": name, "namespace": ns, "labels": dict(labels), **more}

    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(NAME)}
    rbac = role(ns, NAME, rbac_verbs())
    for obj in rbac:
        obj["metadata"] = meta(NAME)
    rbac[1]["roleRef"]["name"] = NAME
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(f"{NAME}-home"),
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}}}
    objects = [account, *rbac, claim]
    if d.with_postgres:
        objects += postgres(d, labels)
    objects += [_deployment(d, labels, meta), _service(d, labels, meta)]
    return objects


def _secret_env(var: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _restricted(uid: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's and the container's securityContext, as Pod Security's "restricted" level asks."""
    pod = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
           "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _deployment(d: Deploy, labels: dict[str, str], meta: Any) -> dict[str, Any]:
    tls = d.tls_secret is not None
    args = ["server", "--host", "0.0.0.0", "--port", str(PORT)]
    args += ["--tls-cert", "/etc/phalanx/tls/tls.crt", "--tls-key", "/etc/phalanx/tls/tls.key"] if tls else ["--insecure-http"]
    scheme = "HTTPS" if tls else "HTTP"
    pod_security, container_security = _restricted(UID)
    mounts: list[dict[str, Any]] = [{"name": "home", "mountPath": HOME}, {"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "home", "persistentVolumeClaim": {"claimName": f"{NAME}-home"}},
                                     {"name": "tmp", "emptyDir": {}}]
    if tls:
        mounts.append({"name": "tls", "mountPath": "/etc/phalanx/tls", "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": d.tls_secret, "defaultMode": 0o440}})
    container = {
        "name": "server", "image": d.image, "command": ["phalanx"], "args": args,
        "env": [_secret_env("PHALANX_STORE", d.store_secret, "url"), _secret_env("PGPASSWORD", d.store_secret, "password"),
                {"name": "PHALANX_HOME", "value": f"{HOME}/home"}, {"name": "HOME", "value": HOME},
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": scheme},
                           "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "initialDelaySeconds": 10, "periodSeconds": 10,
                          "timeoutSeconds": 3, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": container_security, "volumeMounts": mounts,
    }
    pod = {"metadata": {"labels": dict(labels)},
           "spec": {"serviceAccountName": NAME, "securityContext": pod_security, "containers": [container],
                    # the supervisors the server started get the SIGTERM's grace to write their records
                    "terminationGracePeriodSeconds": 30, "volumes": volumes}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(NAME),
            # Recreate: the one ReadWriteOnce home cannot be mounted by two pods during a rollout
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": dict(labels)},
                     "template": pod}}


def _service(d: Deploy, labels: dict[str, str], meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(NAME),
            "spec": {"selector": dict(labels), "ports": [{"name": "http", "port": 443 if d.tls_secret else 80,
                                                          "targetPort": "http", "protocol": "TCP"}]}}


def postgres(d: Deploy, server_labels: dict[str, str]) -> list[dict[str, Any]]:
    """An example PostgreSQL (one pod, its data on a volume), its password from the same Secret
    (key ``password``); a team with a database of its own leaves this out."""
    labels = {**server_labels, "app.kubernetes.io/name": "phalanx-postgres"}
    name = "phalanx-postgres"
    pod_security, container_security = _restricted(999)  # the postgres image's own uid
    container_security = {**container_security, "readOnlyRootFilesystem": False}  # it writes /var/run/postgresql
    container = {
        "name": "postgres", "image": POSTGRES_IMAGE,
        "env": [{"name": "POSTGRES_USER", "value": "phalanx"}, {"name": "POSTGRES_DB", "value": "phalanx"},
                _secret_env("POSTGRES_PASSWORD", d.store_secret, "password"),
                {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
        "ports": [{"name": "postgres", "containerPort": 5432, "protocol": "TCP"}],
        "readinessProbe": {"exec": {"command": ["pg_isready", "-U", "phalanx", "-d", "phalanx"]}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "postgres"}, "initialDelaySeconds": 30, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": container_security,
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
    }
    meta = {"name": name, "namespace": d.namespace, "labels": dict(labels)}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"clusterIP": "None", "selector": dict(labels),
                        "ports": [{"name": "postgres", "port": 5432, "targetPort": "postgres", "protocol": "TCP"}]}}
    stateful = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                "spec": {"serviceName": name, "replicas": 1, "selector": {"matchLabels": dict(labels)},
                         "template": {"metadata": {"labels": dict(labels)},
                                      "spec": {"securityContext": pod_security, "containers": [container]}},
                         "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                                   "spec": {"accessModes": ["ReadWriteOnce"],
                                                            "resources": {"requests": {"storage": "50Gi"}}}}]}}
    return [service, stateful]


def systemd(executable: str, home: str = HOME) -> str:
    """A unit for a server on one machine: its store's URL and password in an environment file
    only root and the service may read, TLS files beside it."""
    return f"""\
[Unit]
Description=phalanx team server
Wants=network-online.target
After=network-online.target postgresql.service

[Service]
Type=simple
User=phalanx
Group=phalanx
# PHALANX_STORE=postgresql://phalanx@db.example.com/phalanx and PGPASSWORD=... (mode 0600)
EnvironmentFile=/etc/phalanx/server.env
Environment=PHALANX_HOME={home}/home
Environment=PYTHONUNBUFFERED=1
StateDirectory=phalanx
WorkingDirectory={home}
ExecStart={executable} server --host 0.0.0.0 --port 8443 --tls-cert /etc/phalanx/server.pem --tls-key /etc/phalanx/server.key
# Stop the server only: the jobs' supervisors run in sessions of their own and live on
KillMode=process
KillSignal=SIGTERM
TimeoutStopSec=30
Restart=on-failure
RestartSec=5
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=full
ProtectHome=read-only
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""
