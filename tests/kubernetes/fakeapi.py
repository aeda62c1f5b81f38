"""A FAKE Kubernetes API server, for tests: exactly the calls phalanx makes, on 127.0.0.1.

No kube-apiserver can be installed here (research §2.1), so this stands in for one, and says so
in every test name that uses it (``test_k8s_fakeapi_*``). It implements, with the API
reference's shapes (https://kubernetes.io/docs/reference/kubernetes-api/):

- create (POST; 409 AlreadyExists; ``stringData`` folded into ``data`` as the server does),
  get, list with label selectors (``=``, ``==``, ``!=``, ``key``, ``!key``) and field selectors
  (``metadata.name``, ``involvedObject.name``, ``status.phase``), JSON merge patch, delete with
  ``DeleteOptions`` (``propagationPolicy`` Foreground/Background/Orphan, ``gracePeriodSeconds``;
  dependents found by ``ownerReferences``; a pod with a grace period stays, with its
  ``deletionTimestamp``, until its kubelet reports it stopped);
- a ``resourceVersion`` that grows with every write;
- pod logs (``container``, ``follow``: chunked until the container ends; 400 while it has not
  started), events, nodes, namespaces, API group discovery, SelfSubjectAccessReview;
- refusals shaped as the server's ``Status``: 404 for a namespace that does not exist, 403 with
  RBAC's message for (verb, resource, namespace) triples a test forbids.

What it is not: no watch, no admission (defaults, webhooks, quotas, Pod Security), no schema
validation (the manifests are checked against the real schemas elsewhere), no authentication.
Controllers and kubelets live in ``fakecluster.py``.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import ssl
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

# plural -> (group, version, kind, namespaced)
KINDS = {
    "namespaces": ("", "v1", "Namespace", False), "nodes": ("", "v1", "Node", False),
    "pods": ("", "v1", "Pod", True), "services": ("", "v1", "Service", True), "configmaps": ("", "v1", "ConfigMap", True),
    "secrets": ("", "v1", "Secret", True), "events": ("", "v1", "Event", True),
    "jobs": ("batch", "v1", "Job", True), "pytorchjobs": ("kubeflow.org", "v1", "PyTorchJob", True),
    "trainjobs": ("trainer.kubeflow.org", "v1alpha1", "TrainJob", True),
    "jobsets": ("jobset.x-k8s.io", "v1alpha2", "JobSet", True),
    "clustertrainingruntimes": ("trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime", False),
}
PLURAL = {kind: plural for plural, (_, _, kind, _) in KINDS.items()}
_PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                   r"(?:/namespaces/(?P<ns>[^/]+))?(?:/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?)?$")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, **({"details": details} if details else {}), "code": code}


class Refused(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body["message"])
        self.body = body


@dataclass
class Log:
    """One container's log: a file the (fake) kubelet appends to, complete once ``ended``."""

    path: Path
    started: bool = False
    ended: bool = False

    def read(self, offset: int) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(offset)
                return fh.read()
        except FileNotFoundError:
            return b""


