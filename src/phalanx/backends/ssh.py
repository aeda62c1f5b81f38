"""The SSH backend: one node agent per host, started over ssh.

``phalanx run --backend ssh --hosts gpu1,gpu2 -n 2x8 train.py``. The OpenSSH client does the
connecting, so the user's ``~/.ssh/config`` (aliases, ProxyJump, keys, ControlMaster) applies
exactly as in their terminal. Per host, ``python -m phalanx.launch.remote`` starts the agent
and mirrors the node's files back into the local job directory (logs, metrics, results), so
``logs``, ``status`` and ``metrics`` work as for local jobs. Closing the connection stops the
node: nothing is left running on a host, and nothing is ever killed by name.

Before anything starts, a preflight reaches every host, checks that Python and torch match
this machine's, and that the rendezvous port is free on the first host; it names the host
that failed and why. Code is shipped from the job's directory unless ``--shared-fs``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from ..core.env import Topology
from ..core.paths import HomePaths, JobPaths
from ..core.spec import JobSpec, in_snapshot
from ..errors import BackendError, UsageError
from ..launch.plan import NodePlan, Plan
from .base import Backend, NodeHandle, PortSource
from .local import RESTART_SAFE_ENV, build_nodes
from .options import BackendOption

PORT_RANGE = (29400, 29900)
# Versions from package metadata, not imports: importing torch on every host costs seconds.
PREFLIGHT = (
    "import json, socket, sys, importlib.metadata as md, importlib.util as iu\n"
    "info = {'python': '%d.%d' % sys.version_info[:2]}\n"
    "try:\n    info['torch'] = md.version('torch')\nexcept md.PackageNotFoundError:\n    info['torch'] = None\n"
    "info['phalanx'] = iu.find_spec('phalanx') is not None\n"
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
    options = (
        BackendOption("hosts", str, None, "Comma-separated ssh hosts, in node-rank order (node 0 hosts the rendezvous)."),
        BackendOption("hostfile", str, None, "A file with one host per line (`host [slots=N]`)."),
        BackendOption("shared_fs", bool, False, "Hosts share this machine's filesystem: no code shipping, no file mirroring."),
        BackendOption("remote_python", str, None, "Python on the hosts (default: this interpreter's path)."),
        BackendOption("remote_home", str, "~/.phalanx/remote", "Where jobs live on the hosts (without --shared-fs)."),
        BackendOption("ssh_config", str, None, "An ssh config file (ssh -F); default: the user's ~/.ssh/config."),
    )

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
        remote = paths if shared else JobPaths(Path(str(opts["remote_home"])) / "jobs" / job_id)
        remote_home = home if shared else HomePaths(Path(str(opts["remote_home"])))
        digest = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest(), 16)
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=addrs,
            master_port=PORT_RANGE[0] + digest % (PORT_RANGE[1] - PORT_RANGE[0]),
            worker_ports=tuple(PORT_RANGE[0] + (digest + 1 + i) % (PORT_RANGE[1] - PORT_RANGE[0])
                               for i in range(nnodes * spec.procs_per_node_started)),
            state_dir=str(remote_home.state_dir(spec.name)), output_dir=str(remote.output_dir), job_dir=str(remote.root),
            num_gpus=0,
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
        spec = JobSpec.from_dict(json.loads(paths.spec.read_text()))
        opts = self._opts(spec)
        hosts = [n.host for n in plan.nodes]
        with ThreadPoolExecutor(max_workers=2) as pool:  # independent: check and ship at once
            shipped = pool.submit(self._ship, opts, hosts, paths, plan) if not opts["shared_fs"] else None
            checked = pool.submit(self.preflight, opts, hosts, plan)
            checked.result()
            if shipped is not None:
                shipped.result()
        return [SshNode(self, opts, node, paths, plan, stream=not opts["shared_fs"]) for node in plan.nodes]

    def _opts(self, spec: JobSpec) -> dict[str, Any]:
        from .options import validate

        return validate(self.name, self.options, spec.backend_options)

    def preflight(self, opts: dict[str, Any], hosts: list[str], plan: Plan) -> None:
        """Reach every host in parallel; raise BackendError naming each host that failed and why."""
        port = int(plan.nodes[0].torchrun_argv and _endpoint_port(plan.nodes[0].torchrun_argv) or 0)
        python = plan.nodes[0].processes[0].argv[0] if plan.nodes[0].processes else _python_of(plan.nodes[0])
        local = {"python": "%d.%d" % sys.version_info[:2], "torch": _local_torch()}

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

    def _ship(self, opts: dict[str, Any], hosts: list[str], paths: JobPaths, plan: Plan) -> None:
        """Copy the job's code snapshot to every host, in parallel (one tar stream per host)."""
        target = remote_path(str(JobPaths(Path(plan.nodes[0].env["PHALANX_JOB_DIR"])).code_dir))

        def ship(host: str) -> str | None:
            cmd = f"mkdir -p {target} && tar -xf - -C {target}"
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(paths.code_dir), "."], stdout=subprocess.PIPE)
            ssh = subprocess.Popen([*self.ssh_argv(opts, host), cmd], stdin=tar.stdout,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            assert tar.stdout is not None
            tar.stdout.close()  # only ssh reads the stream now: tar gets SIGPIPE if ssh dies
            try:
                _, err = ssh.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                ssh.kill()
                _, err = ssh.communicate()
            tar.wait()
            return None if ssh.returncode == 0 else f"{host}: {(err.strip().splitlines() or ['copy failed'])[-1]}"

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            problems = [p for p in pool.map(ship, sorted(set(hosts))) if p]
        if problems:
            raise BackendError("shipping the code failed: " + "; ".join(problems), "check disk space and permissions there")


class SshNode(NodeHandle):
    """A node agent on a host, controlled through the ssh session's stdin; its files mirrored back."""

    kill_margin = 15.0

    def __init__(self, backend: SshBackend, opts: dict[str, Any], node: NodePlan, paths: JobPaths, plan: Plan, stream: bool) -> None:
        self.node_rank = node.node_rank
        self.host = node.host
        self.paths = paths
        self.attempt_dir = paths.attempt(plan.attempt)
        self.exit: int | None = None
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
        self._send(json.dumps({"launch": launch, "stream": stream}))
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
        for raw in stream:
            try:
                frame = json.loads(raw)
            except ValueError:
                continue
            if "exit" in frame:
                self.exit = int(frame["exit"])
                continue
            target = (self.attempt_dir / frame["f"]).resolve()
            if not target.is_relative_to(self.attempt_dir.resolve()):
                continue  # never write outside the job directory
            target.parent.mkdir(parents=True, exist_ok=True)
            if "w" in frame:
                tmp = target.with_name(f".{target.name}.part")
                tmp.write_bytes(base64.b64decode(frame["w"]))
                tmp.replace(target)
            else:
                with open(target, "ab") as fh:
                    fh.truncate(int(frame["o"]))
                    fh.seek(int(frame["o"]))
                    fh.write(base64.b64decode(frame["d"]))

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        self._reader.join(timeout=5)
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


def _local_torch() -> str | None:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - not installed is an answer
        return None
