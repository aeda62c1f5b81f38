"""``/metrics``: what a Prometheus server scrapes (its text format, version 0.0.4): jobs by
state and the queue (read from the store at each scrape, so every replica says the same), and
this replica's request latency by route (a histogram) and answers by status."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_IDS = re.compile(r"^(/api/v1/(?:jobs|sweeps)/)[^/]+|^(/api/v1/objects/)[^/]+|^(/(?:api/)?(?:jobs|sweeps)/)[^/]+")


def route_of(path: str) -> str:
    """A path as a label: ids and names replaced, so the series stay few."""
    return _IDS.sub(lambda m: (m.group(1) or m.group(2) or m.group(3)) + "{ref}", path)


class Requests:
    """Request latency (to the first byte of the answer: a stream's length is its job's) by
    method and route, and answers by status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, str], list[float]] = {}  # bucket counts, then sum, then count
        self._codes: dict[str, int] = {}

    def observe(self, method: str, path: str, status: int, seconds: float) -> None:
        key = (method, route_of(path))
        with self._lock:
            row = self._latency.setdefault(key, [0.0] * (len(BUCKETS) + 2))
            for i, edge in enumerate(BUCKETS):
                if seconds <= edge:
                    row[i] += 1
            row[-2] += seconds
            row[-1] += 1
            self._codes[str(status)] = self._codes.get(str(status), 0) + 1

    def lines(self) -> list[str]:
        out = ["# HELP phalanx_http_request_duration_seconds Time to the first byte of the answer.",
               "# TYPE phalanx_http_request_duration_seconds histogram"]
        with self._lock:
            latency = {k: list(v) for k, v in self._latency.items()}
            codes = dict(self._codes)
        for (method, route), row in sorted(latency.items()):
            labels = f'method="{method}",route="{_escape(route)}"'
            for edge, count in zip(BUCKETS, row):
                out.append(f'phalanx_http_request_duration_seconds_bucket{{{labels},le="{edge}"}} {int(count)}')
            out.append(f'phalanx_http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {int(row[-1])}')
            out.append(f"phalanx_http_request_duration_seconds_sum{{{labels}}} {row[-2]:.6f}")
            out.append(f"phalanx_http_request_duration_seconds_count{{{labels}}} {int(row[-1])}")
        out += ["# HELP phalanx_http_requests_total Answers by HTTP status.", "# TYPE phalanx_http_requests_total counter"]
        out += [f'phalanx_http_requests_total{{code="{code}"}} {n}' for code, n in sorted(codes.items())]
        return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def text(requests: Requests, by_state: dict[str, int], users: int) -> str:
    from ..core.state import JobState

    out = ["# HELP phalanx_jobs Jobs in the store by state (trials of sweeps included).", "# TYPE phalanx_jobs gauge"]
    out += [f'phalanx_jobs{{state="{s.value}"}} {by_state.get(s.value, 0)}' for s in JobState]
    out += ["# HELP phalanx_queue_length Jobs submitted and not started yet (PENDING).", "# TYPE phalanx_queue_length gauge",
            f"phalanx_queue_length {by_state.get(JobState.PENDING.value, 0)}",
            "# HELP phalanx_users Users who may log in.", "# TYPE phalanx_users gauge", f"phalanx_users {users}"]
    return "\n".join(out + requests.lines()) + "\n"


class Timed:
    """ASGI middleware feeding ``Requests``."""

    def __init__(self, app: Any, requests: Requests) -> None:
        self.app, self.requests = app, requests

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen = False

        async def timed(message: dict[str, Any]) -> None:
            nonlocal seen
            if message["type"] == "http.response.start" and not seen:
                seen = True
                self.requests.observe(scope["method"], scope.get("path", "/"), message["status"],
                                      time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)
