"""SshBackend: options, facts (hosts and their addresses), the pure plan, and start.

Every process goes through ``backends/commands.py``: ``ssh -G`` to resolve a host (``facts``),
the preflight and the marker checks (``run``), the copies (``pipe``: ``tar -c | ssh HOST tar
-x``) and each node's session (``link``). ``tests/backends/fake_ssh.py`` stands in for OpenSSH
there; ``tests/cluster/test_ssh*.py`` use a real sshd.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...core.contracts import read_launch
from ...core.env import Topology
from ...core.paths import HomePaths, JobPaths
from ...core.plan import Plan
from ...core.spec import JobSpec, in_snapshot
from ...errors import BackendError, ContractError, NodesUnusable, UsageError
from ...launch.frames import PROTOCOL
from ...launch.host import HostFacts
from ...launch.nodes import RESTART_SAFE_ENV, build_nodes
from .. import commands
from ..base import Backend, Facts, NodeHandle
from .node import SshNode
from .options import OPTIONS
from ...storage.channels import is_single_file
from .ship import Shipment, channel_copy, remote_path, shipments

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
    """``--hosts a,b`` or a hostfile (``host [slots=N]`` per line, # comments). Reads the file."""
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


@dataclass(frozen=True)
class SshFacts(Facts):
    hosts: tuple[str, ...] = ()  # from --hosts or the hostfile, in node-rank order
    addresses: tuple[str, ...] = ()  # what the other nodes reach each host at (its HostName)


class SshBackend(Backend):
    name = "ssh"
    options = OPTIONS  # declared in options.py, which the CLI reads without importing this module
    leaves_out = "exclude"  # see Backend.leaves_out

    def _facts(self, spec: JobSpec, host: HostFacts) -> SshFacts:
        opts = spec.backend_options
        # Hosts an earlier attempt found bad are left out; the next ones in the list stand in.
        hosts = tuple(h for h in parse_hosts(opts["hosts"], opts["hostfile"]) if h not in spec.left_out)
        addresses = tuple(self.resolve(h, opts["ssh_config"]) for h in hosts[:spec.resources.nnodes])
        singles = frozenset(c.name for c in spec.channels if is_single_file(c))
        return SshFacts(host, hosts=hosts, addresses=addresses, single_files=singles)

    def _plan(self, spec: JobSpec, job_id: str, attempt: int, home: HomePaths, paths: JobPaths, facts: Facts) -> Plan:
        assert isinstance(facts, SshFacts), "the ssh backend plans from SshBackend.facts"
        opts = spec.backend_options
        nnodes = spec.resources.nnodes
        if len(facts.hosts) < nnodes and spec.left_out:
            raise UsageError(f"-n asks for {nnodes} nodes but only {len(facts.hosts)} host(s) are left once "
                             f"{', '.join(spec.left_out)} (found bad) are left out", "give spare hosts in --hosts")
        if len(facts.hosts) < nnodes:
            raise UsageError(f"-n asks for {nnodes} nodes but {len(facts.hosts)} host(s) were given", "give more hosts or fewer nodes")
        hosts, addrs = facts.hosts[:nnodes], facts.addresses[:nnodes]
        shared = bool(opts["shared_fs"])
        if not shared and not spec.snapshot:
            raise UsageError("without --shared-fs the ssh backend ships the code snapshot", "drop --no-snapshot, or add --shared-fs")
        # Remote paths keep a leading ~: the remote end expands it to that host's home.
        remote_home = home if shared else HomePaths(Path(str(opts["remote_home"])))
        remote = paths if shared else remote_home.job(job_id)
        channels = tuple((c.name, str(home.channel_path(c)) if shared else channel_copy(remote_home, c, c.name in facts.single_files)[1])
                         for c in spec.channels)
        digest = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest(), 16)
        topo = Topology(
            job_id=job_id, attempt=attempt, node_addrs=addrs,
            master_port=PORT_RANGE[0] + digest % (PORT_RANGE[1] - PORT_RANGE[0]),
            worker_ports=tuple(PORT_RANGE[0] + (digest + 1 + i) % (PORT_RANGE[1] - PORT_RANGE[0])
                               for i in range(nnodes * spec.procs_per_node_started)),
            state_dir=str(remote_home.state_dir(spec.state_key)), output_dir=str(remote.output_dir), job_dir=str(remote.root),
            num_gpus=0, channels=channels, num_cpus=facts.host.cpus, preset_env=frozenset(facts.host.env),
        )
        spec = spec.with_(python=opts["remote_python"] or spec.python)
        if spec.snapshot:
            spec = in_snapshot(spec, str(remote.code_dir), shipped=not shared)
        net_env = {"PHALANX_AUTO_IFNAME": "1", **RESTART_SAFE_ENV}
        nodes = build_nodes(spec, topo, remote, hosts, addrs, net_env)
        # What start needs beyond the nodes: how to reach the hosts, what to copy, what comes back.
        context: dict[str, Any] = {"ssh_config": opts["ssh_config"], "shared_fs": shared}
        if not shared:
            context["ship"] = [s.to_dict() for s in shipments(spec, home, paths, remote_home, remote, facts.single_files)]
            context["remote_home"] = str(opts["remote_home"])  # the remote end expands ~ only under it
            context["trees"] = {"state": [str(remote_home.state_dir(spec.state_key)), str(home.state_dir(spec.state_key))],
                                "output": [str(remote.output_dir), str(paths.output_dir)]}
        return Plan(job_id=job_id, attempt=attempt, backend=self.name, nodes=nodes, grace=spec.grace, context=context)

    def shares_files(self, spec: JobSpec) -> bool:
        return bool(spec.backend_options.get("shared_fs"))

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
        proc = commands.run(argv, timeout=10)
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                return value.strip()
        return host

    # -- start -------------------------------------------------------------------------

    def _start(self, plan: Plan, paths: JobPaths) -> list[NodeHandle]:
        opts: Mapping[str, Any] = {"ssh_config": plan.context.get("ssh_config")}
        shared = bool(plan.context.get("shared_fs"))
        hosts = [n.host for n in plan.nodes]
        items = [Shipment.from_dict(s) for s in plan.context.get("ship", [])]
        # Mirrored back from every node: (the directory on the hosts, the local one).
        trees = {name: (remote, Path(local)) for name, (remote, local) in plan.context.get("trees", {}).items()}
        launches = []
        for node in plan.nodes:
            launch = read_launch(paths.node_launch(plan.attempt, node.node_rank))
            if launch is None:
                raise ContractError(f"no launch file for node {node.node_rank}", "the supervisor writes them before start")
            launches.append(launch)
        with ThreadPoolExecutor(max_workers=2) as pool:  # independent: check and ship at once
            shipped = None if shared else pool.submit(self.ship, opts, sorted(set(hosts)), items)
            checked = pool.submit(self.preflight, opts, hosts, plan)
            checked.result()
            if shipped is not None:
                shipped.result()
        home = str(plan.context.get("remote_home") or "")
        return [SshNode(self.ssh_argv(opts, launch.node.host), launch, paths, stream=not shared, trees=trees, home=home,
                        secrets=self.secret_env(launch.node))
                for launch in launches]

    def preflight(self, opts: Mapping[str, Any], hosts: list[str], plan: Any) -> None:
        """Reach every host in parallel; raise BackendError naming each host that failed and why."""
        first = plan.nodes[0]
        port = int(first.torchrun_argv and _endpoint_port(first.torchrun_argv) or 0)
        python = first.processes[0].argv[0] if first.processes else first.agent_argv[0]
        local = {"python": "%d.%d" % sys.version_info[:2], "torch": _local_version("torch"), "phalanx": _local_version("phalanx")}

        def check(index_host: tuple[int, str]) -> str | None:
            index, host = index_host
            cmd = f"{shlex.quote(python)} -c {shlex.quote(PREFLIGHT)} {port if index == 0 else 0}"
            proc = commands.run([*self.ssh_argv(opts, host), cmd], timeout=60)
            if proc.returncode == 124 and "no answer within" in proc.stderr:
                return f"{host}: no answer within 60 s"
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                return f"{host}: {last}"
            try:
                info = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                return f"{host}: the preflight printed no report ({proc.stdout.strip()[-200:]!r})"
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
            problems = [(h, p) for h, p in zip(hosts, pool.map(check, enumerate(hosts))) if p]
        if problems:
            # A host that cannot run the job is left out where spare hosts allow (the supervisor's
            # call); a busy rendezvous port is the attempt's, not the host's.
            text = "preflight failed: " + "; ".join(p for _, p in problems)
            unusable = {h: p.partition(": ")[2] for h, p in problems if "rendezvous port" not in p}
            if len(unusable) == len(problems):
                raise NodesUnusable(text, "fix the hosts above, then run again", unusable)
            raise BackendError(text, "fix the hosts above, then run again")

    def ship(self, opts: Mapping[str, Any], hosts: list[str], items: list[Shipment]) -> None:
        """Copy every item to every host, in parallel (one tar stream each); an item whose
        marker on a host says it is there already is skipped. Blocking; raises BackendError
        naming each host and item that failed."""

        digests = {item: item.digest() for item in items}  # once, not per host: an input may be large
        sources = {item: item.source() for item in items}

        def one(host_item: tuple[str, Shipment]) -> str | None:
            host, item = host_item
            digest = digests[item]
            if digest and self._marker(opts, host, item) == digest:
                return None
            local = sources[item]
            sink = [*self.ssh_argv(opts, host), item.command(digest, local is not None)]
            proc = commands.pipe(item.tar_argv(local) if local is not None else None, sink, timeout=600)
            if proc.returncode == 0:
                return None
            return f"{host}: {item.what}: {(proc.stderr.strip().splitlines() or ['copy failed'])[-1]}"

        work = [(host, item) for item in items for host in hosts]
        if not work:
            return
        with ThreadPoolExecutor(max_workers=min(16, len(work))) as pool:
            problems = [p for p in pool.map(one, work) if p]
        if problems:
            raise BackendError("copying to the hosts failed: " + "; ".join(problems), "check disk space and permissions there")

    def _marker(self, opts: Mapping[str, Any], host: str, item: Shipment) -> str | None:
        """The digest recorded on ``host`` for ``item`` (None when its directory is gone)."""
        assert item.marker is not None
        check = f"test -d {remote_path(item.remote)} && cat {remote_path(item.marker)} 2>/dev/null || true"
        proc = commands.run([*self.ssh_argv(opts, host), check], timeout=60)
        try:
            return str(json.loads(proc.stdout)["digest"]) if proc.returncode == 0 else None
        except (ValueError, KeyError, TypeError):
            return None


def _control_dir() -> str:
    """A short private directory for ssh control sockets (unix socket paths are limited)."""
    path = os.path.join(tempfile.gettempdir(), f"phalanx-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _endpoint_port(argv: tuple[str, ...]) -> int:
    for word in argv:
        if word.startswith("--rdzv-endpoint="):
            return int(word.rsplit(":", 1)[1])
    return 0


def _local_version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001 - not installed is an answer
        return None
