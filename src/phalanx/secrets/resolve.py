"""A job's secret names -> their values, at the last moment: called by the backend that starts
the ranks (``Backend.secret_env``), once per start, so a retry gets the value as it is now and no
record ever holds it. ``check`` reads every one before a job is recorded, so a name that does not
exist fails the submit with nothing created."""

from __future__ import annotations

from typing import Mapping

from .base import SecretStore


def resolve(refs: Mapping[str, str], store: SecretStore | None = None) -> dict[str, str]:
    """``{env name: secret name}`` -> ``{env name: value}``. Raises SecretError (exit 2)."""
    if not refs:
        return {}
    if store is None:
        from .local import open_store

        store = open_store()
    return {env: store.get(name) for env, name in refs.items()}


def check(refs: Mapping[str, str], store: SecretStore | None = None) -> None:
    """Every secret of ``refs`` exists and may be read; the values are dropped at once."""
    resolve(refs, store)
