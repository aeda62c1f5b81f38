"""``phalanx server``: bind, check what must hold before serving a team, and serve until stopped.

- The store is the one ``--store`` names (``PHALANX_STORE``, also for the supervisors the
  server starts, which inherit it); the home (``PHALANX_HOME``) holds the job directories.
- Off loopback, plain HTTP would carry tokens and logs in clear text: the server refuses to
  start unless given a certificate (``--tls-cert``/``--tls-key``), or told with
  ``--insecure-http`` that a TLS proxy stands in front.
- At start, what submits killed half-way left is removed (``shipping.sweep_orphans``,
  ``sweep_scratch``); jobs and their supervisors live on their own. The server is one replica
  (``replica.py``): it leases the jobs it starts and adopts those whose lease expired (a replica
  that died, or this server before a restart).
- While it serves, a thread moves the projects' queues every few seconds (``admission.advance``:
  capacity a vanished supervisor held is given back) and lets the audit log's retention expire
  old events; a job's own end moves its queue at once, this is the safety net.
- A request does not wait for a store that is away: the server's own store calls give up after
  ``REQUEST_RETRY`` seconds (503 with Retry-After; ``calls.error``), from a pool of ``POOL_SIZE``, while the supervisors it
  starts keep retrying for the ``store_retry`` setting (their writes must not be lost).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..errors import UsageError


def check_tls(cert: Path | None, key: Path | None) -> None:
    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together", "give both (the certificate and its private key)")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag} {path}: no such file", "give the PEM file's path")
    if cert is not None and key is not None:
        import ssl

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(str(cert), str(key))
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"cannot use {cert} with {key}: {getattr(exc, 'reason', None) or exc}",
                             "give a PEM certificate and the private key that belongs to it") from None


REQUEST_RETRY = 3.0
# Connections of the server's PostgreSQL pool: requests run in up to 64 threads (calls.LIMITER),
# and a request that waits longer than REQUEST_RETRY for one is answered 503.
POOL_SIZE = 16


def serve(host: str, port: int, store: str | None, cert: Path | None, key: Path | None, insecure_http: bool,
          announce: Callable[[str], None], warn: Callable[[str], None], lease_ttl: float = 30.0,
          secrets_key: Path | None = None) -> None:
    """Serve until interrupted. Blocking. ``secrets_key``: the file of the key the users'
    secrets are encrypted with (else ``PHALANX_SECRETS_KEY_FILE``; neither: it keeps none)."""
    from ..web.server import bind, is_loopback
    from ..web.guard import resolve

    if port < 0 or port > 65535:
        raise UsageError(f"invalid --port {port}", "use 0..65535 (0 = any free port)")
    check_tls(cert, key)
    resolve(host)
    tls = cert is not None
    if not tls and not is_loopback(host) and not insecure_http:
        raise UsageError(f"refusing to serve on {host} over plain HTTP: API tokens and job logs would cross the "
                         "network in clear text", "give --tls-cert and --tls-key, or, behind a TLS proxy, add --insecure-http")
    if store:
        os.environ["PHALANX_STORE"] = store  # this process and every supervisor it starts
    from ..secrets import server as kept

    if secrets_key is not None or os.environ.get(kept.KEY_ENV):
        kept.load_key(secrets_key)  # a key that cannot be used stops the server now, not a submit later
    # This process and every supervisor it starts: the key file's path (never the key), or empty
    # (this server keeps no secrets): either way its jobs read no one's own store (``for_spec``).
    os.environ[kept.KEY_ENV] = str(Path(secrets_key).resolve()) if secrets_key is not None \
        else os.environ.get(kept.KEY_ENV, "")
    from ..api import query
    from .app import create_app
    from ..store import Store
    from ..store.db import is_url
    from .replica import Replica
    from .shipping import sweep_orphans, sweep_scratch

    where = os.environ.get("PHALANX_STORE", "")
    if is_url(where):  # the first opener's pool serves every request of this process
        Store(where, pool_size=POOL_SIZE)
    opened = query.open_store()
    opened.engine.answer_within(REQUEST_RETRY)
    if opened.users.count() == 0:
        warn("phalanx server: no users yet, so nobody can log in: add one with "
             "phalanx server user add NAME --admin (same --store)")
    sweep_orphans(query.home(), opened)
    sweep_scratch(query.home())
    replica = Replica(lease_ttl, warn)
    replica.start()
    import uvicorn

    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    announce(f"{'https' if tls else 'http'}://{shown}:{bound}/")
    config = uvicorn.Config(create_app(), log_level="warning", access_log=False, lifespan="off",
                            ssl_certfile=str(cert) if cert else None, ssl_keyfile=str(key) if key else None,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    keeper = Housekeeping(warn)
    keeper.start()
    try:
        server.run(sockets=[sock])
    finally:
        keeper.stop()
        replica.close()
        sock.close()


class Housekeeping:
    """The queues moved and old audit events expired, every ``every`` seconds, in a thread."""

    every = 5.0

    def __init__(self, warn: Callable[[str], None]) -> None:
        import threading

        self.warn = warn
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="phalanx-housekeeping", daemon=True)
        self.told = False

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()

    def _run(self) -> None:
        while not self.done.wait(self.every):
            try:
                self.once()
            except Exception as exc:  # noqa: BLE001 - the store may be away a while: say so once, go on
                if not self.told:
                    self.warn(f"phalanx server: housekeeping failed ({type(exc).__name__}: {exc}); retrying")
                    self.told = True

    def once(self) -> None:
        import time

        from .. import config
        from ..api import query
        from ..store import audit, tx
        from ..supervise import admission

        store = query.open_store()
        admission.advance(store)
        days = float(config.get("audit_retention_days") or 0)
        if days > 0:
            tx.atomic(store, lambda t: audit.expire(t, time.time() - days * 86400))
        self.told = False
