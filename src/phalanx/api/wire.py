"""The face over HTTP: what a team server (``phalanx.server``) and its client (``phalanx.remote``)
agree on besides the routes themselves: the API's version, how an error travels, and how the
arguments of a listing travel.

Versioning: every route is under ``/api/v1/``. Within v1, fields are only ever added (a client
ignores keys it does not know; a server gives unknown request keys a 400 naming them); anything
else is ``/api/v2/``, served beside v1 for a while. ``GET /api/v1/whoami`` says the server's
phalanx version, and a client whose version differs says so once.

An error is ``{"error": {"type", "message", "hint", "exit_code"}}`` with an HTTP status that
says its kind (400 usage, 401 who are you, 403 not yours, 404 no such job, 409 cannot now, 413
too large, 429 too many failed logins, 500 a bug, 503 the store is away); the client raises the
same error class with the same words, so a remote command fails exactly as a local one does.
"""

from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import PhalanxError

VERSION = "v1"
PREFIX = f"/api/{VERSION}"
# A 503 (the server's store is away) says how long to wait before asking again (Retry-After):
# about what a PostgreSQL restart takes. ``/healthz`` says the same to a load balancer.
RETRY_AFTER = "5"

# name -> class of the errors a client re-raises as themselves (anything else: PhalanxError
# with the exit code the server gave).
_CLASSES: dict[str, type[PhalanxError]] = {
    cls.__name__: cls for cls in (
        errors.PhalanxError, errors.UsageError, errors.JobNotFound, errors.BackendError, errors.StoreError,
        errors.ContractError, errors.NotAuthenticated, errors.NotAllowed, errors.OverBudget, errors.ServerUnreachable,
        errors.TooLarge,
    )
}


def status_of(exc: PhalanxError) -> int:
    if isinstance(exc, errors.NotAuthenticated):
        return 401
    if isinstance(exc, errors.NotAllowed):
        return 403
    if isinstance(exc, errors.TooLarge):
        return 413
    if isinstance(exc, errors.JobNotFound):
        return 404
    if isinstance(exc, errors.UsageError):
        return 400
    if type(exc).__name__ == "StoreUnavailable":  # the PostgreSQL engine's: the database is away
        return 503
    return 409


def error_body(exc: PhalanxError) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}


def raise_error(body: Any, status: int) -> None:
    """Raise what ``error_body`` describes (a malformed one as a PhalanxError naming the status)."""
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        raise PhalanxError(f"the server answered {status} without saying why", "see the server's log")
    cls = _CLASSES.get(str(body.get("type")), PhalanxError)
    exc = cls.__new__(cls)
    PhalanxError.__init__(exc, body["message"], body.get("hint") if isinstance(body.get("hint"), str) else None)
    code = body.get("exit_code")
    if isinstance(code, int) and code != exc.exit_code:
        exc.exit_code = code  # e.g. wait's timeout (124)
    raise exc


# -- listings ------------------------------------------------------------------------------------

PS_MULTI = ("states", "tags", "columns")  # repeated query parameters
PS_FLAGS = ("all", "wide", "mine")
PS_TEXT = ("name", "backend", "since", "search", "sort", "user", "project")


def ps_params(request: Any) -> list[tuple[str, str]]:
    """A ``PsRequest`` as query parameters."""
    out: list[tuple[str, str]] = []
    for key in PS_FLAGS:
        if getattr(request, key):
            out.append((key, "1"))
    for key in PS_TEXT:
        value = getattr(request, key)
        if value is not None:
            out.append((key, str(value)))
    for key in PS_MULTI:
        out.extend((key, str(v)) for v in getattr(request, key))
    if request.limit is not None:
        out.append(("limit", str(request.limit)))
    return out
