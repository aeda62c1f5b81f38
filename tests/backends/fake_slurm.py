"""A stateful fake of SLURM's client commands behind ``backends.commands.run``.

``sbatch`` hands out job ids, ``squeue`` reports the states the test sets, ``scancel`` and
``scontrol`` act on them. Outputs and error texts are recorded from Slurm 22.05 (Debian 12).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class FakeJob:
    id: str
    script: str
    state: str = "PENDING"
    reason: str = "None"
    exit_code: str = "0:0"
    signals: list[str] = field(default_factory=list)


class FakeSlurm:
    def __init__(self) -> None:
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[list[str]] = []
        self.next_id = 41
        self.refuse: str | None = None  # sbatch's error text, when it should refuse
        self.on_submit: Callable[[FakeJob], None] | None = None
        self.on_signal: Callable[[FakeJob, str], None] | None = None
        self.on_squeue: Callable[[FakeJob], None] | None = None  # before squeue reports the job: time passes

    def __call__(self, argv, env=None, timeout=60.0) -> subprocess.CompletedProcess:
        argv = list(argv)
        self.calls.append(argv)
        handler = getattr(self, "_" + argv[0])
        code, out, err = handler(argv[1:])
        return subprocess.CompletedProcess(argv, code, out, err)

    def calls_to(self, program: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == program]

    # -- the commands ---------------------------------------------------------------------

    def _sbatch(self, args):
        assert args[0] == "--parsable"
        if self.refuse:
            return 1, "", f"sbatch: error: {self.refuse}\nsbatch: error: Batch job submission failed: Invalid partition name specified\n"
        job = FakeJob(str(self.next_id), Path(args[-1]).read_text())
        self.next_id += 1
        self.jobs[job.id] = job
        if self.on_submit:
            self.on_submit(job)
        return 0, f"{job.id}\n", ""

    def _squeue(self, args):
        if "--format=%i|%k" in args:  # this user's jobs with their --comment
            assert "--states=all" in args and any(a.startswith("--user=") for a in args)
            comments = {i: re.search(r"^#SBATCH --comment=(.*)$", j.script, re.M) for i, j in self.jobs.items()}
            return 0, "".join(f"{i}|{c.group(1) if c else '(null)'}\n" for i, c in comments.items()), ""
        ids = next(a for a in args if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        assert "--states=all" in args and "--format=%i|%T|%r" in args
        known = [i for i in ids if i in self.jobs]
        for i in known:
            if self.on_squeue:
                self.on_squeue(self.jobs[i])
        if not known and len(ids) == 1:
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        return 0, "".join(f"{i}|{self.jobs[i].state}|{self.jobs[i].reason}\n" for i in known), ""

    def _scancel(self, args):
        job = self.jobs.get(args[-1])
        if job is None:
            return 0, "", ""
        signal = next((a.split("=", 1)[1] for a in args if a.startswith("--signal=")), None)
        if signal is None:
            if job.state in ("PENDING", "RUNNING"):
                job.state = "CANCELLED"
            return 0, "", ""
        if job.state == "PENDING":
            return 1, "", f"scancel: error: Kill job error on job id {job.id}: Job can not be altered now, try again later\n"
        job.signals.append(signal)
        if self.on_signal:
            self.on_signal(job, signal)
        return 0, "", ""

    def _scontrol(self, args):
        job = self.jobs.get(args[-1])
        if job is None:
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        return 0, (f"JobId={job.id} JobName=t UserId=root(0) JobState={job.state} Reason={job.reason} "
                   f"Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 ExitCode={job.exit_code} NodeList=n[1-2]\n"), ""
