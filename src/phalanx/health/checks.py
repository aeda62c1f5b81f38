"""What a node's health report means: the healthy range and the judgement, pure.

A node reports what it sees (``doctor_probe.py``, on the node): its devices, each device's NVML
counters and matmul rate, free disk and ``/dev/shm``, its clock; the doctor adds the links
between nodes (``doctor_links.py``). Here those reports become findings: *bad* (the node should
not run the job: ``phalanx doctor`` exits non-zero, ``--health-check`` leaves it out) or *warn*
(worth knowing, not a reason to leave a node out).

Some judgements need one node only (an uncorrected ECC error, a wrong matmul, a full disk):
``judge_node``, which the check before an attempt uses on each node by itself. Others compare
nodes with each other (a device far slower than the median, a node whose every link is slow,
a device count unlike the others'): ``judge``, the doctor's, over every report at once.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

GIB = 1024**3
MIB = 1024**2

# The line a probe prints its report on (rank logs carry it back from any backend).
REPORT_TAG = "PHALANX_DOCTOR_NODE "
LINKS_TAG = "PHALANX_DOCTOR_LINKS "
FINDING_TAG = "phalanx health: "  # then "bad: CHECK: MESSAGE" or "warn: ...", one finding a line


@dataclass(frozen=True)
class Limits:
    """The healthy range. Relative limits compare a node with the median of the others, so
    they hold on any hardware; absolute ones are floors no training job should run below."""

    min_disk_free: int = 2 * GIB  # in the job's working directory's filesystem
    min_shm_free: int = 256 * MIB  # /dev/shm: DataLoader workers and NCCL's shared memory
    slow_device: float = 0.4  # a device below this fraction of the median device's matmul rate
    slow_link: float = 0.3  # a link below this fraction of the median link's bandwidth
    max_clock_skew: float = 2.0  # seconds between a node's clock and node 0's
    warn_clock_skew: float = 0.25


@dataclass(frozen=True)
class DeviceReport:
    """One device a node's processes would use: a GPU (``cuda``), or the CPU when it has none."""

    index: int
    kind: str  # "cuda" | "cpu"
    name: str
    gflops: float | None = None  # matmul rate during the burn
    burn_ok: bool = False  # the burn's result matched the reference
    error: str | None = None  # the burn raised, or its result was wrong
    nvml: Mapping[str, Any] = field(default_factory=dict)  # counters read through NVML (GPUs only)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceReport":
        return cls(int(data.get("index", 0)), str(data.get("kind", "cpu")), str(data.get("name", "")),
                   _number(data.get("gflops")), bool(data.get("burn_ok")), data.get("error"), dict(data.get("nvml") or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "name": self.name, "gflops": self.gflops,
                "burn_ok": self.burn_ok, "error": self.error, "nvml": dict(self.nvml)}


@dataclass(frozen=True)
class NodeReport:
    """What one node's probe saw. ``node_rank`` is phalanx's node index."""

    node_rank: int
    hostname: str = ""
    devices: tuple[DeviceReport, ...] = ()
    gpus_visible: int = 0
    nproc_per_node: int = 1
    nvml: str = "absent"  # "ok", "absent" (no driver or no nvidia-ml-py), or "error: ..."
    disk_path: str = ""
    disk_free: int | None = None
    disk_total: int | None = None
    shm_free: int | None = None
    shm_total: int | None = None
    clock: float | None = None  # the node's time.time() when it reported
    skew: float | None = None  # seconds ahead of node 0's clock (the doctor's links phase)
    seconds: float | None = None  # how long the node's checks took
    error: str | None = None  # the probe could not check (torch missing, it crashed)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeReport":
        return cls(
            int(data.get("node_rank", 0)), str(data.get("hostname", "")),
            tuple(DeviceReport.from_dict(d) for d in data.get("devices") or ()),
            int(data.get("gpus_visible") or 0), int(data.get("nproc_per_node") or 1), str(data.get("nvml", "absent")),
            str(data.get("disk_path", "")), _whole(data.get("disk_free")), _whole(data.get("disk_total")),
            _whole(data.get("shm_free")), _whole(data.get("shm_total")), _number(data.get("clock")),
            _number(data.get("skew")), _number(data.get("seconds")), data.get("error"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_rank": self.node_rank, "hostname": self.hostname, "devices": [d.to_dict() for d in self.devices],
            "gpus_visible": self.gpus_visible, "nproc_per_node": self.nproc_per_node, "nvml": self.nvml,
            "disk_path": self.disk_path, "disk_free": self.disk_free, "disk_total": self.disk_total,
            "shm_free": self.shm_free, "shm_total": self.shm_total, "clock": self.clock, "skew": self.skew,
            "seconds": self.seconds, "error": self.error,
        }

    @property
    def device_kind(self) -> str:
        return self.devices[0].kind if self.devices else "none"


@dataclass(frozen=True)
class LinkReport:
    """An all-reduce between two nodes alone: its latency (a few bytes) and bandwidth (bus
    bandwidth of a large message, as nccl-tests count it for two ranks: bytes / time)."""

    a: int
    b: int
    latency: float | None = None  # seconds per small all-reduce
    bandwidth: float | None = None  # bytes per second
    error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LinkReport":
        return cls(int(data["a"]), int(data["b"]), _number(data.get("latency")), _number(data.get("bandwidth")),
                   data.get("error"))

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "latency": self.latency, "bandwidth": self.bandwidth, "error": self.error}


@dataclass(frozen=True)
class Finding:
    node_rank: int | None  # None: about the gang, not one node
    severity: str  # "bad" | "warn"
    check: str  # devices, gpu, burn, disk, shm, clock, link, report
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"node_rank": self.node_rank, "severity": self.severity, "check": self.check, "message": self.message}


