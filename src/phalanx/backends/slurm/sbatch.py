"""The SLURM backend's options and its batch script, as pure functions (golden-tested).

The script asks for ``nnodes`` nodes with one task each, learns the nodes' addresses from
``scontrol`` (node 0, the first of the allocation, hosts the rendezvous) and ``srun``-s one node
agent per node; each agent finds its part of the plan by ``$SLURM_NODEID``. User arguments never
appear in the script: they travel in each node's ``launch.json``, so no shell quoting can bend them.

Preemption: with a time limit, ``--signal=TERM@<lead>`` has SLURM send SIGTERM to every node
agent ``lead`` seconds before the limit, which is what ``phalanx stop`` does too: every rank
gets SIGTERM and the grace period to checkpoint. ``--no-requeue``: phalanx, not SLURM, decides
whether to run the job again (a new attempt, with ``--max-retries``), so attempts stay distinct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ...core.rawtext import shell_join
from ...errors import UsageError
from ..options import BackendOption

OPTIONS = (
    BackendOption("partition", str, None, "SLURM partition to run in (sbatch --partition)."),
    BackendOption("account", str, None, "SLURM account the job is charged to (sbatch --account)."),
    BackendOption("time", str, None, "Time limit, e.g. 4:00:00 or 1-12:00:00 (sbatch --time); ranks get SIGTERM "
                                     "--signal-lead seconds before it, to checkpoint."),
    BackendOption("gpus_per_node", int, None, "GPUs per node (sbatch --gpus-per-node)."),
    BackendOption("signal_lead", int, None, "Seconds before the time limit at which every rank gets SIGTERM "
                                            "(default: --grace + 30)."),
    BackendOption("sbatch", str, (), "An extra #SBATCH line, e.g. --qos=high (repeatable; written last, so it wins).",
                  multiple=True),
)
LEAD_MARGIN = 30  # seconds beyond the grace period: agents report back after their ranks are gone

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_WORD = re.compile(r"^[^\s\"'\\]+$")


def time_limit_seconds(text: str) -> int | None:
    """A SLURM time limit in seconds (None: unlimited). Formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    value = text.strip()
    if value.lower() in ("infinite", "unlimited"):
        return None
    match = _TIME.match(value)
    if not match:
        raise UsageError(f"invalid --time '{text}'", "use minutes, H:MM:SS or D-HH:MM:SS, e.g. --time 4:00:00")
    days, first, second, third = match.groups()
    if days is not None:
        return ((int(days) * 24 + int(first)) * 60 + int(second or 0)) * 60 + int(third or 0)
    if third is not None:
        return (int(first) * 60 + int(second)) * 60 + int(third)
    if second is not None:
        return int(first) * 60 + int(second)
    return int(first) * 60


def check(options: Mapping[str, Any], grace: float) -> int | None:
    """Check the options beyond their types (UsageError when they cannot make a valid script);
    returns the signal lead: seconds before the time limit at which ranks get SIGTERM (None
    without a time limit)."""
    for option in OPTIONS:
        values = options.get(option.name)
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if isinstance(value, str) and ("\n" in value or "\r" in value):
                raise UsageError(f"{option.flag} must be one line", f"got {value!r}")
    for key in ("partition", "account", "time"):
        if options.get(key) is not None and not _WORD.match(str(options[key])):
            raise UsageError(f"invalid --{key} '{options[key]}'", "SLURM names have no spaces or quotes")
    if options.get("gpus_per_node") is not None and int(options["gpus_per_node"]) < 0:
        raise UsageError("--gpus-per-node must not be negative", "e.g. --gpus-per-node 8")
    limit = time_limit_seconds(str(options["time"])) if options.get("time") else None
    lead = options.get("signal_lead")
    if lead is not None and int(lead) < 1:
        raise UsageError("--signal-lead must be at least 1 second", "e.g. --signal-lead 120")
    if limit is None:
        return None
    lead = int(lead) if lead is not None else int(grace) + LEAD_MARGIN
    if lead >= limit:
        raise UsageError(
            f"--time {options['time']} leaves no time to run: ranks would get SIGTERM {lead}s before the limit",
            "give a longer --time, or a smaller --signal-lead / --grace",
        )
    return lead


