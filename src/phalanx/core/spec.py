"""JobSpec and its parts: immutable descriptions of what to run, parsed from CLI or job file.

A spec says *what* runs (entrypoint, topology, framework, environment); it never says
*where* (ports, hosts, directories): that is the plan's business.
"""

from __future__ import annotations

import re
from collections import abc
from dataclasses import dataclass, field, fields, is_dataclass, replace
from enum import Enum
from types import UnionType
from typing import Any, Mapping, Union, get_args, get_origin, get_type_hints

from ..errors import UsageError

# The script's arguments (merging a job file's with the command line's, placeholders): arguments.py.
from .arguments import TEMPLATE_KEYS, has_template, merge_args, render_template  # noqa: F401  (long-standing paths)


class EntrypointKind(str, Enum):
    SCRIPT = "script"  # a Python file, run like `python FILE`
    MODULE = "module"  # a Python module, run like `python -m MODULE`
    COMMAND = "command"  # any executable, run as is


class Framework(str, Enum):
    TORCH = "torch"
    TF = "tf"
    JAX = "jax"


class Spawn(str, Enum):
    """Who starts the processes of a node.

    AUTO: torchrun starts ``nproc_per_node`` workers (PyTorch), or phalanx starts them
    directly when there is a single process or the framework is TF/JAX.
    SELF: phalanx starts one process per node; the script spawns its own workers and connects
    them itself: phalanx initializes nothing in it (no ``jax.distributed.initialize``).
    """

    AUTO = "auto"
    SELF = "self"


@dataclass(frozen=True)
class Entrypoint:
    kind: EntrypointKind
    target: str  # a script's resolved absolute path, a module's name, or a command
    args: tuple[str, ...] = ()
    # A script as the user typed it, relative to the working directory (or absolute): what
    # python puts in sys.argv[0] and derives __file__ from. Empty: ``target``.
    typed: str = ""

    def display(self) -> str:
        """The command line as typed; a word with bytes that are not UTF-8 as bash's ``$'...'``."""
        from .rawtext import shell_join

        head = {"script": [self.target], "module": ["-m", self.target], "command": [self.target]}
        return shell_join([*head[self.kind.value], *self.args])


