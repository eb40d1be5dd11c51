/* The operations page: draws orchestrator/operations/overview.py's snapshot, re-read on each nudge. */
(function () {
  "use strict";
  const root = document.getElementById("ops-live");
  const $ = (id) => document.getElementById(id);
  const when = (iso) => iso ? iso.replace("T", " ").slice(0, 19) + " UTC" : "—";
  function age(s) {
    if (s === null || s === undefined) return "—";
    s = Math.round(s);
    return s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }
  function rows(id, items, cells, empty) {
    const body = $(id).tBodies[0];
    body.replaceChildren();
    if (!items || !items.length) {
      const td = body.insertRow().insertCell();
      td.colSpan = $(id).tHead.rows[0].cells.length;
      td.className = "ops-quiet";
      td.textContent = empty;
      return;
    }
    for (const item of items) {
      const row = body.insertRow();
      for (const value of cells(item)) {
        const td = row.insertCell();
        if (value instanceof Node) td.appendChild(value); else td.textContent = value;
      }
    }
  }
  function runLink(id) {
    const a = document.createElement("a");
    a.href = `${root.dataset.runsUrl}${id}/live/`;
    a.textContent = id.slice(0, 8);
    return a;
  }
  function setStatus(kind, label) { $("live-status").textContent = label; $("live-status").className = "live-status live-" + kind; }

  function render(s) {
    $("ops-generated").textContent = `as of ${when(s.generated_at)}`;
    const states = $("ops-states");
    states.replaceChildren();
    const entries = Object.entries(s.runs_by_state).sort();
    if (!entries.length) states.textContent = "No runs yet.";
    for (const [state, n] of entries) {
      const box = document.createElement("div");
      box.dataset.state = state;
      const strong = document.createElement("strong");
      strong.textContent = n;
      const a = document.createElement("a");
      a.href = `${root.dataset.runsUrl}?state__exact=${state}`;
      a.textContent = state.replace("_", " ");
      box.append(strong, a);
      states.appendChild(box);
    }
    rows("ops-waiting", s.waiting_steps, (w) => {
      const since = document.createElement("span");
      since.textContent = age(w.oldest_age_s);
      since.title = `since ${when(w.oldest_since)}`;
      const kind = document.createElement("span");
      kind.dataset.kind = w.kind;
      kind.textContent = w.kind.replaceAll("_", " ");
      return [kind, w.waiting, since];
    }, "No step is waiting.");
    rows("ops-queues", s.queues, (q) => [q.name, q.depth, age(q.oldest_age_s)],
         s.queues === null ? "Shown to operators." : "The broker could not be read.");
    rows("ops-dependencies", s.dependencies, (d) => [d.dependency,
      d.rate_limit === null ? `${d.calls_this_second} (no limit)` : `${d.calls_this_second} of ${d.rate_limit}`,
      d.breaker_open_s > 0 ? `open for ${age(d.breaker_open_s)}`
        : d.failures ? `closed (${d.failures} failure${d.failures === 1 ? "" : "s"} in a row)` : "closed"],
         s.dependencies === null ? "Shown to operators." : "No model or rate-limited tool is configured.");
    rows("ops-routes", s.routes, (r) => {
      const state = document.createElement("span");
      state.dataset.breaker = r.state;
      state.textContent = r.state === "open" ? `open for ${age(r.open_for_s)}` : r.state;
      return [r.model, r.route, `${r.provider} / ${r.model_id}`, state, r.failures];
    }, s.routes === null ? "Shown to operators." : "No model is configured with routes.");
    const ofLimit = (used, limit, guaranteed) => limit === null ? `${used} (no limit)`
      : `${used} of ${limit} (${Math.floor(guaranteed)} guaranteed)`;
    rows("ops-quotas", s.quotas, (q) => [q.dependency, q.capacity,
      ofLimit(q.calls, q.calls_limit, q.guaranteed_calls),
      ofLimit(q.tokens, q.tokens_limit, q.guaranteed_tokens)],
         s.quotas === null ? "Shown to operators." : "No dependency has a quota (STEPWISE_QUOTAS).");
    rows("ops-workers", s.workers, (w) => [`${w.hostname} (pid ${w.pid})`, w.queues.join(", "), when(w.last_seen)],
         s.workers === null ? "Shown to operators." : "No worker has reported in the last 30 seconds.");
    rows("ops-teams", s.teams_today, (t) => [t.team, t.started, t.ended, t.failed,
      t.failure_rate === null ? "—" : `${(t.failure_rate * 100).toFixed(1)} % (${t.failed} of ${t.ended})`,
      `$${Number(t.spend_usd).toFixed(4)}`], "No runs today.");
    rows("ops-paused", s.paused, (r) => [runLink(r.id), r.workflow, r.team, when(r.since), r.reason || "—"], "No paused runs.");
    $("ops-letters-count").textContent = s.dead_letters.open;
    rows("ops-letters", s.dead_letters.latest, (d) => [runLink(d.run), d.step, d.error_class, d.error, when(d.at)], "No open dead letters.");
  }
  async function reread() {
    const response = await fetch(root.dataset.stateUrl, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
  }
  liveSocket(root.dataset.socketPath, reread, setStatus);
})();
