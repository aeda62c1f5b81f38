"""The doctor's reading of its probe job: the report lines in the rank logs -> a ``Verdict``, and
the verdict as a table for a person. Pure (the caller reads the logs).

Each node's probe prints ``PHALANX_DOCTOR_NODE {json}`` (``checks.NodeReport``); node 0 prints
``PHALANX_DOCTOR_LINKS {json}`` with every node's clock skew and the link matrix. A node whose
report never came (its agent could not start, it crashed, the host was lost) is judged bad, with
what its ``result.json`` says.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .checks import LINKS_TAG, REPORT_TAG, LinkReport, Limits, NodeReport, Verdict, judge, rate, size


def tagged(text: str, tag: str) -> list[dict[str, Any]]:
    """Every JSON object printed after ``tag`` at a line's start in ``text``."""
    out = []
    for line in text.splitlines():
        at = line.find(tag)
        if at < 0 or line[:at].strip():
            continue
        try:
            data = json.loads(line[at + len(tag):])
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def read(logs: Mapping[int, str], expected: int, missing_why: Mapping[int, str],
         limits: Limits = Limits(), unchecked: Mapping[int, str] | None = None) -> tuple[Verdict, dict[str, Any]]:
    """The verdict over the rank logs (rank -> text; one rank per node), and what node 0 said of
    the links (backend, size, or why they could not be measured). ``unchecked``: nodes that did
    not report because the check never started for another node's sake."""
    reports: dict[int, NodeReport] = {}
    links_said: dict[str, Any] = {}
    for text in logs.values():
        for data in tagged(text, REPORT_TAG):
            report = NodeReport.from_dict(data)
            reports[report.node_rank] = report
        for data in tagged(text, LINKS_TAG):
            if data.get("links") is not None or not links_said:
                links_said = data
    skews = {int(k): v for k, v in (links_said.get("skews") or {}).items() if isinstance(v, (int, float))}
    nodes = [_with_skew(r, skews.get(r.node_rank)) for _, r in sorted(reports.items())]
    links = [LinkReport.from_dict(d) for d in links_said.get("links") or ()]
    missing = {n: missing_why.get(n, "the node printed no report") for n in range(expected)
               if n not in reports and n not in (unchecked or {})}
    return judge(nodes, links, expected, missing, limits, unchecked), links_said


def _with_skew(report: NodeReport, skew: float | None) -> NodeReport:
    if skew is None:
        return report
    data = report.to_dict()
    data["skew"] = skew
    return NodeReport.from_dict(data)


def render(verdict: Verdict, names: Mapping[int, str], links_said: Mapping[str, Any]) -> str:
    """The table a person reads: one row per node, the link matrix, then what is wrong."""
    rows: list[tuple[str, ...]] = [("NODE", "HOST", "DEVICES", "MATMUL", "DISK FREE", "/dev/shm", "CLOCK", "VERDICT")]
    reported = {n.node_rank: n for n in verdict.nodes}
    for node_rank in range(max(verdict.expected, len(reported))):
        node = reported.get(node_rank)
        said = {f.severity for f in verdict.about(node_rank)}
        state = "BAD" if "bad" in said else "warn" if "warn" in said else "ok"
        name = names.get(node_rank, "-")
        if node is None:
            rows.append((str(node_rank), name, "-", "-", "-", "-", "-", state))
            continue
        rows.append((str(node_rank), name, _devices(node), _rates(node), size(node.disk_free), size(node.shm_free),
                     "-" if node.skew is None else f"{node.skew * 1000:+.1f} ms", state))
    lines = _table(rows)
    if verdict.links or links_said.get("error"):
        lines.append("")
        lines += _matrix(verdict, links_said)
    bad = [f for f in verdict.findings if f.severity == "bad"]
    warned = [f for f in verdict.findings if f.severity == "warn"]
    if bad or warned:
        lines.append("")
    for finding in [*bad, *warned]:
        who = f"node {finding.node_rank} ({names.get(finding.node_rank, '?')})" if finding.node_rank is not None else "all"
        lines.append(f"{finding.severity}: {who}: {finding.check}: {finding.message}")
    healthy = len(reported) - len([n for n in verdict.bad_nodes if n in reported])
    unchecked = verdict.expected - len(reported) - len([n for n in verdict.bad_nodes if n not in reported])
    lines.append("")
    if verdict.healthy:
        lines.append(f"all {verdict.expected} node(s) healthy")
    else:
        named = ", ".join(f"{n} ({names.get(n, '?')})" for n in verdict.bad_nodes)
        lines.append(f"{len(verdict.bad_nodes)} of {verdict.expected} node(s) outside the healthy range: {named}; "
                     f"{healthy} healthy" + (f", {unchecked} not checked" if unchecked > 0 else ""))
    return "\n".join(lines) + "\n"


def _devices(node: NodeReport) -> str:
    if node.error:
        return "?"
    if not node.gpus_visible:
        return "no GPU (cpu)"
    names = {d.name for d in node.devices}
    return f"{node.gpus_visible}x {names.pop() if len(names) == 1 else 'mixed GPUs'}"


def _rates(node: NodeReport) -> str:
    rates = [d.gflops for d in node.devices if d.gflops]
    if not rates:
        return "-"
    low, high = min(rates), max(rates)
    shown = f"{low:.3g}" if len(rates) == 1 or high - low < 0.05 * high else f"{low:.3g}-{high:.3g}"
    return f"{shown} GFLOP/s"


def _matrix(verdict: Verdict, said: Mapping[str, Any]) -> list[str]:
    if said.get("error") and not verdict.links:
        return [f"links: not measured: {said['error']}"]
    n = max(verdict.expected, 1)
    cell = {(link.a, link.b): link for link in verdict.links}
    header = f"links: all-reduce between two nodes ({said.get('backend', '?')}, {said.get('size_mb', '?')} MB: bandwidth; 4 bytes: latency)"
    rows: list[tuple[str, ...]] = [("", *(f"node {b}" for b in range(n)))]
    for a in range(n):
        row = [f"node {a}"]
        for b in range(n):
            link = cell.get((min(a, b), max(a, b)))
            if a == b or link is None:
                row.append("-")
            elif link.error:
                row.append("FAILED")
            else:
                row.append(f"{rate(link.bandwidth)} {(link.latency or 0) * 1e6:.0f} us")
        rows.append(tuple(row))
    return [header, *_table(rows)]


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
