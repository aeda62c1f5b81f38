"""What a PostgreSQL error means to the store: run the call again (busy, gone) or say what to
check (a refused login, no such database or host), in words that never hold a password."""

from __future__ import annotations

import os
from typing import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import StoreError, StoreUnavailable
from .engine import StoreConflict

GONE = ("57P01", "57P02", "57P03")  # admin shutdown, crash shutdown, cannot connect now
_AUTH = ("authentication failed", "no password supplied", "pg_hba.conf", "role \"")


def redact(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{hosts}" if user else hosts
    query = "&".join(p for p in parts.query.split("&") if p and p.split("=", 1)[0].lower() != "password")
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def secrets_of(url: str) -> list[str]:
    """Every spelling of the passwords this store may use, to scrub from any message."""
    found = []
    netloc = urlsplit(url).netloc
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
    found += [v for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True) if k.lower() == "password"]
    found.append(os.environ.get("PGPASSWORD", ""))
    return sorted({s for raw in found for s in (raw, unquote(raw)) if s}, key=len, reverse=True)


def kind_of(exc: Exception) -> str:
    """What a psycopg error means for a retry: busy, gone, auth, no database, conflict or other."""
    import psycopg
    from psycopg_pool import PoolTimeout

    state = getattr(exc, "sqlstate", None) or ""
    said = str(exc)
    if state in ("40001", "40P01"):
        return "busy"
    # libpq reports a refused connection without a SQLSTATE: its words tell which refusal.
    if state.startswith("28") or (not state and any(w in said for w in _AUTH)):
        return "auth"
    if state == "3D000" or (not state and "database" in said and "does not exist" in said):
        return "no database"
    if not state and ("failed to resolve host" in said or "could not translate host name" in said):
        return "unknown host"
    if isinstance(exc, psycopg.IntegrityError):
        return "conflict"
    if isinstance(exc, PoolTimeout) or (isinstance(exc, psycopg.OperationalError)
                                        and (not state or state.startswith("08") or state in GONE)):
        return "gone"
    if isinstance(exc, psycopg.InterfaceError) and "closed" in str(exc):
        return "gone"
    return "other"


def describe(exc: Exception, kind: str, where: str, retry_for: float, scrub: Callable[[str], str]) -> Exception:
    """The error a caller sees for ``exc`` of ``kind`` (``kind_of``): one line naming the store
    by its URL without the password (``where``), the driver's words scrubbed; ``exc`` itself
    when it is none of the kinds the store explains."""
    said = scrub(" ".join(str(exc).split()))
    if kind == "gone":
        return StoreUnavailable(f"cannot reach the job store {where}: {said}",
                                f"check that PostgreSQL runs there and is reachable (phalanx retried for "
                                f"{retry_for:g} s; setting store_retry)")
    if kind == "unknown host":
        return StoreError(f"cannot reach the job store {where}: {said}", "check the host name in the URL")
    if kind == "auth":
        return StoreError(f"the job store {where} refused the login: {said}",
                          "check the user and password: in the URL, PGPASSWORD, a passfile (~/.pgpass, "
                          "PGPASSFILE) or a service (PGSERVICE)")
    if kind == "no database":
        return StoreError(f"the job store {where} does not exist: {said}",
                          "create it (createdb NAME) or fix the database name in the URL")
    if kind == "busy":
        return StoreError(f"the job store {where} stayed busy: {said}", "try again")
    if kind == "conflict":
        return StoreConflict(f"{said} in the job store {where}", "this id is taken")
    return exc
