// A sweep's page: progress and actions, the trial table (best first, the best highlighted,
// pruned trials marked with the step and the reason), a parallel-coordinates plot of the
// parameters and the objective, and the objective against each parameter.
(function () {
  "use strict";
  const { C, $, el, get, ago, dur, num, hours, stateBadge, actionButtons, layout, chart, COLORS, markRendered } = window.PHX;
  const STATE_COLORS = { SUCCEEDED: "#16a34a", FAILED: "#dc2626", PRUNED: "#f59e0b", RUNNING: "#2563eb", CANCELLED: "#a16207", LOST: "#7f1d1d", PENDING: "#64748b", PREEMPTED: "#a16207", STOPPING: "#2563eb", TIMEOUT: "#a16207" };
  let detail = null;
  let sortBy = null; // client-side re-sort of the table: {key, dir}

  function facts(d) {
    const s = d.settings || {};
    const list = [
      ["command", d.command, "wide mono"],
      ["strategy", `${d.strategy}` + (s.seed !== null && s.seed !== undefined ? ` (seed ${s.seed})` : "")],
      ["objective", d.objective ? `${d.objective} (${d.direction === "max" ? "maximise" : "minimise"})` : "none"],
      ["early stop", s.early_stop || "off"],
      ["parallel", s.parallel ? String(s.parallel) : "as many as fit"],
      ["topology", d.topology],
      ["created", ago(d.created_at)],
      ["duration", dur(d.duration)],
      ["GPU-hours", hours(d.gpu_hours)],
      ["CPU-hours", hours(d.cpu_hours)],
    ];
    if (d.cost !== null && d.cost !== undefined) list.push(["cost", d.cost.toFixed(2)]);
    $("sweep-facts").replaceChildren(...list.map(([k, v, cls]) => el("div", { class: cls || "" }, el("span", { class: "k", text: k }), el("span", { class: "v", text: v }))));
  }

  function progress(d) {
    const total = d.total || 0;
    const pct = (n) => (total ? (100 * n) / total : 0);
    const st = d.table.rows.reduce((m, r) => ((m[r.state] = (m[r.state] || 0) + 1), m), {});
    $("sweep-progress").replaceChildren(
      el("div", { class: "progress big" },
        el("div", { class: "done", style: `width:${pct((st.SUCCEEDED || 0))}%`, title: "succeeded" }),
        el("div", { class: "pruned", style: `width:${pct(st.PRUNED || 0)}%`, title: "pruned" }),
        el("div", { class: "failed", style: `width:${pct((st.FAILED || 0) + (st.LOST || 0))}%`, title: "failed" }),
        el("div", { class: "run", style: `width:${pct((st.RUNNING || 0) + (st.PENDING || 0))}%`, title: "running" })),
      el("span", { class: "progress-text", text: d.progress_text }));
  }

  function paramText(v) {
    return typeof v === "number" ? num(v) : String(v);
  }

  function table(d) {
    const t = d.table;
    const obj = t.objective;
    const heads = [["#", "trial"], ["JOB", "id"], ["STATE", "state"], ...(obj ? [[obj.toUpperCase() + (t.direction === "max" ? " ↑" : " ↓"), "objective"]] : []),
      ...t.params.map((p) => [p, "p:" + p]), ...t.metrics.map((m) => [m, "m:" + m]), ["DURATION", "duration"], ["GPU-H", "gpu_hours"]];
    $("trials-head").replaceChildren(...heads.map(([label, key]) => el("th", {
      class: "sortable" + (["objective", "duration", "gpu_hours"].includes(key) || key.startsWith("m:") ? " num" : "") + (sortBy && sortBy.key === key ? " sorted" : ""),
      onclick: () => { sortBy = { key, dir: sortBy && sortBy.key === key ? -sortBy.dir : 1 }; table(detail); },
    }, label)));
    const value = (r, key) => key.startsWith("p:") ? r.params[key.slice(2)] : key.startsWith("m:") ? r.metrics[key.slice(2)] : r[key];
    const rows = [...t.rows];
    if (sortBy) rows.sort((a, b) => {
      const x = value(a, sortBy.key), y = value(b, sortBy.key);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortBy.dir;
    });
    $("trials-body").replaceChildren(...rows.map((r) => {
      const pruned = r.pruned ? ` at step ${r.pruned.step ?? "?"}` : "";
      const state = el("span", {}, stateBadge(r.state, r.pruned ? r.pruned.reason : ""), pruned ? el("span", { class: "small muted", text: pruned, title: r.pruned.reason }) : null);
      const row = el("tr", { class: "row-" + r.state + (r.best ? " best" : ""), title: r.pruned ? r.pruned.reason : "", onclick: (ev) => {
        if (ev.target.tagName !== "A") location.href = "/jobs/" + r.id;
      } },
      el("td", { class: "num", text: r.trial === null ? "-" : String(r.trial) }),
      el("td", { class: "mono" }, el("a", { href: "/jobs/" + r.id, text: r.id })),
      el("td", {}, state),
      ...(obj ? [el("td", { class: "num mono" + (r.best ? " best-value" : "") + (r.objective === null ? " faint" : ""),
        title: r.pruned ? `its ${obj} when pruned` : r.final ? "" : "latest value (still running)" },
      r.best ? "★ " : "", r.objective !== null ? num(r.objective) + (r.final ? "" : " …") : r.last_value !== null ? `(${num(r.last_value)})` : "-")] : []),
      ...t.params.map((p) => el("td", { class: "mono", text: paramText(r.params[p]) })),
      ...t.metrics.map((m) => el("td", { class: "num mono", text: num(r.metrics[m]) })),
      el("td", { class: "num", text: dur(r.duration) }),
      el("td", { class: "num", text: hours(r.gpu_hours) }));
      return row;
    }));
  }

  // One axis per parameter, on the scale the sweep searched it on (the search space says:
  // ``scales``, log for loguniform, categorical for a list), and its ticks placed on that same
  // scale: a log axis is labelled by decades, a categorical one by its values.
  const tick = (v) => Number(v.toPrecision(4)).toString();
  function axis(label, values, scale, domain) {
    const all = domain || values;  // every trial's values: the axis spans what was tried, lines show what finished
    if (scale === "categorical" || !all.every((v) => typeof v === "number")) {
      const cats = [...new Set(all.map((v) => JSON.stringify(v)))].map((k) => JSON.parse(k));
      if (cats.every((v) => typeof v === "number")) cats.sort((a, b) => a - b);
      const at = (v) => (cats.length > 1 ? cats.findIndex((c) => JSON.stringify(c) === JSON.stringify(v)) / (cats.length - 1) : 0.5);
      return { label, scale: "categorical", y: values.map(at), text: values.map(paramText), ticks: cats.map((c) => ({ y: at(c), text: paramText(c) })) };
    }
    const lo = Math.min(...all), hi = Math.max(...all);
    const log = scale === "log" && lo > 0;
    const f = log ? Math.log10 : (v) => v;
    const at = (v) => (hi > lo ? (f(v) - f(lo)) / (f(hi) - f(lo)) : 0.5);
    let marks = [lo, (lo + hi) / 2, hi];
    if (log) {
      const decades = [];
      for (let k = Math.ceil(Math.log10(lo) - 1e-9); k <= Math.floor(Math.log10(hi) + 1e-9); k++) decades.push(Number((10 ** k).toPrecision(12)));
      const step = Math.ceil(decades.length / 6);
      marks = [...decades.filter((_, i) => i % step === 0), lo, hi];
    }
    const ticks = [];
    for (const v of marks) if (!ticks.some((t) => Math.abs(t.y - at(v)) < 0.06)) ticks.push({ y: at(v), text: tick(v) });
    return { label, scale: log ? "log" : "linear", y: values.map(at), text: values.map(num), ticks };
  }

  // Viridis, as plotly draws it, for the lines' colours.
  const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
  function viridis(f) {
    const x = Math.max(0, Math.min(1, f)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
    const a = VIRIDIS[i], b = VIRIDIS[i + 1], w = x - i;
    const mix = (k) => Math.round(parseInt(a.slice(k, k + 2), 16) * (1 - w) + parseInt(b.slice(k, k + 2), 16) * w);
    return `rgb(${mix(1)},${mix(3)},${mix(5)})`;
  }

  // Parallel coordinates as SVG lines (plotly's parcoords needs WebGL and code generated at run
  // time, which this page's Content-Security-Policy does not allow): one vertical axis per
  // parameter and the objective, each scaled to its own range, one line per finished trial
  // coloured by its objective (the best end of the scale is yellow).
  function parallel(div, dims, objective, best, title, direction) {
    const lo = Math.min(...objective), hi = Math.max(...objective);
    const good = (v) => (hi > lo ? (direction === "max" ? (v - lo) / (hi - lo) : (hi - v) / (hi - lo)) : 1);
    const order = objective.map((_, i) => i).sort((a, b) => good(objective[a]) - good(objective[b])); // best drawn last, on top
    const traces = order.map((i) => ({
      x: dims.map((_, k) => k), y: dims.map((d) => d.y[i]), type: "scatter", mode: "lines+markers", showlegend: false,
      line: { color: viridis(good(objective[i])), width: i === best ? 4 : 2 }, marker: { size: i === best ? 8 : 5, color: viridis(good(objective[i])) },
      hoverinfo: "text", text: dims.map((d) => `${d.label}=${d.text[i]}`),
    }));
    traces.push({ x: [null], y: [null], type: "scatter", mode: "markers", showlegend: false, hoverinfo: "skip",
      marker: { color: [lo, hi], colorscale: "Viridis", reversescale: direction !== "max", cmin: lo, cmax: hi, showscale: true,
        colorbar: { title: { text: dims[dims.length - 1].label }, thickness: 14, len: 0.9 } } });
    const ticks = (d, k) => d.ticks.map((t) => ({ x: k, y: t.y, text: t.text, showarrow: false, xanchor: "right", xshift: -6,
      font: { size: 10, color: "#6b7280" }, name: "tick:" + d.label }));
    const annotations = dims.flatMap((d, k) => [{ x: k, y: 1.1, text: `<b>${d.label}</b>` + (d.scale === "linear" ? "" : ` <i>(${d.scale})</i>`),
      showarrow: false, font: { size: 12 } }, ...ticks(d, k)]);
    const shapes = dims.map((_, k) => ({ type: "line", x0: k, x1: k, y0: 0, y1: 1, line: { color: "#64748b", width: 1.5 } }));
    Plotly.react(div, traces, layout(title, { height: 400, hovermode: "closest", annotations, shapes, margin: { l: 60, r: 30, t: 60, b: 20 },
      xaxis: { visible: false, range: [-0.35, dims.length - 0.65] }, yaxis: { visible: false, range: [-0.06, 1.18] } }),
    { displaylogo: false, responsive: true });
  }

  function plots(d) {
    const t = d.table;
    const done = t.rows.filter((r) => r.objective !== null && r.objective !== undefined);
    if (!t.objective || !done.length) {
      $("parcoords").replaceChildren(el("p", { class: "muted", text: t.objective ? "no trial has an objective value yet" : "this sweep has no --objective: nothing to plot against" }));
      return;
    }
    // Parameters that vary: one that has a single value says nothing about the objective.
    const varying = t.params.filter((p) => new Set(t.rows.map((r) => JSON.stringify(r.params[p]))).size > 1);
    const objective = done.map((r) => r.objective);
    const spread = Math.min(...objective) > 0 && Math.max(...objective) / Math.min(...objective) > 50;
    const tried = (p) => t.rows.map((r) => r.params[p]).filter((v) => v !== null && v !== undefined);
    const dims = [...varying.map((p) => axis(p, done.map((r) => r.params[p]), (t.scales || {})[p], tried(p))),
      axis(t.objective, objective, spread ? "log" : "linear")];
    const parcoordsDiv = $("parcoords");
    parcoordsDiv.querySelector("p")?.remove();
    parallel(parcoordsDiv, dims, done.map((r) => r.objective), done.findIndex((r) => r.best),
      `parameters → ${t.objective} (${done.length} finished trial${done.length > 1 ? "s" : ""}; the best is the thick line)`, t.direction);
    const box = $("scatters");
    for (const p of varying) {
      const groups = {};
      for (const r of t.rows) {
        const y = r.objective !== null && r.objective !== undefined ? r.objective : r.last_value;
        if (y !== null && y !== undefined) (groups[r.state] = groups[r.state] || []).push({ ...r, y });
      }
      const traces = Object.entries(groups).map(([state, rows]) => ({
        x: rows.map((r) => r.params[p]), y: rows.map((r) => r.y), text: rows.map((r) => `trial ${r.trial} · ${r.id}` + (r.pruned ? ` · pruned at step ${r.pruned.step}` : "")),
        name: state.toLowerCase(), type: "scatter", mode: "markers",
        marker: { size: 9, color: STATE_COLORS[state] || COLORS[0], symbol: state === "PRUNED" ? "x" : "circle", line: { width: 0 } },
        hovertemplate: "%{text}<br>" + p + "=%{x}<br>" + t.objective + "=%{y}<extra></extra>",
      }));
      const best = t.rows.find((r) => r.best);
      if (best) traces.push({ x: [best.params[p]], y: [best.objective], name: "best", type: "scatter", mode: "markers",
        marker: { size: 18, symbol: "star", color: "#facc15", line: { color: "#854d0e", width: 1.5 } }, hoverinfo: "skip" });
      const numeric = t.rows.every((r) => typeof r.params[p] === "number");
      const scale = (t.scales || {})[p];
      const xtype = !numeric || scale === "categorical" ? "category" : scale === "log" && t.rows.every((r) => r.params[p] > 0) ? "log" : "linear";
      const cats = [...new Set(t.rows.map((r) => r.params[p]))].sort((a, b) => (numeric ? a - b : 0));
      const ys = Object.values(groups).flat().map((r) => r.y);
      const ylog = ys.every((y) => y > 0) && Math.max(...ys) / Math.min(...ys) > 50;
      chart(box, "scatter:" + p, traces, layout(`${t.objective} by ${p}` + (groups.PRUNED ? " (× pruned: its value when stopped)" : ""), {
        height: 300, hovermode: "closest", legend: { orientation: "h", y: 1.02, x: 1, xanchor: "right", yanchor: "bottom", font: { size: 11 } },
        margin: { l: 56, r: 16, t: 56, b: 44 },
        xaxis: { title: { text: p, font: { size: 11 } }, gridcolor: "#eef0f3", type: xtype,
          ...(xtype === "category" ? { categoryorder: "array", categoryarray: cats } : {}) },
        yaxis: { title: { text: t.objective, font: { size: 11 } }, gridcolor: "#eef0f3", type: ylog ? "log" : "linear" },
      }));
    }
  }

  async function refresh() {
    try {
      detail = await get(`/api/sweeps/${C.sweep}`);
    } catch (e) { window.PHX.toast(e.message, true); return; }
    $("sweep-state").replaceWith(Object.assign(stateBadge(detail.state), { id: "sweep-state" }));
    actionButtons($("actions"), "sweep", detail.id, detail.actions, refresh);
    progress(detail);
    facts(detail);
    table(detail);
    markRendered("rendered");
    plots(detail);
    markRendered("charts");
    $("live").classList.toggle("on", !detail.terminal);
    if (!detail.terminal) setTimeout(refresh, 3000);
  }
  refresh();
})();
