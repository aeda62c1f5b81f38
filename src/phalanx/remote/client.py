"""The HTTP client of a team server: the standard library's ``http.client`` (no import cost worth
measuring for ``ps``), one kept-alive connection, TLS verified against the system's CAs or the
one the login names, and every failure turned into one line naming the server and the fix:

- the server cannot be reached (refused, no such host, timed out): ``ServerUnreachable``;
- its TLS certificate is not trusted, or it does not speak TLS: ``ServerUnreachable``;
- the token is missing, wrong or revoked (401): ``NotAuthenticated``; another user's job or an
  admin's verb (403): ``NotAllowed``; the server's store is away (503, or a stream's error
  saying so): ``StoreUnavailable``, "try again"; anything else the server refused: its own
  error class, with its words (``api/wire.py``).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any, BinaryIO, Iterator, Sequence
from urllib.parse import quote, urlencode, urlsplit

from ..api.wire import PREFIX, raise_error
from ..errors import NotAuthenticated, PhalanxError, ServerUnreachable, StoreUnavailable, UsageError

TIMEOUT = 30.0  # connecting, and waiting for a byte of an answer that is not a stream
QUIET = 60.0  # a stream silent this long (no heartbeat: server/stream.HEARTBEAT is 10 s) is cut off


class Client:
    def __init__(self, url: str, token: str | None, ca: str | None = None, timeout: float = TIMEOUT,
                 project: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"'{url}' is not the URL of a phalanx server", "give it as https://HOST[:PORT]")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.token = token
        self.ca = ca
        self.timeout = timeout
        self.project = project  # --project: every call sees that project only (X-Phalanx-Project)
        self._host, self._port, self._tls = parts.hostname, parts.port, parts.scheme == "https"
        self._conn: http.client.HTTPConnection | None = None
        self._used = False  # the connection answered a request before (kept alive since)

    # -- the connection ----------------------------------------------------------------------------

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        if self._conn is not None and not fresh:
            return self._conn
        self.close()
        if self._tls:
            context = ssl.create_default_context(cafile=self.ca) if self.ca else ssl.create_default_context()
            self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=context)
        else:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._used = False

    def _send(self, method: str, path: str, params: Sequence[tuple[str, str]] = (), body: Any = None,
              data: BinaryIO | bytes | None = None, length: int | None = None) -> http.client.HTTPResponse:
        target = PREFIX + path + (("?" + urlencode(list(params))) if params else "")
        headers = {"Accept": "application/json", "User-Agent": "phalanx-cli"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.project:
            headers["X-Phalanx-Project"] = self.project
        payload: Any = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            payload = data
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(length if length is not None else len(data))  # type: ignore[arg-type]
        # A kept-alive connection the server closed meanwhile: a GET, PUT or DELETE is sent once
        # more on a new one; a POST (a submit) is never sent twice, so it gets a new one up front.
        fresh = method == "POST" and self._used
        for tries in (0, 1):
            conn = self._connection(fresh=fresh or tries > 0)
            try:
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
                self._used = True
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if tries or method == "POST" or not self._used:
                    raise self._unreachable(exc) from None
                if hasattr(payload, "seek"):
                    payload.seek(0)
            except ssl.SSLCertVerificationError as exc:
                self.close()
                raise ServerUnreachable(f"the TLS certificate of {self.url} is not trusted ({exc.verify_message})",
                                        "give the server's CA: phalanx login URL --ca-cert CA.pem (or PHALANX_CA_CERT)") from None
            except ssl.SSLError as exc:
                self.close()
                raise ServerUnreachable(f"no TLS connection to {self.url} ({exc.reason or exc})",
                                        "check the URL: http:// for a server without TLS, https:// with it") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise self._unreachable(exc) from None
        if response.status >= 400:
            self._fail(response)
        return response

    def _unreachable(self, exc: BaseException) -> PhalanxError:
        if isinstance(exc, socket.timeout):
            why = "no answer in time"
        elif isinstance(exc, http.client.BadStatusLine) and self._tls is False:
            why = "it did not answer HTTP (a TLS server? then use https://)"
        else:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return ServerUnreachable(f"cannot reach the phalanx server at {self.url}: {why}",
                                 "check the URL and that the server runs (phalanx login URL), or add --local "
                                 "to use this machine's own store")

    def _store_away(self) -> PhalanxError:
        """The server is up but its job store is not (a database restarting)."""
        return StoreUnavailable(f"the server's store is unavailable ({self.url})", "try again in a few seconds")

    def _fail(self, response: http.client.HTTPResponse) -> None:
        raw = response.read()
        try:
            body = json.loads(raw).get("error")
        except (ValueError, AttributeError):
            body = {"type": "PhalanxError", "message": raw.decode(errors="replace").strip()[:300] or
                    f"the server answered {response.status} {response.reason}", "hint": None}
        if response.status == 503 or (isinstance(body, dict) and body.get("type") == "StoreUnavailable"):
            raise self._store_away()
        if response.status == 401 or (response.status == 429 and isinstance(body, dict)):
            message = body.get("message", "not logged in") if isinstance(body, dict) else "not logged in"
            hint = body.get("hint") if response.status == 429 and isinstance(body, dict) else None
            raise NotAuthenticated(f"{message} ({self.url})",
                                   hint or f"log in again with: phalanx login {self.url} (or set PHALANX_TOKEN)")
        raise_error(body, response.status)

    # -- calls ----------------------------------------------------------------------------------------

    def call(self, method: str, path: str, params: Sequence[tuple[str, str]] = (), body: Any = None) -> Any:
        """One call; its result."""
        response = self._send(method, path, params, body)
        try:
            data = json.loads(response.read())
        except ValueError:
            raise PhalanxError(f"{self.url} answered something that is not JSON", "is it a phalanx server?") from None
        return data.get("result") if isinstance(data, dict) else None

    def lines(self, method: str, path: str, params: Sequence[tuple[str, str]] = (), body: Any = None,
              cut_hint: str = "try again; the job runs on: see phalanx ps") -> Iterator[dict[str, Any]]:
        """A streamed call (``server/stream.py``): its JSON lines as they come, heartbeats left
        out; an ``error`` line is raised. ``cut_hint``: what to do when the answer is cut off."""
        response = self._send(method, path, params, body)
        if self._conn is not None and self._conn.sock is not None:
            self._conn.sock.settimeout(QUIET)  # a quiet stream sends a heartbeat every 10 s
        try:
            while True:
                try:
                    raw = response.readline()
                except (socket.timeout, OSError) as exc:
                    raise ServerUnreachable(f"the connection to {self.url} went silent ({exc or 'no heartbeat'})",
                                            cut_hint) from None
                if not raw:
                    raise ServerUnreachable(f"the connection to {self.url} ended in the middle of an answer", cut_hint)
                if not raw.strip():
                    continue
                item = json.loads(raw)
                if "error" in item:
                    if isinstance(item["error"], dict) and item["error"].get("type") == "StoreUnavailable":
                        raise self._store_away()
                    raise_error(item["error"], 400)
                yield item
                if "result" in item:
                    return
        finally:
            if self._conn is not None and self._conn.sock is not None:
                self._conn.sock.settimeout(self.timeout)
            if not response.isclosed():
                self.close()  # left in the middle: the connection cannot be reused

    def put(self, path: str, params: Sequence[tuple[str, str]], data: BinaryIO, length: int) -> Any:
        response = self._send("PUT", path, params, data=data, length=length)
        return json.loads(response.read()).get("result")

    def raw(self, path: str, params: Sequence[tuple[str, str]] = ()) -> http.client.HTTPResponse:
        """A binary answer (a download's tar), to read to its end."""
        return self._send("GET", path, params)


def ref_path(kind: str, ref: str, tail: str = "") -> str:
    return f"/{kind}/{quote(ref, safe='')}{tail}"
