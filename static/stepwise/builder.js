/* The visual workflow builder (docs/builder.md).
 *
 * The definition is the one source of truth: `def` is the document exactly as it was saved (or
 * as the template has it), and every gesture edits it in place — a dropped palette item appends
 * a step, a drawn edge appends to the target's `after`, a field of the side panel sets or
 * removes one key. The canvas (Cytoscape.js, laid out by dagre, edges drawn with
 * cytoscape-edgehandles), the side panel (generated from the format's JSON Schema by
 * schema_form.js) and the YAML view are all redrawn from `def`. Nothing is added that the person
 * did not ask for, so an unedited definition saves as itself. Positions live in `positions`,
 * stored beside the version, never in `def`.
 *
 * Saving goes through the API (POST /api/v1/workflows/, the same `workflow_save` as every other
 * client); the server's problems are drawn on the step or edge their path names.
 */
(function () {
  "use strict";
  const SF = window.StepwiseSchemaForm;
  const data = JSON.parse(document.getElementById("builder-data").textContent);
  const root = document.getElementById("builder");
  const csrf = root.dataset.csrf;
  const schema = data.schema;
  const STEP_TYPES = ["agent", "tool", "router", "map", "human_gate", "sub_workflow", "loop", "sleep",
                      "human_input", "wait"];
  const BODY_TYPES = ["agent", "tool", "router"];
  const TYPE_LABELS = { agent: "Agent", tool: "Tool", router: "Router", map: "Map",
                        human_gate: "Human gate", sub_workflow: "Sub-workflow", loop: "Loop",
                        sleep: "Sleep", human_input: "Human input", wait: "Wait for signal" };
  const $ = (id) => document.getElementById(id);

  let def = markFloats(data.definition, data.float_paths || []);
  let positions = Object.assign({}, data.positions || {});
  let saved = { name: data.workflow, number: data.version };
  let selected = null;            // {kind: "step", name} | {kind: "edge", id} | null (the workflow)
  let problems = { steps: {}, edges: {}, workflow: [] };
  let refused = [];               // edges drawn on the canvas and refused: {id, source, target, message}
  let cy = null, eh = null;

  // --- the definition -------------------------------------------------------------------

  function markFloats(value, paths) {
    for (const path of paths) {
      if (!path.length) continue;
      let parent = value;
      for (const key of path.slice(0, -1)) parent = parent && parent[key];
      const last = path[path.length - 1];
      if (parent && typeof parent[last] === "number") parent[last] = new SF.FloatNum(parent[last]);
    }
    return value;
  }

  function steps() { return Array.isArray(def.steps) ? def.steps : []; }

  /* Every step with where it lives: top-level (loop null) or in a loop's body. */
  function allSteps() {
    const found = [];
    steps().forEach((step, index) => {
      if (!step || typeof step !== "object") return;
      found.push({ step, loop: null, index });
      if (step.type === "loop" && Array.isArray(step.body)) {
        step.body.forEach((inner, bodyIndex) => {
          if (inner && typeof inner === "object") found.push({ step: inner, loop: step, index: bodyIndex });
        });
      }
    });
    return found;
  }

  function find(name) { return allSteps().find((s) => s.step.name === name) || null; }

  function listOf(entry) { return entry.loop ? entry.loop.body : def.steps; }

  function afterOf(step) { return Array.isArray(step.after) ? step.after : []; }

  function newName(type) {
    const taken = new Set(allSteps().map((s) => s.step.name));
    for (let n = 1; ; n++) if (!taken.has(`${type}_${n}`)) return `${type}_${n}`;
  }

  function routesOf(router) {
    const routes = Array.isArray(router.routes) ? router.routes.filter((r) => r && typeof r === "object") : [];
    const all = routes.map((route, index) => ({ route, label: route.name || `route ${index + 1}` }));
    if (router.default && typeof router.default === "object") {
      all.push({ route: router.default, label: router.default.name || "default", isDefault: true });
    }
    return all;
  }

  /* A path from `from` to `to` following dependencies downstream (x -> y when x is in y.after),
   * within one scope; null when there is none. */
  function pathBetween(from, to, scope) {
    const down = {};
    for (const s of scope) for (const a of afterOf(s)) (down[a] = down[a] || []).push(s.name);
    const previous = { [from]: null };
    const queue = [from];
    while (queue.length) {
      const at = queue.shift();
      if (at === to) {
        const path = [];
        for (let n = to; n !== null; n = previous[n]) path.unshift(n);
        return path;
      }
      for (const next of down[at] || []) if (!(next in previous)) { previous[next] = at; queue.push(next); }
    }
    return null;
  }

  // --- edits ----------------------------------------------------------------------------

  let dirty = false;  // edited since opened or saved

  function changed({ structure = true } = {}) {
    dirty = true;
    if (structure) redraw();
    syncYaml();
  }

  function addStep(type, position, loopName) {
    const name = newName(type);
    const step = { name, type };
    const loop = loopName ? find(loopName) : null;
    if (loop && loop.step.type === "loop" && BODY_TYPES.includes(type)) {
      loop.step.body = Array.isArray(loop.step.body) ? loop.step.body : [];
      loop.step.body.push(step);
    } else {
      if (!Array.isArray(def.steps)) def.steps = [];
      def.steps.push(step);
    }
    positions[name] = position;
    selected = { kind: "step", name };
    changed();
    status(`Added step ${name}: fill in its fields on the right.`);
  }

  function addDependency(source, target) {
    const s = find(source), t = find(target);
    if (!s || !t || source === target) return;
    refused = refused.filter((r) => r.id !== `refused:${source}->${target}`);
    if (s.loop !== t.loop) {
      return refuse(source, target, "refused: a loop's body steps depend only on steps of the same body, " +
        "and steps outside a loop only on steps outside it");
    }
    if (afterOf(t.step).includes(source)) return select({ kind: "edge", id: `${source}->${target}` });
    const scope = s.loop ? s.loop.body : steps();
    const cycle = pathBetween(target, source, scope);
    if (cycle) return refuse(source, target, `refused: this dependency makes a cycle: ${[...cycle, target].join(" → ")}`);
    t.step.after = [...afterOf(t.step), source];
    selected = { kind: "edge", id: `${source}->${target}` };
    changed();
    status(`${target} now runs after ${source}.`);
  }

  function refuse(source, target, message) {
    const id = `refused:${source}->${target}`;
    refused.push({ id, source, target, message });
    selected = { kind: "edge", id };
    redraw();
    status(message, true);
  }

  function removeDependency(source, target) {
    const t = find(target), s = find(source);
    if (!t) return;
    const after = afterOf(t.step).filter((a) => a !== source);
    if (after.length) t.step.after = after; else delete t.step.after;
    if (s && s.step.type === "router") {
      for (const { route } of routesOf(s.step)) {
        if (Array.isArray(route.then)) route.then = route.then.filter((n) => n !== target);
      }
    }
    selected = null;
    changed();
  }

  function deleteStep(name) {
    const entry = find(name);
    if (!entry) return;
    const list = listOf(entry);
    list.splice(list.indexOf(entry.step), 1);
    for (const { step } of allSteps()) {
      if (Array.isArray(step.after) && step.after.includes(name)) {
        const after = step.after.filter((a) => a !== name);
        if (after.length) step.after = after; else delete step.after;
      }
      if (step.type === "router") {
        for (const { route } of routesOf(step)) {
          if (Array.isArray(route.then)) route.then = route.then.filter((n) => n !== name);
        }
      }
      if (step.fallback === name) delete step.fallback;
    }
    delete positions[name];
    refused = refused.filter((r) => r.source !== name && r.target !== name);
    selected = null;
    changed();
  }

  function renameStep(oldName, newName_) {
    if (!newName_ || newName_ === oldName) return true;
    if (find(newName_)) { status(`A step named ${newName_} exists already.`, true); return false; }
    const entry = find(oldName);
    entry.step.name = newName_;
    for (const { step } of allSteps()) {
      if (Array.isArray(step.after)) step.after = step.after.map((a) => (a === oldName ? newName_ : a));
      if (step.type === "router") {
        for (const { route } of routesOf(step)) {
          if (Array.isArray(route.then)) route.then = route.then.map((n) => (n === oldName ? newName_ : n));
        }
      }
      if (step.fallback === oldName) step.fallback = newName_;
    }
    if (positions[oldName]) { positions[newName_] = positions[oldName]; delete positions[oldName]; }
    for (const key of Object.keys(problems.steps)) if (key === oldName) delete problems.steps[key];
    selected = { kind: "step", name: newName_ };
    changed();
    return true;
  }

  // --- the canvas -----------------------------------------------------------------------

  function edgeLabel(sourceStep, target) {
    if (sourceStep && sourceStep.type === "router") {
      return routesOf(sourceStep).filter(({ route }) => Array.isArray(route.then) && route.then.includes(target.name))
        .map(({ label }) => label).join(" / ");
    }
    if (typeof target.when === "string" && target.when) {
      return "if " + (target.when.length > 32 ? target.when.slice(0, 31) + "…" : target.when);
    }
    return "";
  }

  function elements() {
    const els = [];
    const names = new Set();
    for (const { step, loop } of allSteps()) {
      if (typeof step.name !== "string" || names.has(step.name)) continue;
      names.add(step.name);
      const errs = problems.steps[step.name];
      const node = { group: "nodes", data: { id: step.name, label: `${step.name}\n${TYPE_LABELS[step.type] || step.type}`,
                                             type: step.type || "" },
                     classes: [step.type || "unknown", errs ? "has-error" : ""].join(" ") };
      if (loop) node.data.parent = loop.name;
      if (positions[step.name]) node.position = Object.assign({}, positions[step.name]);
      els.push(node);
    }
    for (const { step } of allSteps()) {
      for (const source of afterOf(step)) {
        if (!names.has(source) || !names.has(step.name)) continue;
        const id = `${source}->${step.name}`;
        const entry = find(source);
        els.push({ group: "edges", data: { id, source, target: step.name, label: edgeLabel(entry && entry.step, step) },
                   classes: [entry && entry.step.type === "router" ? "route" : "", problems.edges[id] ? "has-error" : ""].join(" ") });
      }
    }
    for (const r of refused) {
      if (names.has(r.source) && names.has(r.target)) {
        els.push({ group: "edges", data: { id: r.id, source: r.source, target: r.target, label: "refused: cycle",
                                           error: r.message }, classes: "refused has-error" });
      }
    }
    return els;
  }

  const STYLE = [
    { selector: "node", style: { shape: "round-rectangle", width: 140, height: 46, label: "data(label)",
      "text-wrap": "wrap", "text-valign": "center", "font-size": 11, color: "#fff",
      "background-color": "#417690", "border-width": 0 } },
    { selector: "node.tool", style: { "background-color": "#5b7f3a" } },
    { selector: "node.router", style: { shape: "diamond", width: 120, height: 70, "background-color": "#8a5a9e" } },
    { selector: "node.map", style: { "background-color": "#2d6f8f", "border-width": 3, "border-style": "double", "border-color": "#9cc" } },
    { selector: "node.human_gate", style: { shape: "hexagon", "background-color": "#b26a00" } },
    { selector: "node.sub_workflow", style: { "background-color": "#546e7a", "border-width": 2, "border-color": "#263238" } },
    { selector: "node.loop", style: { "background-color": "#6d4c41" } },
    { selector: "node:parent", style: { "background-color": "#efebe9", "background-opacity": 1, color: "#4e342e",
      "text-valign": "top", "text-halign": "center", "border-width": 2, "border-color": "#6d4c41", padding: 16 } },
    { selector: "node.has-error", style: { "border-width": 4, "border-color": "#ba2121", "border-style": "solid" } },
    { selector: "node:selected", style: { "overlay-color": "#ffd54f", "overlay-opacity": 0.35 } },
    { selector: "edge", style: { width: 2, "line-color": "#9e9e9e", "target-arrow-color": "#9e9e9e",
      "target-arrow-shape": "triangle", "curve-style": "bezier", "font-size": 10,
      "text-background-color": "#fff", "text-background-opacity": 0.9, "text-background-padding": 2, color: "#333" } },
    { selector: "edge[label]", style: { label: "data(label)" } },
    { selector: "edge.route", style: { "line-color": "#8a5a9e", "target-arrow-color": "#8a5a9e" } },
    { selector: "edge.has-error", style: { "line-color": "#ba2121", "target-arrow-color": "#ba2121", color: "#ba2121", width: 3 } },
    // A refused edge arcs above the others, so it and its label stay visible.
    { selector: "edge.refused", style: { "line-style": "dashed", "curve-style": "unbundled-bezier",
      "control-point-distances": [90], "control-point-weights": [0.5], "font-weight": "bold" } },
    { selector: "edge:selected", style: { "overlay-color": "#ffd54f", "overlay-opacity": 0.35 } },
    { selector: ".eh-handle", style: { "background-color": "#ba2121", width: 12, height: 12, shape: "ellipse" } },
    { selector: ".eh-preview, .eh-ghost-edge", style: { "line-color": "#417690", "target-arrow-color": "#417690",
      "target-arrow-shape": "triangle", "line-style": "dashed" } },
    { selector: ".eh-ghost-edge.eh-preview-active", style: { opacity: 0 } },
  ];

  function rememberPositions() {
    if (!cy) return;
    cy.nodes().forEach((n) => { if (!n.isParent()) positions[n.id()] = { x: Math.round(n.position("x")), y: Math.round(n.position("y")) }; });
  }

  function layout() {
    const run = cy.layout({ name: "dagre", rankDir: "LR", nodeSep: 30, rankSep: 70, padding: 24, fit: true });
    run.one("layoutstop", rememberPositions);
    run.run();
  }

  function redraw() {
    rememberPositions();
    cy.elements().remove();
    cy.add(elements());
    const missing = cy.nodes().filter((n) => !n.isParent() && !positions[n.id()]);
    if (missing.length && missing.length === cy.nodes().filter((n) => !n.isParent()).length) layout();
    else if (missing.length) layout();
    if (selected) {
      const id = selected.kind === "step" ? selected.name : selected.id;
      const e = cy.getElementById(id);
      if (e.nonempty()) e.select();
    }
    renderPanel();
    renderWorkflowProblems();
    $("btn-delete").disabled = !selected;
  }

  function initCanvas() {
    cy = cytoscape({ container: $("canvas"), elements: [], style: STYLE,
                     boxSelectionEnabled: false, selectionType: "single", minZoom: 0.2, maxZoom: 2.5 });
    cy.add(elements());
    const lone = cy.nodes().filter((n) => !n.isParent());
    if (lone.some((n) => !positions[n.id()])) layout();
    else cy.fit(undefined, 30);
    if (cy.zoom() > 1.2) { cy.zoom(1.2); cy.center(); }
    eh = cy.edgehandles({
      canConnect: (source, target) => !source.same(target) && !source.isParent(),
      edgeParams: () => ({ classes: "eh-new" }),
      hoverDelay: 60, snap: true, snapThreshold: 20, snapFrequency: 30, noEdgeEventsInDraw: true,
    });
    cy.on("ehcomplete", (event, source, target, added) => {
      added.remove();
      addDependency(source.id(), target.id());
    });
    cy.on("tap", "node", (event) => select({ kind: "step", name: event.target.id() }));
    cy.on("tap", "edge", (event) => select({ kind: "edge", id: event.target.id() }));
    cy.on("tap", (event) => { if (event.target === cy) select(null); });
    cy.on("dragfree", "node", rememberPositions);
    // The admin's sidebar and the panel move or resize the canvas after it is drawn; Cytoscape
    // caches where its container is, so tell it, or pointer positions would be off.
    new ResizeObserver(() => cy.resize()).observe($("canvas"));
    $("canvas").addEventListener("mousedown", () => cy.resize(), true);
    $("canvas").addEventListener("touchstart", () => cy.resize(), { capture: true, passive: true });
    window.addEventListener("load", () => cy.resize());
    document.getElementById("toggle-nav-sidebar")?.addEventListener("click", () => setTimeout(() => cy.resize(), 0));
    window.stepwiseBuilder = { cy, definition: () => def, positions: () => positions, text: () => SF.stringify(def) };
  }

  function select(what) {
    selected = what;
    cy.elements().unselect();
    if (what) {
      const e = cy.getElementById(what.kind === "step" ? what.name : what.id);
      if (e.nonempty()) e.select();
    }
    $("btn-delete").disabled = !what;
    renderPanel();
  }

  // --- the side panel -------------------------------------------------------------------

  function h(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function problemList(list) {
    const ul = h("ul", { class: "builder-problems" });
    for (const p of list) ul.appendChild(h("li", {}, p.path ? `${p.path}: ${p.message}` : p.message));
    return ul;
  }

  function renderPanel() {
    const panel = $("panel");
    panel.replaceChildren();
    if (selected && selected.kind === "step") {
      const entry = find(selected.name);
      if (entry) return renderStepPanel(panel, entry);
    }
    if (selected && selected.kind === "edge") {
      const r = refused.find((x) => x.id === selected.id);
      if (r) return renderRefusedPanel(panel, r);
      const [source, target] = selected.id.split("->");
      if (find(source) && find(target) && afterOf(find(target).step).includes(source)) {
        return renderEdgePanel(panel, source, target);
      }
    }
    selected = null;
    renderWorkflowPanel(panel);
  }

  function renderWorkflowPanel(panel) {
    panel.appendChild(h("h3", {}, "Workflow"));
    panel.appendChild(h("p", { class: "builder-quiet" }, "Click a step or a dependency to edit it; drag a step type from the palette to add one."));
    if (problems.workflow.length) panel.appendChild(problemList(problems.workflow));
    const form = h("div", { class: "sf-form", id: "workflow-form" });
    SF.render(form, schema, schema, def, (key, value) => {
      if (value === undefined) delete def[key]; else def[key] = value;
      changed({ structure: false });
    }, { skip: ["steps"], idPrefix: "workflow" });
    panel.appendChild(form);
  }

  function renderStepPanel(panel, entry) {
    const step = entry.step;
    panel.appendChild(h("h3", {}, `Step ${step.name}`));
    panel.appendChild(h("p", { class: "builder-quiet" },
      `${TYPE_LABELS[step.type] || step.type}${entry.loop ? ` in the body of loop ${entry.loop.name}` : ""}` +
      (afterOf(step).length ? `; runs after ${afterOf(step).join(", ")}` : "; runs first")));
    const errs = problems.steps[step.name];
    if (errs) panel.appendChild(problemList(errs));
    const nameRow = h("div", { class: "sf-row" });
    nameRow.appendChild(h("label", { for: "field-step-name" }, "name *"));
    const nameInput = h("input", { id: "field-step-name", type: "text" });
    nameInput.value = step.name;
    nameInput.addEventListener("change", () => { if (!renameStep(step.name, nameInput.value.trim())) nameInput.value = step.name; });
    nameRow.appendChild(nameInput);
    panel.appendChild(nameRow);
    const form = h("div", { class: "sf-form", id: "step-form" });
    const stepSchema = STEP_TYPES.includes(step.type) ? { $ref: `#/$defs/${step.type}_step` } : { type: "object", properties: {} };
    SF.render(form, stepSchema, schema, step, (key, value) => {
      if (value === undefined) delete step[key]; else step[key] = value;
      changed({ structure: ["routes", "default", "when", "body"].includes(key) });
    }, { skip: ["name", "after"], readOnly: ["type"], idPrefix: "step",
         suggest: { model: data.models, tool: data.tools } });
    panel.appendChild(form);
    const del = h("button", { type: "button", class: "button", id: "btn-delete-step" }, `Delete step ${step.name}`);
    del.addEventListener("click", () => deleteStep(step.name));
    panel.appendChild(del);
  }

  function renderEdgePanel(panel, source, target) {
    const s = find(source), t = find(target);
    const id = `${source}->${target}`;
    panel.appendChild(h("h3", {}, `Dependency ${source} → ${target}`));
    panel.appendChild(h("p", { class: "builder-quiet" }, `${target} runs after ${source} (its \`after\`).`));
    if (problems.edges[id]) panel.appendChild(problemList(problems.edges[id]));
    if (s.step.type === "router") {
      const box = h("fieldset", { class: "builder-routes" });
      box.appendChild(h("legend", {}, `Routes of ${source} that run ${target}`));
      routesOf(s.step).forEach(({ route, label }, index) => {
        const row = h("label", { class: "builder-route" });
        const check = h("input", { type: "checkbox", id: `route-${index}` });
        check.checked = Array.isArray(route.then) && route.then.includes(target);
        check.addEventListener("change", () => {
          const then = Array.isArray(route.then) ? route.then.filter((n) => n !== target) : [];
          if (check.checked) then.push(target);
          route.then = then;
          changed();
        });
        row.appendChild(check);
        row.appendChild(document.createTextNode(` ${label}${route.when ? ` (when ${route.when})` : ""}`));
        box.appendChild(row);
      });
      panel.appendChild(box);
    }
    const condition = h("div", { class: "sf-form" });
    const whenSchema = { type: "object", properties: { when: SF.resolve({ $ref: `#/$defs/${t.step.type}_step` }, schema).properties?.when || { type: "string" } } };
    SF.render(condition, whenSchema, schema, t.step, (key, value) => {
      if (value === undefined) delete t.step.when; else t.step.when = value;
      changed();
    }, { idPrefix: "edge", onlySchema: true });
    condition.insertBefore(h("p", { class: "builder-quiet" }, `The condition on this edge is ${target}'s \`when\`: ${target} runs only when it holds.`), condition.firstChild);
    panel.appendChild(condition);
    const del = h("button", { type: "button", class: "button", id: "btn-remove-edge" }, "Remove this dependency");
    del.addEventListener("click", () => removeDependency(source, target));
    panel.appendChild(del);
  }

  function renderRefusedPanel(panel, r) {
    panel.appendChild(h("h3", {}, `Dependency ${r.source} → ${r.target}`));
    panel.appendChild(h("p", { class: "builder-error", id: "refused-message" }, r.message));
    panel.appendChild(h("p", { class: "builder-quiet" }, "It is not in the definition. Remove it, or remove another dependency first."));
    const del = h("button", { type: "button", class: "button", id: "btn-remove-edge" }, "Remove");
    del.addEventListener("click", () => { refused = refused.filter((x) => x.id !== r.id); selected = null; redraw(); });
    panel.appendChild(del);
  }

  function renderWorkflowProblems() {
    const box = $("workflow-errors");
    const count = new Set([...problems.workflow, ...Object.values(problems.steps).flat(),
                           ...Object.values(problems.edges).flat()]).size;
    box.hidden = count === 0;
    box.replaceChildren();
    if (!count) return;
    box.appendChild(h("strong", {}, `${count} problem${count === 1 ? "" : "s"} found by the server`));
    const all = [...new Set([...problems.workflow, ...Object.values(problems.steps).flat(),
                             ...Object.values(problems.edges).flat()])];
    box.appendChild(problemList(all));
  }

  // --- server problems ------------------------------------------------------------------

  /* Each problem on the step or edge its path names (`steps[2].after[0]`: the edge from that
   * dependency; `steps[1].routes[0].then[1]`: the router's edge; `steps[3].prompt`: the step),
   * or on the workflow. */
  function placeProblems(list) {
    problems = { steps: {}, edges: {}, workflow: [] };
    const push = (map, key, p) => (map[key] = map[key] || []).push(p);
    for (const p of list) {
      const m = /^steps\[(\d+)\](?:\.body\[(\d+)\])?(.*)$/.exec(p.path || "");
      let step = m ? steps()[Number(m[1])] : null;
      if (step && m[2] !== undefined) step = Array.isArray(step.body) ? step.body[Number(m[2])] : null;
      if (!step || typeof step.name !== "string") { problems.workflow.push(p); continue; }
      const rest = m[3];
      const after = /^\.after\[(\d+)\]/.exec(rest);
      const then = /^\.(?:routes\[(\d+)\]|default)\.then\[(\d+)\]/.exec(rest);
      const cycle = /^\.after$/.test(rest) && /^cycle: (.+)$/.exec(p.message || "");
      if (cycle) {
        // "cycle: a -> b -> a": each step runs after the one before it, so each pair is an edge.
        const names = cycle[1].split(" -> ");
        for (let i = 0; i + 1 < names.length; i++) push(problems.edges, `${names[i]}->${names[i + 1]}`, p);
        push(problems.steps, step.name, p);
      } else if (after && typeof afterOf(step)[Number(after[1])] === "string" && find(afterOf(step)[Number(after[1])])) {
        push(problems.edges, `${afterOf(step)[Number(after[1])]}->${step.name}`, p);
      } else if (then) {
        const route = then[1] !== undefined ? (step.routes || [])[Number(then[1])] : step.default;
        const target = route && Array.isArray(route.then) ? route.then[Number(then[2])] : null;
        const t = target && find(target);
        if (t && afterOf(t.step).includes(step.name)) push(problems.edges, `${step.name}->${target}`, p);
        else push(problems.steps, step.name, p);
      } else {
        push(problems.steps, step.name, p);
      }
    }
    redraw();
  }

  // --- the server -----------------------------------------------------------------------

  async function call(method, url, bodyText) {
    const response = await fetch(url, {
      method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf },
      body: bodyText,
    });
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    return { status: response.status, body };
  }

  function definitionBody() { return `{"definition":${SF.stringify(def)},"team":${JSON.stringify(data.team)}}`; }

  async function check() {
    status("Checking…");
    const { status: code, body } = await call("POST", data.urls.validate, definitionBody());
    const list = body && Array.isArray(body.errors) ? body.errors : [{ path: "", message: `the server answered ${code}` }];
    placeProblems(code === 200 ? [] : list);
    status(code === 200 ? "No problems: the definition is valid." : `${list.length} problem${list.length === 1 ? "" : "s"}: see the steps and edges marked in red.`, code !== 200);
    return code === 200;
  }

  function stepMap(definition) {
    const map = new Map();
    for (const step of (definition && Array.isArray(definition.steps) ? definition.steps : [])) {
      if (step && typeof step.name === "string") map.set(step.name, step);
    }
    return map;
  }

  /* Steps added, removed and changed (with the keys that changed), and the workflow's own
   * fields that changed, from `before` (the current version, or null) to `after`. */
  function diff(before, after) {
    const a = stepMap(before), b = stepMap(after);
    const added = [...b.keys()].filter((n) => !a.has(n));
    const removed = [...a.keys()].filter((n) => !b.has(n));
    const changedSteps = [];
    for (const [name, step] of b) {
      if (!a.has(name)) continue;
      const old = a.get(name);
      const keys = [...new Set([...Object.keys(old), ...Object.keys(step)])]
        .filter((k) => SF.canonical(old[k]) !== SF.canonical(step[k]));
      if (keys.length) changedSteps.push({ name, keys });
    }
    const top = [...new Set([...Object.keys(before || {}), ...Object.keys(after)])]
      .filter((k) => k !== "steps" && SF.canonical((before || {})[k]) !== SF.canonical(after[k]));
    return { added, removed, changed: changedSteps, workflow: top };
  }

  async function startSave() {
    if (!(await check())) return;
    const name = def.name;
    const { status: code, body } = await call("GET", `${data.urls.workflows}${encodeURIComponent(name)}/?team=${encodeURIComponent(data.team)}`);
    const current = code === 200 ? body : null;
    const d = diff(current ? current.definition : null, SF.plain(def));
    const box = $("save-diff");
    box.replaceChildren();
    box.appendChild(h("p", {}, current ? `Against the current version ${current.version} of ${name}:` : `${name} is a new workflow in team ${data.team}.`));
    const section = (id, title, items) => {
      const div = h("div", { id, class: "builder-diff-section" });
      div.appendChild(h("strong", {}, `${title} (${items.length})`));
      const ul = h("ul");
      for (const item of items) ul.appendChild(h("li", {}, item));
      if (!items.length) ul.appendChild(h("li", { class: "builder-quiet" }, "none"));
      div.appendChild(ul);
      box.appendChild(div);
    };
    section("diff-added", "Steps added", d.added);
    section("diff-removed", "Steps removed", d.removed);
    section("diff-changed", "Steps changed", d.changed.map((c) => `${c.name}: ${c.keys.join(", ")}`));
    if (current && d.workflow.length) section("diff-workflow", "Workflow fields changed", d.workflow);
    if (current && !d.added.length && !d.removed.length && !d.changed.length && !d.workflow.length) {
      box.appendChild(h("p", { id: "diff-none" }, `No changes: saving keeps version ${current.version} (its layout is saved).`));
    }
    $("save-dialog").showModal();
  }

  async function confirmSave() {
    $("save-dialog").close();
    status("Saving…");
    const { status: code, body } = await call("POST", data.urls.workflows, definitionBody());
    if (code !== 200 && code !== 201) {
      const list = body && Array.isArray(body.errors) ? body.errors : [{ path: "", message: `the server answered ${code}` }];
      placeProblems(list);
      return status(`Not saved: ${list.map((p) => (p.path ? `${p.path}: ${p.message}` : p.message)).join("; ")}`, true);
    }
    rememberPositions();
    const layout = await call("POST", data.urls.layout, JSON.stringify({ team: data.team, workflow: body.workflow, number: body.number, positions }));
    saved = { name: body.workflow, number: body.number };
    dirty = false;
    // A reload (or a bookmark) opens the version just saved, not the blank page or template.
    if (layout.status === 200 && layout.body && layout.body.builder_url) {
      window.history.replaceState(null, "", layout.body.builder_url);
    }
    placeProblems([]);
    $("btn-run").disabled = false;
    root.dataset.savedVersion = String(body.number);
    root.dataset.savedCreated = String(code === 201);
    status(`${code === 201 ? "Saved as" : "Unchanged: still"} ${body.workflow} version ${body.number}` +
           (layout.status === 200 ? "." : `; the layout was not stored (${layout.status}).`));
  }

  function openRun() {
    $("run-input").value = JSON.stringify(data.sample_input || {}, null, 2);
    $("run-error").textContent = "";
    $("run-dialog").showModal();
  }

  async function confirmRun() {
    let input;
    try { input = JSON.parse($("run-input").value || "{}"); } catch (e) { $("run-error").textContent = `Not JSON: ${e.message}`; return; }
    const url = `${data.urls.workflows}${encodeURIComponent(saved.name)}/runs/?team=${encodeURIComponent(data.team)}&via=builder`;
    const { status: code, body } = await call("POST", url, JSON.stringify({ input, version: saved.number }));
    if (code !== 202 && code !== 200) {
      const list = body && Array.isArray(body.errors) ? body.errors : [{ path: "", message: `the server answered ${code}` }];
      $("run-error").textContent = list.map((p) => (p.path ? `${p.path}: ${p.message}` : p.message)).join("; ");
      return;
    }
    window.location.href = data.urls.run_live.replace("00000000-0000-0000-0000-000000000000", body.id);
  }

  // --- YAML view ------------------------------------------------------------------------

  let yamlShown = "";

  function syncYaml() {
    yamlShown = SF.toYaml(def);
    $("yaml-text").value = yamlShown;
  }

  function applyYaml() {
    const text = $("yaml-text").value;
    if (text === yamlShown) return true;
    let parsed;
    try { parsed = window.jsyaml.load(text); } catch (e) {
      $("yaml-error").textContent = `Not YAML: ${e.reason || e.message}`;
      return false;
    }
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
      $("yaml-error").textContent = "A definition is a mapping (name, input_schema, steps...).";
      return false;
    }
    $("yaml-error").textContent = "";
    def = SF.remark(parsed, def);
    refused = [];
    problems = { steps: {}, edges: {}, workflow: [] };
    if (selected && selected.kind === "step" && !find(selected.name)) selected = null;
    changed();
    status("The canvas now shows the YAML.");
    return true;
  }

  function showView(view) {
    if (view === "canvas" && !applyYaml()) return;
    if (view === "yaml") syncYaml();
    $("canvas").hidden = view !== "canvas";
    $("yaml-view").hidden = view !== "yaml";
    $("tab-canvas").classList.toggle("active", view === "canvas");
    $("tab-yaml").classList.toggle("active", view === "yaml");
    if (view === "canvas") { cy.resize(); }
  }

  // --- wiring ---------------------------------------------------------------------------

  function status(message, bad) {
    const el = $("builder-status");
    el.textContent = message;
    el.classList.toggle("builder-error", !!bad);
  }

  function modelPoint(clientX, clientY) {
    const box = $("canvas").getBoundingClientRect();
    const pan = cy.pan(), zoom = cy.zoom();
    return { x: Math.round((clientX - box.left - pan.x) / zoom), y: Math.round((clientY - box.top - pan.y) / zoom) };
  }

  // Room a new step needs around it: a step box (140 x 46, a router 120 x 70) and enough gap
  // that an edge to its neighbour shows.
  const ROOM = { x: 190, y: 90 };

  function occupied(point) {
    return cy.nodes().some((n) => !n.isParent() && Math.abs(n.position("x") - point.x) < ROOM.x &&
                                  Math.abs(n.position("y") - point.y) < ROOM.y);
  }

  /* The first place at or after `point` where a new step overlaps none: down the column, then
   * the next column to the right, staying in the visible extent `ext` while it has room. */
  function freeSpot(point, ext) {
    const bottom = Math.max(point.y, ext.y2 - ROOM.y / 2);
    let spot = { x: point.x, y: point.y };
    for (let tries = 0; tries < 400 && occupied(spot); tries++) {
      spot = spot.y + ROOM.y > bottom ? { x: spot.x + ROOM.x, y: point.y } : { x: spot.x, y: spot.y + ROOM.y };
    }
    return { x: Math.round(spot.x), y: Math.round(spot.y) };
  }

  function loopAt(point) {
    const hit = cy.nodes("node.loop").filter((n) => {
      const b = n.boundingBox();
      return point.x >= b.x1 && point.x <= b.x2 && point.y >= b.y1 && point.y <= b.y2;
    });
    return hit.nonempty() ? hit.first().id() : null;
  }

  function initPalette() {
    const palette = $("palette");
    for (const type of STEP_TYPES) {
      const item = h("div", { class: `palette-item palette-${type}`, draggable: "true", "data-type": type,
                               id: `palette-${type}`, role: "button", tabindex: "0",
                               title: SF.resolve({ $ref: `#/$defs/${type}_step` }, schema).title || type }, TYPE_LABELS[type]);
      item.addEventListener("dragstart", (event) => {
        event.dataTransfer.setData("application/x-stepwise-step", type);
        event.dataTransfer.effectAllowed = "copy";
      });
      item.addEventListener("click", () => {
        const ext = cy.extent();
        addStep(type, freeSpot({ x: Math.round(ext.x1 + 120), y: Math.round(ext.y1 + 80) }, ext), null);
      });
      palette.appendChild(item);
    }
    palette.appendChild(h("p", { class: "builder-quiet" }, "Drop an agent, tool or router on a loop to add it to the loop's body."));
    const canvas = $("canvas");
    canvas.addEventListener("dragover", (event) => {
      if (event.dataTransfer.types.includes("application/x-stepwise-step")) { event.preventDefault(); event.dataTransfer.dropEffect = "copy"; }
    });
    canvas.addEventListener("drop", (event) => {
      const type = event.dataTransfer.getData("application/x-stepwise-step");
      if (!STEP_TYPES.includes(type)) return;
      event.preventDefault();
      const point = modelPoint(event.clientX, event.clientY);
      const loop = BODY_TYPES.includes(type) ? loopAt(point) : null;
      addStep(type, loop ? point : freeSpot(point, cy.extent()), loop);
    });
  }

  function init() {
    initPalette();
    initCanvas();
    renderPanel();
    syncYaml();
    $("btn-layout").addEventListener("click", () => { layout(); status("Laid out with dagre."); });
    $("btn-connect").addEventListener("click", () => {
      const on = $("btn-connect").getAttribute("aria-pressed") !== "true";
      $("btn-connect").setAttribute("aria-pressed", String(on));
      $("btn-connect").classList.toggle("active", on);
      if (on) eh.enableDrawMode(); else eh.disableDrawMode();
      status(on ? "Drag from a step to the step that runs after it." : "");
    });
    $("btn-delete").addEventListener("click", () => {
      if (!selected) return;
      if (selected.kind === "step") return deleteStep(selected.name);
      const r = refused.find((x) => x.id === selected.id);
      if (r) { refused = refused.filter((x) => x !== r); selected = null; return redraw(); }
      const [source, target] = selected.id.split("->");
      removeDependency(source, target);
    });
    document.addEventListener("keydown", (event) => {
      // Delete / Backspace on the canvas removes the selected step or dependency, never while
      // typing in a field.
      if ((event.key === "Delete" || event.key === "Backspace") && selected
          && !event.target.closest("input, textarea, select, dialog") && !$("canvas").hidden) {
        event.preventDefault();
        $("btn-delete").click();
      }
    });
    $("btn-check").addEventListener("click", check);
    $("btn-save").addEventListener("click", startSave);
    $("btn-save-confirm").addEventListener("click", confirmSave);
    $("btn-save-cancel").addEventListener("click", () => $("save-dialog").close());
    $("btn-run").addEventListener("click", openRun);
    $("btn-run-confirm").addEventListener("click", confirmRun);
    $("btn-run-cancel").addEventListener("click", () => $("run-dialog").close());
    $("btn-yaml-apply").addEventListener("click", applyYaml);
    $("tab-canvas").addEventListener("click", () => showView("canvas"));
    $("tab-yaml").addEventListener("click", () => showView("yaml"));
    $("template-select").addEventListener("change", (event) => {
      if (event.target.value) {
        if (dirty && !window.confirm("Leave this workflow? Your edits are not saved.")) {
          event.target.value = "";
          return;
        }
        window.location.href = `${data.urls.builder_new}?team=${encodeURIComponent(data.team)}&template=${encodeURIComponent(event.target.value)}`;
      }
    });
    root.dataset.ready = "true";
  }

  init();
})();
