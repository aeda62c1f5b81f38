"""One exception hierarchy. Every message says what happened and what to do next.

The CLI catches :class:`PhalanxError` at one boundary and prints ``error: <message>``
on one line, without a traceback (``--debug`` shows it), exiting with ``exit_code``.
"""

from __future__ import annotations

from typing import Any


class PhalanxError(Exception):
    """Base of every error phalanx raises on purpose.

    ``hint`` is the next step for the user; it is appended to the message.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class UsageError(PhalanxError):
    """The user asked for something malformed: bad flag value, missing script, bad job file."""

    exit_code = 2


class JobNotFound(UsageError):
    """No job matches the given id, id prefix or name."""


class Ambiguous(UsageError):
    """A name that stands for several things where the user must say which: ``choices`` are
    their rows (plain data: ``id``, ``name``, ``state``, ``created_at``, ``command``), so a
    person at a terminal can be asked and a script is shown the list."""

    def __init__(self, message: str, hint: str, choices: "list[dict[str, Any]]") -> None:
        self.choices = choices
        super().__init__(message, hint)


class BackendError(PhalanxError):
    """A backend could not plan, submit or observe a job."""


class NodesUnusable(BackendError):
    """Some nodes could not be used at all (a host that does not answer, or lacks phalanx):
    ``nodes`` maps each, by the name the backend knows it by, to why. The supervisor leaves
    them out and starts the attempt on others where the backend has spares."""

    def __init__(self, message: str, hint: str | None, nodes: dict[str, str]) -> None:
        self.nodes = dict(nodes)
        super().__init__(message, hint)


class StoreError(PhalanxError):
    """The job store is unreadable or from a newer phalanx."""


class StoreUnavailable(StoreError):
    """The job store's server (PostgreSQL) cannot be reached, or did not come back within the
    time the store retries for (a team server answers 503). The write that raised it was not made,
    unless the connection broke while its commit was answered (docs/store.md, "Faults"). The
    message names the host and database, never a password."""


class MissingDependency(PhalanxError):
    """An optional dependency (torch, jax, ...) is needed but not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"this needs the Python package '{module}', which is not installed",
            f"install it with: pip install 'phalanx[{extra}]'",
        )


class ContractError(PhalanxError):
    """A file that crosses a process or machine boundary does not match its model
    (``core/contracts.py``): written by another phalanx version, or edited."""


class DiskFull(PhalanxError):
    """A write failed for lack of space (ENOSPC, EDQUOT, SQLite's "database or disk is full"):
    ``what`` was being written under ``where``. Built by ``core/disk.py``."""

    def __init__(self, what: str, where: str, detail: str = "", hint: str | None = None) -> None:
        self.what, self.where = what, where
        super().__init__(f"disk full while writing {what} under {where}{detail}",
                         hint or "free some space there, or point PHALANX_HOME at a larger disk")


class NotAuthenticated(UsageError):
    """A team server did not accept who is asking: no token, a wrong or revoked one (HTTP 401)."""


class NotAllowed(UsageError):
    """The acting user may not do this: another user's job, an admin's verb (HTTP 403)."""


class OverBudget(NotAllowed):
    """A job whose estimated cost would cross its project's monthly budget (refused at submit)."""


class ServerUnreachable(UsageError):
    """The team server could not be reached, or its TLS certificate was not trusted."""


class TooLarge(UsageError):
    """A request to a team server over its size limit (HTTP 413)."""


class TrackerError(PhalanxError):
    """An experiment tracker (MLflow, TensorBoard, W&B) could not take what phalanx sent. Never
    fails a job: the exporter (``track/``) keeps the points and says so in ``phalanx status``."""


class TrackerUnavailable(TrackerError):
    """Down, unreachable, overloaded or refusing our credentials: the same points are sent again
    later, with backoff."""


class TrackerRefused(TrackerError):
    """The tracker answered that these points (or this request) are invalid: sending them again
    would fail the same way, so they are counted as dropped."""


class SecretError(UsageError):
    """A secret that does not exist, may not be read (a store whose file is open to others), or a
    name that cannot be one. Exit 2: nothing is created (``phalanx.secrets``)."""
