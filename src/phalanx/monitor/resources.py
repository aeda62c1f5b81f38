"""Resource samples of a node and of each rank's process tree, one JSON line per interval.

The node agent runs a :class:`ResourceSampler` next to its workers; each sample is a line of
``node_<n>/resources.jsonl``::

    {"time": 1700000000.0, "node_rank": 0, "host": "h1", "interval": 5.0,
     "cpu_percent": 97.5, "cpu_count": 16, "mem_used": 8.1e9, "mem_total": 6.4e10,
     "disk_read": ..., "disk_write": ..., "net_sent": ..., "net_recv": ...,   # bytes since boot
     "disk_read_rate": ..., "disk_write_rate": ..., "net_sent_rate": ..., "net_recv_rate": ...,  # bytes/s
     "ranks": {"0": {"pid": 123, "cpu_percent": 99.0, "rss": 1.2e9, "procs": 3, "gpu_mem": 2.0e9,
                     "busy": 61, "waiting": 38, "io": 0, "probes": 99}},
     "gpus": [{"index": 0, "name": "NVIDIA H100", "util": 87, "mem_used": 6.0e10, "mem_total": 8.0e10}],
     "sampling_cpu": 0.042}   # CPU seconds the node's samplers have used so far

``busy``/``waiting``/``io``/``probes`` (with a ``probe``, see ``health/straggler_probe.py``): how
often since the last sample the rank's main thread was runnable, asleep or in disk I/O, sampled
a few times a second: the ranks that wait for a slow peer in a collective sleep.

``cpu_percent`` of a rank is its whole process tree (DataLoader workers included), so it can
exceed 100. GPUs are read through NVML (``nvidia-ml-py``) when it is installed and finds a GPU;
without one ``gpus`` is empty. Cheap by design: psutil.Process objects are kept between samples
(their CPU counters need the previous reading anyway) and one /proc scan serves all ranks.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import psutil

from ..core.paths import JobPaths

DEFAULT_INTERVAL = 5.0
FIRST_SAMPLE = 1.0  # seconds to the first sample, whatever the interval
NVIDIA_DEVICES = ("/dev/nvidiactl", "/dev/dxg")  # the driver's control node; WSL's GPU device


class _Gpus:
    """NVML, if it is there. Every failure means "no GPU data", never an error."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.names: list[str] = []
        if sys.platform == "linux" and not any(os.path.exists(d) for d in NVIDIA_DEVICES):
            return  # no driver here: skip NVML's import and library probe (they cost every run time)
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
            self.nvml = pynvml
        except Exception:  # noqa: BLE001 - no library, no driver, no GPU: all the same to us
            self.handles = []

    def sample(self) -> tuple[list[dict[str, Any]], dict[int, int]]:
        """Per GPU util and memory; and GPU memory per pid (for the rank trees)."""
        gpus: list[dict[str, Any]] = []
        by_pid: dict[int, int] = {}
        nvml = self.nvml
        for index, handle in enumerate(self.handles):
            entry: dict[str, Any] = {"index": index, "name": self.names[index]}
            try:
                entry["util"] = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                entry["mem_used"], entry["mem_total"] = mem.used, mem.total
            except Exception:  # noqa: BLE001 - a GPU that fell off the bus reports nothing
                pass
            try:
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(proc, "usedGpuMemory", None) or 0
                    by_pid[proc.pid] = by_pid.get(proc.pid, 0) + int(used)
            except Exception:  # noqa: BLE001
                pass
            gpus.append(entry)
        return gpus, by_pid

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Probe(Protocol):
    """Per-rank counts gathered between samples (``health.straggler_probe.StateProbe``)."""

    cpu_seconds: float

    def start(self) -> Any: ...

    def take(self) -> dict[int, dict[str, int]]: ...

    def stop(self) -> None: ...


