"""What the warm pool checks before it forks: that a child would be a faithful copy of a cold
start (no thread or descriptor left by an import, CUDA not initialised, limits it can grant, no
module next to the script shadowing one it holds), placed where the cold start would be (the
client's cgroup, namespaces, credentials: ``placement``), and that nothing it imported changed on
disk since (``Changes``: inotify on the directories of its modules, else their mtimes and sizes)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import struct
import sys
import time
from typing import Any, Callable

# inotify(7): what makes a watched module file or path directory count as changed
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x8, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x100, 0x200, 0x400, 0x800, 0x4000, 0x8000
WATCHED = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
           | IN_DELETE_SELF | IN_MOVE_SELF)
EVENT = struct.Struct("iIII")


class Changes:
    """Whether a module file the pool imported, or a directory on its sys.path, changed since:
    then a child would run code other than what a cold start would import now.

    Uses inotify on the directories holding them (one read per request); where inotify is not
    available (or runs out of watches) it compares every file's mtime and size instead."""

    def __init__(self, modules: list[Any]) -> None:
        self.files = fingerprint(modules)
        self.path_dirs = {p for p in sys.path[1:] if p and os.path.isdir(p)}
        self.names: dict[str, set[str]] = {}
        for path, _mtime, _size in self.files:
            self.names.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
        self.fd: int | None = None
        self.dirs: dict[int, str] = {}
        self._watch()
        self.why = self._compare()  # what changed before the watches were in place

    def _watch(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            for directory in sorted(set(self.names) | self.path_dirs):
                wd = libc.inotify_add_watch(fd, os.fsencode(directory), WATCHED)
                if wd < 0:
                    os.close(fd)
                    self.dirs.clear()
                    return
                self.dirs[wd] = directory
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = None

    def changed(self) -> str | None:
        """What changed (a path), or None. Once something changed, it stays changed."""
        if self.why is None:
            self.why = self._events() if self.fd is not None else self._compare()
        return self.why

    def _events(self) -> str | None:
        assert self.fd is not None
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return None
        while data:
            wd, mask, _cookie, size = EVENT.unpack_from(data)
            name = data[EVENT.size:EVENT.size + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            data = data[EVENT.size + size:]
            directory = self.dirs.get(wd, "?")
            if mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                return directory
            if name in self.names.get(directory, ()) or (directory in self.path_dirs and _importable(name, mask)):
                return os.path.join(directory, name)
        return None

    def _compare(self) -> str | None:
        for path, mtime, size in self.files:
            try:
                info = os.stat(path)
            except OSError:
                return path
            if info.st_mtime_ns != mtime or info.st_size != size:
                return path
        return None


def _importable(name: str, mask: int) -> bool:
    """An entry that appeared in, or left, a sys.path directory and could change what an import
    finds there (a module, a package, a .pth file, an installed distribution's metadata)."""
    entry = mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)
    suffixes = (".py", ".pyc", ".so", ".pth", ".dist-info", ".egg-info", ".egg-link")
    return bool(entry) and not name.startswith(".") and ("." not in name or name.endswith(suffixes))


def descriptors() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
            found.add(int(name))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return found


def foreign(fds: set[int]) -> str | None:
    """A descriptor an import opened and kept: a child would close it under the module's feet."""
    for fd in sorted(fds):
        try:
            what = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            what = "?"
        return f"descriptor {fd} ({what}) left open by an import"
    return None


def cuda(hidden: dict[str, Any] | None = None) -> str | None:
    cuda = (hidden or {}).get("torch.cuda") or sys.modules.get("torch.cuda")
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "CUDA is initialised in the pool"
    return None


def limits(wanted: dict[str, list[int]]) -> str | None:
    def value(limit: int) -> float:
        return float("inf") if limit == resource.RLIM_INFINITY else float(limit)

    for name, (_soft, hard) in wanted.items():
        current = resource.getrlimit(getattr(resource, name))
        if value(hard) > value(current[1]) and os.geteuid() != 0:
            return f"{name} hard limit {hard} is above the pool's {current[1]}"
    return None


def request(request: dict[str, Any], fds: list[int], interpreter: dict[str, object], baseline: tuple[str, ...],
            environment: dict[str, str]) -> str | None:
    """Why the client's cold start differs from what the pool can fork (another protocol,
    interpreter, start-up, environment, placement, ``sys.path``), or None."""
    from . import proto as warm_proto

    if request.get("protocol") != warm_proto.PROTOCOL:
        return "the client speaks another protocol"
    if request.get("interpreter") != interpreter:
        return "another interpreter (executable, version or flags)"
    started = request.get("baseline", [])
    if list(baseline[: len(started)]) != started:
        return "the interpreter starts with other modules (site, .pth files)"
    if warm_proto.pool_environment(dict(request["env"])) != environment:
        return "another environment"
    placed = placement(int(request.get("peer", 0)))
    if placed:
        return placed
    if request["path"][1:] != sys.path[1:]:
        return "another sys.path"
    if len(fds) != len(request["fd_numbers"]) + 1:
        return "descriptors missing from the request"
    if not request["session_leader"]:
        return "the client does not lead a session of its own (a child could not be placed like it)"
    return None


# Lines of /proc/PID/status a forked child takes from the pool, not from its client: the
# credentials, what the kernel lets it do, and where it may run.
PLACEMENT = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
             "Seccomp_filters", "Cpus_allowed_list", "Mems_allowed_list")
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")


