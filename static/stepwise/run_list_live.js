/* The run list, live: counts by state, and each listed run's cells re-read in place on each
 * nudge. Django's checkboxes (and a selection for an action) are left as they are; when runs
 * were added or removed, a link offers to reload the list rather than moving rows under the
 * person's pointer. */
(function () {
  "use strict";
  const root = document.getElementById("run-list-live");
  function setStatus(kind, label) {
    const el = document.getElementById("live-status");
    el.textContent = label;
    el.className = "live-status live-" + kind;
  }
  function counts(byState) {
    const box = document.getElementById("run-counts");
    box.replaceChildren();
    for (const [state, n] of Object.entries(byState).sort()) {
      const cell = document.createElement("div");
      cell.dataset.state = state;
      const strong = document.createElement("strong");
      strong.textContent = n;
      const a = document.createElement("a");
      a.href = `${root.dataset.runsUrl}?state__exact=${state}`;
      a.textContent = state.replace("_", " ");
      cell.append(strong, a);
      box.appendChild(cell);
    }
  }
  // Each row names its run in a data attribute of its id cell: rows are matched by run, never
  // by the action checkbox, which a person without actions does not have.
  function idOf(row) {
    const cell = row.querySelector("[data-run-id]");
    return cell ? cell.dataset.runId : null;
  }
  function isCheckbox(cell) {
    return cell.classList.contains("action-checkbox") || cell.querySelector("input.action-select");
  }
  async function rows() {
    const current = document.querySelector("#result_list tbody");
    if (!current) return;
    const response = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    const freshRows = Array.from(fresh.querySelectorAll("#result_list tbody tr"));
    const byId = new Map(freshRows.map((row) => [idOf(row), row]));
    const shown = Array.from(current.rows).map(idOf);
    for (const row of current.rows) {
      const id = idOf(row);
      const update = id === null ? undefined : byId.get(id);
      if (!update) continue;
      for (let i = 0; i < row.cells.length && i < update.cells.length; i++) {
        if (isCheckbox(row.cells[i])) continue;  // a selection in progress stays
        if (row.cells[i].innerHTML !== update.cells[i].innerHTML) row.cells[i].innerHTML = update.cells[i].innerHTML;
      }
    }
    const changed = freshRows.length !== shown.length || freshRows.some((row, i) => idOf(row) !== shown[i]);
    document.getElementById("run-list-changed").hidden = !changed;
    ages();
  }
  // The words of RunAdmin's relative times (orchestrator/admin.py, _ago and _seconds), kept
  // current between nudges.
  function ago(seconds) {
    const minutes = Math.floor(seconds / 60);
    if (minutes < 1) return "just now";
    if (minutes < 60) return `${minutes} min ago`;
    if (minutes < 24 * 60) return `${Math.floor(minutes / 60)} h ${minutes % 60} min ago`;
    return `${Math.floor(minutes / (24 * 60))} d ago`;
  }
  function span(seconds) {
    const total = Math.floor(seconds);
    if (total < 60) return `${total} s`;
    if (total < 3600) return `${Math.floor(total / 60)} min ${total % 60} s`;
    return `${Math.floor(total / 3600)} h ${Math.floor((total % 3600) / 60)} min`;
  }
  function ages() {
    const at = Date.now();
    for (const el of document.querySelectorAll("#result_list time[datetime]")) {
      el.textContent = ago(Math.max(0, (at - Date.parse(el.getAttribute("datetime"))) / 1000));
    }
    for (const el of document.querySelectorAll("#result_list [data-since]")) {
      el.textContent = `${span(Math.max(0, (at - Date.parse(el.dataset.since)) / 1000))} so far`;
    }
  }
  setInterval(ages, 30000);
  async function reread() {
    const response = await fetch(root.dataset.stateUrl, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    counts((await response.json()).runs_by_state);
    await rows();
  }
  liveSocket(root.dataset.socketPath, reread, setStatus);
})();