class ResourceSampler:
    """Append a resource sample to ``out`` every ``interval`` seconds, in a daemon thread.

    ``pids()`` maps rank -> pid of the rank's process (it is called at every sample, so ranks
    that start late or restart are picked up). ``probe``: counts per rank merged into each
    sample's ``ranks`` (started and stopped with the sampler). ``start``/``stop`` are idempotent;
    ``stop`` blocks until the thread has ended (at most one sample's time).
    """

    def __init__(self, out: Path, node_rank: int, pids: Callable[[], dict[int, int]], interval: float = DEFAULT_INTERVAL,
                 probe: Probe | None = None) -> None:
        self.out = out
        self.probe = probe
        self.node_rank = node_rank
        self.pids = pids
        self.interval = max(0.05, float(interval))
        self.host = socket.gethostname()
        self.samples = 0
        self.cpu_seconds = 0.0  # CPU time spent by the sampling thread (overhead measurements)
        self._procs: dict[int, psutil.Process] = {}
        self._prev_io: tuple[float, dict[str, float]] | None = None
        self._gpus: _Gpus | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors = 0

    def start(self) -> "ResourceSampler":
        if self._thread is None:
            if self.probe is not None:
                self.probe.start()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="phalanx-resources", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.probe is not None:
            self.probe.stop()

    def _loop(self) -> None:
        began = time.thread_time()
        self._gpus = _Gpus()
        psutil.cpu_percent(None)  # the first reading only sets the baseline
        self.cpu_seconds += time.thread_time() - began
        # The first sample comes within a second, so a short job has its charts too; and one
        # that ended before even that gets one sample as it stops (issue 16).
        wait = min(self.interval, FIRST_SAMPLE)
        while not self._stop.wait(wait):
            wait = self.interval
            self._take()
        if not self.samples:
            self._take()
        self._gpus.close()

    def _take(self) -> None:
        began = time.thread_time()
        try:
            self.write(self.sample())
        except Exception as exc:  # noqa: BLE001 - monitoring must never take the node down
            self._errors += 1
            if self._errors == 1:
                print(f"phalanx: resource sampling failed: {exc}", file=sys.stderr)
        self.cpu_seconds += time.thread_time() - began

    def write(self, sample: dict[str, Any]) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(sample, separators=(",", ":")) + "\n")
        self.samples += 1

    def sample(self) -> dict[str, Any]:
        """One sample now (also usable without the thread, e.g. by tests)."""
        now = time.time()
        mem = psutil.virtual_memory()
        data: dict[str, Any] = {
            "time": round(now, 3), "node_rank": self.node_rank, "host": self.host, "interval": self.interval,
            "cpu_percent": psutil.cpu_percent(None), "cpu_count": psutil.cpu_count() or 1,
            "mem_used": mem.total - mem.available, "mem_total": mem.total,
        }
        data.update(self._io(now))
        gpus, gpu_by_pid = self._gpus.sample() if self._gpus is not None else ([], {})
        data["ranks"] = self._ranks(gpu_by_pid)
        data["gpus"] = gpus
        if self.probe is not None:
            for rank, counts in self.probe.take().items():
                entry = data["ranks"].get(str(rank))
                if entry is not None:
                    entry.update(counts)
            data["sampling_cpu"] = round(self.cpu_seconds + self.probe.cpu_seconds, 4)
        return data

    def _io(self, now: float) -> dict[str, float]:
        counters: dict[str, float] = {}
        try:
            disk = psutil.disk_io_counters()
            if disk is not None:
                counters["disk_read"], counters["disk_write"] = disk.read_bytes, disk.write_bytes
        except (OSError, RuntimeError):  # containers without /proc/diskstats
            pass
        try:
            net = psutil.net_io_counters()
            counters["net_sent"], counters["net_recv"] = net.bytes_sent, net.bytes_recv
        except (OSError, RuntimeError):
            pass
        out = dict(counters)
        if self._prev_io is not None:
            then, prev = self._prev_io
            elapsed = max(now - then, 1e-6)
            for key, value in counters.items():
                if key in prev:
                    out[key + "_rate"] = max(0.0, (value - prev[key]) / elapsed)
        self._prev_io = (now, counters)
        return out

    def _ranks(self, gpu_by_pid: dict[int, int]) -> dict[str, dict[str, Any]]:
        ranks = self.pids()
        if not ranks:
            return {}
        children = _children_map()
        seen: set[int] = set()
        out: dict[str, dict[str, Any]] = {}
        for rank, pid in sorted(ranks.items()):
            tree = [pid]
            for p in tree:  # grows while iterating: breadth-first over the tree
                tree.extend(children.get(p, ()))
            cpu = rss = 0.0
            alive = 0
            gpu_mem = 0
            for p in tree:
                proc = self._process(p)
                if proc is None:
                    continue
                seen.add(p)
                try:
                    with proc.oneshot():
                        if proc.status() == psutil.STATUS_ZOMBIE:
                            continue  # exited, not yet reaped: it holds no memory and uses no CPU
                        cpu += proc.cpu_percent(None)
                        rss += proc.memory_info().rss
                    alive += 1
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                gpu_mem += gpu_by_pid.get(p, 0)
            if not alive:
                continue  # the rank has ended (or not started): nothing to report
            entry: dict[str, Any] = {"pid": pid, "cpu_percent": round(cpu, 1), "rss": int(rss), "procs": alive}
            if gpu_by_pid:
                entry["gpu_mem"] = gpu_mem
            out[str(rank)] = entry
        for gone in set(self._procs) - seen:
            del self._procs[gone]
        return out

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is not None and proc.is_running():  # is_running also catches pid reuse
            return proc
        try:
            proc = psutil.Process(pid)
            proc.cpu_percent(None)  # baseline; the first real reading comes next sample
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(pid, None)
            return None
        self._procs[pid] = proc
        return proc


