"""What the ssh backend copies to its hosts before an attempt, and how a host receives it.

Pure apart from ``Shipment.digest`` (which lists the local files): the plan lists the
shipments (``shipments``), ``SshBackend.ship`` sends them.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import secrets
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from ...core.paths import ChannelCachePaths, HomePaths, JobPaths
from ...core.spec import Channel, JobSpec
from ...storage.channels import is_single_file


@dataclass(frozen=True)
class Shipment:
    """A local directory (or file) copied to a directory on every host."""

    what: str  # for messages
    local: Path | None  # None (or missing): the remote directory is made empty
    remote: str  # a directory on the hosts; a leading ~ is the home there
    replace: bool = True  # the remote directory becomes exactly this; else it is extracted over
    marker: str | None = None  # a file on the hosts recording what was sent, so it is not sent twice
    follow_links: bool = False  # send what links point at (data), not the links (the code's links to .venv)
    # A local directory without files counts as none (the remote one is emptied): the local
    # state is the truth, and an emptied one (--clean-state) empties the hosts' copies.
    empty_as_none: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "local": None if self.local is None else str(self.local)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Shipment":
        return cls(**{**data, "local": None if data.get("local") is None else Path(data["local"])})

    def source(self) -> Path | None:
        """What to send now: the local path, or None when there is nothing (the remote is emptied)."""
        local = self.local if self.local is not None and self.local.exists() else None
        if local is not None and self.empty_as_none and not any(p.is_file() for p in local.rglob("*")):
            return None
        return local

    def digest(self) -> str | None:
        """What the marker records: a digest of the local listing (paths, sizes, mtimes)."""
        if self.marker is None:
            return None
        h = hashlib.sha256()
        if self.local is not None and self.local.is_file():
            st = self.local.stat()
            h.update(os.fsencode(f"{self.local.name}\0{st.st_size}\0{st.st_mtime_ns}\n"))
        elif self.local is not None and self.local.is_dir():
            for path in sorted(self.local.rglob("*")):
                if path.is_file():
                    st = path.stat()
                    h.update(os.fsencode(f"{path.relative_to(self.local).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n"))
        return h.hexdigest()

    def tar_argv(self, local: Path) -> list[str]:
        """The local ``tar -c`` whose output the remote ``command`` unpacks."""
        cwd, member = (local.parent, local.name) if local.is_file() else (local, ".")
        return ["tar", "-cf", "-", *(["-h"] if self.follow_links else []), "-C", str(cwd), member]

    def command(self, digest: str | None, has_data: bool) -> str:
        """The remote shell command that receives the tar stream (on stdin when ``has_data``)."""
        target = remote_path(self.remote)
        if not self.replace:
            return f"mkdir -p {target} && tar -xf - -C {target}"
        # Unpacked beside it, then swapped in: a copy cut off leaves no half-filled directory.
        # Hosts may share their home (NFS) without --shared-fs: each copy has names of its own,
        # and one that finds the directory swapped in by another host's copy (the same files) is
        # done; a third copy may be swapping that one out meanwhile: wait for its own to land.
        parent, name = posixpath.split(self.remote.rstrip("/"))
        token = secrets.token_hex(4)
        incoming = remote_path(posixpath.join(parent, f".{name}.incoming-{token}"))
        old = remote_path(posixpath.join(parent, f".{name}.old-{token}"))
        steps = [f"rm -f {remote_path(self.marker)}"] if self.marker else []
        steps.append(f"mkdir -p {incoming}")
        if has_data:
            steps.append(f"tar -xf - -C {incoming}")
        steps += [f"{{ mv {target} {old} 2>/dev/null || true; }}",
                  f"{{ mv -T {incoming} {target} 2>/dev/null || {{ n=0; until test -d {target}; do n=$((n + 1)); "
                  f"test $n -le 5 || break; sleep 1; done; test $n -le 5; }}; }}",
                  f"rm -rf {incoming} {old}"]
        if self.marker:
            steps.append(f"printf %s {shlex.quote(json.dumps({'digest': digest}))} > {remote_path(self.marker)}")
        return " && ".join(steps)


def shipments(spec: JobSpec, home: HomePaths, paths: JobPaths, remote_home: HomePaths, remote: JobPaths,
              single_files: frozenset[str] = frozenset()) -> list[Shipment]:
    """What goes to every host before an attempt (without a shared filesystem). Pure:
    ``single_files`` names the inputs whose local source is one file (``SshFacts``)."""
    items = [
        Shipment("the code", paths.code_dir, str(remote.code_dir), replace=False),
        # The local state is the truth: a stale directory on a host (an older run of this
        # name) must not win, and an empty one (--clean-state) empties the host's.
        Shipment("the state directory", home.state_dir(spec.state_key), str(remote_home.state_dir(spec.state_key)), empty_as_none=True),
    ]
    for channel in spec.channels:
        cache, _ = channel_copy(remote_home, channel, channel.name in single_files)
        items.append(Shipment(f"input '{channel.name}'", home.channel_path(channel), str(cache.data),
                              marker=str(cache.manifest), follow_links=True))
    return items


def channel_copy(remote_home: HomePaths, channel: Channel, single_file: bool | None = None) -> tuple[ChannelCachePaths, str]:
    """Where hosts keep their copy of a staged input: the cache entry in the remote home (the
    same key as the local one), and the path the job reads (a single local file lies inside).
    ``single_file``: whether the local source is one file (None: look now)."""
    cache = remote_home.channel_cache(channel.source, channel.extract)
    if single_file is None:
        single_file = is_single_file(channel)
    if single_file:
        return cache, str(cache.data / Path(channel.source).name)
    return cache, str(cache.data)


def remote_path(path: str) -> str:
    """Quote a remote path for the remote shell, letting a leading ~ expand to the home there."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:])
    return shlex.quote(path)
