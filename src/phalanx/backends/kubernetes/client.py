"""The one door to the Kubernetes API server: plain HTTP(S) with the standard library.

No ``kubernetes`` package: it requires ``python-dateutil>=3`` (kubernetes 37.0.2's wheel metadata)
where botocore (phalanx's object store) requires ``<3``, and phalanx needs a dozen calls, each written out here
against the API reference (https://kubernetes.io/docs/reference/kubernetes-api/). Tests point
it at a fake server by a kubeconfig like any other.

Credentials the standard way (``kubeconfig.py``). Every request is bounded (``timeout``); a
refused request raises :class:`ApiError` carrying the server's ``Status`` (code, reason,
message), which names the verb and resource for RBAC refusals.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ...errors import BackendError
from .kubeconfig import Credentials


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api(self) -> str:
        return f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"

    @property
    def display(self) -> str:
        """As RBAC and kubectl name it: ``jobs.batch``, ``pods``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        parts = [self.api]
        if self.namespaced:
            parts.append(f"namespaces/{urllib.parse.quote(namespace or 'default', safe='')}")
        parts.append(self.plural)
        if name:
            parts.append(urllib.parse.quote(name, safe=""))
        if sub:
            parts.append(sub)
        return "/".join(parts)


RESOURCES = {
    "Namespace": Resource("", "v1", "namespaces", namespaced=False),
    "Node": Resource("", "v1", "nodes", namespaced=False),
    "ConfigMap": Resource("", "v1", "configmaps"),
    "Secret": Resource("", "v1", "secrets"),
    "Service": Resource("", "v1", "services"),
    "Pod": Resource("", "v1", "pods"),
    "Event": Resource("", "v1", "events"),
    "Job": Resource("batch", "v1", "jobs"),
    "PyTorchJob": Resource("kubeflow.org", "v1", "pytorchjobs"),
    "TrainJob": Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "JobSet": Resource("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "SelfSubjectAccessReview": Resource("authorization.k8s.io", "v1", "selfsubjectaccessreviews", namespaced=False),
}


class ApiError(BackendError):
    """The API server refused a request (``code`` is its HTTP status; 0: no answer)."""

    def __init__(self, code: int, reason: str, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.code = code
        self.reason = reason
        self.text = message


class Client:
    """Requests to one cluster, as one identity, in one namespace by default. Thread-safe: one
    connection per thread."""

    def __init__(self, creds: Credentials, timeout: float = 30.0) -> None:
        self.creds = creds
        self.namespace = creds.namespace or "default"
        self.timeout = timeout
        url = urllib.parse.urlsplit(creds.server)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._base = url.path.rstrip("/")
        self._local = threading.local()
        self._ssl = creds.ssl_context() if self._https else None

    # -- the verbs ------------------------------------------------------------------------

    def create(self, kind: str, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.request("POST", RESOURCES[kind].path(namespace or self.namespace), body=obj)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.request("GET", RESOURCES[kind].path(namespace or self.namespace, name))

    def list(self, kind: str, labels: str | None = None, fields: str | None = None,
             namespace: str | None = None) -> list[dict[str, Any]]:
        query = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        return list(self.request("GET", RESOURCES[kind].path(namespace or self.namespace), query=query).get("items") or [])

    def patch(self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386)."""
        return self.request("PATCH", RESOURCES[kind].path(namespace or self.namespace, name), body=patch,
                            content_type="application/merge-patch+json")

    def delete(self, kind: str, name: str, namespace: str | None = None, propagation: str = "Background",
               grace: int | None = None) -> bool:
        """Delete one object; False when it was gone already. Idempotent."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if grace is not None:
            options["gracePeriodSeconds"] = int(grace)
        try:
            self.request("DELETE", RESOURCES[kind].path(namespace or self.namespace, name), body=options)
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    def logs(self, pod: str, container: str, follow: bool = False, namespace: str | None = None,
             tail_lines: int | None = None) -> Iterator[bytes]:
        """The container's log, line by line (bytes, newline kept); with ``follow`` until the
        container ends or the server closes the stream. Raises ApiError (400 while the
        container has not started)."""
        query = {"container": container}
        if follow:
            query["follow"] = "true"
        if tail_lines is not None:
            query["tailLines"] = str(tail_lines)
        path = RESOURCES["Pod"].path(namespace or self.namespace, pod, "log")
        conn = self._new(None if follow else self.timeout)
        try:
            response = self._send(conn, "GET", path, query, None, "application/json", stream=True)
            while line := response.readline(1 << 20):
                yield line
        finally:
            conn.close()

    def can(self, verb: str, kind: str, namespace: str | None = None, sub: str = "") -> bool | None:
        """Whether this identity may ``verb`` ``kind`` (a SelfSubjectAccessReview); None when the
        server cannot say."""
        res = RESOURCES[kind]
        attributes: dict[str, Any] = {"verb": verb, "group": res.group, "resource": res.plural}
        if res.namespaced:
            attributes["namespace"] = namespace or self.namespace
        if sub:
            attributes["subresource"] = sub
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attributes}}
        try:
            answer = self.request("POST", RESOURCES["SelfSubjectAccessReview"].path(None), body=review)
        except ApiError:
            return None
        return bool((answer.get("status") or {}).get("allowed"))

    # -- the wire -------------------------------------------------------------------------

    def request(self, method: str, path: str, query: Mapping[str, str] | None = None, body: Any = None,
                content_type: str = "application/json") -> Any:
        """One request; the decoded JSON answer. Raises ApiError. Retried once on a dropped
        keep-alive connection."""
        for attempt in (0, 1):
            conn = self._pooled(fresh=attempt > 0)
            try:
                response = self._send(conn, method, path, query, body, content_type)
                data = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                if attempt:
                    raise ApiError(0, "ConnectionLost", f"the API server {self.creds.server} closed the connection") from None
        return json.loads(data) if data else {}

    def _send(self, conn: http.client.HTTPConnection, method: str, path: str, query: Mapping[str, str] | None,
              body: Any, content_type: str, stream: bool = False) -> http.client.HTTPResponse:
        url = self._base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json", "User-Agent": "phalanx"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        token = self.creds.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self.creds.basic_auth:
            import base64

            headers["Authorization"] = "Basic " + base64.b64encode(self.creds.basic_auth.encode()).decode()
        try:
            conn.request(method, url, body=payload, headers=headers)
            response = conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            raise
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ApiError(0, "Unreachable", f"cannot reach the API server {self.creds.server}: {_reason(exc)}",
                           "check that the cluster is up and the kubeconfig's server address") from None
        if response.status >= 400:
            raise _error(response.status, response.read(), method, path)
        return response

    def _pooled(self, fresh: bool = False) -> http.client.HTTPConnection:
        """This thread's kept-alive connection (a new one when ``fresh``)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and not fresh:
            return conn  # type: ignore[no-any-return]
        if conn is not None:
            conn.close()
        self._local.conn = self._new(self.timeout)
        return self._local.conn  # type: ignore[no-any-return]

    def _new(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its certificate is not trusted ({exc.verify_message})"
    if isinstance(exc, socket.timeout):
        return "no answer in time"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _error(code: int, data: bytes, method: str, path: str) -> ApiError:
    """The server's Status as an ApiError; its message names what was refused."""
    try:
        status = json.loads(data)
    except ValueError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    reason = str(status.get("reason") or {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(code, "Error"))
    message = str(status.get("message") or f"{method} {path}: HTTP {code}")
    hint = {
        401: "your credentials were refused: refresh them (log in to the cluster again) and retry",
        403: "ask the cluster's admins for the permission named above (a Role in that namespace)",
        404: "check the name and the namespace (--namespace)",
        409: "an object of that name exists already",
        422: "the cluster refused the object; see the message above",
    }.get(code, "see the message above")
    return ApiError(code, reason, message, hint)


def apply(client: Client, objects: list[dict[str, Any]]) -> str:
    """Create ``objects`` in order, then make the workload (the last) their owner; the
    workload's uid. On any refusal everything created so far is deleted again and a
    BackendError says what was refused."""
    from .manifests import owner_reference

    created: list[tuple[str, str]] = []
    try:
        answers = []
        for obj in objects:
            answers.append(client.create(obj["kind"], obj))
            created.append((obj["kind"], obj["metadata"]["name"]))
        owner = owner_reference(answers[-1])
        for obj in objects[:-1]:
            client.patch(obj["kind"], obj["metadata"]["name"], {"metadata": {"ownerReferences": [owner]}})
    except ApiError as exc:
        for kind, name in reversed(created):
            try:
                client.delete(kind, name, propagation="Foreground", grace=0)
            except ApiError:
                pass
        what = f"creating the {objects[len(created)]['kind']}" if len(created) < len(objects) else "setting owners"
        raise BackendError(f"the cluster refused {what}: {exc.message}", exc.hint) from None
    return str(answers[-1]["metadata"].get("uid", ""))