@dataclass
class Store:
    """The cluster's state; every method is thread-safe."""

    namespaces: set[str] = field(default_factory=lambda: {"default"})
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (plural, ns, name)
    logs: dict[tuple[str, str, str], Log] = field(default_factory=dict)  # (ns, pod, container)
    forbidden: set[tuple[str, str, str]] = field(default_factory=set)  # (verb, resource as RBAC names it, ns)
    # A Role's grants, as RBAC evaluates them: when set, every (verb, resource, ns) not in it is forbidden
    granted: set[tuple[str, str, str]] | None = None
    refuse: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (verb, plural) -> a Status (quota, admission)
    groups: set[str] = field(default_factory=lambda: {"batch/v1", "authorization.k8s.io/v1"})
    user: str = "system:serviceaccount:ci:phalanx"
    rv: int = 1000
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) as received
    auth: list[str] = field(default_factory=list)  # Authorization headers as received
    on_delete_pod: Callable[[dict[str, Any], int], None] | None = None  # the kubelet stops the pod's containers
    lock: threading.RLock = field(default_factory=threading.RLock)

    def denies(self, verb: str, resource: str, ns: str) -> bool:
        return (verb, resource, ns) in self.forbidden or (self.granted is not None and (verb, resource, ns) not in self.granted)

    def _rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def put(self, plural: str, ns: str, obj: dict[str, Any], create: bool = True) -> dict[str, Any]:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            key = (plural, ns if KINDS[plural][3] else "", meta["name"])
            if create:
                if key in self.objects:
                    raise Refused(status(409, "AlreadyExists", f'{_display(plural)} "{meta["name"]}" already exists',
                                         {"name": meta["name"], "kind": plural}))
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
                if KINDS[plural][3]:
                    meta["namespace"] = ns
                group, version, kind, _ = KINDS[plural]
                obj.setdefault("apiVersion", f"{group}/{version}" if group else version)
                obj.setdefault("kind", kind)
                if plural == "secrets" and "stringData" in obj:  # the server folds stringData into data
                    data = obj.setdefault("data", {})
                    data.update({k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()})
            meta["resourceVersion"] = self._rv()
            self.objects[key] = obj
            return copy.deepcopy(obj)

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.get((plural, ns if KINDS[plural][3] else "", name))
            if obj is None:
                raise Refused(status(404, "NotFound", f'{_display(plural)} "{name}" not found', {"name": name, "kind": plural}))
            return copy.deepcopy(obj)

    def list(self, plural: str, ns: str | None, labels: str = "", fields: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for (p, n, _), o in sorted(self.objects.items())
                    if p == plural and (ns is None or n == ns or not KINDS[plural][3])
                    and matches_labels(o, labels) and matches_fields(o, fields)]

    def update(self, plural: str, ns: str, name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        """Apply ``change`` to the stored object (for controllers); None when it is gone."""
        with self.lock:
            obj = self.objects.get((plural, ns if KINDS[plural][3] else "", name))
            if obj is None:
                return None
            change(obj)
            obj["metadata"]["resourceVersion"] = self._rv()
            return copy.deepcopy(obj)

    def remove(self, plural: str, ns: str, name: str) -> None:
        with self.lock:
            self.objects.pop((plural, ns if KINDS[plural][3] else "", name), None)

    def delete(self, plural: str, ns: str, name: str, propagation: str = "Background", grace: int | None = None) -> None:
        with self.lock:
            obj = self.get(plural, ns, name)
            uid = obj["metadata"]["uid"]
            dependents = [(p, n, o["metadata"]["name"]) for (p, n, _), o in list(self.objects.items())
                          if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))]
            if propagation != "Orphan":
                for dep in dependents:
                    self.delete(*dep, propagation=propagation, grace=grace)
            if plural == "pods":
                pod_grace = obj["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
                stored = self.objects[("pods", ns, name)]
                stored["metadata"].setdefault("deletionTimestamp", now())
                stored["metadata"]["deletionGracePeriodSeconds"] = pod_grace
                if self.on_delete_pod is not None:
                    self.on_delete_pod(copy.deepcopy(stored), pod_grace)  # it goes once its kubelet has stopped it
                    return
            self.remove(plural, ns, name)

    def event(self, ns: str, pod: dict[str, Any], reason: str, message: str, kind: str = "Warning",
              component: str = "kubelet") -> None:
        name = f"{pod['metadata']['name']}.{uuid.uuid4().hex[:16]}"
        self.put("events", ns, {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                                "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod["metadata"]["name"],
                                                   "uid": pod["metadata"]["uid"]},
                                "reason": reason, "message": message, "type": kind, "source": {"component": component},
                                "firstTimestamp": now(), "lastTimestamp": now(), "count": 1})


def _display(plural: str) -> str:
    group = KINDS[plural][0]
    return f"{plural}.{group}" if group else plural


