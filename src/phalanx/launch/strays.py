"""What a rank leaves running when it ends (its *strays*): found and ended with its attempt.

"No orphans" covers every process a rank started, however it left: a double-forked daemon, a
child in a session or process group of its own (``setsid``, ``start_new_session``), a grandchild
whose parent died. Process groups and ``PR_SET_PDEATHSIG`` reach none of those, so each rank is
also *marked* in a way its descendants cannot shed by forking:

- **a cgroup of its own**, where this machine has a cgroup v2 hierarchy that this user may write
  (the cgroup the rank starts in, typically the user's session or service, or a container's own):
  before the script runs, the bootstrap moves itself into ``<that cgroup>/phalanx-<job>.<attempt>.<rank>``
  (:func:`enlist`). Everything the script starts stays in it, whatever it does; it is ended with
  ``cgroup.kill`` and removed. Resource limits of the cgroup above still apply: the rank's cgroup is
  inside it.
- **otherwise, its environment**: the bootstrap sets ``PHALANX_METRICS_FILE`` to the rank's own file,
  and every process the script starts inherits it; ``/proc/PID/environ`` names the rank. A process
  that was started with a new environment of its own escapes this (``env -i``); only a cgroup
  catches that. ``PHALANX_RANK_CGROUPS=0`` turns cgroups off (this fallback only).

When the ranks of a node have ended (on their own, failed, or stopped), whoever started them (the
node agent, or the supervisor for a lone process) ends what is left (:class:`Ending`): what has not
exited on its own within a moment gets SIGTERM, the job's grace period, then SIGKILL, and the node's
``result.json`` lists every process that had to be ended (``contracts.Stray``; ``phalanx status``
shows them).

The bootstrap imports this module: only ``os`` at import time.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # mypy reads this as True; workers start without importing typing
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ..core.contracts import Stray

OFF_ENV = "PHALANX_RANK_CGROUPS"  # "0": no cgroups, the environment only
COOKIE = "PHALANX_METRICS_FILE"  # set by the bootstrap to a file in the rank's directory
COOKIE_FILE = "user_metrics.jsonl"
PREFIX = "phalanx-"
SETTLE_S = 0.5  # what is exiting already (a worker's helpers ending with it) is not a stray
POLL_S = 0.05


def leaf_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{PREFIX}{job_id}.{attempt}.{rank}"


def cgroup_dir() -> str | None:
    """This process's own cgroup v2 directory, when processes may be moved into cgroups made
    in it; else None (no cgroup v2, read-only, another user's, or turned off)."""
    if os.environ.get(OFF_ENV) == "0":
        return None
    try:
        with open("/proc/self/cgroup", "rb") as fh:
            cgroup = fh.read().decode("utf-8", "surrogateescape")
        with open("/proc/self/mountinfo", "rb") as fh:
            mounts = fh.read().decode("utf-8", "surrogateescape")
    except OSError:
        return None
    directory = locate(cgroup, mounts)
    if directory and os.access(directory, os.W_OK) and os.access(os.path.join(directory, "cgroup.procs"), os.W_OK):
        return directory
    return None


def locate(cgroup: str, mountinfo: str) -> str | None:
    """Where the cgroup v2 line of ``/proc/self/cgroup`` (``0::PATH``) is mounted, given
    ``/proc/self/mountinfo``: a cgroup2 mount whose root holds PATH (a container's or a cgroup
    namespace's mount shows a subtree). None without a cgroup v2 line or mount."""
    path = next((line[3:] for line in cgroup.splitlines() if line.startswith("0::")), None)
    if path is None or path.endswith(" (deleted)"):
        return None
    for mount in mountinfo.splitlines():
        before, _, after = mount.partition(" - ")
        fields = before.split()
        if not after.startswith("cgroup2 ") or len(fields) < 5:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if root == "/":
            return point.rstrip("/") + path
        if (path + "/").startswith(root.rstrip("/") + "/"):
            return point.rstrip("/") + path[len(root.rstrip("/")):]
    return None


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash as octal escapes (``\\040``)."""
    if "\\" not in field:
        return field
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def enlist() -> None:
    """Move this process (a rank's bootstrap, before the script runs) into a cgroup of its own,
    named after the job, attempt and rank (``RANK``, 0 for a lone process). Nothing when there
    is no writable cgroup v2 here: the environment marks the rank then."""
    job, attempt = os.environ.get("PHALANX_JOB_ID"), os.environ.get("PHALANX_ATTEMPT", "")
    directory = cgroup_dir() if job and attempt.isdigit() else None
    if directory is None or job is None:
        return
    leaf = os.path.join(directory, leaf_name(job, int(attempt), int(os.environ.get("RANK", "0") or 0)))
    for _ in range(2):  # an empty leaf may be swept away between mkdir and the move (``sweep``): again
        try:
            os.mkdir(leaf)
        except FileExistsError:  # torchrun restarted this rank in place: its first run's strays are there too
            pass
        except OSError:
            return
        try:
            fd = os.open(os.path.join(leaf, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
            return
        except FileNotFoundError:
            continue
        except OSError:  # a hierarchy that takes no process here (controllers enabled): the environment then
            _remove(leaf)
            return


def sweep(directory: str) -> None:
    """Remove every empty rank cgroup in ``directory``: those of attempts whose agent and
    supervisor were killed before they could (a cgroup holding a process cannot be removed)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        _remove(os.path.join(directory, name))


class Ending:
    """The strays of some ranks, being ended. Non-blocking: ``poll`` until it returns what had
    to be ended; ``kill_now`` skips what is left of the grace period.

    ``rank_dirs``: each rank's directory as this machine sees it (ranks that ran here);
    ``sessions``: each rank's own pid, which leads its session and process group (to say how a
    stray left them). ``exclude``: pids that are not strays whatever they carry."""

    def __init__(self, job_id: str, attempt: int, rank_dirs: Mapping[int, str], grace: float,
                 sessions: Mapping[int, int] | None = None, exclude: Iterable[int] = ()) -> None:
        import time

        self.grace = grace
        self.sessions = dict(sessions or {})
        self.exclude = {os.getpid(), *exclude}
        self.directory = directory = cgroup_dir()
        leaves = {r: os.path.join(directory, leaf_name(job_id, attempt, r)) for r in rank_dirs} if directory else {}
        self.leaves = {r: path for r, path in leaves.items() if os.path.isdir(path)}
        # Ranks without a cgroup of their own are found by their environment.
        self.cookies = {os.path.join(d, COOKIE_FILE).encode("utf-8", "surrogateescape"): r
                        for r, d in rank_dirs.items() if r not in self.leaves}
        self.settle_until = time.monotonic() + SETTLE_S
        self.kill_at: float | None = None
        self.found: dict[tuple[int, int], Stray] = {}  # (pid, start time) -> what it was
        self.result: list[Stray] | None = None
        if not self._members():
            self._finish()

    def _members(self, scan: bool = True) -> dict[tuple[int, int], int]:
        """The strays alive now: (pid, start time) -> rank. Without ``scan``, of those found by
        their environment only the ones known already (reading every process's environment
        each time the grace period is polled would cost more than it finds)."""
        alive: dict[tuple[int, int], int] = {}
        for rank, leaf in self.leaves.items():
            for pid in _cgroup_pids(leaf):
                start = _start_time(pid)
                if start is not None and pid not in self.exclude:
                    alive[(pid, start)] = rank
        if self.cookies and scan:
            for pid, start, rank in _marked(self.cookies, self.exclude):
                alive[(pid, start)] = rank
        elif self.cookies:
            alive.update({key: s.rank for key, s in self.found.items() if _start_time(key[0]) == key[1]})
        return alive

    def poll(self) -> list[Stray] | None:
        """What had to be ended, once nothing is left; None while waiting."""
        import signal
        import time

        if self.result is not None:
            return self.result
        now = time.monotonic()
        alive = self._members(scan=self.kill_at is None)
        if not alive and self.kill_at is not None and self.cookies and self._members():
            self.kill_now()  # a last look at every process found what a stray started meanwhile
        elif not alive:
            self._finish()
        elif self.kill_at is None and now >= self.settle_until:
            for key, rank in alive.items():  # what outlived its rank by a moment: a stray
                self.found[key] = _describe(key[0], rank, self.sessions.get(rank))
                _signal(key, signal.SIGTERM)
            self.kill_at = now + self.grace
        elif self.kill_at is not None and now >= self.kill_at:
            self.kill_now()
        return self.result

    def wait_hint(self) -> float:
        import time

        if self.result is not None:
            return 0.0
        return POLL_S if self.kill_at is None else max(0.0, min(POLL_S * 4, self.kill_at - time.monotonic()))

    def kill_now(self) -> list[Stray]:
        """SIGKILL to every stray left; returns what had to be ended."""
        import signal
        import time
        from dataclasses import replace

        if self.result is not None:
            return self.result
        deadline = time.monotonic() + 10.0
        while (alive := self._members()) and time.monotonic() < deadline:
            for key, rank in alive.items():
                self.found[key] = replace(self.found.get(key) or _describe(key[0], rank, self.sessions.get(rank)), killed=True)
            for leaf in self.leaves.values():
                _write(os.path.join(leaf, "cgroup.kill"), b"1")  # the whole cgroup at once (Linux 5.14+)
            for key in alive:
                _signal(key, signal.SIGKILL)
            time.sleep(POLL_S)
        self._finish()
        assert self.result is not None
        return self.result

    def _finish(self) -> None:
        if self.directory is not None:
            sweep(self.directory)  # this attempt's cgroups, and any empty ones earlier attempts left
        self.result = [stray for _key, stray in sorted(self.found.items())]


def end(job_id: str, attempt: int, rank_dirs: Mapping[int, str], grace: float,
        sessions: Mapping[int, int] | None = None) -> list[Stray]:
    """``Ending``, waited for (blocking, at most ``grace`` + a moment)."""
    import time

    ending = Ending(job_id, attempt, rank_dirs, grace, sessions)
    while (done := ending.poll()) is None:
        time.sleep(ending.wait_hint())
    return done


def sessions(procs: Mapping[int, Mapping[str, object]]) -> dict[int, int]:
    """Each rank's session (its own pid, ``proc.json``): a rank leads its session and group."""
    found = {}
    for rank, proc in procs.items():
        pid = proc.get("pid")
        if isinstance(pid, int):
            found[rank] = pid
    return found


def _cgroup_pids(leaf: str) -> list[int]:
    """Every process in ``leaf`` and the cgroups below it (a job started inside a rank)."""
    pids: list[int] = []
    for top, dirs, _files in os.walk(leaf):
        try:
            with open(os.path.join(top, "cgroup.procs"), "rb") as fh:
                pids += [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            continue
        dirs.sort()
    return pids


def _marked(cookies: Mapping[bytes, int], exclude: set[int]) -> list[tuple[int, int, int]]:
    """(pid, start time, rank) of every process whose environment names one of the ranks."""
    found = []
    uid = os.geteuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            if uid != 0 and os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        at = environ.find(COOKIE.encode() + b"=")
        if at < 0 or (at and environ[at - 1] != 0):
            continue
        value = environ[at + len(COOKIE) + 1:].split(b"\0", 1)[0]
        rank = cookies.get(value)
        start = _start_time(int(name)) if rank is not None else None
        if rank is not None and start is not None:
            found.append((int(name), start, rank))
    return found


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, a process's identity. None
    when it is gone or a zombie (ended; only its parent's wait is missing)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _signal(key: tuple[int, int], signum: int) -> None:
    pid, start = key
    if _start_time(pid) != start:  # gone, or its pid is someone else's now
        return
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _describe(pid: int, rank: int, session: int | None) -> Stray:
    """What ``pid`` runs, and how it left its rank: a session of its own (``setsid``, a double
    fork), or a process group of its own. ``session``: the rank's (its pid)."""
    from ..core.contracts import Stray

    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = [w.decode("utf-8", "backslashreplace") for w in fh.read().split(b"\0") if w]
    except OSError:
        words = []
    if words:
        words[0] = os.path.basename(words[0])
    command = " ".join(words) or "?"
    how = None
    try:
        sid, pgid = os.getsid(pid), os.getpgid(pid)
        if session is not None:
            how = "setsid" if sid != session else "own process group" if pgid != session else None
        else:  # the rank's pid is not known: say what the process leads itself
            how = "setsid" if sid == pid else "own process group" if pgid == pid else None
    except OSError:
        pass
    return Stray(rank, pid, command if len(command) <= 80 else command[:77] + "...", how)


def _write(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, data)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(leaf: str) -> None:
    """Remove ``leaf`` and any cgroup below it, deepest first; one still holding a process stays."""
    for top, _dirs, _files in sorted(os.walk(leaf), key=lambda entry: -len(entry[0])):
        try:
            os.rmdir(top)
        except OSError:
            pass
