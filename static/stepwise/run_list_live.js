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
  function idOf(row) {
    const box = row.querySelector("input.action-select");
    return box ? box.value : null;
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
      const update = byId.get(idOf(row));
      if (!update) continue;
      for (let i = 1; i < row.cells.length && i < update.cells.length; i++) {
        if (row.cells[i].innerHTML !== update.cells[i].innerHTML) row.cells[i].innerHTML = update.cells[i].innerHTML;
      }
    }
    const changed = freshRows.length !== shown.length || freshRows.some((row, i) => idOf(row) !== shown[i]);
    document.getElementById("run-list-changed").hidden = !changed;
  }
  async function reread() {
    const response = await fetch(root.dataset.stateUrl, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    counts((await response.json()).runs_by_state);
    await rows();
  }
  liveSocket(root.dataset.socketPath, reread, setStatus);
})();
