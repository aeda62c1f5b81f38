// The jobs and sweeps lists: filters, search, metric columns and sorting live in the URL (a
// filtered list is a link to share), pages come by cursor from the API (?after=), so page
// 2,000 of 100,000 jobs is as quick as page 1.
(function () {
  "use strict";
  const { C, $, el, get, api, link, ago, dur, num, hours, stateBadge, markRendered, project } = window.PHX;
  const sweeps = C.view === "sweeps";
  const PAGE = 50;
  const url = new URL(location.href);
  const params = url.searchParams;
  const cursors = [null]; // the cursor of each page shown so far; the last one is the current page
  let next = null;
  let busy = false;
  const selected = new Set();

  const columns = () => params.getAll("columns").flatMap((c) => c.split(",")).filter(Boolean);
  const sortKey = () => params.get("sort") || "created";

  function query(extra) {
    const q = new URLSearchParams();
    for (const key of ["q", "state", "name", "backend", "tag", "since", "sort", "user", "mine"]) {
      for (const v of params.getAll(key)) if (v) q.append(key, v);
    }
    if (!sweeps && columns().length) q.set("columns", columns().join(","));
    if (project()) q.set("project", project());
    for (const [k, v] of Object.entries(extra || {})) if (v !== null && v !== undefined) q.set(k, v);
    return q;
  }

  function setParam(key, value) {
    params.delete(key);
    if (Array.isArray(value)) value.forEach((v) => v && params.append(key, v));
    else if (value) params.set(key, value);
    history.replaceState(null, "", url.pathname + (params.toString() ? "?" + params.toString() : ""));
  }

  // -- header -------------------------------------------------------------------------------
  function header() {
    const sortable = (label, key, cls) => {
      const current = sortKey().replace(/^-/, "");
      const desc = sortKey().startsWith("-");
      const arrow = current === key ? (key === "created" ? (desc ? " ↑" : " ↓") : (desc ? " ↓" : " ↑")) : "";
      return el("th", {
        class: "sortable" + (current === key ? " sorted" : "") + (cls ? " " + cls : ""), title: "sort by " + label.toLowerCase(),
        onclick: () => { setParam("sort", current === key ? (desc ? key : "-" + key) : key); reload(); },
      }, label + arrow);
    };
    let cells;
    if (sweeps) {
      cells = [el("th", {}, ""), sortable("ID", "created"), sortable("NAME", "name"), sortable("STATE", "state"),
        el("th", {}, "PROGRESS"), sortable("BEST", "best"), el("th", {}, "STRATEGY"), el("th", {}, "CREATED"),
        el("th", {}, "DURATION"), el("th", { class: "num" }, "GPU-H"), el("th", {}, "COMMAND")];
    } else {
      cells = [el("th", {}, ""), sortable("ID", "created"), sortable("NAME", "name"), sortable("STATE", "state"),
        sortable("BACKEND", "backend"), el("th", {}, "USER"), el("th", {}, "PROJECT"), el("th", {}, "TOPOLOGY"), el("th", {}, "CREATED"), el("th", {}, "DURATION"),
        el("th", {}, "PROGRESS"), sortable("GPU-H", "gpu_hours", "num"),
        ...columns().map((c) => {
          const th = sortable(c.toUpperCase(), c, "num metric");
          th.append(el("button", { type: "button", class: "x", title: "remove column", onclick: (ev) => {
            ev.stopPropagation();
            setParam("columns", columns().filter((x) => x !== c));
            if (sortKey().replace(/^-/, "") === c) setParam("sort", null);
            reload();
          } }, "×"));
          return th;
        }),
        el("th", {}, "COMMAND"), el("th", {}, "TAGS")];
    }
    $("list-head").replaceChildren(...cells);
    return cells.length;
  }

  function tagChips(tags) {
    return el("span", { class: "tags" }, ...Object.entries(tags || {}).map(([k, v]) => el("a", {
      class: "tag", href: "#", title: "filter by this tag",
      onclick: (ev) => { ev.preventDefault(); setParam("tag", k + "=" + v); $("f-tag").value = k + "=" + v; reload(); },
    }, `${k}=${v}`)));
  }

  function jobRow(j) {
    const check = el("input", { type: "checkbox", checked: selected.has(j.id), "aria-label": "select " + j.id, onchange: (ev) => {
      ev.target.checked ? selected.add(j.id) : selected.delete(j.id);
      $("compare").disabled = selected.size < 1;
      $("compare").textContent = selected.size ? `Compare ${selected.size} selected` : "Compare selected";
    } });
    const state = stateBadge(j.state, j.root_cause ? (j.root_cause.message || "") : (j.queued || ""));
    if (j.queue_place) state.append(el("span", { class: "place", text: ` #${j.queue_place}` }));
    return el("tr", { class: "row-" + j.state },
      el("td", {}, check),
      el("td", { class: "mono" }, el("a", { href: "/jobs/" + j.id, text: j.id })),
      el("td", {}, el("a", { href: "/jobs/" + j.id, text: j.name }), j.attempt ? el("span", { class: "muted small", text: ` a${j.attempt}` }) : null),
      el("td", {}, state, j.exit_code ? el("span", { class: "muted small", text: " " + j.exit_code }) : null),
      el("td", { text: j.backend }),
      el("td", { class: "user", text: j.user_name || "-" }),
      el("td", { class: "project", text: j.project || "-" }),
      el("td", { text: j.topology }),
      el("td", { text: ago(j.created_at), title: new Date(j.created_at * 1000).toLocaleString() }),
      el("td", { text: dur(j.duration) }),
      el("td", { class: "progress-cell", title: j.health || "" }, j.fraction === null || j.fraction === undefined ? "-" :
        el("div", { class: "progress" }, el("div", { class: "done", style: `width:${Math.round(100 * j.fraction)}%` })),
        el("span", { class: "small", text: j.progress || "" }),
        j.health ? el("span", { class: "warn small", text: " ⚠ " + j.health }) : null),
      el("td", { class: "num", text: hours(j.gpu_hours), title: `CPU-hours ${hours(j.cpu_hours)}` + (j.cost !== null && j.cost !== undefined ? ` · cost ${j.cost.toFixed(2)}` : "") }),
      ...columns().map((c) => el("td", { class: "num mono", text: num(j.columns ? j.columns[c] : null) })),
      el("td", { class: "cmd", text: j.command_short, title: j.command }),
      el("td", {}, tagChips(j.tags)),
    );
  }

  function sweepRow(s) {
    const total = s.total || 0;
    const pct = total ? Math.round((100 * s.finished) / total) : 0;
    const bar = el("div", { class: "progress", title: s.progress_text },
      el("div", { class: "done", style: `width:${pct}%` }),
      el("div", { class: "run", style: `width:${total ? Math.round((100 * (s.running || 0)) / total) : 0}%` }));
    return el("tr", { class: "row-" + s.state },
      el("td", {}, el("span", { class: "kind", text: "sweep" })),
      el("td", { class: "mono" }, el("a", { href: "/sweeps/" + s.id, text: s.id })),
      el("td", {}, el("a", { href: "/sweeps/" + s.id, text: s.name })),
      el("td", {}, stateBadge(s.state)),
      el("td", { class: "progress-cell" }, bar, el("span", { class: "small", text: s.progress_text })),
      el("td", { class: "num mono", text: s.best_value === null ? "-" : `${s.objective}=${num(s.best_value)}` }),
      el("td", { text: s.strategy }),
      el("td", { text: ago(s.created_at) }),
      el("td", { text: dur(s.duration) }),
      el("td", { class: "num", text: hours(s.gpu_hours) }),
      el("td", { class: "cmd", text: s.command_short, title: s.command }),
    );
  }

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  let again = false; // asked to load while a load ran: load once more, with what was asked last
  async function load(quiet) {
    if (busy) { again = again || !quiet; return; }
    busy = true;
    try {
      const width = header();
      const after = cursors[cursors.length - 1];
      let res;
      try {
        res = await api(sweeps ? "/api/sweeps" : "/api/jobs", query({ limit: PAGE, after }));
      } catch (e) {
        showError(e.message);
        $("list-body").replaceChildren(el("tr", {}, el("td", { colspan: width, class: "muted", text: "nothing to show: " + e.message })));
        markRendered("rendered");
        return;
      }
      showError(null);
      next = res.headers.get("X-Next-Page");
      const rows = res.body.map(sweeps ? sweepRow : jobRow);
      const empty = sweeps ? "no sweeps here (a search space in the arguments makes one: phalanx run train.py --lr \"[0.1, 0.01]\")"
        : (params.toString() ? "no job matches these filters" : "no jobs yet: phalanx run train.py");
      $("list-body").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: width, class: "muted", text: empty }))]));
      $("prev").disabled = cursors.length < 2;
      $("next").disabled = !next;
      $("page-no").textContent = `page ${cursors.length}`;
      markRendered("rendered");
      if (!quiet && !sweeps) count();
      $("live").classList.toggle("on", res.body.some((r) => ["RUNNING", "PENDING", "QUEUED", "STOPPING"].includes(r.state)));
    } finally {
      busy = false;
      if (again) { again = false; load(); }
    }
  }

  async function count() {
    try {
      const { count } = await get("/api/jobs/count", query());
      const first = (cursors.length - 1) * PAGE + 1;
      const shown = $("list-body").querySelectorAll("tr").length;
      $("count").textContent = count ? `${first}–${first + shown - 1} of ${count.toLocaleString()} jobs` : "";
    } catch (e) { $("count").textContent = ""; }
  }

  function reload() {
    cursors.splice(0, cursors.length, null);
    load();
  }

  // -- filters ------------------------------------------------------------------------------
  async function filters() {
    for (const [id, key] of [["f-q", "q"], ["f-name", "name"], ["f-tag", "tag"], ["f-since", "since"], ["f-user", "user"]]) $(id).value = params.get(key) || "";
    $("f-mine").checked = params.get("mine") === "1";
    try {
      const meta = await get("/api/meta");
      $("f-state").append(...meta.states.map((s) => el("option", { value: s.toLowerCase(), text: s.toLowerCase() })),
        el("option", { value: "active", text: "active (not ended)" }));
      $("f-backend").append(...meta.backends.map((b) => el("option", { value: b, text: b })));
      $("metric-names").replaceChildren(...meta.metrics.flatMap((m) => [m, m + ":min", m + ":max"]).map((m) => el("option", { value: m })));
      $("tag-keys").replaceChildren(...meta.tag_keys.map((k) => el("option", { value: k + "=" })));
    } catch (e) { /* the list says what is wrong */ }
    $("f-state").value = params.get("state") || "";
    $("f-backend").value = params.get("backend") || "";
    $("filters").addEventListener("submit", (ev) => {
      ev.preventDefault();
      setParam("q", $("f-q").value.trim());
      setParam("state", $("f-state").value);
      setParam("name", $("f-name").value.trim());
      setParam("backend", $("f-backend").value);
      setParam("tag", $("f-tag").value.trim());
      setParam("since", $("f-since").value);
      setParam("user", $("f-user").value.trim());
      setParam("mine", $("f-mine").checked ? "1" : null);
      const col = $("f-col").value.trim();
      if (col && !columns().includes(col)) setParam("columns", [...columns(), col]);
      $("f-col").value = "";
      reload();
    });
    for (const id of ["f-state", "f-backend", "f-since", "f-mine"]) $(id).addEventListener("change", () => $("filters").requestSubmit());
    $("f-clear").addEventListener("click", () => {
      for (const key of ["q", "state", "name", "backend", "tag", "since", "sort", "columns", "user", "mine"]) params.delete(key);
      setParam("q", null);
      location.reload();
    });
  }

  $("next").addEventListener("click", () => { if (next) { cursors.push(next); load(); } });
  $("prev").addEventListener("click", () => { if (cursors.length > 1) { cursors.pop(); load(); } });
  $("compare").addEventListener("click", () => { location.href = link("/compare", { jobs: [...selected].join(",") }); });
  load();
  filters();
  setInterval(() => { if (!document.hidden) load(true); }, 3000);
})();