def _children_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from one pass over the process table."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid:
            children.setdefault(ppid, []).append(proc.pid)
    return children


def rank_pids(paths: JobPaths, attempt: int, node_rank: int | None = None) -> dict[int, int]:
    """rank -> pid from the ranks' ``proc.json`` files (optionally only one node's ranks):
    the ``pids`` callable a node agent can hand to :class:`ResourceSampler`."""
    from ..core.paths import read_json

    out: dict[int, int] = {}
    for rank in paths.ranks(attempt):
        proc = read_json(paths.rank_proc(attempt, rank))
        if not isinstance(proc, dict) or "pid" not in proc:
            continue
        if node_rank is not None and proc.get("node_rank") != node_rank:
            continue
        out[rank] = int(proc["pid"])
    return out


def read_resources(paths: JobPaths, attempt: int | None = None, node_rank: int | None = None) -> list[dict[str, Any]]:
    """Samples of one attempt (all attempts if None), every node, oldest first per node.
    Each sample gets an ``attempt`` key."""
    from .metricfile import read_jsonl

    out: list[dict[str, Any]] = []
    for a in paths.attempts() if attempt is None else [attempt]:
        for node in node_ranks(paths, a) if node_rank is None else [node_rank]:
            for sample in read_jsonl(paths.node_resources(a, node))[0]:
                sample["attempt"] = a
                out.append(sample)
    return out


def recent_resources(paths: JobPaths, attempt: int, max_bytes: int = 1 << 18) -> list[dict[str, Any]]:
    """The latest samples of every node of an attempt (the end of each file): the hint window."""
    from .metricfile import tail_jsonl

    out = []
    for node in node_ranks(paths, attempt):
        for sample in tail_jsonl(paths.node_resources(attempt, node), max_bytes):
            sample["attempt"] = attempt
            out.append(sample)
    return out


def latest_samples(paths: JobPaths, attempt: int) -> dict[int, dict[str, Any]]:
    """The newest sample of every node of an attempt (reads only the end of each file)."""
    out: dict[int, dict[str, Any]] = {}
    for node in node_ranks(paths, attempt):
        last = _last_line(paths.node_resources(attempt, node))
        if last is not None:
            out[node] = last
    return out


def _last_line(path: Path, window: int = 65536) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - window))
            data = fh.read()
    except OSError:
        return None
    for line in reversed(data.split(b"\n")):
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                continue  # a line cut by the window or still being written
            return value if isinstance(value, dict) else None
    return None


def node_ranks(paths: JobPaths, attempt: int) -> list[int]:
    """The node numbers that have a directory in an attempt (``JobPaths.nodes``)."""
    return paths.nodes(attempt)
