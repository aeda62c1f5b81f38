"""The SSH backend: one node agent per host, started over ssh.

``phalanx run --backend ssh --hosts gpu1,gpu2 -n 2x8 train.py``. The OpenSSH client does the
connecting, so the user's ``~/.ssh/config`` (aliases, ProxyJump, keys, ControlMaster) applies
exactly as in their terminal. Per host, ``python -m phalanx.launch.remote`` starts the agent
and mirrors the node's files back into the local job directory (logs, metrics, results), so
``logs``, ``status`` and ``metrics`` work as for local jobs. Closing the connection stops the
node: nothing is left running on a host, and nothing is ever killed by name.

Before anything starts, a preflight reaches every host, checks that Python, torch and phalanx
match this machine's (the two ends of a node's link must speak the same frames), and that the
rendezvous port is free on the first host; it names the host that failed and why.

Without ``--shared-fs`` each host keeps its own copy of the job under ``--remote-home``
(``~/.phalanx/remote``, laid out like ``$PHALANX_HOME``), and the local files stay the truth:

- before every attempt, in parallel with the preflight, the code snapshot, the local state
  directory (which replaces the host's: an emptied or ``--clean-state`` one empties it) and
  every staged input channel (sent again only when its files changed) go to every host;
- while the attempt runs and at its end, every node (node 0 is not special) mirrors its
  attempt files and what its ranks write into the state and output directories back into
  the local ones (see :mod:`phalanx.launch.remote`), so ``--state`` uploads, ``phalanx resume``
  and ``--output`` uploads work from the local copies as for local jobs.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import secrets
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping

from ..core.env import Topology
from ..core.paths import ChannelCachePaths, HomePaths, JobPaths
from ..core.spec import Channel, JobSpec, in_snapshot
from ..errors import BackendError, UsageError
from ..launch.plan import NodePlan, Plan
from ..launch.remote import PROTOCOL, Receiver
from .base import Backend, NodeHandle, PortSource
from .local import RESTART_SAFE_ENV, build_nodes
from .ssh_options import OPTIONS

PORT_RANGE = (29400, 29900)
# Versions from package metadata, not imports: importing torch on every host costs seconds.
PREFLIGHT = (
    "import json, socket, sys, importlib.metadata as md, importlib.util as iu\n"
    "info = {'python': '%d.%d' % sys.version_info[:2]}\n"
    "try:\n    info['torch'] = md.version('torch')\nexcept md.PackageNotFoundError:\n    info['torch'] = None\n"
    "info['phalanx'] = iu.find_spec('phalanx') is not None\n"
    "try:\n    info['phalanx_version'] = md.version('phalanx')\nexcept md.PackageNotFoundError:\n    info['phalanx_version'] = None\n"
    "try:\n    from phalanx.launch.remote import PROTOCOL\n    info['protocol'] = PROTOCOL\nexcept Exception:\n    info['protocol'] = None\n"
    "port = int(sys.argv[1])\n"
    "if port:\n    s = socket.socket()\n    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    try:\n        s.bind(('', port)); info['port_free'] = True\n    except OSError:\n        info['port_free'] = False\n"
    "print(json.dumps(info))\n"
)


def parse_hosts(hosts: str | None, hostfile: str | None) -> list[str]:
    """``--hosts a,b`` or a hostfile (``host [slots=N]`` per line, # comments)."""
    if hosts and hostfile:
        raise UsageError("--hosts and --hostfile both given", "use one of them")
    if hostfile:
        path = Path(hostfile).expanduser()
        if not path.is_file():
            raise UsageError(f"hostfile '{hostfile}' not found", "check the path given to --hostfile")
        names = [line.split("#")[0].split()[0] for line in path.read_text().splitlines() if line.split("#")[0].strip()]
    else:
        names = [h.strip() for h in (hosts or "").split(",") if h.strip()]
    if not names:
        raise UsageError("the ssh backend needs hosts", "give --hosts host1,host2 or --hostfile FILE")
    return names


class SshBackend(Backend):
    name = "ssh"
    options = OPTIONS  # declared in ssh_options.py, which the CLI reads without importing this module

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, ports: PortSource) -> Plan:
        opts = spec.backend_options
        hosts = parse_hosts(opts["hosts"], opts["hostfile"])
        nnodes = spec.resources.nnodes
        if len(hosts) < nnodes:
            raise UsageError(f"-n asks for {nnodes} nodes but {len(hosts)} host(s) were given", "give more hosts or fewer nodes")
        hosts = hosts[:nnodes]
        addrs = tuple(self.resolve(h, opts["ssh_config"]) for h in hosts)
        shared = bool(opts["shared_fs"])
        if not shared and not spec.snapshot:
            raise UsageError("without --shared-fs the ssh backend ships the code snapshot", "drop --no-snapshot, or add --shared-fs")
        # Remote paths keep a leading ~: the remote end expands it to that host's home.
        remote_home = home if shared else _remote_home(opts)
        remote = paths if shared else remote_home.job(job_id)
        channels = tuple((c.name, str(home.channel_path(c)) if shared else channel_copy(remote_home, c)[1])
                         for c in spec.channels)
        digest = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest(), 16)
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=addrs,
            master_port=PORT_RANGE[0] + digest % (PORT_RANGE[1] - PORT_RANGE[0]),
            worker_ports=tuple(PORT_RANGE[0] + (digest + 1 + i) % (PORT_RANGE[1] - PORT_RANGE[0])
                               for i in range(nnodes * spec.procs_per_node_started)),
            state_dir=str(remote_home.state_dir(spec.name)), output_dir=str(remote.output_dir), job_dir=str(remote.root),
            num_gpus=0, channels=channels,
        )
        spec = spec.with_(python=opts["remote_python"] or spec.python)
        if spec.snapshot:
            spec = in_snapshot(spec, str(remote.code_dir))
        net_env = {"PHALANX_AUTO_IFNAME": "1", **RESTART_SAFE_ENV}
        nodes = build_nodes(spec, topo, remote, tuple(hosts), addrs, net_env)
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace)

    def ssh_argv(self, spec_or_opts: Any, host: str) -> list[str]:
        opts = spec_or_opts.backend_options if isinstance(spec_or_opts, JobSpec) else spec_or_opts
        # One TCP+auth handshake per host for the whole job (preflight, shipping, the agent),
        # unless the user's config says otherwise (-o options come first and win over the file).
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ControlMaster=auto",
                "-o", f"ControlPath={_control_dir()}/%C", "-o", "ControlPersist=60"]
        if opts.get("ssh_config"):
            argv += ["-F", str(Path(opts["ssh_config"]).expanduser())]
        return [*argv, host]

    def resolve(self, host: str, ssh_config: str | None) -> str:
        """The address other nodes reach ``host`` at: its HostName in the ssh config."""
        argv = ["ssh", "-G"] + (["-F", str(Path(ssh_config).expanduser())] if ssh_config else []) + [host]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return host
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                return value.strip()
        return host

    # -- start -------------------------------------------------------------------------

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        from .. import config

        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = self._opts(spec)
        hosts = [n.host for n in plan.nodes]
        shared = bool(opts["shared_fs"])
        home, remote_home = HomePaths(config.home()), _remote_home(opts)
        remote = remote_home.job(plan.job_id)
        # Mirrored back from every node: (the directory on the hosts, the local one).
        trees = {} if shared else {
            "state": (str(remote_home.state_dir(spec.name)), home.state_dir(spec.name)),
            "output": (str(remote.output_dir), paths.output_dir),
        }
        with ThreadPoolExecutor(max_workers=2) as pool:  # independent: check and ship at once
            shipped = None if shared else pool.submit(
                self.ship, opts, sorted(set(hosts)), shipments(spec, home, paths, remote_home, remote))
            checked = pool.submit(self.preflight, opts, hosts, plan)
            checked.result()
            if shipped is not None:
                shipped.result()
        return [SshNode(self, opts, node, paths, plan, stream=not shared, trees=trees) for node in plan.nodes]

    def _opts(self, spec: JobSpec) -> dict[str, Any]:
        from .options import validate

        return validate(self.name, self.options, spec.backend_options)

    def preflight(self, opts: dict[str, Any], hosts: list[str], plan: Plan) -> None:
        """Reach every host in parallel; raise BackendError naming each host that failed and why."""
        port = int(plan.nodes[0].torchrun_argv and _endpoint_port(plan.nodes[0].torchrun_argv) or 0)
        python = plan.nodes[0].processes[0].argv[0] if plan.nodes[0].processes else _python_of(plan.nodes[0])
        local = {"python": "%d.%d" % sys.version_info[:2], "torch": _local_version("torch"), "phalanx": _local_version("phalanx")}

        def check(index_host: tuple[int, str]) -> str | None:
            index, host = index_host
            cmd = f"{shlex.quote(python)} -c {shlex.quote(PREFLIGHT)} {port if index == 0 else 0}"
            try:
                proc = subprocess.run([*self.ssh_argv(opts, host), cmd], capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                return f"{host}: no answer within 60 s"
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                return f"{host}: {last}"
            info = json.loads(proc.stdout.strip().splitlines()[-1])
            if not info["phalanx"]:
                return f"{host}: phalanx is not installed for {python} (pip install phalanx there, or --remote-python)"
            if info.get("protocol") != PROTOCOL:  # a mixed pair would garble the mirror's frames
                theirs, ours = (v or "(unknown version)" for v in (info.get("phalanx_version"), local["phalanx"]))
                return (f"{host}: its phalanx {theirs} speaks link protocol {info.get('protocol')}, this machine's {ours} "
                        f"speaks {PROTOCOL} (install the same phalanx on both)")
            if info["python"] != local["python"]:
                return f"{host}: Python {info['python']} differs from this machine's {local['python']}"
            if info["torch"] != local["torch"]:
                return f"{host}: torch {info['torch']} differs from this machine's {local['torch']}"
            if index == 0 and port and not info.get("port_free", True):
                return f"{host}: the rendezvous port {port} is in use"
            return None

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            problems = [p for p in pool.map(check, enumerate(hosts)) if p]
        if problems:
            raise BackendError("preflight failed: " + "; ".join(problems), "fix the hosts above, then run again")

    def ship(self, opts: dict[str, Any], hosts: list[str], items: list["Shipment"]) -> None:
        """Copy every item to every host, in parallel (one tar stream each); an item whose
        marker on a host says it is there already is skipped. Blocking; raises BackendError
        naming each host and item that failed."""

        digests = {item: item.digest() for item in items}  # once, not per host: an input may be large

        def one(host_item: tuple[str, Shipment]) -> str | None:
            host, item = host_item
            digest = digests[item]
            if digest and self._marker(opts, host, item) == digest:
                return None
            local = item.local if item.local is not None and item.local.exists() else None
            tar = None
            if local is not None:
                cwd, member = (local.parent, local.name) if local.is_file() else (local, ".")
                tar = subprocess.Popen(["tar", "-cf", "-", *(["-h"] if item.follow_links else []), "-C", str(cwd), member],
                                       stdout=subprocess.PIPE)
            ssh = subprocess.Popen([*self.ssh_argv(opts, host), item.command(digest, local is not None)],
                                   stdin=tar.stdout if tar else subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if tar is not None:
                assert tar.stdout is not None
                tar.stdout.close()  # only ssh reads the stream now: tar gets SIGPIPE if ssh dies
            try:
                _, err = ssh.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                ssh.kill()
                _, err = ssh.communicate()
            if tar is not None:
                tar.wait()
            if ssh.returncode == 0:
                return None
            return f"{host}: {item.what}: {(err.strip().splitlines() or ['copy failed'])[-1]}"

        work = [(host, item) for item in items for host in hosts]
        if not work:
            return
        with ThreadPoolExecutor(max_workers=min(16, len(work))) as pool:
            problems = [p for p in pool.map(one, work) if p]
        if problems:
            raise BackendError("copying to the hosts failed: " + "; ".join(problems), "check disk space and permissions there")

    def _marker(self, opts: dict[str, Any], host: str, item: "Shipment") -> str | None:
        """The digest recorded on ``host`` for ``item`` (None when its directory is gone)."""
        assert item.marker is not None
        check = f"test -d {remote_path(item.remote)} && cat {remote_path(item.marker)} 2>/dev/null || true"
        try:
            proc = subprocess.run([*self.ssh_argv(opts, host), check],
                                  capture_output=True, text=True, timeout=60)
            return str(json.loads(proc.stdout)["digest"]) if proc.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Shipment:
    """A local directory (or file) copied to a directory on every host."""

    what: str  # for messages
    local: Path | None  # None (or missing): the remote directory is made empty
    remote: str  # a directory on the hosts; a leading ~ is the home there
    replace: bool = True  # the remote directory becomes exactly this; else it is extracted over
    marker: str | None = None  # a file on the hosts recording what was sent, so it is not sent twice
    follow_links: bool = False  # send what links point at (data), not the links (the code's links to .venv)

    def digest(self) -> str | None:
        """What the marker records: a digest of the local listing (paths, sizes, mtimes)."""
        if self.marker is None:
            return None
        h = hashlib.sha256()
        if self.local is not None and self.local.is_file():
            st = self.local.stat()
            h.update(f"{self.local.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        elif self.local is not None and self.local.is_dir():
            for path in sorted(self.local.rglob("*")):
                if path.is_file():
                    st = path.stat()
                    h.update(f"{path.relative_to(self.local).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()

    def command(self, digest: str | None, has_data: bool) -> str:
        """The remote shell command that receives the tar stream (on stdin when ``has_data``)."""
        target = remote_path(self.remote)
        if not self.replace:
            return f"mkdir -p {target} && tar -xf - -C {target}"
        # Unpacked beside it, then swapped in: a copy cut off leaves no half-filled directory.
        # Hosts may share their home (NFS) without --shared-fs: each copy has names of its own,
        # and one that finds the directory swapped in by another host's copy (the same files) is
        # done; a third copy may be swapping that one out meanwhile: wait for its own to land.
        parent, name = posixpath.split(self.remote.rstrip("/"))
        token = secrets.token_hex(4)
        incoming = remote_path(posixpath.join(parent, f".{name}.incoming-{token}"))
        old = remote_path(posixpath.join(parent, f".{name}.old-{token}"))
        steps = [f"rm -f {remote_path(self.marker)}"] if self.marker else []
        steps.append(f"mkdir -p {incoming}")
        if has_data:
            steps.append(f"tar -xf - -C {incoming}")
        steps += [f"{{ mv {target} {old} 2>/dev/null || true; }}",
                  f"{{ mv -T {incoming} {target} 2>/dev/null || {{ n=0; until test -d {target}; do n=$((n + 1)); "
                  f"test $n -le 5 || break; sleep 1; done; test $n -le 5; }}; }}",
                  f"rm -rf {incoming} {old}"]
        if self.marker:
            steps.append(f"printf %s {shlex.quote(json.dumps({'digest': digest}))} > {remote_path(self.marker)}")
        return " && ".join(steps)


def shipments(spec: JobSpec, home: HomePaths, paths: JobPaths, remote_home: HomePaths, remote: JobPaths) -> list[Shipment]:
    """What goes to every host before an attempt (without a shared filesystem)."""
    state = home.state_dir(spec.name)
    has_state = state.is_dir() and any(p.is_file() for p in state.rglob("*"))
    items = [
        Shipment("the code", paths.code_dir, str(remote.code_dir), replace=False),
        # The local state is the truth: a stale directory on a host (an older run of this
        # name) must not win, and an empty one (--clean-state) empties the host's.
        Shipment("the state directory", state if has_state else None, str(remote_home.state_dir(spec.name))),
    ]
    for channel in spec.channels:
        cache, _ = channel_copy(remote_home, channel)
        items.append(Shipment(f"input '{channel.name}'", home.channel_path(channel), str(cache.data),
                              marker=str(cache.manifest), follow_links=True))
    return items


def channel_copy(remote_home: HomePaths, channel: Channel) -> tuple[ChannelCachePaths, str]:
    """Where hosts keep their copy of a staged input: the cache entry in the remote home (the
    same key as the local one), and the path the job reads (a single local file lies inside)."""
    cache = remote_home.channel_cache(channel.source, channel.extract)
    if not channel.is_remote and not channel.extract and Path(channel.source).is_file():
        return cache, str(cache.data / Path(channel.source).name)
    return cache, str(cache.data)


def _remote_home(opts: Mapping[str, Any]) -> HomePaths:
    return HomePaths(Path(str(opts["remote_home"])))


class SshNode(NodeHandle):
    """A node agent on a host, controlled through the ssh session's stdin; its files mirrored back."""

    kill_margin = 15.0

    def __init__(self, backend: SshBackend, opts: dict[str, Any], node: NodePlan, paths: JobPaths, plan: Plan, stream: bool,
                 trees: dict[str, tuple[str, Path]] | None = None) -> None:
        self.node_rank = node.node_rank
        self.host = node.host
        self.paths = paths
        self.exit: int | None = None
        trees = trees or {}
        self.receiver = Receiver(paths.attempt(plan.attempt), {name: local for name, (_, local) in trees.items()},
                                 tag=str(node.node_rank))
        launch = {"node": node.to_dict(), "job_dir": node.env["PHALANX_JOB_DIR"],
                  "attempt": plan.attempt, "grace": plan.grace}
        python = _python_of(node)
        remote_cmd = f"exec {shlex.quote(python)} -m phalanx.launch.remote"
        log = open(paths.node_dir(plan.attempt, node.node_rank) / "ssh.log", "ab")
        self.proc = subprocess.Popen(
            [*backend.ssh_argv(opts, node.host), remote_cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True,
        )
        log.close()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._send(json.dumps({"launch": launch, "stream": stream, "home": str(opts.get("remote_home") or ""),
                               "trees": {name: remote for name, (remote, _) in trees.items()}}))
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def _read(self, stream: IO[bytes]) -> None:
        self.exit = self.receiver.receive(stream)

    def poll(self) -> int | None:
        """The node's exit code once its connection ended *and* every frame before it was
        written: the supervisor's state and output uploads then see complete files."""
        code = self.proc.poll()
        if code is None or self._reader.is_alive():
            return None
        if self.exit is not None:
            return self.exit
        return 255  # the connection ended without the node's exit: the host is lost

    def signal(self, signum: int) -> None:
        self._send(f"signal {int(signum)}")

    def kill(self) -> None:
        self._send("kill")
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _control_dir() -> str:
    """A short private directory for ssh control sockets (unix socket paths are limited)."""
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"phalanx-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def remote_path(path: str) -> str:
    """Quote a remote path for the remote shell, letting a leading ~ expand to the home there."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:])
    return shlex.quote(path)


def _endpoint_port(argv: tuple[str, ...]) -> int:
    for word in argv:
        if word.startswith("--rdzv-endpoint="):
            return int(word.rsplit(":", 1)[1])
    return 0


def _python_of(node: NodePlan) -> str:
    return node.agent_argv[0]


def _local_version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001 - not installed is an answer
        return None
