"""Real sshd "hosts" on loopback addresses for tests (recipe: shared/recipes, section 1).

Each host is its own sshd with its own host key on 127.0.0.N and a free port; key auth only;
nothing under /etc/ssh is touched. Stopped by PID.

Each host has a HOME of its own (``SetEnv HOME=...``: sshd applies SetEnv after its default
environment, so it overrides the account's home), so what a job writes under ``~`` on one
host is not there on another, as on separate machines. The rest of the filesystem is shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from phalanx.backends.base import free_port

SSHD = "/usr/sbin/sshd"


@dataclass
class SshHosts:
    config: Path  # an ssh config naming the hosts node1, node2, ...
    names: list[str]
    addrs: list[str]
    pids: list[int]
    homes: list[Path]  # each host's HOME

    def ssh(self, host: str, command: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(self.config), host, command], capture_output=True, text=True, timeout=30, **kw)


def start(root: Path, count: int = 2, wrap: Mapping[int, Sequence[str]] | None = None) -> SshHosts:
    """``count`` hosts; ``wrap``: for host i (0-based), a command line its sshd starts under (e.g.
    ``unshare --mount ...`` for a host whose files differ from the others')."""
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        raise FileNotFoundError("openssh-server / openssh-client are not installed (apt-get install openssh-server)")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    root.mkdir(parents=True, exist_ok=True)
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key), "-C", "phalanx-tests"], check=True)
    authorized = root / "authorized_keys"
    authorized.write_text((root / "id_ed25519.pub").read_text())
    authorized.chmod(0o600)
    names, addrs, pids, entries, homes = [], [], [], [], []
    for i in range(count):
        addr = f"127.0.0.{i + 2}"
        port = free_port(addr)  # not one a port-0 listener beside us can take first
        home = root / f"home{i + 1}"
        home.mkdir(exist_ok=True)
        homes.append(home)
        hostkey = root / f"hostkey{i}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)], check=True)
        conf = root / f"sshd{i}.conf"
        pidfile = root / f"sshd{i}.pid"
        conf.write_text(
            f"ListenAddress {addr}:{port}\nHostKey {hostkey}\nPidFile {pidfile}\nAuthorizedKeysFile {authorized}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nAcceptEnv LANG LC_*\n"
            f"SetEnv HOME={home}\n"
        )
        subprocess.run([*(wrap or {}).get(i, ()), SSHD, "-f", str(conf), "-E", str(root / f"sshd{i}.log")], check=True)
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        pids.append(int(pidfile.read_text()))
        name = f"node{i + 1}"
        names.append(name)
        addrs.append(addr)
        entries.append(f"Host {name}\n  HostName {addr}\n  Port {port}\n")
    config = root / "ssh_config"
    config.write_text(
        "".join(entries)
        + f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        f"  UserKnownHostsFile {root / 'known_hosts'}\n  BatchMode yes\n  ConnectTimeout 5\n  LogLevel ERROR\n"
    )
    return SshHosts(config, names, addrs, pids, homes)


def stop(hosts: SshHosts) -> None:
    for pid in hosts.pids:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