@dataclass(frozen=True)
class Verdict:
    nodes: tuple[NodeReport, ...]
    links: tuple[LinkReport, ...]
    findings: tuple[Finding, ...]
    expected: int  # how many nodes should have reported

    @property
    def bad_nodes(self) -> list[int]:
        return sorted({f.node_rank for f in self.findings if f.severity == "bad" and f.node_rank is not None})

    @property
    def healthy(self) -> bool:
        return not any(f.severity == "bad" for f in self.findings)

    def about(self, node_rank: int) -> list[Finding]:
        return [f for f in self.findings if f.node_rank == node_rank]

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "bad_nodes": self.bad_nodes, "expected": self.expected,
                "nodes": [n.to_dict() for n in self.nodes], "links": [link.to_dict() for link in self.links],
                "findings": [f.to_dict() for f in self.findings]}


# -- one node alone -----------------------------------------------------------------------------


def judge_node(node: NodeReport, limits: Limits = Limits()) -> list[Finding]:
    """What is wrong with ``node`` on its own (no other node to compare with)."""
    out: list[Finding] = []

    def bad(check: str, message: str) -> None:
        out.append(Finding(node.node_rank, "bad", check, message))

    def warn(check: str, message: str) -> None:
        out.append(Finding(node.node_rank, "warn", check, message))

    if node.error:
        bad("report", f"the check could not run: {node.error}")
        return out
    if not node.devices:
        bad("devices", "no device was checked")
    if node.gpus_visible and node.gpus_visible < node.nproc_per_node:
        bad("devices", f"sees {node.gpus_visible} GPU(s) but the job starts {node.nproc_per_node} process(es) per node")
    if node.nvml.startswith("error"):
        warn("gpu", f"NVML: {node.nvml[len('error: '):] or node.nvml}")
    for device in node.devices:
        label = f"{device.kind}:{device.index}" if device.kind != "cpu" else "cpu"
        if device.error or not device.burn_ok:
            bad("burn", f"{label}: matmul {device.error or 'gave a wrong result'}")
        elif not device.gflops:
            bad("burn", f"{label}: matmul rate not measured")
        for finding in _gpu_counters(device.nvml):
            (bad if finding[0] == "bad" else warn)("gpu", f"{label}: {finding[1]}")
    if node.disk_free is not None and node.disk_free < limits.min_disk_free:
        bad("disk", f"{size(node.disk_free)} free in {node.disk_path or 'the working directory'} "
                    f"(below {size(limits.min_disk_free)})")
    if node.shm_free is not None and node.shm_free < limits.min_shm_free:
        bad("shm", f"{size(node.shm_free)} free in /dev/shm (below {size(limits.min_shm_free)}; DataLoader workers "
                   "and NCCL need it)")
    if node.skew is not None:
        if abs(node.skew) > limits.max_clock_skew:
            bad("clock", f"clock {node.skew:+.3f}s from node 0's (over {limits.max_clock_skew:g}s)")
        elif abs(node.skew) > limits.warn_clock_skew:
            warn("clock", f"clock {node.skew:+.3f}s from node 0's")
    return out


