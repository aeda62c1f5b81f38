// A job's page (and the compare page): facts and actions, root cause, topology, attempts,
// metric charts (x by step or time, smoothing, log scale, other jobs overlaid), resource
// charts of every attempt, live per-rank logs with search, artifacts with previews.
(function () {
  "use strict";
  const { C, $, el, get, link, ago, dur, bytes, num, hours, money, stateBadge, actionButtons, layout, chart, smooth,
    COLORS, markRendered, parts } = window.PHX;
  const GiB = 2 ** 30, MiB = 2 ** 20;

  // -- metric charts, shared with the compare page ---------------------------------------------
  const view = { x: "step", smooth: 0, log: false };
  function bindChartControls(redraw) {
    $("m-x").addEventListener("change", () => { view.x = $("m-x").value; redraw(); });
    $("m-smooth").addEventListener("input", () => {
      view.smooth = Number($("m-smooth").value);
      $("m-smooth-v").textContent = view.smooth.toFixed(2);
      redraw();
    });
    $("m-log").addEventListener("change", () => { view.log = $("m-log").checked; redraw(); });
  }

  // Traces of one curve: the smoothed line, and the raw one faint behind it when smoothing.
  function curve(t, name, color, dash, t0) {
    const x = view.x === "step" ? t.x : view.x === "rel" ? t.t.map((s) => (s - t0) / 60) : t.t.map((s) => new Date(s * 1000));
    const line = { x, y: smooth(t.y, view.smooth), name, type: "scatter", mode: t.x.length > 1 ? "lines" : "markers",
      line: { width: 1.8, color, dash: dash || "solid" }, marker: { color, size: 6 } };
    if (!view.smooth) return [line];
    return [{ x, y: t.y, type: "scatter", mode: "lines", line: { width: 1, color }, opacity: 0.25, showlegend: false, hoverinfo: "skip" }, line];
  }
  function axes(name, kind, maxStep) {
    const xtitle = view.x === "step" ? (kind || "step") : view.x === "rel" ? "minutes since start" : "time";
    return layout(name, {
      height: 360,
      xaxis: { title: { text: xtitle, font: { size: 11 } }, gridcolor: "#eef0f3", type: view.x === "wall" ? "date" : "linear",
        dtick: view.x === "step" && maxStep !== undefined && maxStep <= 12 ? 1 : undefined },
      yaxis: { gridcolor: "#eef0f3", type: view.log ? "log" : "linear", exponentformat: "power" },
    });
  }

  // -- job page ---------------------------------------------------------------------------------
  function jobPage() {
    const job = C.job;
    let detail = null;
    let metricsEvery = 0;
    let metricData = null;
    const overlays = new Map(); // job id -> its metric series (rank 0)

    function renderHead(d) {
      $("job-state").replaceWith(Object.assign(stateBadge(d.state), { id: "job-state" }));
      const u = d.usage || {};
      const facts = [
        ["command", d.command, "wide mono"],
        ["topology", `${d.topology} (${d.world_size} rank${d.world_size > 1 ? "s" : ""}) on ${d.backend}`],
        ["project", d.project + (d.user_name ? ` · submitted by ${d.user_name}` : "")],
        ...(d.queued ? [["queue", d.queued, "wide"]] : []),
        ["attempt", `${d.attempt}` + (d.retries ? ` (${d.retries} retried)` : "")],
        ["created", `${ago(d.created_at)}`],
        ["duration", dur(d.duration)],
        ...(d.health && d.health.progress ? [["progress", null, "", progressBar(d.health.progress)]] : []),
        ["exit", d.exit_code === null ? "-" : String(d.exit_code)],
        ["GPU-hours", hours(u.gpu_hours) + (u.gpus_per_node ? ` (${u.gpus_per_node} GPU/node${u.gpu_model ? ", " + u.gpu_model : ""})` : "")],
        ["CPU-hours", hours(u.cpu_hours)],
        ["cost", u.cost === null || u.cost === undefined ? "- (no price set)" : `${money(u.cost)} (${u.priced_by})`],
        ["dir", d.job_dir, "wide mono"],
      ];
      if (d.sweep) facts.splice(1, 0, ["sweep", null, "", el("a", { href: "/sweeps/" + d.sweep.id, text: `${d.sweep.id} · trial ${d.sweep.trial}` })]);
      for (const [k, v] of Object.entries(d.settings || {})) facts.push([k.replace(/_/g, " "), Array.isArray(v) ? v.join(", ") : String(v)]);
      for (const t of d.trackers || []) {
        const web = /^https?:\/\//.test(t.url || "");
        const note = ` (${t.sent} sent${t.waiting ? `, ${t.waiting} waiting` : ""}${t.dropped ? `, ${t.dropped} dropped` : ""}${t.error ? "; " + t.error : ""})`;
        facts.push([t.kind, null, "wide", el("span", { class: "v tracker" },
          web ? el("a", { href: t.url, target: "_blank", rel: "noopener", text: t.run_id || t.url }) : el("span", { class: "mono", text: t.url || "no run yet" }),
          el("span", { class: "muted", text: note }))]);
      }
      const tags = Object.entries(d.tags || {});
      if (tags.length) facts.push(["tags", null, "", el("span", { class: "tags" }, ...tags.map(([k, v]) => el("a", { class: "tag", href: link("/", { tag: `${k}=${v}` }), text: `${k}=${v}` })))]);
      $("job-facts").replaceChildren(...facts.map(([k, v, cls, node]) => el("div", { class: cls || "" },
        el("span", { class: "k", text: k }), node || el("span", { class: "v", text: v }))));
      actionButtons($("actions"), "job", d.id, d.actions, refresh);
    }

    function progressBar(p) {
      const pct = p.fraction === null ? 0 : Math.round(100 * p.fraction);
      return el("span", { class: "progress-cell", id: "job-progress" },
        el("div", { class: "progress", title: p.words }, el("div", { class: "done", style: `width:${pct}%` })),
        el("span", { class: "small", text: p.words }));
    }

    function renderHints(d) {
      // the health watch's words first (the slow rank, the stop clocks), then the hints
      const health = ((d.health && d.health.lines) || []).filter((l) => l.label !== "progress" && l.label !== "anomaly");
      $("hints-box").hidden = !d.hints.length && !health.length;
      $("hints").replaceChildren(
        ...health.map((l) => el("li", { class: "health " + l.label, text: l.text })),
        ...d.hints.map((h) => el("li", { text: h })));
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
          const slow = d.health && d.health.straggler && d.health.straggler.ranks.includes(rank);
          const why = rank === d.root_cause_rank ? "root cause" : r && r.peer_lost ? "lost its peer" : state;
          ranks.push(el("div", { class: "rank " + state + (slow ? " slow" : ""), title: r ? `pid ${r.pid} on ${r.host}, ${state}` + (r.exitcode !== null ? `, exit ${r.exitcode}` : "") : state },
            el("b", { text: "rank " + rank }), el("span", { text: r && r.pid ? `pid ${r.pid} · ${why}` : why })));
        }
        const host = (d.ranks.find((x) => x.node_rank === n) || {}).host;
        nodes.push(el("div", { class: "node" }, el("div", { class: "node-title", text: `node ${n}` + (host ? " · " + host : "") }), el("div", { class: "ranks" }, ...ranks)));
      }
      $("topology").replaceChildren(...nodes);
    }

    function renderAttempts(d) {
      const now = Date.now() / 1000;
      const atts = d.attempts.filter((a) => a.start);
      if (!atts.length) { $("attempts").replaceChildren(el("p", { class: "muted", text: d.terminal ? "no attempt started" : "not started yet" })); return; }
      const t0 = Math.min(...atts.map((a) => a.start));
      const t1 = Math.max(...atts.map((a) => a.end || now));
      const span = Math.max(t1 - t0, 1e-3);
      const rows = atts.map((a) => {
        const end = a.end || now;
        const outcome = a.outcome || (a.end === null ? "running" : a.exitcode === 0 ? "succeeded" : "failed");
        const cls = outcome === "running" ? "running" : outcome === "succeeded" ? "ok" : ["cancelled", "preempted", "pruned"].includes(outcome) ? "warn" : "failed";
        const after = a.retried ? "retried" : (a.reason && a.reason !== outcome ? a.reason : "");
        return el("div", { class: "attempt" },
          el("div", { class: "label" }, el("b", { text: `attempt ${a.attempt}` }), ` · ${dur(end - a.start)} · `,
            el("span", { class: "outcome " + cls, text: outcome }), a.exitcode !== null && a.exitcode !== undefined && outcome !== "running" ? ` (exit ${a.exitcode})` : ""),
          el("div", { class: "track" }, el("div", {
            class: "span " + cls, style: `left:${(100 * (a.start - t0)) / span}%;width:${Math.max(0.8, (100 * (end - a.start)) / span)}%`,
          })),
          a.message && outcome !== "succeeded" && a.message !== outcome ? el("div", { class: "amsg", text: a.message + (after ? ` → ${after}` : "") }) : null);
      });
      $("attempts").replaceChildren(...rows);
    }

    function fillSelect(select, values, keep) {
      const current = select.value;
      const want = values.map(String);
      const have = [...select.options].map((o) => o.value).filter((v) => !keep || v !== keep);
      if (want.join() === have.join()) return;
      select.replaceChildren(...(keep ? [el("option", { value: keep, text: keep })] : []), ...want.map((v) => el("option", { value: v, text: v })));
      if ([...select.options].some((o) => o.value === current)) select.value = current;
    }

    // Metrics: one large chart per metric; ranks (and attempts) as lines; overlaid jobs dashed.
    function drawMetrics() {
      const data = metricData;
      if (!data) return;
      const names = [...new Set([...Object.keys(data.metrics), ...[...overlays.values()].flatMap((o) => Object.keys(o.metrics))])].sort();
      const box = $("metrics");
      if (!names.length) return;
      box.querySelector("p.muted")?.remove();
      const multiAttempt = data.attempts.length > 1;
      const latest = detail ? detail.attempt : 0;
      const starts = Object.values(data.metrics).flat().map((t) => t.t[0]).filter((v) => v);
      const t0 = starts.length ? Math.min(...starts) : 0;
      names.forEach((name) => {
        const own = data.metrics[name] || [];
        const traces = own.flatMap((t) => curve(t, `rank ${t.rank}` + (multiAttempt ? ` · attempt ${t.attempt}` : ""),
          COLORS[t.rank % COLORS.length], multiAttempt && t.attempt !== latest ? "dot" : "solid", t0));
        let i = 0;
        for (const [other, series] of overlays) {
          i++;
          for (const t of series.metrics[name] || []) {
            const o0 = t.t.length ? t.t[0] : 0;
            traces.push(...curve(t, `${other} ${series.name || ""} · rank ${t.rank}`, COLORS[(i + 3) % COLORS.length], "dash", o0));
          }
        }
        const maxStep = Math.max(...own.map((t) => (t.x.length ? t.x[t.x.length - 1] : 0)));
        chart(box, "metric:" + name, traces, axes(name, own[0] && own[0].x_kind, maxStep), "big");
      });
    }

    async function refreshMetrics() {
      const rankSel = $("metric-rank");
      const rank = rankSel.value;
      metricData = await get(`/api/jobs/${job}/metrics`, rank === "all" ? {} : { rank });
      fillSelect(rankSel, metricData.ranks, "all");
      drawMetrics();
    }

    async function overlay(ev) {
      ev.preventDefault();
      const ref = $("overlay-job").value.trim();
      if (!ref) return;
      try {
        const other = await get(`/api/jobs/${encodeURIComponent(ref)}`);
        const series = await get(`/api/jobs/${other.id}/metrics`, { rank: 0 });
        overlays.set(other.id, { ...series, name: other.name });
        $("overlay-job").value = "";
        renderOverlays();
        drawMetrics();
      } catch (e) { window.PHX.toast(e.message, true); }
    }
    function renderOverlays() {
      $("overlays").replaceChildren(...[...overlays.entries()].map(([id, s]) => el("span", { class: "chip" },
        el("a", { href: "/jobs/" + id, text: `${id} ${s.name}` }),
        el("button", { type: "button", class: "x", title: "remove", onclick: () => { overlays.delete(id); renderOverlays(); $("metrics").replaceChildren(); drawMetrics(); } }, "×"))));
    }

    // Resources: every attempt, so a job that ended keeps its charts; attempts are marked.
    async function refreshResources() {
      const box = $("resources");
      if (detail && detail.resources_summary) { parts.resourceSummary(box, detail.resources_summary); return; }
      const data = await get(`/api/jobs/${job}/resources`);
      const nodes = Object.entries(data.nodes);
      if (!nodes.length) {
        box.replaceChildren(el("p", { class: "muted", text: detail && detail.terminal
          ? (detail.backend === "sagemaker" ? "SageMaker jobs have no resource samples (CloudWatch has them)" : "no resource samples: the job ended before its first sample")
          : "no resource samples yet (the first comes within a second of the start)" }));
        return;
      }
      box.querySelectorAll("p.muted, .resource-summary").forEach((n) => n.remove());
      const marks = data.starts.length > 1 ? data.starts.map((s) => ({
        type: "line", xref: "x", yref: "paper", x0: new Date(s.time * 1000), x1: new Date(s.time * 1000), y0: 0, y1: 1,
        line: { color: "#94a3b8", width: 1, dash: "dot" } })) : [];
      const count = nodes.reduce((n, [, v]) => n + v.time.length, 0);
      $("res-note").textContent = `${count} samples` + (data.attempts.length > 1 ? ` over ${data.attempts.length} attempts (dotted lines)` : "");
      const lay = (title, y) => layout(title, { height: 280, shapes: marks, xaxis: { type: "date", gridcolor: "#eef0f3" }, yaxis: Object.assign({ gridcolor: "#eef0f3", rangemode: "tozero" }, y || {}) });
      const line = (x, y, name, color, width) => ({ x, y, name, type: "scatter", mode: x.length > 3 ? "lines" : "lines+markers",
        line: { color, width: width || 1.5 }, marker: { color, size: 6 }, connectgaps: false });
      for (const [node, n] of nodes) {
        const t = n.time.map((s) => new Date(s * 1000));
        const ranks = Object.entries(n.ranks);
        const label = nodes.length > 1 ? `node ${node} · ` : "";
        chart(box, `cpu:${node}`, [line(t, n.cpu_percent, "node (all cores)", "#64748b", 2),
          ...ranks.map(([r, v]) => line(t, v.cpu_percent, `rank ${r} tree`, COLORS[r % COLORS.length]))],
        lay(`${label}CPU %` + (n.cpu_count ? ` (${n.cpu_count} cores = ${n.cpu_count * 100}%)` : "")));
        chart(box, `mem:${node}`, [line(t, n.mem_used.map((v) => (v === null ? null : v / GiB)), "node used", "#64748b", 2),
          ...ranks.map(([r, v]) => line(t, v.rss.map((b) => (b === null ? null : b / GiB)), `rank ${r} RSS`, COLORS[r % COLORS.length]))],
        lay(`${label}memory GiB` + (n.mem_total ? ` (of ${(n.mem_total / GiB).toFixed(0)})` : "")));
        const gpus = Object.entries(n.gpus);
        if (gpus.length) {
          chart(box, `gpu:${node}`, gpus.map(([g, v]) => line(t, v.util, `GPU ${g}` + (v.name ? ` ${v.name}` : ""), COLORS[g % COLORS.length])),
            lay(`${label}GPU utilisation %`, { range: [0, 100] }));
          chart(box, `gmem:${node}`, gpus.map(([g, v]) => line(t, v.mem_used.map((b) => (b === null ? null : b / GiB)), `GPU ${g}`, COLORS[g % COLORS.length])),
            lay(`${label}GPU memory GiB`));
        }
        const mb = (xs) => xs.map((v) => (v === null || v === undefined ? null : v / MiB));
        chart(box, `disk:${node}`, [line(t, mb(n.disk_read_rate), "read", "#0891b2"), line(t, mb(n.disk_write_rate), "write", "#ea580c")],
          lay(`${label}disk MiB/s`));
        chart(box, `net:${node}`, [line(t, mb(n.net_recv_rate), "received", "#16a34a"), line(t, mb(n.net_sent_rate), "sent", "#9333ea")],
          lay(`${label}network MiB/s`));
      }
    }

    // Logs: the tail of one rank's own log, then, while "follow" is on, what is appended as it is
    // written: one long answer of Server-Sent Events (the server is woken by the file changing).
    const log = { rank: null, attempt: null, next: null, busy: false };
    const MAX_SHOWN = 2_000_000;
    let source = null;

    function show(data) {
      const pre = $("log");
      if (!data.exists && log.next === null) { pre.textContent = "(no output yet)"; return; }
      if (log.next === null && data.offset > 0) pre.textContent = `… ${bytes(data.offset)} earlier (search covers the whole log)\n`;
      if (pre.textContent === "(no output yet)") pre.textContent = "";
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
      if (data.text || data.fold) {
        parts.appendLog(pre, data);
        if (pre.textContent.length > MAX_SHOWN) pre.textContent = pre.textContent.slice(-MAX_SHOWN);
      }
      log.next = data.next;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }

    function stopFollowing() {
      if (source) { source.close(); source = null; }
    }

    function follow() {
      stopFollowing();
      if (!$("log-follow").checked || !detail || detail.terminal || log.rank === null || log.next === null) return;
      const params = new URLSearchParams({ rank: log.rank, attempt: log.attempt, offset: log.next });
      const here = new EventSource(`/api/jobs/${job}/logs/stream?${params}`);
      source = here;
      here.onmessage = (ev) => {
        const data = JSON.parse(ev.data);
        if (data.end || data.error) { stopFollowing(); return; }
        if (data.offset === log.next) show(data);
      };
      here.onerror = () => {  // cut off: follow again from where the page is, not where it began
        if (source !== here) return;
        stopFollowing();
        setTimeout(follow, 2000);
      };
    }

    async function loadLog(reset) {
      if (log.busy) return;
      log.busy = true;
      try {
        const pre = $("log");
        const rank = $("log-rank").value, attempt = $("log-attempt").value;
        if (rank === "" || attempt === "") return;
        if (reset || rank !== log.rank || attempt !== log.attempt) {
          stopFollowing();
          log.rank = rank; log.attempt = attempt; log.next = null;
          pre.textContent = "";
          const first = detail && attempt === String(detail.attempt) && rank === String(detail.root_cause_rank);
          $("log-note").textContent = first ? parts.logNote(detail) : "";
        }
        const params = { rank, attempt };
        if (log.next !== null) params.offset = log.next;
        show(await get(`/api/jobs/${job}/logs`, params));
      } finally {
        log.busy = false;
      }
      if (!source) follow();
    }

    async function search(ev) {
      ev.preventDefault();
      const q = $("log-query").value.trim();
      const box = $("log-matches");
      if (!q) { box.hidden = true; return; }
      const data = await get(`/api/jobs/${job}/logs`, { rank: $("log-rank").value, attempt: $("log-attempt").value, q });
      box.hidden = false;
      const lower = q.toLowerCase();
      const rows = data.matches.map((m) => {
        const i = m.text.toLowerCase().indexOf(lower);
        return el("div", { class: "match" }, el("span", { class: "ln", text: String(m.line) }),
          el("span", { text: m.text.slice(0, i) }), el("mark", { text: m.text.slice(i, i + q.length) }), el("span", { text: m.text.slice(i + q.length) }));
      });
      box.replaceChildren(el("div", { class: "muted", text: `${data.matches.length}${data.truncated ? "+" : ""} lines match “${q}” in rank ${data.rank}, attempt ${data.attempt}` }), ...rows);
    }

    // Artifacts: images and text shown in place, everything downloadable.
    async function refreshArtifacts() {
      const data = await get(`/api/jobs/${job}/artifacts`);
      const key = JSON.stringify(data);
      if (key === refreshArtifacts.shown) return;  // unchanged: keep what the person opened
      refreshArtifacts.shown = key;
      $("art-where").textContent = data.uploaded ? `uploaded to ${data.location}` : (data.files.length ? data.location : "");
      if (!data.files.length) {
        $("artifacts").replaceChildren(el("p", { class: "muted", text: "no outputs: files the script writes to $PHALANX_OUTPUT_DIR show here" }));
        return;
      }
      const file = (f, download) => link(`/api/jobs/${job}/artifacts/file`, download ? { path: f.path, download: 1 } : { path: f.path });
      const images = data.files.filter((f) => f.preview === "image");
      const rows = data.files.map((f) => el("tr", {},
        el("td", { class: "mono" }, f.path),
        el("td", { class: "num", text: bytes(f.size) }),
        el("td", {}, f.preview === "text" ? el("button", { type: "button", class: "link", onclick: async (ev) => {
          const box = ev.target.closest("tr").nextElementSibling;
          if (!box.hidden) { box.hidden = true; return; }
          const r = await fetch(link(`/api/jobs/${job}/artifacts/file`, { path: f.path, preview: 1 }));
          box.querySelector("pre").textContent = (await r.text()) + (f.size > 65536 ? "\n… (the first 64 KiB)" : "");
          box.hidden = false;
        } }, "preview") : f.preview === "image" ? el("a", { href: "#img-" + encodeURIComponent(f.path) }, "view") : null),
        el("td", {}, el("a", { href: file(f, true), download: f.path.split("/").pop() }, "download"))));
      const body = [];
      rows.forEach((r) => { body.push(r, el("tr", { class: "preview", hidden: true }, el("td", { colspan: 4 }, el("pre", { class: "artifact-text" })))); });
      $("artifacts").replaceChildren(...[
        images.length ? el("div", { class: "gallery" }, ...images.slice(0, 24).map((f) => el("figure", { id: "img-" + encodeURIComponent(f.path) },
          el("a", { href: file(f), target: "_blank", rel: "noopener" }, el("img", { src: file(f), alt: f.path, loading: "lazy" })),
          el("figcaption", { text: f.path })))) : null,
        el("table", { class: "list artifacts" }, el("thead", {}, el("tr", {}, el("th", {}, "FILE"), el("th", { class: "num" }, "SIZE"), el("th", {}, ""), el("th", {}, ""))),
          el("tbody", {}, ...body))].filter(Boolean));
    }

    async function refresh() {
      try {
        detail = await get(`/api/jobs/${job}`);
      } catch (e) { return; }
      if (detail.metrics_note && !$("metrics").querySelector("[data-chart]")) $("metrics").replaceChildren(el("p", { class: "muted", text: detail.metrics_note }));
      renderHead(detail); parts.renderCause(detail); renderHints(detail); renderTopology(detail); renderAttempts(detail);
      markRendered("rendered");
      $("live").classList.toggle("on", !detail.terminal);
      fillSelect($("log-attempt"), detail.attempts.length ? detail.attempts.map((a) => a.attempt) : [detail.attempt]);
      if (log.attempt === null) $("log-attempt").value = String(detail.attempt);
      const ranks = [...new Set(detail.ranks.map((r) => r.rank))].sort((a, b) => a - b);
      fillSelect($("log-rank"), ranks.length ? ranks : [0]);
      if (log.rank === null && detail.root_cause_rank !== null && ranks.includes(detail.root_cause_rank)) {
        $("log-rank").value = String(detail.root_cause_rank);  // a failed job's panel opens on the rank that failed first
      }
      if (metricsEvery-- <= 0 || !refresh.started) {  // charts every 6 s: they cost more than the rest
        const first = !refresh.started;
        refresh.started = true;
        if (!first) metricsEvery = 2;
        await Promise.all([first ? null : refreshMetrics().catch(() => {}), refreshResources().catch(() => {}),
          refreshArtifacts().catch(() => {})]);
        markRendered("charts");
      }
      if (log.next === null || (detail.terminal && !source)) await loadLog(false).catch(() => {});
      else if (!source) follow();
      if (!detail.terminal) setTimeout(refresh, 2000);
      else if (!refresh.final) { refresh.final = true; metricsEvery = 0; setTimeout(refresh, 500); }
    }

    // The charts' data is asked for at once, beside the job's: the first chart comes sooner.
    metricsEvery = 2;
    refreshMetrics().then(() => markRendered("metrics")).catch(() => {});
    $("log-rank").addEventListener("change", () => loadLog(true));
    $("log-attempt").addEventListener("change", () => loadLog(true));
    $("metric-rank").addEventListener("change", () => { $("metrics").replaceChildren(); refreshMetrics(); });
    $("log-search").addEventListener("submit", search);
    $("overlay").addEventListener("submit", overlay);
    $("log-follow").addEventListener("change", () => { if ($("log-follow").checked) loadLog(false); else stopFollowing(); });
    bindChartControls(() => { $("metrics").replaceChildren(); drawMetrics(); });
    refresh();
  }

  // -- compare ----------------------------------------------------------------------------------
  async function comparePage() {
    const data = await get("/api/compare", { jobs: C.jobs.join(",") });
    $("compare-jobs").replaceChildren(...data.jobs.map((j, i) => el("div", {},
      el("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` }),
      el("a", { href: "/jobs/" + j.id, text: j.id }), " ", el("span", { text: j.name + " · " }), stateBadge(j.state))));
    const index = Object.fromEntries(data.jobs.map((j, i) => [j.id, i]));
    function draw() {
      const box = $("compare");
      box.replaceChildren();
      const names = Object.keys(data.metrics).sort();
      if (!names.length) { box.append(el("p", { class: "muted", text: "these jobs have no metrics" })); return; }
      for (const name of names) {
        const traces = data.metrics[name].flatMap((t) => curve(t, t.label, COLORS[index[t.job] % COLORS.length], "solid", t.t.length ? t.t[0] : 0));
        chart(box, name, traces, axes(name, data.metrics[name][0].x_kind), "big");
      }
      markRendered("rendered");
    }
    bindChartControls(draw);
    draw();
  }

  if (C.page === "job") jobPage();
  else if (C.page === "compare") comparePage();
})();
