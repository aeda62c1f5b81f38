"""Every option of ``phalanx run`` and of a job file, declared once.

From this table (plus each backend's own options, ``backends/options.py``) come the flags of
``phalanx run`` (``cli/runflags.py``), the job-file keys and their validation (``jobfile/``),
the values a ``JobSpec`` is built from, and the option reference ``docs/options.md``
(``cli/optdocs.py``, checked by a test). To add an option: add one ``Option`` here, then use
its value where the spec is built (``jobfile.build_spec``) if it is not a plain field.

An option is read from the command line as text (``flags``), from a job file as a YAML value
(``file``: the key, ``sweep.trials`` for a nested one), and both go through the same
``type`` (``core/optiontypes.py``), so the two can never disagree. The command line beats the
job file; the job file beats ``default``. Pure data; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .grammar import (
    TAG_VALUE_LONGEST,
    channel_name,
    duration,
    endpoint,
    metric_name,
    metric_regex,
    node_range,
    notify_targets,
    objective,
    procs_per_node,
    project_name,
    progress_regex,
    python_name,
    rank_list,
    regex,
    secret_ref,
    stream_spec,
    tag_key,
    topology,
    watch_pattern,
)
from .optiontypes import (
    MAX_NODES,
    Bool,
    Choice,
    Custom,
    Float,
    Int,
    ListOf,
    MappingOf,
    SecretRefs,
    Str,
    ValueType,
    env_name,
    shell_words,
)

GROUPS = {
    "what": "What runs",
    "topology": "Topology",
    "torchrun": "torchrun's rendezvous and launch settings",
    "terminal": "At the terminal",
    "survival": "Failures, retries and state",
    "monitoring": "Metrics and resources",
    "data": "Data in, results out",
    "labels": "Labels and notifications",
    "team": "Projects and the queue (team servers; docs/teams.md)",
    "tracking": "Experiment trackers (MLflow, TensorBoard, Weights & Biases)",
    "sweep": "Sweeps (a search space in the script's arguments)",
    "backend": "Backend options",
}


@dataclass(frozen=True)
class Option:
    """One option. ``name`` is its key in ``RunOptions`` and, unless ``file`` says otherwise, in
    the job file; ``flags`` its command-line spellings (none: job file only); ``file`` None: the
    command line only. ``flag_value``: the option is a flag without a value that sets this.
    ``backends``: the backends that honour it (empty: all); given for another, it is an error.
    ``field``: the ``JobSpec`` field it ends up in (documentation; ``jobfile`` does the work).
    ``expands``: a backend's own job-file section (``backends/options.py: BackendSection``)."""

    name: str
    type: ValueType
    help: str
    flags: tuple[str, ...] = ()
    group: str = "what"
    default: Any = None
    default_doc: str = ""  # the default in words, when it is computed
    file: str | None = ""  # "" = name
    field: str | None = None
    backends: tuple[str, ...] = ()
    flag_value: Any = None
    metavar: str = ""
    label: str = ""  # how messages name it, when not by its first long flag
    # A backend's job-file section (``sagemaker:``): its value is a mapping of that backend's
    # options, which go into the spec as if given one by one, under those given by name.
    expands: bool = False
    # Set for the options most people need: their one-line help in the short ``phalanx run --help``
    # (the rest are in ``--help-all``). ``{backends}`` in it or in ``help``: the installed backends.
    brief: str = ""

    @property
    def file_key(self) -> str | None:
        return self.name if self.file == "" else self.file

    @property
    def is_flag(self) -> bool:
        return self.flag_value is not None

    @property
    def repeatable(self) -> bool:
        return isinstance(self.type, (ListOf, MappingOf)) and not (isinstance(self.type, ListOf) and self.type.commas)

    @property
    def takes_value(self) -> bool:
        return bool(self.flags) and not self.is_flag

    @property
    def main_flag(self) -> str:
        if self.label:
            return self.label
        long = [f for f in self.flags if f.startswith("--")]
        return (long or list(self.flags) or [f"{self.file_key}:"])[0]

    @property
    def shown_metavar(self) -> str:
        return self.metavar or self.type.metavar

    @property
    def common(self) -> bool:
        return bool(self.brief)

    def described(self, backends: "tuple[str, ...] | list[str]", brief: bool = False) -> str:
        """Its help (or brief) with ``{backends}`` filled in, the default first: ``[default: X] ...``."""
        text = (self.brief if brief and self.brief else self.help).replace("{backends}", ", ".join(backends))
        if text.startswith("[default: ") or self.expands:  # says it first already; a section's keys say theirs
            return text
        written, text = default_first(text)
        default = self.default_text() if (self.default_doc or not self.is_flag) else ""
        default = default or written or ""
        if brief:  # one line: the default without its qualifiers
            default = default.split(" (")[0].split(", ")[0]
        return f"[default: {default}] {text}" if default else text

    def default_text(self) -> str:
        if self.default_doc:
            return self.default_doc
        if self.default is None or self.default == () or self.default == {}:
            return ""
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return str(self.default)


