"""The in-pod half for real: a FAKE kubelet whose containers are real processes.

Each pod the fake API server's Job controller creates runs in a network namespace of its own
(``tests/cluster/netns.py``: its own address, and ``/etc/hosts`` standing in for cluster DNS),
in a mount namespace that gives it what a container runtime would (``sandbox.sh``): the pod's
volumes at their ``mountPath`` (emptyDir, configMap, secret; ``medium: Memory`` as tmpfs), a
private ``/dev`` with its own ``/dev/shm`` and ``/dev/termination-log``, the pod's hostname.
Everything is derived from the pod object the fake API server holds, itself made from the
manifests phalanx generated: command, args, workingDir, env (``value``; ``valueFrom`` with
``fieldRef``, ``secretKeyRef``, ``configMapKeyRef``: the completion index arrives the way the
real Job controller passes it). So the environment under test is the one that would be
submitted, not typed twice.

The "image" is a virtualenv holding only python3 and torch (``make_image``): no phalanx, no
psutil, no yaml. A pod's name appears in the other pods' hosts files once it has an address
(when it is scheduled), as a headless Service's record does, so a pod may start before node 0's
name resolves. Stopping a pod is SIGTERM to each container's first process, the pod's grace
period, then SIGKILL to every process in its namespace.

What it is not: a kubelet. No cgroups (no OOM kills, no limits), no image pulls, no probes, no
restarts; the shared PID space means processes see each other.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster import netns

from .fakecluster import Cluster, container_status, terminated
from .fakeapi import now

SANDBOX = Path(__file__).parent / "sandbox.sh"
TORCH_DEPS = ("torch", "torchgen", "filelock", "fsspec", "jinja2", "markupsafe", "networkx", "sympy", "mpmath",
              "typing_extensions.py", "numpy", "numpy.libs")
FALLBACK_BYTES, FALLBACK_LINES = 2048, 80  # FallbackToLogsOnError: the log's tail, the smaller of these


@dataclass(frozen=True)
class Image:
    """What a training image gives a container: python3 and torch, and its environment."""

    root: Path
    env: dict[str, str]


def make_image(root: Path) -> Image:
    """A virtualenv without pip whose site-packages see torch and its dependencies only."""
    import torch

    site = Path(torch.__file__).resolve().parent.parent
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    deps = root / "site"
    deps.mkdir()
    for name in TORCH_DEPS:
        if (site / name).exists():
            (deps / name).symlink_to(site / name)
    (next((root / "venv" / "lib").glob("python3*")) / "site-packages" / "image.pth").write_text(f"{deps}\n")
    path = f"{root / 'venv' / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return Image(root, {"PATH": path, "LANG": "C.UTF-8"})


@dataclass(frozen=True)
class ServiceAccount:
    """What a kubelet gives every pod to reach the API server: ``KUBERNETES_SERVICE_HOST`` and
    ``_PORT``, and (unless ``automountServiceAccountToken: false``) the token, the cluster's CA
    and the namespace in ``/var/run/secrets/kubernetes.io/serviceaccount``."""

    host: str
    port: int
    dir: Path  # holds token, ca.crt, namespace


SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class PodRun:
    pod: dict[str, Any]
    namespace: str  # the network namespace
    addr: str
    dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    deleting: bool = False
    ended: bool = False
    thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]


class NetnsKubelet:
    def __init__(self, root: Path, net: netns.Network, image: Image, service: ServiceAccount | None = None) -> None:
        self.root = root
        self.service = service
        self.net = net
        self.image = image
        self.free = list(zip(net.node_namespaces, net.node_addrs))
        self.runs: dict[str, PodRun] = {}  # pod uid -> its run
        self.lock = threading.RLock()
        self.tools = {t: shutil.which(t) or t for t in ("ip", "unshare", "sh")}

    # -- the Kubelet protocol ---------------------------------------------------------------

    def sync(self, cluster: Cluster, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            if uid in self.runs or pod["metadata"].get("deletionTimestamp") or not self.free:
                return
            ns, addr = self.free.pop(0)
            run = PodRun(pod, ns, addr, self.root / "pods" / pod["metadata"]["name"])
            self.runs[uid] = run
        run.thread = threading.Thread(target=self._run, args=(cluster, run), name=f"pod-{run.name}", daemon=True)
        run.thread.start()

    def stop(self, cluster: Cluster, pod: dict[str, Any], grace: int) -> None:
        run = self.runs.get(pod["metadata"]["uid"])
        if run is None or run.ended:
            cluster.gone(pod)
            return
        run.deleting = True
        threading.Thread(target=self._terminate, args=(run, grace), daemon=True).start()

    def take(self, cluster: Cluster, pod_name: str, reason: str, message: str, evicted: bool = False) -> None:
        """Take a running pod from its node as a preemption (or a kubelet eviction) does: the
        ``DisruptionTarget`` condition, then SIGTERM and the pod's grace period."""
        run = next(r for r in self.runs.values() if r.name == pod_name)

        def mark(status: dict[str, Any]) -> None:
            status.setdefault("conditions", []).append({"type": "DisruptionTarget", "status": "True", "reason": reason,
                                                        "message": message, "lastProbeTime": None, "lastTransitionTime": now()})
            if evicted:
                status.update(reason="Evicted", message=message)

        cluster.set_status(run.pod, mark)
        grace = int(run.pod["spec"].get("terminationGracePeriodSeconds", 30))
        if not evicted:
            run.deleting = True  # a preemption deletes the pod
            cluster.store.update("pods", run.pod["metadata"]["namespace"], run.name,
                                 lambda o: o["metadata"].setdefault("deletionTimestamp", now()))
        threading.Thread(target=self._terminate, args=(run, grace), daemon=True).start()

    def close(self) -> None:
        for run in list(self.runs.values()):
            self._kill_all(run)

    # -- one pod ----------------------------------------------------------------------------

    def _run(self, cluster: Cluster, run: PodRun) -> None:
        try:
            self._lifecycle(cluster, run)
        except Exception as exc:  # noqa: BLE001 - a test must see what broke, not a stuck pod
            print(f"podsim: pod {run.name}: {exc!r}", file=sys.stderr, flush=True)
        finally:
            self._kill_all(run)
            run.ended = True
            with self.lock:
                self.free.append((run.namespace, run.addr))
            self.publish(cluster)
            if run.deleting:
                cluster.gone(run.pod)

    def _lifecycle(self, cluster: Cluster, run: PodRun) -> None:
        spec = run.pod["spec"]
        inits, mains = spec.get("initContainers", []), spec["containers"]
        waiting = {"waiting": {"reason": "PodInitializing"}}
        cluster.set_status(run.pod, lambda s: s.update(
            phase="Pending", hostIP="10.0.0.1", podIP=run.addr, podIPs=[{"ip": run.addr}], startTime=now(),
            initContainerStatuses=[container_status(c["name"], c["image"], waiting) for c in inits],
            containerStatuses=[container_status(c["name"], c["image"], waiting) for c in mains]))
        self.publish(cluster)  # the pod has an address: its name resolves in the others' DNS
        volumes = self._volumes(cluster, run)
        for i, container in enumerate(inits):
            code, message = self._container(cluster, run, container, volumes, "initContainerStatuses", i)
            if code != 0 or run.deleting:
                cluster.set_status(run.pod, lambda s: s.update(phase="Failed"))
                return
        threads = [threading.Thread(target=self._main, args=(cluster, run, c, volumes, i)) for i, c in enumerate(mains)]
        cluster.set_status(run.pod, lambda s: s.update(phase="Running"))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = [s["state"]["terminated"]["exitCode"] for s in (cluster.store.get(
            "pods", run.pod["metadata"]["namespace"], run.name).get("status") or {}).get("containerStatuses", [])]
        cluster.set_status(run.pod, lambda s: s.update(phase="Succeeded" if all(c == 0 for c in codes) else "Failed"))

    def _main(self, cluster: Cluster, run: PodRun, container: dict[str, Any], volumes: dict[str, Any], index: int) -> None:
        self._container(cluster, run, container, volumes, "containerStatuses", index)

    def _container(self, cluster: Cluster, run: PodRun, container: dict[str, Any], volumes: dict[str, Any],
                   key: str, index: int) -> tuple[int, str]:
        name = container["name"]
        while True:
            try:
                env = self._env(cluster, run, container)
                break
            except LookupError as exc:  # as the kubelet does: report it and try again
                message = str(exc)  # bound for the lambda: exc is unbound once this block ends
                cluster.set_status(run.pod, lambda s, message=message: s[key].__setitem__(index, container_status(
                    name, container["image"], {"waiting": {"reason": "CreateContainerConfigError", "message": message}})))
                if run.deleting:
                    return 1, message
                time.sleep(1)
        mounts = run.dir / f"{name}.mounts"
        termination = run.dir / f"{name}.termination-log"
        termination.write_text("")
        lines = []
        for mount in container.get("volumeMounts", []):
            source = volumes[mount["name"]]
            if source == "tmpfs":
                lines.append(f"tmpfs {mount['mountPath']}")
            else:
                lines.append(f"bind {source} {mount['mountPath']}" + (" ro" if mount.get("readOnly") else ""))
        lines.append(f"file {termination} {container.get('terminationMessagePath', '/dev/termination-log')}")
        if self.service is not None and run.pod["spec"].get("automountServiceAccountToken") is not False:
            # /var/run is a link to /run here: a pod's own /run (a tmpfs, as in a container) holds
            # the service account's files, and nothing is created on this machine.
            target = SA_PATH.replace("/var/run/", "/run/") if os.path.realpath("/var/run") == "/run" else SA_PATH
            if target.startswith("/run/"):
                lines.append("tmpfs /run")
            lines.append(f"bind {self.service.dir} {target} ro")
        mounts.write_text("\n".join(lines) + "\n")
        root = run.dir / f"{name}.root"
        root.mkdir(exist_ok=True)
        argv = [*container.get("command", []), *container.get("args", [])]
        log = cluster.log(run.pod, name)
        with open(log.path, "ab") as out:
            proc = subprocess.Popen(
                [self.tools["ip"], "netns", "exec", run.namespace, self.tools["unshare"], "--mount", "--uts", "--propagation",
                 "private", self.tools["sh"], str(SANDBOX), str(root), container.get("workingDir", "/"),
                 run.pod["spec"].get("hostname", run.name), str(mounts), "--", *argv],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        run.procs[name] = proc
        started = now()
        log.started = True
        cluster.set_status(run.pod, lambda s: s[key].__setitem__(index, container_status(
            name, container["image"], {"running": {"startedAt": started}})))
        code = proc.wait()
        code = 128 - code if code < 0 else code
        message = termination.read_text()[:4096]
        if not message and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = log.path.read_bytes()[-FALLBACK_BYTES:].decode(errors="replace")
            message = "\n".join(tail.splitlines()[-FALLBACK_LINES:])
        log.ended = True
        reason = "Completed" if code == 0 else "Error"
        cluster.set_status(run.pod, lambda s: s[key].__setitem__(index, container_status(
            name, container["image"], terminated(code, reason, message, started))))
        return code, message

    def _env(self, cluster: Cluster, run: PodRun, container: dict[str, Any]) -> dict[str, str]:
        pod, ns = run.pod, run.pod["metadata"]["namespace"]
        env = {**self.image.env, "HOSTNAME": pod["spec"].get("hostname", run.name)}
        if self.service is not None:  # the kubelet gives every container the API server's Service
            env.update(KUBERNETES_SERVICE_HOST=self.service.host, KUBERNETES_SERVICE_PORT=str(self.service.port))
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
                continue
            source = var.get("valueFrom") or {}
            if "fieldRef" in source:
                env[var["name"]] = _field(pod, source["fieldRef"]["fieldPath"], run.addr)
            elif "secretKeyRef" in source or "configMapKeyRef" in source:
                plural, ref = ("secrets", source["secretKeyRef"]) if "secretKeyRef" in source else ("configmaps", source["configMapKeyRef"])
                try:
                    obj = cluster.store.get(plural, ns, ref["name"])
                except Exception:
                    raise LookupError(f'{plural[:-1]} "{ref["name"]}" not found') from None
                data = obj.get("data") or {}
                if ref["key"] not in data:
                    raise LookupError(f'couldn\'t find key {ref["key"]} in {plural[:-1]} {ns}/{ref["name"]}')
                env[var["name"]] = base64.b64decode(data[ref["key"]]).decode() if plural == "secrets" else data[ref["key"]]
        return env

    def _volumes(self, cluster: Cluster, run: PodRun) -> dict[str, Any]:
        out: dict[str, Any] = {}
        ns = run.pod["metadata"]["namespace"]
        for vol in run.pod["spec"].get("volumes", []):
            path = run.dir / "volumes" / vol["name"]
            if "emptyDir" in vol:
                if (vol["emptyDir"] or {}).get("medium") == "Memory":
                    out[vol["name"]] = "tmpfs"
                    continue
                path.mkdir(parents=True, exist_ok=True)
            elif "configMap" in vol or "secret" in vol:
                plural, ref = ("configmaps", vol["configMap"]["name"]) if "configMap" in vol else ("secrets", vol["secret"]["secretName"])
                obj = cluster.wait_for(lambda plural=plural, ref=ref: _try_get(cluster, plural, ns, ref), timeout=60,
                                       text=f"{plural} {ref}")
                path.mkdir(parents=True, exist_ok=True)
                for key, value in (obj.get("data") or {}).items():
                    (path / key).write_bytes(base64.b64decode(value) if plural == "secrets" else value.encode())
                for key, value in (obj.get("binaryData") or {}).items():
                    (path / key).write_bytes(base64.b64decode(value))
            else:
                raise NotImplementedError(f"podsim has no volume like {vol}")
            out[vol["name"]] = str(path)
        return out

    def publish(self, cluster: Cluster) -> None:
        """Every namespace's hosts file: its pod's own names (as the kubelet writes them) and
        the names of the pods that have an address (as a headless Service publishes them)."""
        with self.lock:
            live = [r for r in self.runs.values() if not r.ended]
            records: dict[str, str] = {}
            for r in live:
                spec, k8s_ns = r.pod["spec"], r.pod["metadata"]["namespace"]
                if spec.get("subdomain"):
                    base = f"{spec['hostname']}.{spec['subdomain']}"
                    records[base] = r.addr
                    records[f"{base}.{k8s_ns}.svc.cluster.local"] = r.addr
            for r in live:
                own = {r.pod["spec"].get("hostname", r.name): r.addr}
                netns.set_hosts(self.net, r.namespace, {**records, **own})

    def _terminate(self, run: PodRun, grace: int) -> None:
        for proc in list(run.procs.values()):
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in run.procs.values()):
            time.sleep(0.1)
        self._kill_all(run)

    def _kill_all(self, run: PodRun) -> None:
        """SIGKILL to every process of the pod (its network namespace), as a container's
        cgroup is killed."""
        proc = subprocess.run([self.tools["ip"], "netns", "pids", run.namespace], capture_output=True, text=True)
        for pid in (int(p) for p in proc.stdout.split()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in run.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def _try_get(cluster: Cluster, plural: str, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return cluster.store.get(plural, ns, name)
    except Exception:
        return None


def _field(pod: dict[str, Any], path: str, addr: str) -> str:
    """A downward-API ``fieldRef`` (the paths the API server accepts for env)."""
    meta = pod["metadata"]
    if path.startswith("metadata.annotations['"):
        return str(meta.get("annotations", {}).get(path[len("metadata.annotations['"):-2], ""))
    if path.startswith("metadata.labels['"):
        return str(meta.get("labels", {}).get(path[len("metadata.labels['"):-2], ""))
    return {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""), "metadata.uid": meta.get("uid", ""),
            "spec.nodeName": pod["spec"].get("nodeName", ""), "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": addr, "status.hostIP": "10.0.0.1"}[path]
