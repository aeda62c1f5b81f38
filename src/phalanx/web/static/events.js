// The audit log: who did what, when, from where, and how it ended; newest first, a page at a
// time (?before= the last id shown). Project admins see their projects' events, server admins all.
(function () {
  "use strict";
  const { $, el, get, project, markRendered } = window.PHX;
  const params = new URL(location.href).searchParams;
  let oldest = null;

  function when(ts) {
    return new Date(ts * 1000).toLocaleString([], { year: "numeric", month: "short", day: "numeric", hour: "2-digit",
      minute: "2-digit", second: "2-digit" });
  }
  function outcome(e) {
    const d = e.detail || {};
    const text = e.outcome !== "ok" && d.message ? `${e.outcome}: ${d.message}` : e.outcome;
    return el("span", { class: "outcome " + e.outcome, text });
  }
  function row(e) {
    return el("tr", { class: "event-" + e.outcome },
      el("td", { text: when(e.at) }), el("td", { class: "user", text: e.user }), el("td", { class: "mono", text: e.address || "-" }),
      el("td", { class: "mono", text: e.action }), el("td", { class: "mono", text: e.target || "-" }),
      el("td", { text: e.project || "-" }), el("td", {}, outcome(e)));
  }

  async function load(more) {
    const q = { limit: 100 };
    for (const key of ["user", "since"]) if (params.get(key)) q[key] = params.get(key);
    if (project()) q.project = project();
    if (more && oldest !== null) q.before = oldest;
    let found;
    try { found = await get("/api/events", q); } catch (e) {
      $("error").hidden = false;
      $("error").textContent = e.message;
      $("events-body").replaceChildren();
      markRendered("rendered");
      return;
    }
    const rows = found.map(row);
    if (more) $("events-body").append(...rows);
    else $("events-body").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7, class: "muted", text: "no events" }))]));
    oldest = found.length ? found[found.length - 1].id : oldest;
    $("older").disabled = found.length < 100;
    markRendered("rendered");
  }

  $("ev-user").value = params.get("user") || "";
  $("ev-since").value = params.get("since") || "";
  $("ev-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    for (const [id, key] of [["ev-user", "user"], ["ev-since", "since"]]) {
      if ($(id).value.trim()) params.set(key, $(id).value.trim()); else params.delete(key);
    }
    history.replaceState(null, "", location.pathname + (params.toString() ? "?" + params.toString() : ""));
    load(false);
  });
  $("older").addEventListener("click", () => load(true));
  load(false);
})();
