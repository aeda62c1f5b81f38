// Parts of a job's page drawn from what its view (api/jobview.py) says of how it went: the root
// cause (its error as Python prints it, the ranks that only lost their peer), a log's collateral
// trace folded under one line, the one summary row of a job too short to chart its resources,
// and what stands where metrics would be. `phalanx status` and `logs` print the same facts.
(function () {
  "use strict";
  const { $, el, bytes, dur } = window.PHX;

  // The traceback box opens on its end, where the exception and the frame that raised it (with
  // Python 3.11's ~~~^^^ marks) are; it scrolls both ways for the rest.
  function renderCause(d) {
    const c = d.root_cause;
    $("cause-box").hidden = !c || d.state === "SUCCEEDED";
    const key = JSON.stringify([c, d.peer_lost]);
    if (!c || key === renderCause.shown) return;
    renderCause.shown = key;
    const where = c.rank !== undefined ? `rank ${c.rank} on node ${c.node_rank}` : (c.node_rank !== undefined ? `node ${c.node_rank}` : "job");
    const how = c.signal ? `killed by ${c.signal}` : `exit code ${c.exitcode}`;
    const trace = (c.traceback || c.log_tail) ? el("pre", { class: "trace", text: c.traceback || c.log_tail }) : null;
    $("cause").replaceChildren(
      el("p", {}, el("b", { text: where }), ` (${how}${c.attempt !== undefined ? ", attempt " + c.attempt : ""}): `,
        el("span", { class: "cause-error", text: d.root_cause_error || c.message || "" })),
      trace,
      ...(d.peer_lost || []).map((p) => el("p", { class: "peer-lost muted", text: `${p.line} (${p.error})` })));
    if (trace) trace.scrollTop = trace.scrollHeight;
  }

  // What the log panel says above a failed job's logs, and which rank it opens on.
  function logNote(d) {
    if (d.root_cause_rank === null || d.root_cause_rank === undefined) return "";
    const lost = (d.peer_lost || []).map((p) => p.line);
    return `rank ${d.root_cause_rank} failed first: its log is shown` + (lost.length ? `; ${lost.join("; ")} (folded in its log)` : "");
  }

  // A piece of a rank's log (GET /api/jobs/ID/logs) into the panel: the collateral trace of a
  // rank that lost its peer stays folded under its one line until opened.
  function appendLog(pre, data) {
    if (data.text) pre.append(document.createTextNode(data.text));
    if (data.fold) {
      pre.append(el("details", { class: "fold" },
        el("summary", { text: `${data.fold.line} (${data.fold.error}; ${data.fold.lines} lines)` }),
        document.createTextNode(data.fold.text)));
    }
  }

  // A job too short to chart: one row per node instead of charts of a sample or two.
  function resourceSummary(box, s) {
    const cell = (v) => el("td", { text: v });
    const rows = s.nodes.map((n) => el("tr", {},
      cell(`node ${n.node_rank}` + (n.host ? ` · ${n.host}` : "")),
      cell(`${n.samples} sample${n.samples === 1 ? "" : "s"}` + (n.span > 0 ? ` over ${dur(n.span)}` : "")),
      cell(n.cpu_percent === null ? "-" : `${n.cpu_percent.toFixed(0)}%` + (n.cpu_count ? ` of ${n.cpu_count} cores` : "")),
      cell(n.mem_used === null ? "-" : bytes(n.mem_used) + (n.mem_total ? ` of ${bytes(n.mem_total)}` : "")),
      cell(n.rank_rss === null ? "-" : bytes(n.rank_rss)),
      cell(n.gpu_util === null ? "-" : `${n.gpu_util.toFixed(0)}%, ${bytes(n.gpu_mem || 0)}`),
      cell(n.disk_read === null ? "-" : `${bytes(n.disk_read)} read, ${bytes(n.disk_write || 0)} written`)));
    const head = ["NODE", "SAMPLES", "CPU PEAK", "MEMORY PEAK", "LARGEST RANK", "GPU PEAK", "DISK"];
    box.replaceChildren(el("div", { class: "resource-summary table-wrap" },
      el("p", { class: "muted", text: "too short to chart: its samples in one row" }),
      el("table", { class: "list" }, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
        el("tbody", {}, ...rows))));
  }

  window.PHX.parts = { renderCause, logNote, appendLog, resourceSummary };
})();