def placement(client: int) -> str | None:
    """Why a child forked here would not be placed where the client's cold start would be:
    another cgroup (a memory or CPU limit the client is under: SLURM's, ``systemd-run``'s, a
    container's), another namespace, other credentials, capabilities, seccomp filter, CPU or
    memory-node set, or priority. Resource limits (rlimits) are the client's own: the child sets
    them (``limits``). ``client``: its pid as the kernel gave it (``SO_PEERCRED``)."""
    if client <= 0:
        return "the client's process is not visible from the pool (another pid namespace)"
    try:
        if _read(f"/proc/{client}/cgroup") != _read("/proc/self/cgroup"):
            return "the client is in another cgroup (its resource limits would not hold in the pool's)"
        for name in NAMESPACES:
            try:
                theirs = os.readlink(f"/proc/{client}/ns/{name}")
            except FileNotFoundError:  # a namespace this kernel does not have
                continue
            if theirs != os.readlink(f"/proc/self/ns/{name}"):
                return f"the client is in another {name} namespace"
        theirs_status, mine_status = _status(client), _status("self")
        for key in PLACEMENT:
            if theirs_status.get(key) != mine_status.get(key):
                return f"the client differs from the pool in {key} (/proc/PID/status)"
        if _priority(client) != _priority("self"):
            return "the client runs at another priority (nice, scheduling policy)"
    except OSError as exc:
        return f"the client's placement cannot be read ({exc.strerror})"
    return None


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _status(pid: int | str) -> dict[str, str]:
    lines = (line.partition(":") for line in _read(f"/proc/{pid}/status").splitlines())
    return {key: value.strip() for key, _, value in lines}


def _priority(pid: int | str) -> tuple[str, str]:
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    return fields[16], fields[38]  # nice (field 19), policy (field 41)


def shadowed(dirs: list[str], held: set[str], baseline: set[str]) -> str | None:
    """A module or package in the script's directory (or the working directory) named like a
    top-level module the pool holds: a cold start would import that one instead."""
    tops = {name for name in held if "." not in name} - baseline
    for directory in dirs:
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                name = entry.name.partition(".")[0]
                if name not in tops:
                    continue
                if entry.name.endswith((".py", ".pyc", ".so")) or os.path.exists(os.path.join(entry.path, "__init__.py")):
                    return f"{entry.path} would shadow the pool's {name}"
    return None


def fingerprint(modules: list[Any]) -> list[tuple[str, int, int]]:
    """Every module file of ``modules`` and every directory on sys.path, with mtime and size."""
    paths: set[str] = {getattr(m, "__file__") for m in modules if isinstance(getattr(m, "__file__", None), str)}
    paths.update(p for p in sys.path[1:] if p)
    files = []
    for path in sorted(paths):
        try:
            info = os.stat(path)
        except OSError:
            continue
        files.append((str(path), info.st_mtime_ns, info.st_size))
    return files


def memory() -> dict[str, int]:
    """The pool's own resident and proportional set sizes, in bytes."""
    sizes = {}
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                    sizes[key.lower()] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return sizes




def settle() -> None:
    """Fork once and let the child exit at once: libraries that keep worker threads stop them
    before a fork (OpenBLAS, through pthread_atfork) and start them again only when used."""
    fork_and_wait(lambda: None)


def threads() -> str | None:
    """Why the pool cannot fork now: a thread besides the main one (a child gets only the forking one)."""
    count = len(os.listdir("/proc/self/task"))
    return f"{count - 1} thread(s) running in the pool" if count > 1 else None


def command_lines_shown(show_as: Callable[[list[str], list[list[str]]], None]) -> str | None:
    """Whether a child can show its own command line and environment in /proc (``show_as`` tried
    in a throwaway child, once the pool runs no thread: a child of a threaded process must not do
    more than exit)."""
    if fork_and_wait(lambda: show_as(sys.orig_argv, [[k, v] for k, v in os.environ.items()])):
        return None
    return "the kernel does not let a child show its own command line (PR_SET_MM_MAP)"


def fork_and_wait(work: Callable[[], object], timeout: float = 30.0) -> bool:
    """Run ``work`` in a throwaway child; whether it exited 0 in time (else it is killed)."""
    pid = os.fork()
    if pid == 0:
        try:
            work()
            os._exit(0)
        finally:
            os._exit(1)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status == 0
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.005)


class Allocation:
    """The process of a SLURM allocation (``slurmstepd``, ``salloc``) a pool must not outlive,
    given as PID:START (its start time, so that a reused pid is not taken for it): ``fd`` is a
    pidfd, readable once that process has exited; None when it is gone already."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    @classmethod
    def of(cls, given: str) -> "Allocation":
        pid, _, start = given.partition(":")
        try:
            fd = os.pidfd_open(int(pid))
        except (OSError, ValueError):
            return cls(None)
        try:  # checked after the pidfd is open: it holds that very process
            with open(f"/proc/{int(pid)}/stat", "rb") as fh:
                same = int(fh.read().rsplit(b")", 1)[1].split()[19]) == int(start)
        except (OSError, IndexError, ValueError):
            same = False
        if not same:
            os.close(fd)
            return cls(None)
        return cls(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
