"""A real SLURM cluster for tests: munged + slurmctld + two slurmd on this machine (recipe:
shared/recipes/cluster-on-one-machine.md, section 2).

Everything lives under one temporary directory: munge's key and socket, slurm.conf, state, logs
and pid files; ports are chosen free. The two "nodes" n1 and n2 are slurmd processes on the
loopback addresses 127.0.0.2 and 127.0.0.3, so each node has an address of its own. Client
commands need ``SLURM_CONF`` (``SlurmCluster.env``). Daemons are stopped by their pid files.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.backends.base import free_port

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/mungekey", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3"}


class Unavailable(Exception):
    """SLURM cannot run here; the message says why (tests skip with it)."""


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    pidfiles: list[Path] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})

    def job_state(self, job_id: str) -> str:
        out = self.run("squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T").stdout.strip()
        return out or "GONE"

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                         for p in sorted((self.root / "log").glob("*.log")))


def _conf(root: Path, munge_socket: Path) -> str:
    ports = {name: free_port() for name in ("ctld", "d", *NODES)}  # none a port-0 listener can take first
    nodes = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr={addr} Port={ports[name]} CPUs=2 RealMemory=2000 State=UNKNOWN"
        for name, addr in NODES.items()
    )
    return f"""ClusterName=phalanxtest
SlurmctldHost=localhost
SlurmctldPort={ports["ctld"]}
SlurmdPort={ports["d"]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def start(root: Path) -> SlurmCluster:
    """Start munged, slurmctld and one slurmd per node; returns once both nodes are idle.
    Raises Unavailable (with the reason) when SLURM cannot run here."""
    missing = [p for p in DAEMONS if not os.path.exists(p)] + [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        raise Unavailable(f"slurm-wlm / munge are not installed ({', '.join(missing)} missing; "
                          "apt-get install slurm-wlm slurm-client munge, as .ci/run does)")
    if os.geteuid() != 0:
        raise Unavailable("the test cluster runs its daemons as root (SlurmUser=root); run the tests as root")
    root.chmod(0o700)  # munged refuses keys and sockets in directories others can write
    for sub in ("munge", "ctld", "run", "log", *(f"spool-{n}" for n in NODES)):
        (root / sub).mkdir(mode=0o700)
    key, sock = root / "munge" / "munge.key", root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, sock))
    cluster = SlurmCluster(root, conf)
    try:
        subprocess.run(["/usr/sbin/mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        munge_pid = root / "munge" / "munged.pid"
        cluster.pidfiles.append(munge_pid)
        subprocess.run(["/usr/sbin/munged", "--force", f"--socket={sock}", f"--key-file={key}", f"--pid-file={munge_pid}",
                        f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"], check=True, capture_output=True)
        cluster.pidfiles.append(root / "run" / "slurmctld.pid")
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(conf)], check=True, capture_output=True)
        for name in NODES:
            cluster.pidfiles.append(root / "run" / f"slurmd-{name}.pid")
            subprocess.run(["/usr/sbin/slurmd", "-f", str(conf), "-N", name], check=True, capture_output=True)
        deadline = time.monotonic() + 30
        while cluster.run("sinfo", "--noheader", "--states=idle", "--format=%D").stdout.strip() != str(len(NODES)):
            if time.monotonic() > deadline:
                raise Unavailable(f"the SLURM nodes did not come up within 30 s:\n{cluster.logs()}")
            time.sleep(0.2)
    except (subprocess.CalledProcessError, Unavailable) as exc:
        detail = exc.stderr.decode(errors="replace") if isinstance(exc, subprocess.CalledProcessError) and exc.stderr else ""
        stop(cluster)
        raise Unavailable(f"SLURM did not start here: {exc} {detail}\n{cluster.logs()}") from None
    return cluster


def stop(cluster: SlurmCluster) -> None:
    """Cancel what still runs, then stop every daemon by its pid file (SIGTERM, then SIGKILL)."""
    if cluster.conf.exists():
        ids = cluster.run("squeue", "--noheader", "--format=%i").stdout.split()
        for job_id in ids:
            cluster.run("scancel", "--full", "--signal=KILL", job_id)
    for pidfile in reversed(cluster.pidfiles):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
