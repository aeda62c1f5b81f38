"""Hosts that are "different machines" for tests: network namespaces with addresses and hostnames
of their own, one sshd in each (recipe: shared/recipes/cluster-on-one-machine.md, sections 1 and 6).

Layout, for a run with prefix ``px1a2b`` and subnet 10.200.K.0/24 (K chosen free)::

    root ns: px1a2bh 10.200.K.1 --veth-- [px1a2b-hub: bridge br0] --veth-- px1a2b-n1: eth0 10.200.K.11
                                                                  --veth-- px1a2b-n2: eth0 10.200.K.12 ...

The nodes have no default route, so nothing they send can leave the machine. Every name carries
a per-run prefix (interface names stay within the kernel's 15 characters), so parallel runs do
not meet. sshd runs in each node namespace under its own UTS namespace, so ``hostname`` there
says the node's name. It shares the filesystem, the pid space and the users with this machine.

Needs root, iproute2, util-linux (nsenter, unshare) and openssh-server. ``destroy`` removes
exactly what ``create`` made and is safe to call on a half-built network.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.sshd import SSHD

# Held while a subnet is picked and claimed, so that two runs of these tests cannot pick the same one.
LOCK = Path("/run/phalanx-tests-netns.lock")
SECOND_OCTETS = range(100, 250)  # 10.200.K.0/24; the recipe's own 10.200.0.0/24 stays out
NODE_HOST_BASE = 10  # node i (1-based) is 10.200.K.(10+i)


class Unavailable(Exception):
    """Namespaces (or sshd in them) cannot be had here; the message says why (tests skip with it)."""


@dataclass
class Network:
    prefix: str
    subnet: ipaddress.IPv4Network
    namespaces: list[str] = field(default_factory=list)  # hub first, then nodes; only those that exist
    links: list[str] = field(default_factory=list)  # root-namespace links to delete
    node_namespaces: list[str] = field(default_factory=list)
    node_addrs: list[str] = field(default_factory=list)
    etc_dirs: list[Path] = field(default_factory=list)  # /etc/netns/<ns>/ written by set_hosts

    @property
    def driver_addr(self) -> str:
        """This machine's (the root namespace's) address on the bridge."""
        return str(self.subnet.network_address + 1)


@dataclass
class NetnsHosts:
    """sshd "hosts" in namespaces: ssh alias ``names[i]`` is ``addrs[i]`` whose hostname is ``hostnames[i]``."""

    root: Path
    network: Network
    config: Path  # an ssh config naming the hosts
    names: list[str]
    addrs: list[str]
    hostnames: list[str]
    pids: list[int] = field(default_factory=list)

    def ssh(self, host: str, command: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(self.config), host, command], capture_output=True, text=True, timeout=30, **kw)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """IPv4 networks this machine already has addresses in or routes to (the default route aside)."""
    used = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        words = line.split()
        if "inet" in words:
            used.append(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    route_types = {"unicast", "local", "broadcast", "multicast", "unreachable", "blackhole", "prohibit", "throw", "anycast", "nat"}
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if words and words[0] in route_types:
            words = words[1:]
        if not words or words[0] == "default":
            continue
        try:
            used.append(ipaddress.ip_network(words[0], strict=False))
        except ValueError:
            continue
    return used


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _networks_in_use()
    for k in random.sample(list(SECOND_OCTETS), len(SECOND_OCTETS)):
        subnet = ipaddress.ip_network(f"10.200.{k}.0/24")
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise Unavailable("every 10.200.K.0/24 in the test range is in use on this machine")


def _new_prefix() -> str:
    taken = _ip("netns", "list").stdout + _ip("-o", "link", "show").stdout
    for _ in range(20):
        prefix = f"px{random.randrange(16 ** 4):04x}"
        if prefix not in taken:
            return prefix
    raise Unavailable("no unused namespace prefix found")


def create(count: int) -> Network:
    """A hub namespace with a bridge, ``count`` node namespaces on it, and this machine on it at .1."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise Unavailable("iproute2 is not installed (apt-get install iproute2)")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        net = Network(prefix=_new_prefix(), subnet=_pick_subnet())
        try:
            _build(net, count)
        except BaseException:
            destroy(net)
            raise
    return net


