// phalanx dashboard: what every page shares. No framework, no CDN: the only library is
// plotly.js, served from the installed Python package. Pages read their settings from the
// JSON element #phx-config (no inline script runs: the Content-Security-Policy forbids it).
(function () {
  "use strict";
  const C = JSON.parse(document.getElementById("phx-config").textContent || "{}");
  const CSRF = (document.querySelector('meta[name="phalanx-csrf"]') || {}).content || "";
  const $ = (id) => document.getElementById(id);
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"];
  const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  const link = (path, params) => {
    const p = new URLSearchParams(params || {}).toString();
    return path + (p ? "?" + p : "");
  };

  async function api(path, params, options) {
    const r = await fetch(link(path, params), { cache: "no-store", credentials: "same-origin", ...(options || {}) });
    let body = null;
    try { body = await r.json(); } catch (e) { body = { error: r.statusText }; }
    if (!r.ok) {
      const err = new Error((body && body.error) || r.statusText);
      err.status = r.status;
      throw err;
    }
    return { body, headers: r.headers };
  }
  const get = async (path, params) => (await api(path, params)).body;
  const post = async (path) => (await api(path, null, { method: "POST", headers: { "X-Phalanx-CSRF": CSRF } })).body;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k === "style") node.setAttribute("style", v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c !== null && c !== undefined && c !== false) node.append(c);
    return node;
  }

  function ago(ts) {
    if (!ts) return "-";
    const d = Date.now() / 1000 - ts;
    if (d < 60) return Math.max(0, Math.floor(d)) + "s ago";
    if (d < 3600) return Math.floor(d / 60) + "m ago";
    if (d < 86400) return Math.floor(d / 3600) + "h ago";
    return new Date(ts * 1000).toLocaleString([], { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }
  function dur(s) {
    if (s === null || s === undefined) return "-";
    if (s < 60) return s.toFixed(1) + "s";
    const m = Math.floor(s / 60), h = Math.floor(m / 60);
    return h ? `${h}h${String(m % 60).padStart(2, "0")}m` : `${m}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  }
  function bytes(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }
  function num(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e5 || a < 1e-3 ? v.toExponential(3) : Number(v.toPrecision(5)).toString();
  }
  function hours(v) {
    if (v === null || v === undefined) return "-";
    return v < 10 ? Number(v.toPrecision(3)).toString() : v.toFixed(1);
  }
  const money = (v) => (v === null || v === undefined ? "-" : v.toFixed(2));

  function stateBadge(state, extra) {
    return el("span", { class: "state " + state, title: extra || state }, state);
  }

  function toast(text, bad) {
    const t = $("toast");
    t.textContent = text;
    t.className = "toast" + (bad ? " bad" : "");
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, bad ? 9000 : 5000);
  }

  // A confirmation dialog of the page's own (a window.confirm would freeze the page's updates).
  function confirmDialog(title, text, okLabel) {
    return new Promise((resolve) => {
      $("modal-title").textContent = title;
      $("modal-text").textContent = text;
      $("modal-ok").textContent = okLabel;
      $("modal").hidden = false;
      const done = (answer) => {
        $("modal").hidden = true;
        $("modal-ok").onclick = $("modal-cancel").onclick = null;
        document.removeEventListener("keydown", onKey);
        resolve(answer);
      };
      const onKey = (ev) => { if (ev.key === "Escape") done(false); };
      document.addEventListener("keydown", onKey);
      $("modal-ok").onclick = () => done(true);
      $("modal-cancel").onclick = () => done(false);
      $("modal-ok").focus();
    });
  }

  const ACTION_TEXT = {
    stop: ["Stop", "Every rank gets SIGTERM and its grace period to save a checkpoint, then SIGKILL. The job can be resumed later."],
    resume: ["Resume", "The job continues as a new attempt from its state directory (its last checkpoint)."],
    retry: ["Run again", "A new job runs the same command with the same settings, from the code as it is now in its working directory."],
    delete: ["Delete", "The job's record, logs, metrics, outputs and its own state directory are removed for good."],
  };

  // Buttons for the actions the server says apply; each asks first, then POSTs.
  function actionButtons(box, kind, id, available, after) {
    box.replaceChildren(...available.map((action) => {
      const [label, text] = ACTION_TEXT[action];
      return el("button", {
        type: "button", class: "act act-" + action + (action === "stop" || action === "delete" ? " danger" : ""),
        "data-action": action,
        onclick: async (ev) => {
          const ok = await confirmDialog(`${label} ${kind} ${id}?`, text, `${label} ${kind}`);
          if (!ok) return;
          ev.target.disabled = true;
          try {
            const res = await post(`/api/${kind}s/${id}/${action}`);
            toast(res.message || "done");
            if (res.redirect) setTimeout(() => { location.href = res.redirect; }, 700);
            else if (after) after();
          } catch (e) {
            toast(e.message, true);
            ev.target.disabled = false;
          }
        },
      }, label);
    }));
  }

  function layout(title, extra) {
    return Object.assign({
      title: { text: title, font: { size: 14 }, x: 0.01, xanchor: "left" },
      margin: { l: 56, r: 16, t: 36, b: 40 },
      paper_bgcolor: "#fff", plot_bgcolor: "#fff", hovermode: "x unified",
      legend: { orientation: "h", y: -0.18, font: { size: 11 } },
      xaxis: { gridcolor: "#eef0f3", zeroline: false }, yaxis: { gridcolor: "#eef0f3", rangemode: "normal", zeroline: false },
    }, extra || {});
  }

  // One chart per key inside `container`, reusing divs across refreshes (Plotly.react diffs,
  // and keeps the user's zoom while `uirevision` stays the same).
  function chart(container, key, traces, lay, cls) {
    let div = container.querySelector(`[data-chart="${CSS.escape(key)}"]`);
    if (!div) {
      div = el("div", { class: "chart" + (cls ? " " + cls : ""), "data-chart": key });
      container.append(div);
    }
    Plotly.react(div, traces, Object.assign({ uirevision: key }, lay), PLOT_CONFIG);
    return div;
  }

  // TensorBoard's smoothing: an exponential moving average, debiased at the start.
  function smooth(ys, weight) {
    if (!weight) return ys;
    const out = new Array(ys.length);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (y === null || !isFinite(y)) { out[i] = y; continue; }
      last = last * weight + (1 - weight) * y;
      n++;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  function markRendered(name) {
    if (document.body.dataset[name]) return;
    document.body.dataset[name] = String(Math.round(performance.now()));
    try { performance.mark("phx-" + name); } catch (e) { /* old browsers */ }
  }

  // The project the dashboard shows (the header's switcher): kept in this browser; "" is every
  // project of mine. The server filters by it (?project=) and never shows another's anyway.
  const PROJECT_KEY = "phx-project";
  const project = () => localStorage.getItem(PROJECT_KEY) || "";
  async function projectSwitch() {
    const box = $("project-switch");
    if (!box) return;
    let meta;
    try { meta = await get("/api/meta"); } catch (e) { return; }
    const mine = meta.projects || {};
    if (project() && !(project() in mine)) localStorage.removeItem(PROJECT_KEY);
    box.append(...Object.entries(mine).map(([name, role]) => el("option", { value: name, text: `${name} (${role})` })));
    box.value = project();
    box.addEventListener("change", () => {
      if (box.value) localStorage.setItem(PROJECT_KEY, box.value); else localStorage.removeItem(PROJECT_KEY);
      location.href = C.page === "list" || C.page === "events" ? location.pathname + location.search : "/";
    });
    if (meta.events && $("nav-events")) $("nav-events").hidden = false;
    document.body.dataset.projects = "ready";
  }
  projectSwitch();

  window.PHX = { C, $, el, api, get, post, link, ago, dur, bytes, num, hours, money, stateBadge, toast, confirmDialog,
    actionButtons, layout, chart, smooth, COLORS, markRendered, project };
})();
