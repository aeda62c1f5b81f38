"""Storage URIs: validated up front, so a typo fails before anything starts."""

from __future__ import annotations

from ..errors import UsageError

KNOWN = ("file", "s3", "gs", "gcs", "az", "abfs", "hdfs", "memory")


def validate_uri(uri: str, what: str, extra_schemes: tuple[str, ...] = ()) -> str:
    """A local path or ``scheme://...`` with a scheme fsspec knows. Returns the URI (paths made absolute)."""
    import os

    if "://" not in uri:
        return os.path.abspath(os.path.expanduser(uri))
    scheme, _, rest = uri.partition("://")
    known = KNOWN + extra_schemes
    if scheme not in known:
        raise UsageError(f"{what} '{uri}' has an unknown scheme '{scheme}'", f"use a path or one of: {', '.join(s + '://' for s in known)}")
    if not rest.strip("/"):
        raise UsageError(f"{what} '{uri}' has no bucket or path", f"for example {scheme}://bucket/prefix")
    return uri
