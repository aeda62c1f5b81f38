"""``phalanx artifacts | download``: what a job produced, and bringing it here. Thin: parse, call, render."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .args import PROJECT_HELP, job_ref, project_scope


def register(app: typer.Typer) -> None:
    app.command("artifacts")(artifacts_cmd)
    app.command("download")(download_cmd)


def artifacts_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List a job's outputs: path, size, and where they are (the --output URI or the job directory)."""
    from ..storage.transfer import human_size as _size
    from .face import face
    from .render import dump_json, table

    found = face().artifacts(job)
    if as_json:
        dump_json(found, sys.stdout)
        return
    out = sys.stdout
    files = found["files"]
    total = sum(int(m.get("size") or 0) for m in files)
    where = found["location"] + ("" if found["uploaded"] else "  (on this machine)")
    out.write(f"job {found['id']} ({found['name']}): {len(files)} output file(s), {_size(total)} in {where}\n")
    if found["error"]:
        out.write(f"the upload failed: {found['error']}\n")
    if files:
        out.write("\n")
        table([(_size(int(m.get("size") or 0)), m["path"]) for m in files], ("SIZE", "PATH"), out)
    out.write(f"\nlogs: {found['logs']} file(s); fetch everything with: phalanx download {found['id']} --logs\n")


def download_cmd(
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope, help=PROJECT_HELP),
    job: str = typer.Argument(..., callback=job_ref, help="Job id, id prefix or name."),
    dest: Optional[Path] = typer.Option(None, "-o", "--output-dir", help="Where to put them (default: ./NAME-ID)."),
    logs: bool = typer.Option(False, "--logs", help="Also the logs (DIR/logs)."),
    state: bool = typer.Option(False, "--state", help="Also the state directory (DIR/state)."),
) -> None:
    """Bring a job's outputs here (DIR/output), and with --logs / --state its logs and state."""
    from .face import face

    def event(text: str) -> None:
        sys.stderr.write(f"phalanx: {text}\n")

    where, counts = face().download(job, dest, logs=logs, state=state, events=event)
    typer.echo(f"{where}: " + ", ".join(f"{part}/ {n} file(s)" for part, n in counts.items()))