def _build(net: Network, count: int) -> None:
    p, plen = net.prefix, net.subnet.prefixlen
    hub = f"{p}-hub"
    _ip("netns", "add", hub)
    net.namespaces.append(hub)
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")
    _ip("-n", hub, "link", "set", "lo", "up")
    for i in range(1, count + 1):
        ns, veth = f"{p}-n{i}", f"{p}v{i}"
        addr = str(net.subnet.network_address + NODE_HOST_BASE + i)
        _ip("netns", "add", ns)
        net.namespaces.append(ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        net.links.append(veth)
        _ip("link", "set", veth, "netns", hub)
        net.links.remove(veth)  # it lives (and dies) with the hub now
        _ip("-n", hub, "link", "set", veth, "master", "br0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/{plen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        net.node_namespaces.append(ns)
        net.node_addrs.append(addr)
    uplink = f"{p}h"
    _ip("link", "add", uplink, "type", "veth", "peer", "name", f"{p}u", "netns", hub)
    net.links.append(uplink)
    _ip("-n", hub, "link", "set", f"{p}u", "master", "br0", "up")
    _ip("addr", "add", f"{net.driver_addr}/{plen}", "dev", uplink)
    _ip("link", "set", uplink, "up")


def destroy(net: Network) -> None:
    """Stop whatever still runs in the node namespaces (all of it started by the tests), then
    delete the links, namespaces and hosts files. Idempotent."""
    for ns in net.node_namespaces:
        _kill(_netns_pids(ns))
    for etc in net.etc_dirs:
        shutil.rmtree(etc, ignore_errors=True)
    net.etc_dirs.clear()
    for link in reversed(net.links):
        _ip("link", "del", link, check=False)
    net.links.clear()
    for ns in reversed(net.namespaces):
        _ip("netns", "del", ns, check=False)
    net.namespaces.clear()


def set_hosts(net: Network, ns: str, names: dict[str, str]) -> None:
    """What ``ns`` resolves by name: ``names`` (name -> address) plus localhost, as the file
    ``ip netns exec`` bind-mounts over /etc/hosts for processes of that namespace (``spawn``).
    Call again to change it (a DNS record that appears late); processes already running see
    the new file at their next lookup."""
    etc = Path("/etc/netns") / ns
    if etc not in net.etc_dirs:
        etc.mkdir(parents=True, exist_ok=True)
        net.etc_dirs.append(etc)
    lines = ["127.0.0.1 localhost", *(f"{addr} {name}" for name, addr in names.items())]
    tmp = etc / ".hosts.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    # Same inode, new content: a bind mount of the old file would not see a renamed one.
    (etc / "hosts").touch()
    with open(etc / "hosts", "r+") as fh:
        fh.write(tmp.read_text())
        fh.truncate()
    tmp.unlink()


def spawn(ns: str, argv: list[str], env: dict[str, str], hostname: str | None = None, cwd: str | None = None,
          log: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` as a process of namespace ``ns`` (its own session), as a "host", "pod" or
    "instance" of a test would run: with exactly ``env`` (nothing inherited), the hosts file of
    ``set_hosts``, and ``hostname`` in a UTS namespace of its own. Output goes to ``log`` (or is
    discarded). Stop it with ``stop_group`` or ``destroy``."""
    prefix = ["ip", "netns", "exec", ns]
    if hostname:
        prefix += ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
    out = open(log, "ab") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen([*prefix, *argv], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group ``spawn`` started, SIGKILL what is left after ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _netns_pids(ns: str) -> list[int]:
    return [int(word) for word in _ip("netns", "pids", ns, check=False).stdout.split()]


def _kill(pids: list[int], wait: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        pids = [pid for pid in pids if _alive(pid)]
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


# -- sshd in the namespaces ---------------------------------------------------------------------


def start(root: Path, names: tuple[str, ...] = ("nodeA", "nodeB")) -> NetnsHosts:
    """Namespaces plus one sshd per node (key auth, port 22 inside its namespace). Stop with ``stop``."""
    for tool in ("nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise Unavailable(f"`{tool}` is not installed (util-linux / openssh-client)")
    if not os.path.exists(SSHD):
        raise Unavailable("openssh-server is not installed (apt-get install openssh-server)")
    net = create(len(names))
    hosts = NetnsHosts(root, net, root / "ssh_config", list(names), list(net.node_addrs),
                       [f"{net.prefix}-{chr(ord('a') + i)}" for i in range(len(names))])
    try:
        _start_sshds(hosts)
    except BaseException:
        stop(hosts)
        raise
    return hosts


def _keygen(path: Path, comment: str = "phalanx-tests") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


def _start_sshds(hosts: NetnsHosts) -> None:
    root = hosts.root
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    root.mkdir(parents=True, exist_ok=True)
    key = root / "id_ed25519"
    _keygen(key)
    authorized = root / "authorized_keys"
    authorized.write_text((root / "id_ed25519.pub").read_text())
    authorized.chmod(0o600)
    entries = []
    for i, (name, addr, hostname, ns) in enumerate(zip(hosts.names, hosts.addrs, hosts.hostnames, hosts.network.node_namespaces)):
        hostkey, conf, pidfile = root / f"hostkey{i}", root / f"sshd{i}.conf", root / f"sshd{i}.pid"
        _keygen(hostkey)
        conf.write_text(
            f"ListenAddress {addr}:22\nHostKey {hostkey}\nPidFile {pidfile}\nAuthorizedKeysFile {authorized}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nAcceptEnv LANG LC_*\n"
        )
        # sshd daemonizes: the shell ends, the daemon stays in the namespaces and writes its pid.
        inner = f"hostname {hostname} && exec {SSHD} -f {conf} -E {root / f'sshd{i}.log'}"
        proc = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh", "-c", inner],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise Unavailable(f"sshd did not start in {ns}: {proc.stderr.strip()}")
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        else:
            raise Unavailable(f"sshd in {ns} wrote no pid file; see {root / f'sshd{i}.log'}")
        hosts.pids.append(int(pidfile.read_text()))
        entries.append(f"Host {name}\n  HostName {addr}\n")
    hosts.config.write_text(
        "".join(entries)
        + f"Host *\n  Port 22\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        f"  UserKnownHostsFile {root / 'known_hosts'}\n  BatchMode yes\n  ConnectTimeout 5\n  LogLevel ERROR\n"
    )


def stop(hosts: NetnsHosts) -> None:
    """Stop the sshd daemons by pid, then take the network down. Idempotent."""
    _kill(hosts.pids)
    destroy(hosts.network)
