"""``phalanx server project ...``: projects, their members, quotas and budgets; and ``phalanx
events``, the audit log. Thin: parse, one call on the face, render.

With ``--store`` (or no login) they act on that store directly as its owner (a server admin at
the server's machine); logged in, they go to the server as you, and it checks your role.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

import typer

from .args import project_scope

if TYPE_CHECKING:
    from ..api.face import Face

project_app = typer.Typer(help="Projects: who is in them with which role, their quotas and budgets.",
                          no_args_is_help=True, add_completion=False, rich_markup_mode=None)
member_app = typer.Typer(help="The members of a project and their roles (viewer, member, admin).",
                         no_args_is_help=True, add_completion=False, rich_markup_mode=None)
project_app.add_typer(member_app, name="member")

STORE_HELP = "Act on this store directly, as its owner (default: the server logged in to, else this machine's store)."


def _face(store: Optional[str]) -> "Face":
    if store:
        import os

        from ..api.face import LocalFace

        os.environ["PHALANX_STORE"] = store
        return LocalFace()
    from .face import face

    return face()


def _say(text: str) -> None:
    typer.echo(text)


@project_app.command("list")
def list_cmd(store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The projects you are in (a server admin: all), your role, their quotas, what is in use,
    what waits, and their budget with this month's spending."""
    from .render import dump_json, table

    found = _face(store).projects()
    if as_json:
        dump_json(found, sys.stdout)
        return
    if not found:
        _say("you are in no project: ask a project admin to add you")
        return
    table([(p["name"], p["role"] or "-", str(p["members"]), _quota(p), _in_use(p), str(p["queued"]), _budget(p))
           for p in found], ("PROJECT", "ROLE", "MEMBERS", "QUOTA", "IN USE", "QUEUED", "BUDGET (THIS MONTH)"), sys.stdout)


def _quota(p: dict[str, Any]) -> str:
    parts = [f"{p[k]} {what}" for k, what in (("max_gpus", "GPUs"), ("max_cpus", "CPUs"), ("max_jobs", "jobs"))
             if p.get(k) is not None]
    return ", ".join(parts) or "-"


def _in_use(p: dict[str, Any]) -> str:
    use = p["in_use"]
    return f"{use['gpus']} GPUs, {use['cpus']} CPUs, {use['jobs']} jobs"


def _budget(p: dict[str, Any]) -> str:
    if p.get("budget") is None:
        return "-"
    from ..supervise.budget import used_of
    from ..store.teams import ProjectRecord

    record = ProjectRecord(**{k: p[k] for k in ProjectRecord.__dataclass_fields__})
    return f"{used_of(record, p['spent']):,.2f} of {p['budget']:g} {p['budget_unit']}"


