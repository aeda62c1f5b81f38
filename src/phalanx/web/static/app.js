// phalanx dashboard: fills the server's page shells from the JSON API. No framework, no CDN:
// the only library is plotly.js, served from the installed Python package.
(function () {
  "use strict";
  const C = window.PHX_CONFIG || {};
  const $ = (id) => document.getElementById(id);
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
  const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function withToken(params) {
    const p = new URLSearchParams(params || {});
    if (C.token) p.set("token", C.token);
    const s = p.toString();
    return s ? "?" + s : "";
  }
  const link = (path, params) => path + withToken(params);

  async function api(path, params) {
    const r = await fetch(link(path, params), { cache: "no-store" });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k === "style") node.setAttribute("style", v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function ago(ts) {
    if (!ts) return "-";
    const d = Date.now() / 1000 - ts;
    if (d < 60) return Math.floor(d) + "s ago";
    if (d < 3600) return Math.floor(d / 60) + "m ago";
    if (d < 86400) return Math.floor(d / 3600) + "h ago";
    return new Date(ts * 1000).toLocaleString();
  }
  function dur(s) {
    if (s === null || s === undefined) return "-";
    if (s < 60) return s.toFixed(1) + "s";
    const m = Math.floor(s / 60), h = Math.floor(m / 60);
    return h ? `${h}h${String(m % 60).padStart(2, "0")}m` : `${m}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  }
  function bytes(v) {
    if (v === null || v === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : v.toFixed(0)) + " " + units[i];
  }
  const stateBadge = (state) => el("span", { class: "state " + state, text: state });

  function layout(title, extra) {
    return Object.assign({
      title: { text: title, font: { size: 13 }, x: 0.02 },
      height: 260, margin: { l: 50, r: 12, t: 34, b: 58 },
      paper_bgcolor: "#fff", plot_bgcolor: "#fff",
      legend: { orientation: "h", y: -0.32, font: { size: 11 } },
      xaxis: { gridcolor: "#eef0f3" }, yaxis: { gridcolor: "#eef0f3", rangemode: "normal" },
    }, extra || {});
  }

  // One chart per key inside `container`, reusing divs across refreshes (Plotly.react diffs).
  function chart(container, key, traces, lay) {
    let div = container.querySelector(`[data-chart="${CSS.escape(key)}"]`);
    if (!div) {
      div = el("div", { class: "chart", "data-chart": key });
      container.append(div);
    }
    Plotly.react(div, traces, lay, PLOT_CONFIG);
  }

  // -- jobs list -------------------------------------------------------------------------------
  function jobsPage() {
    const selected = new Set();
    const button = $("compare");
    button.addEventListener("click", () => { location.href = link("/compare", { jobs: [...selected].join(",") }); });
    async function refresh() {
      let list;
      try { list = await api("/api/jobs"); } catch (e) { return; }
      const rows = list.map((j) => el("tr", {},
        el("td", {}, el("input", {
          type: "checkbox", checked: selected.has(j.id), onchange: (ev) => {
            ev.target.checked ? selected.add(j.id) : selected.delete(j.id);
            button.disabled = selected.size < 1;
          },
        })),
        el("td", {}, el("a", { href: link("/jobs/" + j.id), text: j.id })),
        el("td", { text: j.name }),
        el("td", {}, stateBadge(j.state), j.exit_code ? el("span", { class: "muted", text: " (" + j.exit_code + ")" }) : null),
        el("td", { text: j.topology }),
        el("td", { text: ago(j.created_at) }),
        el("td", { text: dur(j.duration) }),
        el("td", { class: "cmd", text: j.command, title: j.command }),
      ));
      $("jobs").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 8, class: "muted", text: "no jobs yet: phalanx run train.py" }))]));
    }
    refresh();
    setInterval(refresh, 2000);
  }

  // -- job page --------------------------------------------------------------------------------
  function jobPage() {
    const job = C.job;
    let detail = null;
    let metricsEvery = 0;

    function renderHead(d) {
      $("job-state").replaceWith(Object.assign(stateBadge(d.state), { id: "job-state" }));
      const facts = [
        ["command", d.command], ["topology", `${d.topology} (${d.world_size} ranks) on ${d.backend}`],
        ["attempt", String(d.attempt)], ["created", ago(d.created_at)], ["duration", dur(d.duration)],
        ["exit", d.exit_code === null ? "-" : String(d.exit_code)], ["dir", d.job_dir],
      ];
      $("job-facts").replaceChildren(...facts.map(([k, v]) => el("div", { class: k === "command" ? "wide" : "" },
        el("span", { class: "k", text: k }), el("span", { class: "v", text: v }))));
    }

    function renderCause(d) {
      const c = d.root_cause;
      $("cause-box").hidden = !c;
      if (!c) return;
      const where = c.rank !== undefined ? `rank ${c.rank} on node ${c.node_rank}` : `node ${c.node_rank ?? "?"}`;
      const how = c.signal ? `killed by ${c.signal}` : `exit code ${c.exitcode}`;
      $("cause").replaceChildren(
        el("p", {}, el("b", { text: where }), ` (${how}): `, el("span", { text: (c.type ? c.type + ": " : "") + (c.message || "") })),
        (c.traceback || c.log_tail) ? el("pre", { class: "trace", text: c.traceback || c.log_tail }) : null,
      );
    }

    function renderHints(d) {
      $("hints-box").hidden = !d.hints.length;
      $("hints").replaceChildren(...d.hints.map((h) => el("li", { text: h })));
    }

    function renderTopology(d) {
      const perNode = d.world_size / d.nnodes;
      const nodes = [];
      for (let n = 0; n < d.nnodes; n++) {
        const ranks = [];
        for (let i = 0; i < perNode; i++) {
          const rank = n * perNode + i;
          const r = d.ranks.find((x) => x.rank === rank);
          const state = r ? r.state : (d.terminal ? "unknown" : "pending");
          ranks.push(el("div", { class: "rank " + state, title: r ? `pid ${r.pid} on ${r.host}, ${state}` + (r.exitcode !== null ? `, exit ${r.exitcode}` : "") : state },
            el("b", { text: "rank " + rank }), el("span", { text: r && r.pid ? "pid " + r.pid : state })));
        }
        const host = (d.ranks.find((x) => x.node_rank === n) || {}).host;
        nodes.push(el("div", { class: "node" }, el("div", { class: "node-title", text: `node ${n}` + (host ? " · " + host : "") }), el("div", { class: "ranks" }, ...ranks)));
      }
      $("topology").replaceChildren(...nodes);
    }

    function renderAttempts(d) {
      const now = Date.now() / 1000;
      const atts = d.attempts.filter((a) => a.start);
      if (!atts.length) { $("attempts").replaceChildren(el("p", { class: "muted", text: "not started" })); return; }
      const t0 = Math.min(...atts.map((a) => a.start));
      const t1 = Math.max(...atts.map((a) => a.end || now));
      const span = Math.max(t1 - t0, 1e-3);
      $("attempts").replaceChildren(...atts.map((a) => {
        const end = a.end || now;
        const cls = a.end === null ? "running" : a.exitcode === 0 ? "ok" : "failed";
        const label = `attempt ${a.attempt} · ${dur(end - a.start)}` + (a.end === null ? " · running" : ` · exit ${a.exitcode}`);
        return el("div", { class: "attempt" },
          el("div", { class: "label", text: label }),
          el("div", { class: "track" }, el("div", {
            class: "span " + cls, style: `left:${(100 * (a.start - t0)) / span}%;width:${Math.max(0.8, (100 * (end - a.start)) / span)}%`,
          })));
      }));
    }

    function fillSelect(select, values, keep) {
      const current = select.value;
      const want = values.map(String);
      const have = [...select.options].map((o) => o.value).filter((v) => !keep || v !== keep);
      if (want.join() === have.join()) return;
      select.replaceChildren(...(keep ? [el("option", { value: keep, text: keep })] : []), ...want.map((v) => el("option", { value: v, text: v })));
      if ([...select.options].some((o) => o.value === current)) select.value = current;
    }

    async function refreshMetrics() {
      const rankSel = $("metric-rank");
      const rank = rankSel.value;
      const data = await api(`/api/jobs/${job}/metrics`, rank === "all" ? {} : { rank });
      fillSelect(rankSel, data.ranks, "all");
      const names = Object.keys(data.metrics).sort();
      const box = $("metrics");
      if (!names.length) return;
      box.querySelector("p.muted")?.remove();
      const multiAttempt = data.attempts.length > 1;
      const latest = detail ? detail.attempt : 0;  // earlier attempts are drawn dotted
      for (const name of names) {
        const traces = data.metrics[name].map((t, i) => ({
          x: t.x, y: t.y, type: "scatter",
          mode: t.x.length > 1 ? "lines" : "markers", name: `rank ${t.rank}` + (multiAttempt ? ` · attempt ${t.attempt}` : ""),
          line: { width: 1.5, color: COLORS[t.rank % COLORS.length], dash: multiAttempt && t.attempt !== latest ? "dot" : "solid" },
        }));
        const kind = data.metrics[name][0].x_kind;
        chart(box, "metric:" + name, traces, layout(name, { xaxis: { title: { text: kind, font: { size: 11 } }, gridcolor: "#eef0f3" } }));
      }
    }

    async function refreshResources() {
      const data = await api(`/api/jobs/${job}/resources`);
      const box = $("resources");
      const nodes = Object.entries(data.nodes);
      if (!nodes.length) return;
      box.querySelector("p.muted")?.remove();
      const GiB = 2 ** 30;
      for (const [node, n] of nodes) {
        const t = n.time.map((s) => new Date(s * 1000));
        const ranks = Object.entries(n.ranks);
        const cpu = [{ x: t, y: n.cpu_percent, name: "node (all cores)", line: { color: "#64748b", width: 2 } },
          ...ranks.map(([r, v]) => ({ x: t, y: v.cpu_percent, name: `rank ${r} tree`, line: { color: COLORS[r % COLORS.length], width: 1.5 } }))];
        chart(box, `cpu:${node}`, cpu.map((c) => ({ ...c, mode: "lines", type: "scatter" })), layout(`node ${node} · CPU %`, { yaxis: { rangemode: "tozero", gridcolor: "#eef0f3" } }));
        const mem = [{ x: t, y: n.mem_used.map((v) => v / GiB), name: "node used", line: { color: "#64748b", width: 2 } },
          ...ranks.map(([r, v]) => ({ x: t, y: v.rss.map((b) => (b === null ? null : b / GiB)), name: `rank ${r} RSS`, line: { color: COLORS[r % COLORS.length], width: 1.5 } }))];
        chart(box, `mem:${node}`, mem.map((c) => ({ ...c, mode: "lines", type: "scatter" })),
          layout(`node ${node} · memory GiB` + (n.mem_total ? ` (of ${(n.mem_total / GiB).toFixed(0)})` : ""), { yaxis: { rangemode: "tozero", gridcolor: "#eef0f3" } }));
        const gpus = Object.entries(n.gpus);
        if (gpus.length) {
          chart(box, `gpu:${node}`, gpus.map(([g, v]) => ({ x: t, y: v.util, name: `GPU ${g}`, mode: "lines", type: "scatter", line: { color: COLORS[g % COLORS.length] } })),
            layout(`node ${node} · GPU utilisation %`, { yaxis: { range: [0, 100], gridcolor: "#eef0f3" } }));
          chart(box, `gmem:${node}`, gpus.map(([g, v]) => ({ x: t, y: v.mem_used.map((b) => (b === null ? null : b / GiB)), name: `GPU ${g}`, mode: "lines", type: "scatter", line: { color: COLORS[g % COLORS.length] } })),
            layout(`node ${node} · GPU memory GiB`, { yaxis: { rangemode: "tozero", gridcolor: "#eef0f3" } }));
        }
      }
    }

    // Logs: the tail of one rank's own log, then what is appended (follow), or search results.
    const log = { rank: null, attempt: null, next: null, busy: false };
    const MAX_SHOWN = 2_000_000;
    async function loadLog(reset) {
      if (log.busy) return;
      log.busy = true;
      try {
        const pre = $("log");
        const rank = $("log-rank").value, attempt = $("log-attempt").value;
        if (rank === "" || attempt === "") return;
        if (reset || rank !== log.rank || attempt !== log.attempt) {
          log.rank = rank; log.attempt = attempt; log.next = null;
          pre.textContent = "";
        }
        const params = { rank, attempt };
        if (log.next !== null) params.offset = log.next;
        const data = await api(`/api/jobs/${job}/logs`, params);
        if (!data.exists && log.next === null) { pre.textContent = "(no output yet)"; return; }
        if (log.next === null && data.offset > 0) pre.textContent = `… ${bytes(data.offset)} earlier (search covers the whole log)\n`;
        if (pre.textContent === "(no output yet)") pre.textContent = "";
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
        if (data.text) {
          pre.append(document.createTextNode(data.text));
          if (pre.textContent.length > MAX_SHOWN) pre.textContent = pre.textContent.slice(-MAX_SHOWN);
        }
        log.next = data.next;
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      } finally {
        log.busy = false;
      }
    }

    async function search(ev) {
      ev.preventDefault();
      const q = $("log-query").value.trim();
      const box = $("log-matches");
      if (!q) { box.hidden = true; return; }
      const data = await api(`/api/jobs/${job}/logs`, { rank: $("log-rank").value, attempt: $("log-attempt").value, q });
      box.hidden = false;
      const lower = q.toLowerCase();
      const rows = data.matches.map((m) => {
        const i = m.text.toLowerCase().indexOf(lower);
        return el("div", { class: "match" }, el("span", { class: "ln", text: String(m.line) }),
          el("span", { text: m.text.slice(0, i) }), el("mark", { text: m.text.slice(i, i + q.length) }), el("span", { text: m.text.slice(i + q.length) }));
      });
      box.replaceChildren(el("div", { class: "muted", text: `${data.matches.length}${data.truncated ? "+" : ""} lines match “${q}” in rank ${data.rank}, attempt ${data.attempt}` }), ...rows);
    }

    async function refresh() {
      try {
        detail = await api(`/api/jobs/${job}`);
      } catch (e) { return; }
      renderHead(detail); renderCause(detail); renderHints(detail); renderTopology(detail); renderAttempts(detail);
      fillSelect($("log-attempt"), detail.attempts.length ? detail.attempts.map((a) => a.attempt) : [detail.attempt]);
      if (log.attempt === null) $("log-attempt").value = String(detail.attempt);
      const ranks = [...new Set(detail.ranks.map((r) => r.rank))].sort((a, b) => a - b);
      fillSelect($("log-rank"), ranks.length ? ranks : [0]);
      if (metricsEvery-- <= 0) {  // charts every 5 s: they cost more than the rest
        metricsEvery = 2;
        await Promise.all([refreshMetrics().catch(() => {}), refreshResources().catch(() => {})]);
      }
      if ($("log-follow").checked || log.next === null) await loadLog(false).catch(() => {});
      if (!detail.terminal) setTimeout(refresh, 2000);
      else if (!refresh.final) { refresh.final = true; metricsEvery = 0; setTimeout(refresh, 500); }
    }

    $("log-rank").addEventListener("change", () => loadLog(true));
    $("log-attempt").addEventListener("change", () => loadLog(true));
    $("metric-rank").addEventListener("change", () => { $("metrics").replaceChildren(); refreshMetrics(); });
    $("log-search").addEventListener("submit", search);
    $("log-follow").addEventListener("change", () => { if ($("log-follow").checked) loadLog(false); });
    setInterval(() => { if (detail && !detail.terminal && $("log-follow").checked) loadLog(false).catch(() => {}); }, 1000);
    refresh();
  }

  // -- compare -----------------------------------------------------------------------------------
  async function comparePage() {
    const data = await api("/api/compare", { jobs: C.jobs.join(",") });
    $("compare-jobs").replaceChildren(...data.jobs.map((j, i) => el("div", {},
      el("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` }),
      el("a", { href: link("/jobs/" + j.id), text: j.id }), " ", el("span", { text: j.name + " · " }), stateBadge(j.state))));
    const box = $("compare");
    box.replaceChildren();
    const names = Object.keys(data.metrics).sort();
    if (!names.length) { box.append(el("p", { class: "muted", text: "these jobs have no metrics" })); return; }
    const index = Object.fromEntries(data.jobs.map((j, i) => [j.id, i]));
    for (const name of names) {
      chart(box, name, data.metrics[name].map((t) => ({
        x: t.x, y: t.y, name: t.label, type: "scatter", mode: t.x.length > 1 ? "lines" : "markers",
        line: { width: 1.5, color: COLORS[index[t.job] % COLORS.length] },
      })), layout(name, { xaxis: { title: { text: "step", font: { size: 11 } }, gridcolor: "#eef0f3" } }));
    }
  }

  if (C.page === "jobs") jobsPage();
  else if (C.page === "job") jobPage();
  else if (C.page === "compare") comparePage();
})();