@dataclass(frozen=True)
class Resources:
    nnodes: int = 1  # with an elastic range (min_nodes set): the most nodes
    nproc_per_node: int = 1
    # The user gave a topology (-n, --nnodes, --nproc-per-node, or the job file's n, nnodes,
    # nproc_per_node). Without one a job is one process run like python; an explicit -n 1 is
    # torchrun with one process. How a topology was given is not part of what it is: not compared.
    explicit: bool = field(default=False, compare=False)
    min_nodes: int | None = None  # elastic: start with at least this many nodes (torchrun --nnodes MIN:MAX)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes != self.nnodes

    def display(self) -> str:
        nodes = f"{self.min_nodes}:{self.nnodes}" if self.elastic else str(self.nnodes)
        return f"{nodes}x{self.nproc_per_node}"


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's rendezvous settings as the user typed them (``--node-rank``, ``--master-addr``,
    ``--master-port``, ``--rdzv-*``): this machine runs one node of a job whose other nodes are
    started by hand on the other machines, as with torchrun. None: not given (torchrun's default)."""

    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    backend: str | None = None
    endpoint: str | None = None
    id: str | None = None
    conf: str | None = None

    def torchrun_args(self) -> tuple[str, ...]:
        """The given settings, in torchrun's spelling."""
        given = [("--node-rank", self.node_rank), ("--master-addr", self.master_addr),
                 ("--master-port", self.master_port), ("--rdzv-backend", self.backend),
                 ("--rdzv-endpoint", self.endpoint), ("--rdzv-id", self.id), ("--rdzv-conf", self.conf)]
        return tuple(f"{flag}={value}" for flag, value in given if value is not None)


_TOPOLOGY = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(\d+)\s*$")


def parse_topology(text: str) -> Resources:
    """``"4"`` -> 1 node x 4 processes; ``"2x4"`` -> 2 nodes x 4 processes."""
    from .grammar import topology
    from .optiontypes import BadValue

    try:
        nnodes, nproc = topology(text or "")
    except BadValue as exc:
        raise UsageError(f"invalid -n '{text}'", f"use {exc.expected}") from None
    return Resources(nnodes=nnodes, nproc_per_node=nproc, explicit=True)


@dataclass(frozen=True)
class MetricDef:
    """A named regular expression over each rank's output; group 1 is the value."""

    name: str
    regex: str


def parse_metric(text: str) -> MetricDef:
    """``loss=REGEX`` (the --metric syntax) -> MetricDef; the regex must compile with one group."""
    name, sep, regex = text.partition("=")
    if not sep or not name.strip() or not regex:
        raise UsageError(f"invalid --metric '{text}'", "use NAME=REGEX, e.g. --metric 'loss=loss=([0-9.eE+-]+)'")
    try:
        groups = re.compile(regex).groups
    except re.error as exc:
        raise UsageError(f"invalid regular expression for metric '{name}': {exc}", "fix the pattern") from None
    if groups < 1:
        raise UsageError(f"metric '{name}' has no capture group", "put the number in parentheses, e.g. loss=([0-9.]+)")
    return MetricDef(name.strip(), regex)


ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")
_CHANNEL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Channel:
    """An input channel: data the job reads, staged to a local directory before it starts.

    ``uri`` is what the user wrote (a path, ``s3://...``, ``job:prep``); ``source`` is where
    the bytes are: an absolute local path (used in place) or a remote URI (downloaded to a
    cache directory). A ``job:`` reference is resolved into ``source`` once, at submit time,
    so retries and resumes read the same data.
    """

    name: str
    uri: str
    source: str = ""
    extract: bool = False  # unpack an archive (.tar, .tar.gz, .zip) on arrival

    @property
    def env_name(self) -> str:
        return channel_env_name(self.name)

    @property
    def is_remote(self) -> bool:
        return "://" in self.source


def channel_env_name(name: str) -> str:
    """``train-a`` -> ``TRAIN_A`` (as in ``PHALANX_CHANNEL_TRAIN_A``)."""
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def parse_channel(text: str) -> Channel:
    """``NAME=URI`` or ``NAME=URI#extract`` (the --input syntax) -> Channel (``source`` unresolved)."""
    name, sep, uri = text.partition("=")
    name = name.strip()
    if not sep or not uri:
        raise UsageError(f"invalid --input '{text}'", "use NAME=URI, e.g. --input train=s3://bucket/train")
    if not _CHANNEL_NAME.match(name):
        raise UsageError(f"invalid input name '{name}'", "use letters, digits, - and _, starting with a letter")
    extract = uri.endswith("#extract")
    if extract:
        uri = uri[: -len("#extract")]
        if not uri.lower().endswith(ARCHIVE_SUFFIXES):
            raise UsageError(
                f"input '{name}': '{uri}' is not an archive that #extract can unpack",
                f"give a file ending in {', '.join(ARCHIVE_SUFFIXES)}, or drop #extract",
            )
    return Channel(name, uri, extract=extract)


# Failures that another attempt cannot fix: retrying them only burns time.
DEFAULT_NO_RETRY = (
    r"CUDA out of memory",
    r"OutOfMemoryError",
    r"error: unrecognized arguments",
    r"ModuleNotFoundError",
    r"SyntaxError",
)


@dataclass(frozen=True)
class JobSpec:
    """Everything that defines a job, independent of where it runs. Immutable."""

    entrypoint: Entrypoint
    resources: Resources = field(default_factory=Resources)
    name: str = ""
    framework: Framework = Framework.TORCH
    spawn: Spawn = Spawn.AUTO
    env: Mapping[str, str] = field(default_factory=dict)
    # --secret: environment variable -> secret name. Names only: the values are resolved by the
    # backend that starts the ranks, into their environment (phalanx.secrets; docs/secrets.md).
    secrets: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "."
    backend: str = "local"
    python: str = "python3"
    max_restarts: int = 0  # torchrun's in-place worker restarts
    grace: float = 30.0  # seconds between SIGTERM and SIGKILL when stopping
    max_retries: int = 0  # job-level restarts of all nodes after a failure or preemption
    no_retry_on: tuple[str, ...] = DEFAULT_NO_RETRY  # log patterns that make a failure final
    retry_on_exit_codes: tuple[int, ...] = ()  # if set, only these exit codes are retried
    stall_timeout: float | None = None  # fail when no output/metric for this long
    max_duration: float | None = None  # seconds the job may run (queue time aside), then TIMEOUT
    idle_timeout: float | None = None  # seconds its GPUs (or CPUs and output) may idle, then TIMEOUT
    on_nan: str | None = None  # stop | retry: a watched metric went nan/inf (health/anomaly.py)
    on_spike: float | None = None  # a watched metric above FACTOR x its recent median counts as divergence
    watch_metrics: tuple[str, ...] = ()  # the metrics watched (globs); empty: *loss and the objective
    on_nan_args: str = ""  # arguments recomputed on a retry after divergence ("--lr {lr*0.5}")
    keep_states: int = 0  # versions of the state directory kept for rollbacks (storage/versions.py)
    progress: str | None = None  # --progress REGEX (health/progress.py); None: the known formats
    # Check each node before each attempt (launch/nodecheck.py): phalanx's node checks, or the
    # user's shell line; a node that fails is left out of the retry where the backend can.
    health_check: bool = False
    health_check_cmd: str | None = None
    # Nodes a retry leaves out (found bad by an earlier attempt; set by the supervisor, never
    # by the user), by the name the backend knows them by: an ssh host, a SLURM node, a
    # Kubernetes node. Each backend's plan honours it where it can (Backend.leaves_out).
    left_out: tuple[str, ...] = ()
    state_uri: str | None = None  # fsspec URI the state directory is synced with
    metrics: tuple[MetricDef, ...] = ()
    auto_metrics: bool = True  # pick up name=value / name: value numbers too
    sample_interval: float = 5.0  # seconds between resource samples
    backend_options: Mapping[str, Any] = field(default_factory=dict)  # see backends/options.py
    channels: tuple[Channel, ...] = ()  # input data, staged before the first attempt
    output_uri: str | None = None  # where PHALANX_OUTPUT_DIR and the logs are uploaded at the end
    skip_if_done: bool = False  # no-op when the last successful run of this name had the same inputs
    snapshot: bool = False  # freeze the code at submit time (JobPaths.code_dir; see storage/snapshot.py)
    # Set at plan time (``in_snapshot``): the frozen copy of ``code_root(spec)`` the workers
    # import Python code from, while cwd and file names stay the user's.
    code_dir: str = ""
    # The state directory's key ($PHALANX_HOME/state/<key>), shared on purpose only: the
    # --name given, or derived from --state; resolved per job otherwise (storage/statedir.py).
    state_name: str = ""
    monitor_interval: float = 0.1  # seconds between torchrun's checks of its workers
    rendezvous: Rendezvous | None = None  # one node of a job started by hand on each machine (torchrun's way)
    # Labels of the job (--tag KEY=VALUE): filters in ps and the dashboard; SageMaker also
    # puts them on the training job's Tags.
    tags: Mapping[str, str] = field(default_factory=dict)
    # Where the job's outcome is announced (--notify): webhook URLs, mailto:ADDR, desktop.
    notify: tuple[str, ...] = ()
    warm: bool = False  # start Python processes from a warm interpreter pool (launch/warm/plan.py)
    # Experiment trackers (--track: mlflow, tensorboard, wandb), fed from the job's metric and
    # resource files by an exporter beside the supervisor (track/, supervise/tracking.py):
    # whose ranks ("0" or "all"), where TensorBoard writes, whether outputs and logs go along,
    # and the tools' own settings as they were at submit (places and names, never a key).
    track: tuple[str, ...] = ()
    track_ranks: str = "0"
    track_dir: str | None = None
    track_artifacts: bool = False
    track_config: Mapping[str, str] = field(default_factory=dict)
    # Teams (issue 27): the project the job belongs to ("": the submitter's default, resolved by
    # the face) and its place in that project's queue (higher first).
    project: str = ""
    priority: int = 0

    @property
    def state_key(self) -> str:
        """The state directory's name; specs written before ``state_name`` existed used the job name."""
        return self.state_name or self.name

    @property
    def uses_torchrun(self) -> bool:
        return (
            self.framework is Framework.TORCH
            and self.spawn is Spawn.AUTO
            and self.resources.world_size > 1
        )

    @property
    def procs_per_node_started(self) -> int:
        """How many processes phalanx (or torchrun) starts on each node."""
        return 1 if self.spawn is Spawn.SELF else self.resources.nproc_per_node

    def with_(self, **changes: Any) -> "JobSpec":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: enums by value, tuples as lists, nested parts as mappings."""
        return _encode(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        """The inverse of ``to_dict``; fields missing from ``data`` (older specs) take their default."""
        return _decode_fields(cls, data)


def _encode(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode_fields(cls: Any, data: Mapping[str, Any]) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    return cls(**{name: _decode(hints[name], value) for name, value in data.items() if name in known})


def _decode(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, UnionType):
        return _decode(next(a for a in args if a is not type(None)), value)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if isinstance(kind, type) and is_dataclass(kind):
        return _decode_fields(kind, value)
    if origin is tuple:
        return tuple(_decode(args[0], v) for v in value)
    if origin in (dict, Mapping, abc.Mapping):
        return dict(value)
    if kind in (int, float, bool, str):
        return kind(value)
    return value


def code_root(spec: JobSpec) -> str:
    """The directory whose code a snapshot freezes: the working directory, or the script's own
    directory when the script lies outside it (``cd data && phalanx run ../train.py``). Pure."""
    import os.path

    workdir = os.path.abspath(spec.workdir)
    entry = spec.entrypoint
    if entry.kind is EntrypointKind.SCRIPT:
        target = os.path.abspath(entry.target)
        if os.path.commonpath([workdir, target]) != workdir:
            return os.path.dirname(target)
    return workdir


def in_snapshot(spec: JobSpec, code_dir: str, shipped: bool = False) -> JobSpec:
    """``spec`` as run with its code frozen in ``code_dir`` (a copy of ``code_root(spec)``). Pure.

    Where the user's files are there (this machine, a shared filesystem), the job keeps its
    working directory and file names and only reads Python code from the copy
    (``launch/frozen.py``). Where they are not (``shipped``: a host that got the copy), the
    copy is the working directory and holds the script."""
    import os.path

    if not shipped:
        return spec.with_(code_dir=code_dir)
    root = code_root(spec)
    entry = spec.entrypoint
    if entry.kind is EntrypointKind.SCRIPT:
        target = os.path.abspath(entry.target)
        if os.path.commonpath([root, target]) == root:
            rel = os.path.relpath(target, root)
            entry = replace(entry, target=os.path.join(code_dir, rel), typed=rel)
    return spec.with_(workdir=code_dir, entrypoint=entry, code_dir="")


def parse_tag(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the --tag syntax, ``ps --tag``) -> (key, value)."""
    from .grammar import tag
    from .optiontypes import BadValue

    try:
        return tag(str(text))
    except BadValue:
        raise UsageError(f"invalid --tag '{text}'", "use KEY=VALUE, the key of letters, digits and _.:/@+-, e.g. --tag team=vision") from None