def matches_labels(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        node: Any = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (str(node) == value) == negate:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeApiServer:
    """The HTTP face of a Store, on ``host``:a free port (``url``). ``close()`` stops it."""

    def __init__(self, store: Store | None = None, host: str = "127.0.0.1", tls: Any = None) -> None:
        self.store = store or Store()
        handler = type("Handler", (_Handler,), {"store": self.store})
        self.httpd = ThreadingHTTPServer((host, 0), handler)
        self.httpd.daemon_threads = True
        if tls is not None:  # an ssl.SSLContext: HTTPS, as real API servers speak
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def kubeconfig(self, path: Path, namespace: str = "default", context: str = "fake") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "ci", "user": {"token": "fake-token"}}],
            "contexts": [{"name": context, "context": {"cluster": "fake", "user": "ci", "namespace": namespace}}],
        }))
        return path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    store: Store
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.store.requests.append((method, url.path))
        self.store.auth.append(self.headers.get("Authorization") or "")
        try:
            match = _PATH.match(url.path)
            if not match:
                raise Refused(status(404, "NotFound", "the server could not find the requested resource"))
            if match["plural"] is None and match["ns"]:  # GET /api/v1/namespaces/<name>
                return self._json(*self._object(method, {**match.groupdict(), "plural": "namespaces", "name": match["ns"],
                                                         "ns": None}, query, body))
            if match["plural"] is None:  # discovery: GET /apis/<group>/<version>
                if f"{match['group']}/{match['version']}" not in self.store.groups and match["cv"] is None:
                    raise Refused(status(404, "NotFound", "the server could not find the requested resource"))
                return self._json(200, {"kind": "APIResourceList", "groupVersion": f"{match['group']}/{match['version']}"})
            if match["sub"] == "log":
                if self.store.denies("get", "pods/log", match["ns"] or ""):
                    raise Refused(status(403, "Forbidden", f'pods "{match["name"]}" is forbidden: User "{self.store.user}" '
                                         f'cannot get resource "pods/log" in API group "" in the namespace "{match["ns"]}"'))
                return self._log(match["ns"], match["name"], query)
            self._json(*self._object(method, match, query, body))
        except Refused as exc:
            self._json(exc.body["code"], exc.body)

    def _object(self, method: str, match: Any, query: dict[str, str], body: Any) -> tuple[int, Any]:
        store, plural, ns, name = self.store, match["plural"], match["ns"] or "", match["name"]
        if plural == "selfsubjectaccessreviews":
            attrs = body["spec"]["resourceAttributes"]
            res = attrs["resource"] + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
            display = f"{res}.{attrs['group']}" if attrs.get("group") else res
            allowed = not store.denies(attrs["verb"], display, attrs.get("namespace", ""))
            return 201, {**body, "status": {"allowed": allowed}}
        if plural not in KINDS:
            raise Refused(status(404, "NotFound", "the server could not find the requested resource"))
        verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(method, "get" if name else "list")
        if store.denies(verb, _display(plural), ns):
            group = KINDS[plural][0]
            raise Refused(status(403, "Forbidden", f'{_display(plural)}{" " + repr(name).replace(chr(39), chr(34)) if name else ""} '
                                 f'is forbidden: User "{store.user}" cannot {verb} resource "{plural}" in API group "{group}"'
                                 + (f' in the namespace "{ns}"' if ns else ""), {"group": group, "kind": plural}))
        if (verb, plural) in store.refuse:
            raise Refused(store.refuse[(verb, plural)])
        if ns and ns not in store.namespaces and plural != "namespaces":
            raise Refused(status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}))
        if plural == "namespaces" and name and method == "GET":
            if name not in store.namespaces:
                raise Refused(status(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"}))
            return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}
        if method == "POST":
            return 201, store.put(plural, ns, copy.deepcopy(body))
        if method == "GET" and name:
            return 200, store.get(plural, ns, name)
        if method == "GET":
            items = store.list(plural, ns or None, query.get("labelSelector", ""), query.get("fieldSelector", ""))
            kind = KINDS[plural][2]
            return 200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": str(store.rv)}, "items": items}
        if method == "PATCH":
            with store.lock:
                current = store.get(plural, ns, name)
                return 200, store.put(plural, ns, merge_patch(current, body), create=False)
        options = body or {}
        store.delete(plural, ns, name, options.get("propagationPolicy", "Background"), options.get("gracePeriodSeconds"))
        return 200, status(200, "", "") | {"status": "Success"}

    def _log(self, ns: str, pod: str, query: dict[str, str]) -> None:
        obj = self.store.get("pods", ns, pod)
        container = query.get("container") or obj["spec"]["containers"][0]["name"]
        log = self.store.logs.get((ns, pod, container))
        if log is None or not log.started:
            raise Refused(status(400, "BadRequest", f'container "{container}" in pod "{pod}" is waiting to start: PodInitializing'))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        offset = 0
        follow = query.get("follow") == "true"
        try:
            while True:
                ended = log.ended
                data = log.read(offset)
                if data:
                    offset += len(data)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                if not follow or (ended and not data):
                    break
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True  # the reader went away (over TLS: without a close_notify)

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
