"""``/api/v1``: projects, members, limits and the audit log, as the request's user (the face's
team part, ``api/teamface.py``; who may do what is checked there).

    GET    /projects                          the projects I am in (an admin: all)
    POST   /projects                          {"name"}: add one (server admins)
    DELETE /projects/{name}                   remove it (server admins)
    PATCH  /projects/{name}                   {"max_gpus", "max_cpus", "max_jobs", "budget", "kueue_queue",
                                              "slurm_account", "slurm_qos"}: change limits
    POST   /projects/{name}/use               make it my default project
    GET    /projects/{name}/members           its members and their roles
    PUT    /projects/{name}/members/{user}    {"role", "new"}: add a member, or change their role
    DELETE /projects/{name}/members/{user}    remove a member
    GET    /events?since&user&project&before&limit   the audit log (project and server admins)
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import schema
from .calls import answer, body, number, text

LIMIT: schema.Schema = {"type": ["integer", "string", "null"], "max": 64}
PROJECT = schema.obj(("name",), name=schema.STRING)
LIMITS = schema.obj((), max_gpus=LIMIT, max_cpus=LIMIT, max_jobs=LIMIT, budget=schema.OPT_STRING,
                    kueue_queue=schema.OPT_STRING, slurm_account=schema.OPT_STRING, slurm_qos=schema.OPT_STRING)
MEMBER = schema.obj(("role",), role=schema.STRING, new=schema.BOOL)


def _name(request: Request) -> str:
    return str(request.path_params["name"])


async def projects(request: Request) -> Response:
    return await answer(request, lambda face: face.projects())


async def add(request: Request) -> Response:
    given = await body(request, PROJECT)
    return await answer(request, lambda face: face.project_add(given["name"]), 201)


async def remove(request: Request) -> Response:
    return await answer(request, lambda face: face.project_rm(_name(request)))


async def change(request: Request) -> Response:
    given = await body(request, LIMITS)
    limits = {k: v for k, v in given.items() if v is not None}
    return await answer(request, lambda face: face.project_set(_name(request), limits))


async def use(request: Request) -> Response:
    return await answer(request, lambda face: face.project_use(_name(request)))


async def members(request: Request) -> Response:
    return await answer(request, lambda face: face.members(_name(request)))


async def set_member(request: Request) -> Response:
    given = await body(request, MEMBER)
    user = str(request.path_params["user"])
    return await answer(request, lambda face: face.member_set(_name(request), user, given["role"],
                                                              bool(given.get("new", True))))


async def remove_member(request: Request) -> Response:
    user = str(request.path_params["user"])
    return await answer(request, lambda face: face.member_rm(_name(request), user))


async def events(request: Request) -> Response:
    args: dict[str, Any] = {"since": text(request, "since"), "user": text(request, "user"),
                            "project": text(request, "project"), "before": number(request, "before")}
    limit = number(request, "limit") or 100
    return await answer(request, lambda face: face.events(limit=limit, **args))


def routes(prefix: str) -> list[Route]:
    return [
        Route(f"{prefix}/projects", projects, methods=["GET"]),
        Route(f"{prefix}/projects", add, methods=["POST"]),
        Route(f"{prefix}/projects/{{name}}", remove, methods=["DELETE"]),
        Route(f"{prefix}/projects/{{name}}", change, methods=["PATCH"]),
        Route(f"{prefix}/projects/{{name}}/use", use, methods=["POST"]),
        Route(f"{prefix}/projects/{{name}}/members", members, methods=["GET"]),
        Route(f"{prefix}/projects/{{name}}/members/{{user}}", set_member, methods=["PUT"]),
        Route(f"{prefix}/projects/{{name}}/members/{{user}}", remove_member, methods=["DELETE"]),
        Route(f"{prefix}/events", events, methods=["GET"]),
    ]
