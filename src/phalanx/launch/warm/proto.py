"""What the warm pool and its clients agree on: where pools live, which pool serves whom, and the
messages between them.

A pool serves one user, one interpreter (executable, prefix, version, flags) and one environment,
less the variables that differ from run to run by design (``RUN_VARIABLES``): torchrun's and
phalanx's per-process variables, which nothing reads when a module is imported, and what shells
and terminals set per session. Everything else in the environment may change what an import
does (``OMP_NUM_THREADS`` sizes OpenMP's pool when the library loads, ``PYTHONPATH`` decides what
is found), so it is part of the key: a different environment gets a different pool. So is the
cgroup (its memory and CPU limits): a job started under SLURM's cgroup, ``systemd-run`` or in a
container gets a pool started there, whose children are limited as a cold start would be. The key
only finds the pool; the pool compares interpreter, environment and placement itself.

Pools live in a private directory (0700, owned by the user, never a symlink): ``$PHALANX_WARM_DIR``,
else ``$XDG_RUNTIME_DIR/phalanx-warm``, else ``/tmp/phalanx-warm-<uid>``. Per pool:
``<key>.sock`` (the socket), ``<key>.log`` (the pool's notes, and every fallback to a cold start
with its reason) and ``<key>.lock`` (held by the live pool, handed to it by the client that
started it: one pool per environment).

Messages are a 4-byte big-endian length and a ``marshal``-encoded value (both ends run the same
interpreter; the pool reads nothing before it checked the caller's uid); a run request carries
the client's descriptors and working directory (SCM_RIGHTS).

Only C modules and ones the interpreter has already loaded: every warm start imports this, and
its cost is on every start.
"""

import _socket
import array
import marshal
import os
import stat
import struct
import sys
import time
import zlib

PROTOCOL = 2

# Set per process by torchrun or phalanx, or per trial by a sweep: they differ between the
# requests one pool serves. None of them is read when torch (or numpy) is imported.
RUN_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES", "TF_CONFIG",
    "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
    # Set by shells, terminals, ssh sessions and pytest per command or session:
    "PWD", "OLDPWD", "_", "SHLVL", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "TERM_SESSION_ID", "WINDOWID",
    "COLUMNS", "LINES", "PYTEST_CURRENT_TEST",
})
RUN_PREFIXES = ("PHALANX_", "SM_", "TORCHELASTIC_")

# Modules worth keeping imported in a pool when a script uses them (seconds to import).
PRELOADABLE = ("torch", "numpy")

LENGTH = struct.Struct("!I")
MAX_MESSAGE = 16 << 20
MAX_FDS = 253  # the kernel's SCM_MAX_FD


def is_run_variable(name: str) -> bool:
    return name in RUN_VARIABLES or name.startswith(RUN_PREFIXES)


def pool_environment(environ: "dict[str, str] | os._Environ[str]") -> "dict[str, str]":
    """The environment a pool runs (and imports) with: the caller's, less the per-run variables
    and the job's secrets (``PHALANX_SECRET_VARS`` names them): a pool outlives the job, and
    neither its environment nor its key may hold a value; each forked child gets its caller's."""
    secrets = set(environ.get("PHALANX_SECRET_VARS", "").split(","))
    return {k: v for k, v in environ.items() if not is_run_variable(k) and k not in secrets}


def interpreter() -> "dict[str, object]":
    """What makes two interpreters interchangeable for a pool (``-u`` is not among them: each
    child's standard streams are rebuilt from the request)."""
    return {
        "executable": sys.executable, "prefix": sys.prefix, "version": sys.version,
        "flags": list(sys.flags), "xoptions": sorted(map(str, sys._xoptions.items())),
        "warnoptions": list(sys.warnoptions),
    }


def pool_key(environ: "dict[str, str] | os._Environ[str]") -> str:
    """The pool of this user, interpreter, environment and cgroup: a process under a memory or CPU
    limit (SLURM's cgroup, ``systemd-run``, a container) finds a pool started under the same one,
    never one that would fork its children outside it (the pool checks: ``warm_checks.placement``)."""
    # Not marshal: its bytes depend on interning and reference counts, not only on the value.
    parts = [str(PROTOCOL), str(os.geteuid()), *sorted(map(str, interpreter().items())), _cgroup(),
             *(f"{k}={v}" for k, v in sorted(pool_environment(environ).items()))]
    identity = "\0".join(parts).encode("utf-8", "surrogateescape")
    return "%08x%08x%08x" % (zlib.crc32(identity), zlib.adler32(identity), zlib.crc32(identity, 0x9E3779B9))


def _cgroup() -> str:
    try:
        with open("/proc/self/cgroup") as fh:
            return fh.read()
    except OSError:
        return ""


def pool_dir(environ: "dict[str, str] | os._Environ[str]") -> str:
    if environ.get("PHALANX_WARM_DIR"):
        return environ["PHALANX_WARM_DIR"]
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "phalanx-warm")
    return f"/tmp/phalanx-warm-{os.geteuid()}"


def private_dir(path: str) -> "str | None":
    """Create ``path`` (0700) if needed; None when it is fit for sockets, else why not."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to uid {info.st_uid}, not to this user"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); it must be 0700"
    return None


def note(path: str, text: str) -> None:
    """Append one line to a pool's log; never fails the caller."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {text}\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def unix_socket() -> "_socket.socket":
    return _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)


def listen(path: str) -> "_socket.socket":
    """Bind under a temporary name, then rename over ``path``: a client never finds a socket that
    does not accept yet, and a dead pool's socket is replaced at once."""
    tmp = f"{path}.{os.getpid()}.tmp"
    sock = unix_socket()
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    sock.bind(tmp)
    os.chmod(tmp, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    os.replace(tmp, path)
    return sock


def peer_uid(conn: "_socket.socket") -> int:
    return peer(conn)[1]


def peer(conn: "_socket.socket") -> "tuple[int, int, int]":
    """(pid, uid, gid) of the process at the other end, as the kernel saw it connect."""
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return int(pid), int(uid), int(gid)


class Channel:
    """Length-prefixed ``marshal`` messages over a Unix stream socket, with file descriptors."""

    def __init__(self, sock: "_socket.socket") -> None:
        self.sock = sock
        self._buf = b""
        self._fds: "list[int]" = []

    def send(self, message: object, fds: "list[int] | tuple[int, ...]" = ()) -> None:
        data = marshal.dumps(message, 4)  # type: ignore[arg-type]
        frame = LENGTH.pack(len(data)) + data
        if fds:
            sent = self.sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            sent = self.sock.send(frame)
        if sent < len(frame):
            self.sock.sendall(frame[sent:])

    def receive(self) -> "tuple[object, list[int]] | None":
        """The next message and the descriptors that came with it; None at end of stream."""
        while True:
            if len(self._buf) >= LENGTH.size:
                (size,) = LENGTH.unpack_from(self._buf)
                if size > MAX_MESSAGE:
                    raise ValueError(f"message of {size} bytes")
                if len(self._buf) >= LENGTH.size + size:
                    data = self._buf[LENGTH.size:LENGTH.size + size]
                    self._buf = self._buf[LENGTH.size + size:]
                    fds, self._fds = self._fds, []
                    return marshal.loads(data), fds
            chunk, ancillary, _flags, _addr = self.sock.recvmsg(1 << 16, _socket.CMSG_SPACE(MAX_FDS * 4))
            for level, kind, payload in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    given = array.array("i")
                    given.frombytes(payload[: len(payload) - len(payload) % given.itemsize])
                    self._fds.extend(given)
            if not chunk:
                for fd in self._fds:
                    os.close(fd)
                return None
            self._buf += chunk