@project_app.command("add")
def add_cmd(name: str = typer.Argument(..., help="The project's name (lower-case letters, digits, . _ -)."),
            store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Add a project (server admins)."""
    _face(store).project_add(name)
    _say(f"project {name} added; add people with: phalanx server project member add {name} USER --role member")


@project_app.command("rm")
def rm_cmd(name: str = typer.Argument(..., help="The project to remove."),
           store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Remove a project and its members (server admins). Its running jobs run on; its queued
    jobs are cancelled, saying why; its finished jobs stay."""
    done = _face(store).project_rm(name)
    cancelled = len(done["cancelled"])
    _say(f"project {name} removed" + (f"; {cancelled} queued job(s) cancelled" if cancelled else ""))


@project_app.command("set")
def set_cmd(
    name: str = typer.Argument(..., help="The project."),
    max_gpus: Optional[str] = typer.Option(None, "--max-gpus", help="GPUs its jobs may hold at once (none: no limit)."),
    max_cpus: Optional[str] = typer.Option(None, "--max-cpus", help="CPUs its jobs may hold at once (none: no limit)."),
    max_jobs: Optional[str] = typer.Option(None, "--max-jobs", help="Jobs it may run at once (none: no limit)."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Per calendar month: 500usd, 2000gpu-h, or none "
                                         "(server admins; money is priced with the prices setting)."),
    kueue_queue: Optional[str] = typer.Option(None, "--kueue-queue", help="Kueue LocalQueue its Kubernetes jobs go to "
                                              "(Kueue then enforces their quota)."),
    slurm_account: Optional[str] = typer.Option(None, "--slurm-account", help="SLURM account its SLURM jobs are "
                                                "charged to (SLURM then enforces their limits)."),
    slurm_qos: Optional[str] = typer.Option(None, "--slurm-qos", help="SLURM QOS of its SLURM jobs."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """Set a project's quotas (its admins) and budget (server admins), and which cluster queues
    enforce them; prints which engine enforces what."""
    limits = {k: v for k, v in (("max_gpus", max_gpus), ("max_cpus", max_cpus), ("max_jobs", max_jobs),
                                ("budget", budget), ("kueue_queue", kueue_queue), ("slurm_account", slurm_account),
                                ("slurm_qos", slurm_qos)) if v is not None}
    done = _face(store).project_set(name, limits)
    _say(f"project {name}: {_quota(done)}" + (f"; budget {done['budget']:g} {done['budget_unit']} a month"
                                               if done.get("budget") is not None else ""))
    for line in done["enforced_by"]:
        _say(f"  {line}")


@project_app.command("use")
def use_cmd(name: str = typer.Argument(..., help="The project your jobs go to when they name none."),
            store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Make a project your default on the server (--project and the job file's project: still win)."""
    _face(store).project_use(name)
    _say(f"your jobs go to project {name} unless they name another")


@member_app.command("list")
def member_list_cmd(project: str = typer.Argument(..., help="The project."),
                    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
                    as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Who is in a project, with which role."""
    from .render import ago, dump_json, table

    found = _face(store).members(project)
    if as_json:
        dump_json(found, sys.stdout)
        return
    table([(m["user_name"], m["role"], ago(m["added_at"])) for m in found], ("USER", "ROLE", "ADDED"), sys.stdout)


@member_app.command("add")
def member_add_cmd(project: str = typer.Argument(..., help="The project."),
                   user: str = typer.Argument(..., help="The user (phalanx server user list)."),
                   role: str = typer.Option("member", "--role", help="viewer (reads), member (also runs jobs and acts "
                                            "on their own) or admin (acts on all, manages members and quotas)."),
                   store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Add a user to a project (its admins)."""
    _face(store).member_set(project, user, role, new=True)
    _say(f"{user} is now {_a(role)} of project {project}")


@member_app.command("role")
def member_role_cmd(project: str = typer.Argument(..., help="The project."),
                    user: str = typer.Argument(..., help="One of its members."),
                    role: str = typer.Argument(..., help="viewer, member or admin."),
                    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Change a member's role (its admins)."""
    _face(store).member_set(project, user, role, new=False)
    _say(f"{user} is now {_a(role)} of project {project}")


@member_app.command("rm")
def member_rm_cmd(project: str = typer.Argument(..., help="The project."),
                  user: str = typer.Argument(..., help="One of its members."),
                  store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Remove a member (its admins). Their jobs stay in the project."""
    _face(store).member_rm(project, user)
    _say(f"{user} is no longer in project {project}")


def _a(role: str) -> str:
    return f"an {role}" if role[0] in "aeiou" else f"a {role}"


def events_cmd(
    since: Optional[str] = typer.Option(None, "--since", help="Only events since: 2h, 3d, 2025-03-01."),
    user: Optional[str] = typer.Option(None, "--user", help="Only what this user did."),
    project: Optional[str] = typer.Option(None, "--project", callback=project_scope,
                                          help="Only events of this project."),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000, help="At most this many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (one JSON object per line)."),
) -> None:
    """The audit log: who did what, when, from where, and how it ended (project admins: their
    projects; server admins: everything)."""
    from .face import face
    from .render import dump_json_stream, table

    found = face().events(since=since, user=user, project=project, limit=limit)
    if as_json:
        dump_json_stream(iter(found), sys.stdout)
        return
    if not found:
        _say("no events")
        return
    table([(_when(e["at"]), e["user"], e["address"] or "-", e["action"], e["target"] or "-", e["project"] or "-",
            _outcome(e)) for e in found], ("WHEN", "USER", "FROM", "ACTION", "TARGET", "PROJECT", "OUTCOME"), sys.stdout)


def _when(at: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _outcome(event: dict[str, Any]) -> str:
    detail = event.get("detail") or {}
    if event["outcome"] != "ok" and detail.get("message"):
        return f"{event['outcome']}: {detail['message']}"
    shown = {k: v for k, v in detail.items() if k != "message"}
    return event["outcome"] + (f" {_compact(shown)}" if shown else "")


def _compact(detail: dict[str, Any]) -> str:
    import json

    return json.dumps(detail, sort_keys=True, separators=(",", ":"))
