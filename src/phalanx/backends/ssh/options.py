"""The ssh backend's options (see ``backends/options.py``): a module that imports nothing else,
so ``phalanx run --help`` lists them without importing the backend."""

from __future__ import annotations

from ..options import BackendOption

OPTIONS = (
    BackendOption("hosts", str, None, "Comma-separated ssh hosts, in node-rank order (node 0 hosts the rendezvous)."),
    BackendOption("hostfile", str, None, "A file with one host per line (`host [slots=N]`)."),
    BackendOption("shared_fs", bool, False, "Hosts share this machine's filesystem: no code shipping, no file mirroring."),
    BackendOption("remote_python", str, None, "Python on the hosts (default: this interpreter's path)."),
    BackendOption("remote_home", str, "~/.phalanx/remote", "Where jobs live on the hosts (without --shared-fs)."),
    BackendOption("ssh_config", str, None, "An ssh config file (ssh -F); default: the user's ~/.ssh/config."),
)
