"""The SSH backend: one node agent per host, started over ssh.

``phalanx run --backend ssh --hosts gpu1,gpu2 -n 2x8 train.py``. The OpenSSH client does the
connecting, so the user's ``~/.ssh/config`` (aliases, ProxyJump, keys, ControlMaster) applies
exactly as in their terminal. Per host, ``python -m phalanx.launch.remote`` starts the agent
and mirrors the node's files back into the local job directory (logs, metrics, results), so
``logs``, ``status`` and ``metrics`` work as for local jobs. Closing the connection stops the
node: nothing is left running on a host, and nothing is ever killed by name.

Before anything starts, a preflight reaches every host, checks that Python, torch and phalanx
match this machine's (the two ends of a node's link must speak the same frames), and that the
rendezvous port is free on the first host; it names the host that failed and why.

Without ``--shared-fs`` each host keeps its own copy of the job under ``--remote-home``
(``~/.phalanx/remote``, laid out like ``$PHALANX_HOME``), and the local files stay the truth:

- before every attempt, in parallel with the preflight, the code snapshot, the local state
  directory (which replaces the host's: an emptied or ``--clean-state`` one empties it) and
  every staged input channel (sent again only when its files changed) go to every host
  (``ship.py``);
- while the attempt runs and at its end, every node (node 0 is not special) mirrors its
  attempt files and what its ranks write into the state and output directories back into
  the local ones (``node.py``, :mod:`phalanx.launch.frames`), so ``--state`` uploads,
  ``phalanx resume`` and ``--output`` uploads work from the local copies as for local jobs.

Modules: ``backend.py`` (facts, the pure plan, start, preflight, copying), ``options.py`` (its
options, read by ``phalanx run --help`` without importing the rest), ``ship.py`` (what is copied
and how a host receives it), ``node.py`` (one node's session). This package imports them on first
use, so reading ``options`` imports nothing else.
"""

from __future__ import annotations

from ...core.lazy import exports

_WHERE = {
    "PREFLIGHT": "backend", "SshBackend": "backend", "SshFacts": "backend", "parse_hosts": "backend",
    "PROTOCOL": "backend", "Shipment": "ship", "channel_copy": "ship", "remote_path": "ship", "shipments": "ship",
}
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
