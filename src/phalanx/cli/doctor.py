"""``phalanx doctor``: check the nodes a job would get, with the options ``run`` takes for them.

Its flags are ``run``'s that say where and on what a job runs (backend and its options, -n,
env, working directory, job file), from the same option table; the rest of ``run``'s (the
script, retries, metrics, sweeps) have no meaning here and are not offered.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
import typer

from .runflags import RunCommand, run_options

if TYPE_CHECKING:
    from ..core.options import Option

DOCTOR_HELP = """Check the nodes a job with these options would get, and name the bad ones.

\b
  phalanx doctor -n 2x1                                   two local nodes
  phalanx doctor --backend ssh --hosts a,b,c -n 3x8       three hosts, 8 GPUs each
  phalanx doctor --backend slurm --partition gpu -n 4x8   four nodes SLURM picks

Per node: the devices it sees, GPU health and ECC counters (NVML, with the gpu extra), a matmul
burn per device (rate and correctness), free disk and /dev/shm, its clock against node 0's;
between nodes: an all-reduce of every pair (bandwidth, latency). It runs as a job (named doctor)
through the backend, as a job would. Exits 1 when a node is outside the healthy range."""

# run's options that say where a job runs and on what: the doctor takes these.
KEPT = {"job_file", "backend", "warm", "env", "workdir", "n", "nnodes", "nproc_per_node", "quiet", "as_json", "snapshot",
        "grace"}


def doctor_options() -> tuple[Option, ...]:
    return tuple(o for o in run_options() if o.name in KEPT or o.group == "backend")


class DoctorCommand(RunCommand):
    """``run``'s option machinery with the doctor's subset of the table, no script, and ``--burn``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.callback = _callback
        self.help = DOCTOR_HELP

    def options_table(self) -> tuple[Option, ...]:
        return doctor_options()

    @property  # type: ignore[override]
    def params(self) -> list[click.Parameter]:
        if self._params is None:
            burn = click.Option(["--burn"], type=float, default=2.0, metavar="SECONDS",
                                help="Seconds of matmul on each device. [default: 2]")
            self._params = [p for p in super().params if p.name != "words"] + [burn]
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        """typer's (none) are replaced by the table's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return click.Command.parse_args(self, ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        own = [p.get_help_record(ctx) for p in self.get_params(ctx) if p.name == "burn"]
        with formatter.section("The check"):
            formatter.write_dl([r for r in own if r is not None])


def _callback(burn: float = 2.0, **given: Any) -> None:
    from ..errors import UsageError
    from ..jobfile import RunOptions, build_spec, resolve
    from .control import event
    from .face import face
    from .render import dump_json, warn
    from .runflow import _backend_options

    if burn <= 0:
        raise UsageError(f"--burn {burn:g} is not a duration", "give seconds, e.g. --burn 2")
    backend_names = {o.name for o in _backend_options()}
    opts = RunOptions(module="phalanx.health.doctor_probe", spawn="self",
                      backend_options={k: v for k, v in given.items() if k in backend_names},
                      **{k: v for k, v in given.items() if k not in backend_names})
    values = resolve(opts)
    spec = build_spec(opts, values)
    as_json, quiet = bool(values["as_json"]), bool(values["quiet"])
    warn(values.warnings, values.notes)
    found = face().doctor(spec, events=None if quiet or as_json else event, burn=burn)
    text = found.pop("text")
    if as_json:
        dump_json(found, sys.stdout)
    else:
        sys.stdout.write(text)
        if not quiet:
            event(f"checked in {found['seconds']:.1f}s (job {found['job']})")
    raise typer.Exit(0 if found["healthy"] else 1)
