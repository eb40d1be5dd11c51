/* The live run page: draws the run's JSON state (orchestrator/web/progress.py run_snapshot) and
 * redraws it in place each time the websocket nudges (live_socket.js). The DAG is drawn with
 * Cytoscape.js and laid out by dagre (vendored in static/stepwise/vendor; docs/live.md). */
(function () {
  "use strict";
  const root = document.getElementById("run-live");
  const COLOURS = {
    blocked: "#9e9e9e", ready: "#90caf9", queued: "#64b5f6", running: "#1565c0",
    retrying: "#ef6c00", waiting: "#b26a00", completed: "#2e7d32", skipped: "#78909c",
    failed: "#ba2121", timed_out: "#ba2121", cancelled: "#5d4037",
  };
  const BADGE = {
    completed: "state-good", failed: "state-bad", timed_out: "state-bad", cancelled: "state-bad",
    compensation_failed: "state-bad", waiting: "state-attention", paused: "state-attention",
    retrying: "state-attention", running: "state-busy", queued: "state-busy", cancelling: "state-busy",
    compensating: "state-busy",
  };
  // The error classes the retry table never retries (orchestrator/engine/retry.py NEVER_RETRIED).
  const NEVER_RETRIED = new Set(["auth", "policy", "validation", "permanent", "invalid_request",
                                 "rejected", "cancelled", "budget", "uncertain", "stale"]);
  let graph = null;

  const $ = (id) => document.getElementById(id);
  function text(value) { return value === null || value === undefined || value === "" ? "—" : String(value); }
  function when(iso) { return iso ? iso.replace("T", " ").slice(0, 19) + " UTC" : "—"; }
  function seconds(value) {
    if (value === null || value === undefined) return "—";
    const s = Math.round(Number(value));
    if (s < 60) return `${Number(value).toFixed(1)} s`;
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return (h ? `${h} h ` : "") + `${m} min ${r} s`;
  }
  function usd(value) {
    if (value === null || value === undefined) return "—";
    const n = Number(value);
    return `$${n.toFixed(n !== 0 && Math.abs(n) < 0.01 ? 6 : 4)}`;
  }
  function badge(el, state) {
    el.textContent = state.replace("_", " ");
    el.className = "state-badge " + (BADGE[state] || "");
    el.dataset.state = state;
  }
  function setStatus(kind, label) {
    const el = $("live-status");
    el.textContent = label;
    el.className = "live-status live-" + kind;
  }
  function errorText(error) {
    if (!error) return "";
    if (typeof error === "string") return error;
    return [error.class, error.message].filter(Boolean).join(": ") || JSON.stringify(error);
  }

  function drawGraph(steps) {
    const elements = [];
    for (const step of steps) {
      elements.push({ data: { id: step.name, label: `${step.name}\n${step.kind}`, state: step.state } });
      for (const parent of step.after) elements.push({ data: { id: `${parent}->${step.name}`, source: parent, target: step.name } });
    }
    const style = [
      { selector: "node", style: {
        shape: "round-rectangle", width: 130, height: 44, label: "data(label)", "text-wrap": "wrap",
        "text-valign": "center", "font-size": 11, color: "#fff", "background-color": "#9e9e9e",
        "border-width": 0 } },
      { selector: "edge", style: { width: 1.5, "line-color": "#b0b0b0", "target-arrow-color": "#b0b0b0",
        "target-arrow-shape": "triangle", "curve-style": "bezier" } },
    ];
    for (const [state, colour] of Object.entries(COLOURS)) {
      style.push({ selector: `node[state = "${state}"]`, style: { "background-color": colour } });
    }
    graph = cytoscape({ container: $("run-dag"), elements, style, userZoomingEnabled: false,
                        boxSelectionEnabled: false, autoungrabify: true,
                        layout: { name: "dagre", rankDir: "LR", nodeSep: 20, rankSep: 50, padding: 12 } });
    $("dag-legend").innerHTML = Object.entries(COLOURS).map(([state, colour]) =>
      `<span><i style="background:${colour}"></i>${state.replace("_", " ")}</span>`).join("");
  }

  function cell(row, value, className) {
    const td = row.insertCell();
    td.textContent = value;
    if (className) td.className = className;
    return td;
  }

  // One kind of thing the run waits for (approvals, input tasks, sleeps, signals): a heading,
  // then a line for each, which `fill` writes; nothing when there is none.
  function waiting(parent, title, items, className, fill) {
    if (!items.length) return;
    const h = document.createElement("h3");
    h.textContent = title;
    parent.appendChild(h);
    for (const item of items) {
      const p = document.createElement("p");
      if (className) p.className = className;
      fill(p, item);
      parent.appendChild(p);
    }
  }

  // Which model route answered the step's latest attempt, and the routes that failed or were
  // skipped before it (each model call's own order; a repair turn starts at the answering one).
  function routeNote(step) {
    const note = document.createElement("div");
    note.className = "live-route";
    note.id = `route-${step.name}`;
    const routes = step.routes;
    const answered = routes.filter((r) => r.outcome === "answered").pop();
    const before = routes.filter((r) => r.outcome !== "answered");
    const what = (r) => `${r.route} (${r.provider})`;
    const why = (r) => `${what(r)} ${r.outcome}${r.error_class ? ` ${r.error_class}` : ""}${r.error ? `: ${r.error}` : ""}`;
    note.textContent = answered ? `answered by ${what(answered)}` : "no route answered";
    if (answered) note.title = `${answered.tokens_in} / ${answered.tokens_out} tokens, $${answered.cost_usd}, ${answered.duration_ms} ms`;
    if (before.length) {
      const list = document.createElement("ul");
      list.className = "live-route-failed";
      for (const r of before) {
        const item = document.createElement("li");
        item.textContent = why(r);
        list.appendChild(item);
      }
      note.appendChild(list);
    }
    return note;
  }

  function render(run) {
    badge($("run-state"), run.state);
    const p = run.progress;
    let progress = `${p.steps_done} of ${p.steps_total} steps ended`;
    if (p.steps_failed) progress += ` (${p.steps_failed} failed)`;
    for (const m of p.map_items) progress += `; ${m.step}: ${m.done} of ${m.total} items done`;
    $("run-progress").textContent = progress;
    $("run-cost").textContent = run.budget_usd !== null
      ? `${usd(run.cost_usd)} of ${usd(run.budget_usd)} budget` : `${usd(run.cost_usd)} (no cost budget)`;
    $("run-tokens").textContent = `${run.tokens_in} in / ${run.tokens_out} out`;
    $("run-started").textContent = when(run.started_at);
    $("run-finished").textContent = when(run.finished_at);
    $("run-duration").textContent = seconds(run.duration_s);
    const err = $("run-error");
    err.hidden = !run.error;
    err.textContent = run.error ? (run.state === "paused" ? "Paused: " : "Error: ") + errorText(run.error) : "";

    if (!graph) drawGraph(run.steps);
    const body = $("run-steps").tBodies[0];
    body.replaceChildren();
    for (const step of run.steps) {
      if (graph) graph.getElementById(step.name).data("state", step.state);
      const row = body.insertRow();
      row.id = `step-${step.name}`;
      row.dataset.state = step.state;
      const name = row.insertCell();
      const link = document.createElement("a");
      link.href = step.url; link.textContent = step.name;
      name.appendChild(link);
      cell(row, step.kind);
      const state = row.insertCell();
      const b = document.createElement("span");
      badge(b, step.state);
      b.classList.add("step-state");
      state.appendChild(b);
      if (step.reused_from) {
        // Its output was copied from an earlier run's step: nothing was called or spent.
        const r = document.createElement("a");
        r.href = step.reused_from.url; r.className = "live-reused";
        r.id = `reused-${step.name}`;
        r.textContent = "reused";
        r.title = `Output reused from step ${step.reused_from.step} of run ${step.reused_from.run}: no model or tool was called, nothing was spent.`;
        state.appendChild(r);
      }
      if (step.routes.length) state.appendChild(routeNote(step));
      if (step.attestation) {
        // Who produced the output, and whether its signed record still holds.
        const t = document.createElement("span");
        t.id = `attestation-${step.name}`;
        const who = step.attestation.producer || "no producer";
        if (step.attestation.ok) {
          t.className = "live-signed";
          t.textContent = "signed";
          t.title = `Produced by ${who}, signed (key ${step.attestation.key}).`;
        } else {
          t.className = "live-unattested live-error-cell";
          t.textContent = "attestation failed";
          t.title = step.attestation.problem;
        }
        state.appendChild(t);
      }
      cell(row, step.attempts);
      cell(row, step.retries);
      cell(row, when(step.started_at));
      cell(row, when(step.finished_at));
      cell(row, seconds(step.duration_s));
      cell(row, `${step.tokens_in} / ${step.tokens_out}`);
      cell(row, usd(step.cost_usd));
      cell(row, step.skip_reason ? `skipped: ${step.skip_reason}`
        : errorText(step.error) || ((step.state === "queued" || step.state === "waiting") && step.waiting_for) || "—", step.error ? "live-error-cell" : "");
      const actions = row.insertCell();
      for (const op of ["retry", "skip"]) {
        const url = run.controls[op] && run.controls[op][step.name];
        if (url) {
          const a = document.createElement("a");
          a.href = url; a.className = "button live-op"; a.textContent = op;
          // A permanent error (or another the retry table never retries) fails the same way
          // again: the button says so, and its confirmation page says why.
          if (op === "retry" && step.error && NEVER_RETRIED.has(step.error.class)) {
            a.textContent = `retry (${step.error.class} error)`;
            a.classList.add("live-op-warn");
            a.title = "This error is never retried automatically: fix its cause first.";
          }
          actions.appendChild(a);
        }
      }
    }
    const controls = $("run-controls");
    controls.replaceChildren();
    for (const op of ["resume", "cancel"]) {
      if (run.controls[op]) {
        const a = document.createElement("a");
        a.href = run.controls[op]; a.className = "button live-op"; a.id = `control-${op}`;
        a.textContent = op === "resume" ? "Resume run" : "Cancel run";
        controls.appendChild(a);
      }
    }
    const approvals = $("run-approvals");
    approvals.hidden = run.approvals.length === 0 && run.inputs.length === 0
      && run.sleeps.length === 0 && run.signals.length === 0 && run.held.length === 0;
    approvals.replaceChildren();
    waiting(approvals, "Waiting for approval", run.approvals, "", (p, a) => {
      const link = document.createElement("a");
      link.href = a.url; link.textContent = `Decide on ${a.step}`;
      p.appendChild(link);
      p.appendChild(document.createTextNode(` (${a.risk_tier} risk, group ${a.approvers}, due ${when(a.deadline_at)})`));
    });
    waiting(approvals, "Waiting for input", run.inputs, "live-input", (p, input) => {
      const link = document.createElement("a");
      link.href = input.url; link.textContent = input.step;
      p.appendChild(link);
      p.appendChild(document.createTextNode(
        ` waits for input from ${input.assignee || input.group} until ${when(input.until)}`));
    });
    waiting(approvals, "Sleeping", run.sleeps, "live-sleep", (p, sleep) => {
      p.textContent = `${sleep.step} sleeps until ${when(sleep.until)}`;
    });
    waiting(approvals, "Waiting for a signal", run.signals, "live-signal", (p, wait) => {
      p.textContent = `${wait.step} waits for signal ${wait.signal} until ${when(wait.until)}`;
    });
    waiting(approvals, "Waiting its turn", run.held, "live-held", (p, held) => {
      const place = held.place === 1 ? "next in line" : `number ${held.place} in line`;
      p.textContent = `Runs of concurrency key "${held.key}" are at their limit: this run is ${place}, `
        + "and starts when one of them ends.";
    });
    root.dataset.lastEvent = run.last_event;
  }

  async function reread() {
    const response = await fetch(root.dataset.stateUrl, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
  }

  liveSocket(root.dataset.socketPath, reread, setStatus);
})();
