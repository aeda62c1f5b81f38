"""torch's c10d rendezvous, with its waits sized for the job's node count.

torch's dynamic rendezvous (``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``,
torch 2.13) waits in three places, sized for thousands of nodes sharing one store:

- before the first round, each node sleeps a random 0-0.3 s, to spread the nodes' first writes;
- a node waiting for others to join polls the shared state once a second (``_delay(1)``),
- and serves a poll from a copy of the state up to a second old (``_BackendRendezvousStateHolder``'s
  ``cache_duration``), so the last node's arrival is seen up to a second late.

Every phalanx attempt is a new rendezvous (a fresh store on a new port), so all are paid on
every retry: on one node about 0.15 s for the spread alone, on two nodes a whole second of
polling, more than the rest of a restart together. Here they are scaled by the node count: the
spread is 3 ms per node (0.3 s from 100 nodes up), the poll and the copy's age 20 ms plus 10 ms
per node (1 s from 98 nodes up), so the store sees at most about a hundred reads a second
whatever the size, and a small job is not made to wait for the traffic of a large one. Only
while ``elastic_launch`` runs in this agent; what a torch lacks of these is left alone.

Each step of the rendezvous names itself for torch's event log through ``get_method_name``, which
calls ``inspect.stack()`` (every frame of the stack, with its source line read) twice, and is
asked even when no event handler is set (the default): tens of milliseconds per step on a loaded
machine, a tenth of a second or more per rendezvous. The same name comes from
``sys._getframe(depth)``, without the source lines.

When an attempt ends, torch closes its rendezvous (``DynamicRendezvousHandler.shutdown``: a few
store round trips, 20-130 ms on a loaded machine) before ``elastic_launch`` returns. A kept agent
(more attempts follow in its process) closes it in a thread instead (``close_behind``): the other
nodes still learn the rendezvous is closed, while this node's report, and the next attempt's new
rendezvous on a new port, do not wait for it.

A third wait is the store's: a node that connects before node 0 listens is turned away and
retries after a backoff of about a second (torch's TCPStore client, in C++). On a retry every
kept agent starts at once and node 0 opens the new store only as its rendezvous begins, so the
others would pay that second nearly every time: ``wait_for_host`` lets them connect only once
node 0 listens (a TCP connect every 10 ms, which the store server takes and drops as it does
any client's).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

SPREAD_PER_NODE = 0.003
POLL_BASE, POLL_PER_NODE = 0.02, 0.01


def poll_interval(nnodes: int) -> float:
    return min(1.0, POLL_BASE + POLL_PER_NODE * max(1, nnodes))


def spread(nnodes: int) -> float:
    return min(0.3, SPREAD_PER_NODE * max(0, nnodes - 1))


@contextmanager
def tuned(nnodes: int, close_behind: bool = False) -> Iterator[None]:
    """While in this block, torch's rendezvous waits as long as ``nnodes`` nodes need and names
    its steps cheaply; with ``close_behind`` (a kept agent, whose process lives on) its close does
    not hold up the end."""
    module: Any
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as module
    except ImportError:
        module = None
    original = getattr(module, "_delay", None)
    holder = getattr(module, "_BackendRendezvousStateHolder", None)
    if module is None or original is None:
        yield
        return
    init = getattr(holder, "__init__", None)

    def delay(seconds: Any) -> None:
        if isinstance(seconds, tuple):  # the spread before the first round: (low, high)
            low, high = seconds
            seconds = (min(low, spread(nnodes)), min(high, spread(nnodes)))
            if seconds[1] <= 0:
                return
        elif seconds == 1:  # the poll while waiting for the other nodes
            seconds = poll_interval(nnodes)
        original(seconds=seconds)

    def fresher(self: Any, backend: Any, settings: Any, cache_duration: float = 1) -> None:
        assert init is not None
        init(self, backend, settings, min(cache_duration, poll_interval(nnodes)))

    naming = getattr(module, "get_method_name", None)
    handler = getattr(module, "DynamicRendezvousHandler", None) if close_behind else None
    shutdown = getattr(handler, "shutdown", None)

    def closing_behind(self: Any) -> bool:
        assert shutdown is not None
        threading.Thread(target=_quietly, args=(shutdown, self), name="phalanx-rendezvous-close", daemon=True).start()
        return True

    module._delay = delay
    if naming is not None:
        module.get_method_name = method_name
    if holder is not None and init is not None:
        holder.__init__ = fresher
    if handler is not None and shutdown is not None:
        handler.shutdown = closing_behind
    try:
        yield
    finally:
        module._delay = original
        if naming is not None:
            module.get_method_name = naming
        if holder is not None and init is not None:
            holder.__init__ = init
        if handler is not None and shutdown is not None:
            handler.shutdown = shutdown


def method_name(depth: int = 2) -> str:
    """``dynamic_rendezvous.get_method_name``'s answer (the name of the function ``depth`` frames
    up from it), read from the frame instead of ``inspect.stack()``."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def _quietly(shutdown: Any, handler: Any) -> None:
    try:
        shutdown(handler)
    except Exception:  # noqa: BLE001 - node 0's store may be gone already: nobody is left to tell
        pass


# How long a non-host node waits for node 0 to listen before connecting anyway (torch then retries
# on its own). The agent's ``--rdzv-wait`` sets it: a Kubernetes pod starts its agent before node
# 0's name resolves, and waits as long as it waits for that name.
HOST_WAIT_S = 10.0


def wait_for_host(endpoint: str, timeout: float | None = None) -> bool:
    """Block until ``HOST:PORT`` accepts a connection (True), or ``timeout`` passes (False: the
    rendezvous then connects as it would have, with torch's own retries)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        return False
    deadline = time.monotonic() + (HOST_WAIT_S if timeout is None else timeout)
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
