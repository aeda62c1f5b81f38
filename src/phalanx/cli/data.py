"""``phalanx artifacts | download``: what a job produced, and bringing it here. Thin: parse, call, render."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .args import job_ref


def register(app: typer.Typer) -> None:
    app.command("artifacts")(artifacts_cmd)
    app.command("download")(download_cmd)


def artifacts_cmd(
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List a job's outputs: path, size, and where they are (the --output URI or the job directory)."""
    from .. import query
    from ..storage.transfer import human_size as _size
    from .render import dump_json, table

    record = query.get_job(job)
    found = query.artifacts(record)
    if as_json:
        dump_json({"id": record.id, "name": record.name, **found.to_dict()}, sys.stdout)
        return
    out = sys.stdout
    total = sum(int(m.get("size") or 0) for m in found.files.values())
    where = found.location + ("" if found.uploaded else "  (on this machine)")
    out.write(f"job {record.id} ({record.name}): {len(found.files)} output file(s), {_size(total)} in {where}\n")
    if found.error:
        out.write(f"the upload failed: {found.error}\n")
    if found.files:
        out.write("\n")
        table([(_size(int(m.get("size") or 0)), rel) for rel, m in sorted(found.files.items())], ("SIZE", "PATH"), out)
    out.write(f"\nlogs: {len(found.logs)} file(s); fetch everything with: phalanx download {record.id} --logs\n")


def download_cmd(
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    dest: Optional[Path] = typer.Option(None, "-o", "--output-dir", help="Where to put them (default: ./NAME-ID)."),
    logs: bool = typer.Option(False, "--logs", help="Also the logs (DIR/logs)."),
    state: bool = typer.Option(False, "--state", help="Also the state directory (DIR/state)."),
) -> None:
    """Bring a job's outputs here (DIR/output), and with --logs / --state its logs and state."""
    from .. import jobs, query

    def event(text: str) -> None:
        sys.stderr.write(f"phalanx: {text}\n")

    where, counts = jobs.download(query.get_job(job), dest, logs=logs, state=state, events=event)
    typer.echo(f"{where}: " + ", ".join(f"{part}/ {n} file(s)" for part, n in counts.items()))
