"""The job store: SQLite in WAL mode. No SQL outside this package."""

from .db import JobRecord, Store

__all__ = ["JobRecord", "Store"]
