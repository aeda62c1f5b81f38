"""A stateful fake of the OpenSSH client behind ``backends.commands`` (``run``, ``pipe``, ``link``).

Each fake host is a directory that is its home (``~``); a command "run on the host" runs here,
with ``HOME`` set to that directory, so a job's nodes really start (the real remote end, the
real agent, real worker processes) and each host keeps its own files, as hosts without a
shared filesystem do. A host can be unreachable, lack phalanx, have another torch, have the
rendezvous port taken, and lose its link mid-job (``cut``). ``ssh -G`` answers with output
recorded from OpenSSH 9.2p1 (Debian 12), the host's address filled in; the unreachable host's
error is what that ssh printed for a refused connection.

Only what the fake cannot do is faked: there is no network, no sshd, no authentication. The
cluster tier (``tests/cluster/test_ssh*.py``) runs the same backend against a real sshd.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

RECORDED = Path(__file__).parent / "recorded"
REFUSED = "ssh: connect to host {address} port 22: Connection refused\r\n"  # OpenSSH 9.2p1, exit status 255


@dataclass
class FakeHost:
    name: str
    address: str
    home: Path
    reachable: bool = True
    phalanx: bool = True
    torch: str | None = "same"  # "same": this machine's version
    port_busy: bool = False


class FakeSsh:
    def __init__(self, root: Path, names: Sequence[str]) -> None:
        self.hosts = {}
        for i, name in enumerate(names):
            home = root / "hosts" / name
            home.mkdir(parents=True)
            self.hosts[name] = FakeHost(name, f"10.0.0.{i + 1}", home)
        self.calls: list[list[str]] = []
        self.links: dict[str, list[subprocess.Popen[bytes]]] = {name: [] for name in names}

    def install(self, monkeypatch) -> "FakeSsh":
        from phalanx.backends import commands

        monkeypatch.setattr(commands, "run", self.run)
        monkeypatch.setattr(commands, "pipe", self.pipe)
        monkeypatch.setattr(commands, "link", self.link)
        return self

    def calls_to(self, what: str) -> list[list[str]]:
        """Calls whose remote command (or ssh option) contains ``what``."""
        return [c for c in self.calls if any(what in word for word in c)]

    # -- parsing an ssh command line ---------------------------------------------------------

    @staticmethod
    def parse(argv: Sequence[str]) -> tuple[dict[str, str], str, str]:
        """(options, host, remote command) of ``ssh [-o K=V]... [-F FILE] [-G] HOST [COMMAND...]``."""
        assert argv[0] == "ssh", argv
        opts: dict[str, str] = {}
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            flag = argv[i]
            if flag in ("-o", "-F"):
                key, _, value = argv[i + 1].partition("=") if flag == "-o" else ("-F", "", argv[i + 1])
                opts[key] = value
                i += 2
            else:
                opts[flag] = ""
                i += 1
        return opts, argv[i], " ".join(argv[i + 1:])

    def _host(self, name: str) -> FakeHost:
        if name not in self.hosts:
            raise AssertionError(f"the test has no fake host {name!r}")
        return self.hosts[name]

    def _env(self, host: FakeHost) -> dict[str, str]:
        return {**os.environ, "HOME": str(host.home)}

    # -- the seam ---------------------------------------------------------------------------

    def run(self, argv, env=None, timeout: float = 60.0) -> subprocess.CompletedProcess:
        argv = list(argv)
        self.calls.append(argv)
        opts, name, command = self.parse(argv)
        host = self._host(name)
        if "-G" in opts:  # ssh -G: the configuration ssh would use, nothing is contacted
            text = (RECORDED / "ssh-G.txt").read_text()
            text = text.replace("host gpu1\n", f"host {name}\n").replace("hostname 10.1.0.7\n", f"hostname {host.address}\n")
            return subprocess.CompletedProcess(argv, 0, text, "")
        if not host.reachable:
            return subprocess.CompletedProcess(argv, 255, "", REFUSED.format(address=host.address))
        proc = subprocess.run(["bash", "-c", command], env=self._env(host), cwd=host.home, capture_output=True,
                              text=True, timeout=timeout)
        if "importlib.metadata as md" in command and proc.returncode == 0:  # the preflight: this host's software
            info = json.loads(proc.stdout.strip().splitlines()[-1])
            info["phalanx"] = info["phalanx"] and host.phalanx
            if host.torch != "same":
                info["torch"] = host.torch
            if host.port_busy and "port_free" in info:
                info["port_free"] = False
            return subprocess.CompletedProcess(argv, 0, json.dumps(info) + "\n", proc.stderr)
        return subprocess.CompletedProcess(argv, proc.returncode, proc.stdout, proc.stderr)

    def pipe(self, source, sink, timeout: float = 600.0) -> subprocess.CompletedProcess:
        sink = list(sink)
        self.calls.append(sink)
        opts, name, command = self.parse(sink)
        host = self._host(name)
        if not host.reachable:
            return subprocess.CompletedProcess(sink, 255, "", REFUSED.format(address=host.address))
        src = subprocess.Popen(list(source), stdout=subprocess.PIPE) if source else None
        proc = subprocess.run(["bash", "-c", command], stdin=src.stdout if src else subprocess.DEVNULL,
                              env=self._env(host), cwd=host.home, capture_output=True, text=True, timeout=timeout)
        if src is not None:
            assert src.stdout is not None
            src.stdout.close()
            src.wait()
        return subprocess.CompletedProcess(sink, proc.returncode, "", proc.stderr)

    def link(self, argv, log: Path) -> subprocess.Popen[bytes]:
        argv = list(argv)
        self.calls.append(argv)
        opts, name, command = self.parse(argv)
        host = self._host(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:
            if not host.reachable:
                proc = subprocess.Popen(["bash", "-c", f"printf %s {json.dumps(REFUSED.format(address=host.address))} >&2; "
                                         "exit 255"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
            else:
                proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                        env=self._env(host), cwd=host.home, start_new_session=True)
        self.links[name].append(proc)
        return proc

    def cut(self, name: str) -> None:
        """The host's link breaks: its session ends at once, without a word."""
        for proc in self.links[name]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """Nothing the fake started may outlive the test."""
        for procs in self.links.values():
            for proc in procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                proc.wait()