def _gpu_counters(nvml: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(severity, what) for a GPU's NVML counters; see ``doctor_probe.nvml_counters`` for the keys."""
    out: list[tuple[str, str]] = []
    uncorrected = nvml.get("ecc_uncorrected")
    if isinstance(uncorrected, int) and uncorrected > 0:
        out.append(("bad", f"{uncorrected} uncorrected ECC error(s) since the driver loaded"))
    if nvml.get("remap_failure"):
        out.append(("bad", "row remapping failed (the GPU needs service)"))
    if nvml.get("remap_pending") or nvml.get("retired_pending"):
        out.append(("warn", "memory pages wait to be retired: reset the GPU"))
    corrected = nvml.get("ecc_corrected")
    if isinstance(corrected, int) and corrected > 1000:
        out.append(("warn", f"{corrected} corrected ECC errors"))
    for reason in nvml.get("throttle") or ():
        out.append(("warn", f"clocks held back: {reason}"))
    return out


# -- the gang -----------------------------------------------------------------------------------


def judge(nodes: Sequence[NodeReport], links: Sequence[LinkReport], expected: int,
          missing: Mapping[int, str] | None = None, limits: Limits = Limits(),
          unchecked: Mapping[int, str] | None = None) -> Verdict:
    """Every node on its own, then against the others. ``missing``: nodes that never reported,
    with what is known of why (the node's exit, its agent's error); ``unchecked``: nodes nothing
    is known of because the check could not start for another node's sake (a warning)."""
    findings: list[Finding] = []
    for node_rank, why in sorted((missing or {}).items()):
        findings.append(Finding(node_rank, "bad", "report", f"no report: {why}"))
    for node_rank, why in sorted((unchecked or {}).items()):
        findings.append(Finding(node_rank, "warn", "report", f"not checked: {why}"))
    for node in nodes:
        findings += judge_node(node, limits)
    findings += _slow_devices(nodes, limits)
    findings += _odd_device_counts(nodes)
    findings += _links(links, len(nodes), limits)
    return Verdict(tuple(sorted(nodes, key=lambda n: n.node_rank)), tuple(links), tuple(findings), expected)


def _slow_devices(nodes: Sequence[NodeReport], limits: Limits) -> list[Finding]:
    out: list[Finding] = []
    for kind in sorted({d.kind for n in nodes for d in n.devices}):
        rates = [(n.node_rank, d) for n in nodes for d in n.devices if d.kind == kind and d.gflops]
        if len(rates) < 2:
            continue
        median = statistics.median(d.gflops or 0.0 for _, d in rates)
        for node_rank, d in rates:
            if median and (d.gflops or 0.0) < limits.slow_device * median:
                label = f"{kind}:{d.index}" if kind != "cpu" else "cpu"
                out.append(Finding(node_rank, "bad", "burn", f"{label}: {d.gflops:.3g} GFLOP/s, "
                                   f"{median / (d.gflops or 1):.1f}x slower than the median device ({median:.3g})"))
    return out


def _odd_device_counts(nodes: Sequence[NodeReport]) -> list[Finding]:
    """Nodes of one job should be alike: one that sees fewer GPUs than most is suspect."""
    counts = [n.gpus_visible for n in nodes if not n.error]
    if len(counts) < 2:
        return []
    usual = statistics.median_high(counts)
    return [Finding(n.node_rank, "bad", "devices", f"sees {n.gpus_visible} GPU(s), the other nodes {usual}")
            for n in nodes if not n.error and n.gpus_visible < usual]


def _links(links: Sequence[LinkReport], nnodes: int, limits: Limits) -> list[Finding]:
    """A failed link names both ends; with three nodes or more a node whose every link is slow
    (while the median link is not) is named alone: the slow part is that node's."""
    out: list[Finding] = []
    for link in links:
        if link.error:
            for end in (link.a, link.b):
                out.append(Finding(end, "bad", "link", f"all-reduce between node {link.a} and node {link.b} failed: {link.error}"))
    measured = [link for link in links if link.bandwidth]
    if nnodes < 3 or len(measured) < 2:
        return out
    median = statistics.median(link.bandwidth or 0.0 for link in measured)
    slow = {(link.a, link.b) for link in measured if (link.bandwidth or 0.0) < limits.slow_link * median}
    for node in range(nnodes):
        own = [link for link in measured if node in (link.a, link.b)]
        if own and all((link.a, link.b) in slow for link in own):
            worst = min(own, key=lambda link: link.bandwidth or 0.0)
            out.append(Finding(node, "bad", "link", f"every all-reduce with this node is slow: down to "
                               f"{rate(worst.bandwidth)} against a median of {rate(median)}"))
    return out


# -- words --------------------------------------------------------------------------------------


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", GIB), ("MiB", MIB)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.0f} KiB"


def rate(bytes_per_s: float | None) -> str:
    if not bytes_per_s:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.2f} {unit}"
    return f"{bytes_per_s / 1e3:.0f} kB/s"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