def check_secrets(options: Mapping[str, Any]) -> None:
    """A job with secrets hands them to SLURM through sbatch's environment (its default
    ``--export=ALL``): an ``--export`` line of the user's would keep them from the ranks."""
    for line in options.get("sbatch") or ():
        if re.search(r"(^|\s)--export(=|\s|$)", str(line)):
            raise UsageError(f"--sbatch '{line.strip()}' would keep the job's secrets (--secret) from its ranks: "
                             "phalanx hands them over in sbatch's environment",
                             "drop the --export line, or pass what it sets with --env")


@dataclass(frozen=True)
class BatchJob:
    """What the batch script needs to know; every path is absolute and on the shared filesystem."""

    job_id: str
    attempt: int
    name: str
    command: str  # what the job runs, for a comment
    nnodes: int
    cpus_per_task: int
    workdir: str
    batch_log: str
    agent_log: str  # with %n: srun fills in the node's index in the allocation
    agent_argv: tuple[str, ...]  # the node agent, finding its launch file by $SLURM_NODEID
    options: Mapping[str, Any]  # validated (backends.options.validate)
    lead: int | None
    exclude: tuple[str, ...] = ()  # nodes an earlier attempt found bad (JobSpec.left_out)


def _path(flag: str, value: str) -> str:
    """An #SBATCH line with a path; sbatch reads double quotes there, nothing else."""
    if '"' in value or "\n" in value:
        raise UsageError(f"cannot pass the path {value!r} to sbatch", "use a directory without double quotes or newlines")
    return f'#SBATCH {flag}="{value}"' if re.search(r"\s", value) else f"#SBATCH {flag}={value}"


def submission_tag(job_id: str, attempt: int) -> str:
    """The batch job's ``--comment``: finds an attempt's SLURM job when its id was never recorded."""
    return f"phalanx:{job_id}:{attempt}"


def render(job: BatchJob) -> str:
    """The sbatch script. Pure."""
    opts = job.options
    comment = job.command.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    lines = [
        "#!/bin/bash",
        f"# phalanx job {job.job_id}, attempt {job.attempt}: {comment}",
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --comment={submission_tag(job.job_id, job.attempt)}",
        f"#SBATCH --nodes={job.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={job.cpus_per_task}",
        _path("--output", job.batch_log),
        "#SBATCH --open-mode=append",
        _path("--chdir", job.workdir),
        "#SBATCH --no-requeue",
    ]
    for key in ("partition", "account", "time"):
        if opts.get(key):
            lines.append(f"#SBATCH --{key}={opts[key]}")
    if job.lead is not None:
        lines.append(f"#SBATCH --signal=TERM@{job.lead}")
    if opts.get("gpus_per_node"):
        lines.append(f"#SBATCH --gpus-per-node={opts['gpus_per_node']}")
    names = [n for n in job.exclude if _WORD.match(n) and "," not in n]
    if names:  # left out after an earlier attempt pointed at them (the result.json's node_name)
        lines.append(f"#SBATCH --exclude={','.join(names)}")
    for extra in filter(None, (line.strip() for line in opts.get("sbatch") or ())):
        lines.append(extra if extra.startswith("#SBATCH") else f"#SBATCH {extra}")
    srun = [
        "srun", f"--nodes={job.nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
        f"--output={job.agent_log}", "--open-mode=append", *job.agent_argv,
    ]
    lines += [
        "set -eu",
        "# Node addresses in allocation order ($SLURM_NODEID): what slurmctld reaches each node at.",
        "addrs=",
        'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
        "    addr=$(scontrol show node -o \"$node\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')",
        '    addrs="${addrs:+$addrs,}${addr:-$node}"',
        "done",
        'export PHALANX_NODE_ADDRS="$addrs"',
        f'echo "phalanx: job {job.job_id} attempt {job.attempt}: SLURM job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($addrs)"',
        "# srun no longer inherits --cpus-per-task from the allocation (Slurm 22.05+).",
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
        "exec " + shell_join(srun),  # bash: $'...' keeps bytes that are not UTF-8
    ]
    return "\n".join(lines) + "\n"