_WRITTEN_DEFAULT = (
    re.compile(r"\s*\(default:?\s+((?:[^()]|\([^()]*\))*)\)"),  # "... (default: X)"
    re.compile(r";\s*default:?\s+((?:[^()]|\([^()]*\))*?)(?=\))"),  # "(...; default X)"
    re.compile(r";\s*default:?\s+(.*?)(?=\.(?:\s|$))"),  # "...; default: X."
)


def default_first(text: str) -> tuple[str | None, str]:
    """A default written inside a help text (``AWS region (default: AWS_PROFILE).``), and the
    text without it: help lines say their default first, whoever wrote them."""
    for pattern in _WRITTEN_DEFAULT:
        found = pattern.search(text)
        if found:
            return found.group(1).strip(), (text[:found.start()] + text[found.end():]).strip()
    return None, text


# -- the table -----------------------------------------------------------------------------

RUN_OPTIONS: tuple[Option, ...] = (
    # What runs
    Option("job_file", Str(expected="a path"), "A YAML job file (- reads standard input); options given here override it.",
           ("-f", "--file"), file=None, metavar="FILE", brief="A YAML job file; options here override it."),
    Option("script", Str(expected="a path"), "The Python file to run (on the command line: the first word after the options).",
           file="script", field="entrypoint"),
    Option("module", Custom(expected="a module name", parser=python_name), "Run a Python module, like python -m; "
           "everything after it goes to the module.", ("-m", "--module"), field="entrypoint", metavar="MODULE"),
    Option("command", ListOf(item=Str(), split=shell_words), "Any command, as a list or a string split like a shell "
           "(on the command line: a first word that is not a .py file, or --no-python).", field="entrypoint"),
    Option("args", ListOf(item=Str(allow_empty=True), split=shell_words),
           "Arguments of the script, module or command: a list, or a string split like a shell "
           "(\"--lr 0.1\" is two arguments). Arguments typed after the script override flags of the same name.",
           field="entrypoint"),
    Option("no_python", Bool(), "Run the first word as a command, not with python, even if it is a .py file "
           "(torchrun's --no-python).", ("--no-python", "--no_python"), flag_value=True, field="entrypoint"),
    Option("name", Str(), "Job name: the state directory and `phalanx status NAME` go by it.", ("--name",),
           field="name", default_doc="the script's name", brief="The job's name."),
    Option("workdir", Str(expected="a path"), "Directory the job runs in.", ("--workdir",), field="workdir",
           default_doc="the current directory (the job file's, with -f)", metavar="DIR"),
    Option("env", MappingOf(key=env_name), "Extra environment variable KEY=VALUE (repeatable; job file: a mapping).",
           ("-e", "--env"), field="env", brief="An environment variable (repeatable)."),
    Option("secrets", SecretRefs(parser=secret_ref), "Put the secret NAME (phalanx secret set NAME) in the ranks' "
           "environment as the variable NAME, or VAR=NAME as VAR (repeatable; job file: a list). Only the ranks see "
           "the value: records, --dry-run and logs hold the name (see docs/secrets.md).", ("--secret",),
           field="secrets"),
    Option("framework", Choice(choices=("torch", "tf", "jax")), "torch (torchrun starts the workers), tf (one "
           "process per node with TF_CONFIG; with no topology too, one worker, as SageMaker gives a one-instance "
           "MultiWorkerMirroredStrategy job) or jax (JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID; with a "
           "topology phalanx calls jax.distributed.initialize first, and a later call for the same processes is a "
           "no-op). See docs/environment.md.", ("--framework",),
           field="framework", default="torch", label="framework"),
    Option("spawn", Choice(choices=("auto", "self")), "auto, or self: one process per node that spawns and connects "
           "its own workers (phalanx initializes nothing in it). {node_rank}-style placeholders in the arguments are "
           "filled in wherever phalanx starts each node's processes (--spawn self, -n, --nnodes; {{node_rank}} keeps "
           "one literal), never for one plain process.", ("--spawn",),
           field="spawn", default="auto"),
    Option("local_rank_arg", Choice(choices=("--local-rank", "--local_rank")), "Append this argument with each "
           "worker's local rank (--local-rank=N), as python -m torch.distributed.launch did without --use-env.",
           ("--local-rank-arg", "--local_rank_arg"), field="entrypoint", metavar="FLAG"),
    Option("backend", Str(), "Where the job runs: {backends} (the installed backends; phalanx help BACKEND "
           "lists one's options).", ("--backend",), field="backend", default_doc="local (setting: backend)",
           metavar="NAME", brief="{backends}."),
    Option("warm", Bool(), "Start every Python process of the job cold, not from a warm interpreter pool "
           "(see phalanx pool --help).", ("--cold", "--no-warm"), field="warm",
           default_doc="warm on the local backend (setting: warm)", flag_value=False),
    # Topology
    Option("n", Custom(expected="a topology", parser=topology), "Topology: NPROC or NNODESxNPROC (e.g. 4, 2x4).",
           ("-n", "--n"), group="topology", field="resources", metavar="TOPOLOGY", label="-n",
           default_doc="one process, as python runs it", brief="4 or 2x4 (nodes x processes)."),
    Option("nnodes", Custom(expected="a node count", parser=node_range), "Number of nodes, or MIN:MAX for an "
           "elastic job that runs with as many nodes as join (torchrun's spelling).", ("--nnodes",),
           group="topology", field="resources", metavar="N|MIN:MAX"),
    Option("nproc_per_node", Custom(expected="a process count", parser=procs_per_node), "Processes per node: "
           "a number, or gpu, cpu, auto (as torchrun counts them on this machine).",
           ("--nproc-per-node", "--nproc_per_node"), group="topology", field="resources", metavar="N"),
    Option("standalone", Bool(), "One node with its own rendezvous on a free port (torchrun's --standalone; "
           "phalanx always does this for jobs on this machine).", ("--standalone",), group="topology",
           flag_value=True, backends=("local",)),
    # torchrun
    Option("node_rank", Int(high=MAX_NODES - 1), "This machine is node N of a job started by hand on each machine "
           "(torchrun's static rendezvous, with --master-addr/--master-port).", ("--node-rank", "--node_rank"),
           group="torchrun", field="rendezvous", backends=("local",)),
    Option("master_addr", Str(), "Address of node 0, which hosts the rendezvous (torchrun's static rendezvous).",
           ("--master-addr", "--master_addr"), group="torchrun", field="rendezvous", backends=("local",),
           metavar="ADDR"),
    Option("master_port", Int(low=1, high=65535), "Port of the rendezvous on node 0.",
           ("--master-port", "--master_port"), group="torchrun", field="rendezvous", backends=("local",),
           metavar="PORT"),
    Option("rdzv_backend", Str(), "torchrun's rendezvous backend (c10d, static, etcd-v2) for a job whose other "
           "nodes join from other machines.", ("--rdzv-backend", "--rdzv_backend"), group="torchrun",
           field="rendezvous", backends=("local",), metavar="NAME"),
    Option("rdzv_endpoint", Custom(expected="an endpoint", parser=endpoint), "Where the rendezvous is, HOST[:PORT].",
           ("--rdzv-endpoint", "--rdzv_endpoint"), group="torchrun", field="rendezvous", backends=("local",),
           metavar="HOST:PORT"),
    Option("rdzv_id", Str(), "The rendezvous id every node of the job shares.", ("--rdzv-id", "--rdzv_id"),
           group="torchrun", field="rendezvous", backends=("local",), metavar="ID"),
    Option("rdzv_conf", Str(), "torchrun's rendezvous settings, KEY=VALUE,... (e.g. join_timeout=900).",
           ("--rdzv-conf", "--rdzv_conf"), group="torchrun", field="rendezvous", backends=("local",),
           metavar="CONF"),
    Option("max_restarts", Int(high=10_000), "torchrun's in-place worker restarts.",
           ("--max-restarts", "--max_restarts"), group="torchrun", field="max_restarts", default=0),
    Option("monitor_interval", Float(positive=True), "Seconds between torchrun's checks of its workers.",
           ("--monitor-interval", "--monitor_interval"), group="torchrun", field="monitor_interval", default=0.1),
    # At the terminal
    Option("ranks", Custom(expected="ranks", parser=rank_list), "Only show the output of these ranks at the "
           "terminal, e.g. 0 or 0,3 (every rank's output is in its log).", ("--ranks",), group="terminal",
           file=None, metavar="RANKS"),
    Option("local_ranks_filter", Custom(expected="local ranks", parser=rank_list), "Only show the output of "
           "these local ranks of every node (torchrun's spelling of --ranks).",
           ("--local-ranks-filter", "--local_ranks_filter"), group="terminal", file=None, metavar="RANKS"),
    Option("redirects", Custom(expected="a stream setting", parser=stream_spec), "torchrun's --redirects: ranks "
           "whose output it redirects are not shown at the terminal (phalanx logs every rank's output anyway).",
           ("--redirects",), group="terminal", file=None, metavar="N|RANK:N,..."),
    Option("tee", Custom(expected="a stream setting", parser=stream_spec), "torchrun's --tee: accepted; phalanx "
           "always both logs every rank's output and shows it at the terminal.", ("--tee",), group="terminal",
           file=None, metavar="N|RANK:N,..."),
    Option("log_dir", Str(expected="a path"), "Also copy every rank's log to DIR/NAME-ID/logs/ at the end "
           "(torchrun's --log-dir; the same as --output DIR, which copies the outputs too).",
           ("--log-dir", "--log_dir"), group="terminal", file=None, metavar="DIR"),
    Option("quiet", Bool(), "No start and end lines from phalanx (the script's output and errors still show).",
           ("-q", "--quiet"), group="terminal", file=None, flag_value=True),
    Option("as_json", Bool(), "Machine-readable output: only JSON on stdout (the script's output goes to stderr).",
           ("--json",), group="terminal", file=None, flag_value=True),
    Option("dry_run", Bool(), "Check everything a run checks, print the plan (per-node argv and env), and exit.",
           ("--dry-run",), group="terminal", file=None, flag_value=True,
           brief="Print the plan; start nothing."),
    Option("detach", Bool(), "Run in the background: print the job id (stdout) and how to follow it (stderr).",
           ("-d", "--detach"), group="terminal", file=None, flag_value=True,
           brief="Run in the background; print the job id."),
    # Failures, retries and state
    Option("grace", Float(), "Seconds between SIGTERM and SIGKILL when stopping.", ("--grace",), group="survival",
           field="grace", default_doc="30 (setting: grace)"),
    Option("max_retries", Int(high=10_000), "Rerun the whole job up to N times after a failure.", ("--max-retries",),
           group="survival", field="max_retries", default=0, brief="Runs again after a failure."),
    Option("no_retry_on", ListOf(item=Custom(expected="a regular expression", parser=regex)), "A failure whose output "
           "matches this regex is final (repeatable; replaces the defaults; job file: a list, or one pattern).",
           ("--no-retry-on",), group="survival", field="no_retry_on", metavar="REGEX",
           default_doc="CUDA out of memory, OutOfMemoryError, unrecognized arguments, ModuleNotFoundError, SyntaxError"),
    Option("retry_on_exit_codes", ListOf(item=Int(expected="an exit code", high=255), commas=True),
           "Only retry these exit codes, e.g. 1,137.", ("--retry-on-exit-codes",), group="survival",
           field="retry_on_exit_codes", metavar="CODES"),
    Option("stall_timeout", Float(positive=True), "Fail (and dump stacks) when no rank prints for this many seconds.",
           ("--stall-timeout",), group="survival", field="stall_timeout"),
    Option("max_duration", Custom(expected="a duration", parser=duration), "End the job after it has run this long "
           "(6h, 30m, 1h30m; queue time not counted): SIGTERM, the grace period, the state synced; state TIMEOUT.",
           ("--max-duration",), group="survival", field="max_duration", metavar="DURATION"),
    Option("idle_timeout", Custom(expected="a duration", parser=duration), "End the job when its GPUs (without "
           "GPUs: its CPUs and its output) have been idle this long; state TIMEOUT, with the reason.",
           ("--idle-timeout",), group="survival", field="idle_timeout", metavar="DURATION"),
    Option("on_nan", Choice(choices=("stop", "retry")), "When a watched metric is nan or inf: stop the job "
           "(diverged), or retry: restore the newest kept state written before it and run again "
           "(--max-retries then defaults to 3, --keep-states to 3).", ("--on-nan",), group="survival",
           field="on_nan", metavar="ACTION"),
    Option("on_spike", Float(positive=True), "Also count a watched metric jumping above FACTOR times its recent "
           "median as divergence (then handled as --on-nan says; stop without it).", ("--on-spike",),
           group="survival", field="on_spike", metavar="FACTOR"),
    Option("watch_metrics", ListOf(item=Custom(expected="a metric name", parser=watch_pattern)), "The metrics "
           "--on-nan and --on-spike watch (repeatable, globs allowed; job file: a list).", ("--watch-metric",),
           group="survival", field="watch_metrics", metavar="NAME",
           default_doc="every metric ending in loss, and a sweep's objective"),
    Option("on_nan_args", Str(), "Arguments that replace the script's own on a retry after divergence, computed "
           "from them: \"--lr {lr*0.5}\" halves --lr each time.", ("--on-nan-args",), group="survival",
           field="on_nan_args", metavar="ARGS"),
    Option("keep_states", Int(low=0, high=1000), "Keep the last K versions of the state directory (hard links and "
           "copy-on-write where the filesystem allows), each tagged with the step it was written at, for "
           "--on-nan retry to roll back to.", ("--keep-states",), group="survival", field="keep_states",
           metavar="K", default_doc="0; 3 with --on-nan retry"),
    Option("health_check", Bool(), "Check each node before each attempt (devices, GPU health and ECC through NVML, a "
           "matmul burn, free disk and /dev/shm; what phalanx doctor checks on one node); a node that fails, or that a "
           "failure's root cause points at (SIGBUS, ECC, Xid, NIC errors, a lost host), is left out of the next "
           "attempt where the backend can (ssh spare hosts, SLURM --exclude, Kubernetes anti-affinity).",
           ("--health-check",), group="survival", field="health_check", default=False, flag_value=True),
    Option("health_check_cmd", Str(), "Your own check instead (a shell line, run on each node before each attempt "
           "with the node's environment); a non-zero exit fails the node. Implies --health-check.",
           ("--health-check-cmd",), group="survival", field="health_check_cmd", metavar="CMD"),
    Option("state", Str(expected="a URI"), "Sync the state directory with this URI (s3://, gs://, file://, path).",
           ("--state",), group="survival", field="state_uri", metavar="URI"),
    Option("clean_state", Bool(), "Start from an empty state directory (the old one is moved aside).",
           ("--clean-state",), group="survival", file=None, flag_value=True),
    # Metrics and resources
    Option("metrics", MappingOf(key=metric_name, item=Custom(expected="a regular expression", parser=metric_regex),
                                expected="a mapping of metric name to regular expression", metavar="NAME=REGEX"),
           "A metric NAME=REGEX over each rank's output; group 1 is the value (repeatable; job file: a mapping).",
           ("--metric",), group="monitoring", field="metrics", brief="A metric in the output: group 1 is its value."),
    Option("auto_metrics", Bool(), "Do not pick up name=value numbers from the output (only --metric ones).",
           ("--no-auto-metrics",), group="monitoring", field="auto_metrics", default=True, flag_value=False,
           default_doc="on: name=value and name: value numbers are metrics (docs/metrics.md)"),
    Option("sample_interval", Float(positive=True), "Seconds between resource samples.", ("--sample-interval",),
           group="monitoring", field="sample_interval", default=5.0),
    Option("progress", Custom(expected="a regular expression", parser=progress_regex), "Read progress (and the "
           "ETA) from lines matching REGEX: groups done and total (or two groups), or one for a percentage "
           "(default: tqdm, Lightning and Keras bars, step N/M, epoch N/M, [N/M]).", ("--progress",),
           group="monitoring", field="progress", metavar="REGEX"),
    # Data in, results out
    Option("inputs", MappingOf(key=channel_name, item=Str(expected="a URI"),
                               expected="a mapping of input name to URI", metavar="NAME=URI"),
           "Input channel NAME=URI: a path, s3://, gs://, http(s)://, job:NAME[/state]; URI#extract unpacks an "
           "archive (repeatable; job file: a mapping, paths relative to the file).", ("--input",), group="data",
           field="channels"),
    Option("output", Str(expected="a URI"), "Upload PHALANX_OUTPUT_DIR and the logs to this URI at the end.",
           ("--output",), group="data", field="output_uri", metavar="URI"),
    Option("skip_if_done", Bool(), "Do nothing if the last successful run of this name had the same code, "
           "command and inputs.", ("--skip-if-done",), group="data", field="skip_if_done", default=False,
           flag_value=True),
    Option("snapshot", Bool(), "Run from the working directory itself, not from a copy of it taken at submit time "
           "(edits made while the job runs, or before a retry, reach it).", ("--no-snapshot",), group="data",
           field="snapshot", default=True, flag_value=False,
           default_doc="a copy of the working directory taken at submit time"),
    # Labels and notifications
    Option("tags", MappingOf(key=tag_key, item=Str(allow_empty=True, expected="a tag value", longest=TAG_VALUE_LONGEST),
                             expected="a mapping of tag key to value"),
           "A label KEY=VALUE of the job: a filter in ps and the dashboard; SageMaker also tags its training job "
           "with it (repeatable; job file: a mapping).", ("--tag",), group="labels", field="tags"),
    Option("notify", ListOf(item=Custom(expected="a webhook URL (https://...), mailto:ADDR or desktop",
                                        parser=notify_targets)),
           "Send the outcome to URL (a webhook, Slack-compatible), mailto:ADDR[,ADDR] or desktop (repeatable, "
           "or comma-separated; job file: a list, or one string).", ("--notify",), group="labels",
           field="notify", metavar="TARGET", default_doc="the notify setting"),
    # Projects and the queue
    Option("project", Custom(expected="a project name", parser=project_name), "The project the job belongs to: "
           "who sees it, whose quota and budget it counts against.", ("--project",), group="team", field="project",
           metavar="NAME", default_doc="the project setting, else your default on the server, else default"),
    Option("priority", Int(low=-1000, high=1000), "Its place in its project's queue: higher starts first, then "
           "earlier submissions.", ("--priority",), group="team", field="priority", default=0, metavar="N"),
    # Experiment trackers
    Option("track", ListOf(item=Choice(choices=("mlflow", "tensorboard", "wandb"))),
           "Send the parsed metrics, resource samples, parameters and outcome to this tracker, one run per job "
           "across retries: mlflow (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME), tensorboard (event files in "
           "--track-dir) or wandb (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE) (repeatable; job file: a list, or one "
           "name).", ("--track",), group="tracking", field="track", metavar="TRACKER",
           default_doc="the track setting"),
    Option("track_ranks", Choice(choices=("0", "all")), "Whose metrics go to the tracker: rank 0, or all (one "
           "series per rank, rankN/NAME; and every node's resources).", ("--track-ranks",), group="tracking",
           field="track_ranks", default="0", metavar="0|all"),
    Option("track_dir", Str(expected="a path or URI"), "Where TensorBoard event files go: a directory (each job "
           "in NAME-ID/ under it) or an object-store URI (s3://, gs://: written in the job's directory, copied "
           "there).", ("--track-dir",), group="tracking", field="track_dir", metavar="DIR",
           default_doc="the job's directory"),
    Option("track_artifacts", Bool(), "Also send the job's outputs (PHALANX_OUTPUT_DIR) and logs at the end "
           "(MLflow artifacts, W&B files).", ("--track-artifacts",), group="tracking", field="track_artifacts",
           default=False, flag_value=True),
    # Sweeps
    Option("strategy", Choice(choices=("grid", "random", "tpe")), "grid, random or tpe.", ("--strategy",),
           group="sweep", file="sweep.strategy", default_doc="grid when every value is finite, else random"),
    Option("trials", Int(low=1), "Number of trials (random, tpe; caps a grid).", ("--trials",), group="sweep",
           file="sweep.trials", default_doc="every point of a grid (random and tpe need it)"),
    Option("seed", Int(low=None), "Seed of random and tpe.", ("--seed",), group="sweep", file="sweep.seed",
           default=0),
    Option("objective", Custom(expected="an objective", parser=objective), "METRIC:min or METRIC:max: a --metric, or "
           "a NAME=VALUE (NAME: VALUE) the script prints; a sweep in which no trial reports it fails.", ("--objective",),
           group="sweep", file="sweep.objective", metavar="METRIC:DIR", brief="A sweep's objective: loss:min, acc:max."),
    Option("early_stop", Choice(choices=("median", "halving")), "Prune hopeless trials: median or halving.",
           ("--early-stop",), group="sweep", file="sweep.early_stop"),
    Option("parallel", Int(low=1), "At most this many trials at once.", ("--parallel",), group="sweep",
           file="sweep.parallel", default_doc="as many as fit", brief="A sweep's trials at once."),
    Option("fail_fast", Bool(), "Stop at the first failed trial.", ("--fail-fast",), group="sweep",
           file="sweep.fail_fast", default=False, flag_value=True),
)

TOPOLOGY_OPTIONS = ("n", "nnodes", "nproc_per_node")
RENDEZVOUS_OPTIONS = ("node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf")
SWEEP_OPTIONS = tuple(o.name for o in RUN_OPTIONS if o.group == "sweep")


def by_name(options: tuple[Option, ...] = RUN_OPTIONS) -> dict[str, Option]:
    return {o.name: o for o in options}
