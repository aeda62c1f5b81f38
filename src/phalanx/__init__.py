"""phalanx: run an existing training script distributed, with one command and no change to it.

The public API is imported lazily so that ``phalanx --help`` and worker start-up stay fast.
"""

from __future__ import annotations

__all__ = [
    "JobSpec",
    "Resources",
    "Entrypoint",
    "EntrypointKind",
    "Framework",
    "Spawn",
    "JobState",
    "PhalanxError",
    "UsageError",
    "build_spec",
    "RunOptions",
    "run",
    "submit_detached",
    "get_job",
    "list_jobs",
    "stop",
    "wait",
    "plan_job",
    "face",
]

_WHERE = {
    "JobSpec": "core.spec",
    "Resources": "core.spec",
    "Entrypoint": "core.spec",
    "EntrypointKind": "core.spec",
    "Framework": "core.spec",
    "Spawn": "core.spec",
    "JobState": "core.state",
    "PhalanxError": "errors",
    "UsageError": "errors",
    "build_spec": "jobfile",
    "RunOptions": "jobfile",
    "run": "api.jobs",
    "submit_detached": "api.jobs",
    "get_job": "api.query",
    "list_jobs": "api.query",
    "stop": "api.jobs",
    "wait": "api.jobs",
    "plan_job": "api.jobs",
    "face": "cli.face",  # every verb and view: a team server's when logged in (phalanx login), else this machine's
}


def __getattr__(name: str) -> object:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'phalanx' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(__all__)
