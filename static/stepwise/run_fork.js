// The run page's Fork dialog: reads the form, posts it to POST /api/v1/runs/<id>/fork/, opens
// the new run's page, or lists every problem the API answered, by path (docs/operations.md).
(function () {
  "use strict";
  const dialog = document.getElementById("fork-dialog");
  const open = document.getElementById("fork-open");
  if (!dialog || !open) return;
  const form = document.getElementById("fork-form");
  const errors = document.getElementById("fork-errors");

  function show(problems) {
    errors.replaceChildren();
    const title = document.createElement("p");
    title.textContent = "The fork was not started:";
    const list = document.createElement("ul");
    for (const p of problems) {
      const item = document.createElement("li");
      if (p.path) {
        const code = document.createElement("code");
        code.textContent = p.path;
        item.append(code, ": ");
      }
      item.append(p.message);
      list.append(item);
    }
    errors.append(title, list);
    errors.hidden = false;
  }

  function json(field, path) {
    const text = form.elements[field].value.trim();
    if (!text) return [undefined, null];
    try {
      const value = JSON.parse(text);
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        return [undefined, { path, message: "must be a JSON object" }];
      }
      return [value, null];
    } catch (e) {
      return [undefined, { path, message: `not JSON: ${e.message}` }];
    }
  }

  open.addEventListener("click", () => { errors.hidden = true; dialog.showModal(); });
  document.getElementById("fork-cancel").addEventListener("click", () => dialog.close());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const [input, badInput] = json("input", "input");
    const [stepInput, badStepInput] = json("step_input", "step_input");
    const bad = [badInput, badStepInput].filter(Boolean);
    if (bad.length) { show(bad); return; }
    const body = { step: form.elements.step.value, version: Number(form.elements.version.value) };
    if (input !== undefined) body.input = input;
    if (stepInput !== undefined && Object.keys(stepInput).length) body.step_input = stepInput;
    const ticked = [...form.querySelectorAll("input[name=repeat_effects]:checked")].map((b) => b.value);
    if (ticked.length) {
      body.repeat_effects = ticked;
      body.reason = form.elements.reason.value;
    }
    const submit = document.getElementById("fork-submit");
    submit.disabled = true;
    try {
      const response = await fetch(dialog.dataset.url, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json",
                   "X-CSRFToken": dialog.dataset.csrf },
        body: JSON.stringify(body),
      });
      const answer = await response.json().catch(() => null);
      if (response.ok && answer && answer.id) {
        window.location.assign(`../../${answer.id}/live/`);
        return;
      }
      show(answer && Array.isArray(answer.errors) ? answer.errors
        : [{ path: "", message: `the server answered ${response.status}` }]);
    } catch (e) {
      show([{ path: "", message: `the server could not be reached: ${e.message}` }]);
    } finally {
      submit.disabled = false;
    }
  });
})();
