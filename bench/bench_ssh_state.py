"""2 nodes over SSH without --shared-fs: what mirroring and pushing the state directory costs.

Real sshd "hosts" on 127.0.0.2/3, each with a HOME of its own (tests/cluster/sshd.py), so the
hosts' copies under ``~/.phalanx/remote`` are separate, as on separate machines.

- **pull**: a 2x1 job (``--name``) whose rank 0 writes a checkpoint of ``--size-mib`` random
  bytes into ``PHALANX_STATE_DIR`` (a temp name, then ``os.replace``, as ``torch.save`` users
  do) and exits; timed from the command to its exit, when the local state directory has the
  file (size and sha256 checked after the clock stops). Compared with the hand alternative,
  ``ssh HOST torchrun ...`` per node in parallel (the state dir set by hand) then ``scp -O
  HOST:FILE .``, and with ``phalanx run --shared-fs`` (nothing copied: the floor).
- **transfer**: the same file moved alone, by phalanx's mirror code (``Mirror``/``TreeMirror``
  in ``python -m phalanx.launch.remote``'s place on the host, ``Receiver`` here, one ``ssh``)
  and by ``scp -O``. Also, inside the pull run: the file's ``os.replace`` on the host to its
  arrival here (the local file's ctime).
- **push**: a second run of the same ``--name`` (the local state holds the checkpoint, shipped
  to both hosts before the attempt, in parallel with the preflight): time from the command to
  the ranks' first line, against the pull run's (a fresh name: an empty state); the difference
  is what the push adds. Also timed alone: ``SshBackend.ship`` of that state directory to both
  hosts (``tar | ssh`` per host), and ``scp -O FILE node1:... & scp -O FILE node2:...``.

Rounds run the variants of each group in a rotated order, after a warm-up (one phalanx run and
one by hand, dropped), so that noise on the machine hits all of them alike.

    .venv/bin/python bench/bench_ssh_state.py [--repeats 3] [--size-mib 256] [--json FILE]

(``scp -O``: the test sshd has no sftp subsystem, so scp uses the classic protocol.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SELF = str(Path(__file__).resolve())
PY = sys.executable
PHALANX = str(Path(PY).parent / "phalanx")
CKPT = "model.pt"
MiB = 1 << 20


# -- the job's script (run by phalanx and by torchrun: `bench_ssh_state.py --worker ...`) ------

def worker(size_mib: int, write: bool) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"first rank={rank} t={time.time():.6f}", flush=True)
    if write and rank == 0:
        state = Path(os.environ["PHALANX_STATE_DIR"])
        state.mkdir(parents=True, exist_ok=True)
        tmp = state / f"{CKPT}.tmp.{os.getpid()}"
        digest = hashlib.sha256()
        with open(tmp, "wb") as fh:
            for _ in range(size_mib):
                chunk = os.urandom(MiB)
                digest.update(chunk)
                fh.write(chunk)
        os.replace(tmp, state / CKPT)
        print(f"wrote t={time.time():.6f} path={state / CKPT} sha={digest.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


# -- helpers --------------------------------------------------------------------------------

def _first_line(text: str) -> float:
    times = [float(t) for t in re.findall(r"first rank=\d+ t=([0-9.]+)", text)]
    assert len(times) == 2, text
    return max(times)


def _wrote(text: str) -> tuple[float, str, str]:
    m = re.search(r"wrote t=([0-9.]+) path=(\S+) sha=([0-9a-f]+)", text)
    assert m, text
    return float(m.group(1)), m.group(2), m.group(3)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def _check(path: Path, size_mib: int, sha: str) -> None:
    assert path.stat().st_size == size_mib * MiB, (path, path.stat().st_size)
    assert _sha256(path) == sha, f"{path}: sha256 differs"


def _ssh(hosts, host: str) -> list[str]:
    return ["ssh", "-F", str(hosts.config), host]


def _scp(hosts, src: str, dst: str) -> subprocess.Popen:
    return subprocess.Popen(["scp", "-O", "-q", "-F", str(hosts.config), src, dst])


def _host_of(hosts, path: str) -> str:
    for name, home in zip(hosts.names, hosts.homes):
        if path.startswith(str(home) + "/"):
            return name
    raise AssertionError(f"{path} is in no host's home")


# -- the contenders -------------------------------------------------------------------------

def phalanx_run(hosts, home: Path, name: str, size_mib: int, write: bool, shared: bool = False) -> tuple[float, float, str]:
    """(seconds to exit, seconds to the ranks' first line, output)."""
    env = {**os.environ, "PHALANX_HOME": str(home), "OMP_NUM_THREADS": "1"}
    argv = [PHALANX, "run", "--backend", "ssh", "--ssh-config", str(hosts.config), "--hosts", "node1,node2",
            "-n", "2x1", "--name", name, *(["--shared-fs"] if shared else []),
            SELF, "--worker", "--size-mib", str(size_mib), "--write", str(int(write))]
    start = time.time()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    end = time.time()
    assert out.returncode == 0, out.stdout + out.stderr
    return end - start, _first_line(out.stdout) - start, out.stdout


def hand_run(hosts, size_mib: int) -> tuple[float, str]:
    """`ssh HOST torchrun ...` per node, in parallel; the state directory set by hand."""
    from bench_ssh import hand_commands  # bench/ is the script's directory: first on sys.path

    procs = []
    start = time.time()
    for name, cmd in hand_commands(hosts, f"{SELF} --worker --size-mib {size_mib} --write 1",
                                   env="PHALANX_STATE_DIR=$HOME/hand_state "):
        procs.append(subprocess.Popen([*_ssh(hosts, name), cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    took = time.time() - start
    assert all(p.returncode == 0 for p in procs), outs
    return took, "".join(out for out, _ in outs)


def scp_pull(hosts, host: str, remote: str, local: Path) -> float:
    start = time.time()
    proc = _scp(hosts, f"{host}:{remote}", str(local))
    assert proc.wait(timeout=600) == 0
    return time.time() - start


def scp_push(hosts, local: Path, remotes: list[str]) -> float:
    start = time.time()
    procs = [_scp(hosts, str(local), f"{host}:{path}") for host, path in zip(hosts.names, remotes)]
    assert all(p.wait(timeout=600) == 0 for p in procs)
    return time.time() - start


MIRROR_SENDER = """\
import sys
from pathlib import Path
from phalanx.launch.frames import Mirror
mirror = Mirror(Path(sys.argv[1]), 0, sys.stdout.buffer, {"state": Path(sys.argv[2])})
mirror.trees[0].known = {}  # as if the file had been written after the start
mirror.scan(final=True)
"""


def ship_state(hosts, local: Path, name: str) -> float:
    """phalanx's push alone: SshBackend.ship of the state directory to both hosts, as before an
    attempt (one tar | ssh per host, in parallel, unpacked beside the old one and swapped in)."""
    from phalanx.backends.ssh import Shipment, SshBackend

    start = time.time()
    SshBackend().ship({"ssh_config": str(hosts.config)}, list(hosts.names),
                      [Shipment("the state directory", local, f"~/.phalanx/remote/state/{name}")])
    return time.time() - start


def mirror_pull(hosts, host: str, remote_dir: str, local_dir: Path) -> float:
    """phalanx's mirror alone: the remote end's Mirror/TreeMirror sending a directory's files as
    frames over one ssh session, read here as SshNode does (Receiver.receive)."""
    from phalanx.launch.frames import Receiver

    receiver = Receiver(local_dir.parent / "attempt", {"state": local_dir}, tag="0")
    cmd = f"cd {shlex.quote(str(ROOT))} && exec {PY} -c {shlex.quote(MIRROR_SENDER)} /nonexistent {shlex.quote(remote_dir)}"
    start = time.time()
    proc = subprocess.Popen([*_ssh(hosts, host), cmd], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    receiver.receive(proc.stdout)
    assert proc.wait() == 0
    return time.time() - start


# -- the rounds -----------------------------------------------------------------------------

def one_round(hosts, work: Path, size_mib: int, i: int, samples: dict[str, list[float]]) -> None:
    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    home = work / "home"
    name = f"ck{i}"
    hand_local = work / "hand" / CKPT
    hand_local.parent.mkdir(parents=True)
    found: dict[str, str] = {}

    # pull: three ways to end up with the checkpoint on this machine
    def pull_phalanx() -> None:
        took, first, out = phalanx_run(hosts, home, name, size_mib, write=True)
        wrote_t, _, sha = _wrote(out)
        local = home / "state" / name / CKPT
        arrived = local.stat().st_ctime  # Receiver: utime + os.replace when complete
        _check(local, size_mib, sha)
        add("pull phalanx", took)
        add("pull phalanx: first line", first)
        add("pull phalanx: replace on host -> here", arrived - wrote_t)

    def pull_hand() -> None:
        took, out = hand_run(hosts, size_mib)
        _, path, sha = _wrote(out)
        copy = scp_pull(hosts, _host_of(hosts, path), path, hand_local)
        _check(hand_local, size_mib, sha)
        add("pull hand: ssh torchrun + scp", took + copy)
        add("pull hand: ssh torchrun", took)
        add("pull hand: scp", copy)
        found["hand file"] = path

    def pull_shared() -> None:
        took, _, out = phalanx_run(hosts, work / "home_shared", name, size_mib, write=True, shared=True)
        _check(work / "home_shared" / "state" / name / CKPT, size_mib, _wrote(out)[2])
        add("pull phalanx --shared-fs", took)

    pulls = [pull_phalanx, pull_hand, pull_shared]
    for step in pulls[i % 3:] + pulls[:i % 3]:
        step()

    # transfer alone: the hand run's file on its host, by phalanx's mirror and by scp
    path = found["hand file"]
    host = _host_of(hosts, path)

    def move_mirror() -> None:
        dst = work / f"mirror{i}"
        dst.mkdir()
        add("transfer phalanx mirror", mirror_pull(hosts, host, str(Path(path).parent), dst))
        assert (dst / CKPT).stat().st_size == size_mib * MiB
        shutil.rmtree(dst)

    def move_scp() -> None:
        dst = work / f"scp{i}"
        add("transfer scp -O", scp_pull(hosts, host, path, dst))
        assert dst.stat().st_size == size_mib * MiB
        dst.unlink()

    moves = [move_mirror, move_scp]
    for step in moves[i % 2:] + moves[:i % 2]:
        step()

    # push: the same name again (the local state holds the checkpoint); the pull run above,
    # a fresh name with an empty state, is the baseline
    local_state = home / "state" / name

    def push_phalanx() -> None:
        add("push phalanx: first line, state of S MiB", phalanx_run(hosts, home, name, size_mib, write=False)[1])

    def push_ship() -> None:
        add("push SshBackend.ship of the state alone", ship_state(hosts, local_state, f"ship{i}"))

    def push_scp() -> None:
        remotes = [str(h / f"pushed{i}") for h in hosts.homes]
        add("push scp -O to both hosts (parallel)", scp_push(hosts, local_state / CKPT, remotes))
        for r in remotes:
            os.unlink(r)

    pushes = [push_phalanx, push_ship, push_scp]
    for step in pushes[i % 3:] + pushes[:i % 3]:
        step()


def warm_up(hosts, work: Path, size_mib: int) -> None:
    """Once, dropped: the first ssh logins, torch's imports and the rendezvous warm up."""
    phalanx_run(hosts, work / "home", "warm", size_mib, write=True)
    hand_run(hosts, size_mib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--warmup-mib", type=int, default=1, help="checkpoint size of the warm-up runs (dropped)")
    parser.add_argument("--json", help="save every sample here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--write", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.size_mib, bool(args.write))
        return

    sys.path.insert(0, str(ROOT))
    from tests.cluster import sshd

    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        hosts = sshd.start(Path(tmp) / "sshd")
        try:
            for i in range(args.repeats + 1):
                work = Path(tmp) / f"round{i}"
                work.mkdir()
                if i:
                    one_round(hosts, work, args.size_mib, i, samples)
                else:
                    warm_up(hosts, work, args.warmup_mib)
                # the hosts' copies and this round's files go (the disk holds a few S MiB at a time)
                shutil.rmtree(work)
                for h in hosts.homes:
                    shutil.rmtree(h / ".phalanx", ignore_errors=True)
                    shutil.rmtree(h / "hand_state", ignore_errors=True)
                print(f"round {i} done", file=sys.stderr, flush=True)
        finally:
            sshd.stop(hosts)
    report(samples, args.size_mib)
    if args.json:
        Path(args.json).write_text(json.dumps({"size_mib": args.size_mib, "samples": samples}, indent=1))


ROWS = (  # (key, with a MiB/s column)
    ("pull phalanx", False),
    ("pull phalanx: first line", False),
    ("pull hand: ssh torchrun + scp", False),
    ("pull hand: ssh torchrun", False),
    ("pull hand: scp", True),
    ("pull phalanx --shared-fs", False),
    ("pull phalanx: replace on host -> here", True),
    ("transfer phalanx mirror", True),
    ("transfer scp -O", True),
    ("push phalanx: first line, state of S MiB", False),
    ("push SshBackend.ship of the state alone", True),
    ("push scp -O to both hosts (parallel)", True),
)


def report(samples: dict[str, list[float]], size_mib: int) -> None:
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{size_mib} MiB checkpoint, 2x1 over ssh, {len(samples['pull phalanx'])} rounds")
    print(f"{'variant':<46} {'median s':>9} {'min s':>7} {'MiB/s':>7}")
    for key, rated in ROWS:
        rate = f"{size_mib / med[key]:7.0f}" if rated else ""
        print(f"{key:<46} {med[key]:9.2f} {min(samples[key]):7.2f} {rate:>7}")
    print(f"pull: phalanx / by hand (ssh torchrun + scp) = {med['pull phalanx'] / med['pull hand: ssh torchrun + scp']:.2f}")
    print(f"pull: phalanx / phalanx --shared-fs          = {med['pull phalanx'] / med['pull phalanx --shared-fs']:.2f}")
    print(f"transfer: mirror / scp (time)                = {med['transfer phalanx mirror'] / med['transfer scp -O']:.2f}")
    push = [a - b for a, b in zip(samples["push phalanx: first line, state of S MiB"],
                                  samples["pull phalanx: first line"])]
    print(f"push: first line, state of S MiB - empty     = {statistics.median(push):.2f} s (per round: "
          + ", ".join(f"{d:.2f}" for d in push) + ")")
    print(f"push: ship alone / scp to both hosts         = "
          f"{med['push SshBackend.ship of the state alone'] / med['push scp -O to both hosts (parallel)']:.2f}")


if __name__ == "__main__":
    main()
