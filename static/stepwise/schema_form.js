/* A small, generic JSON-Schema-to-form renderer for the workflow builder (docs/builder.md).
 *
 * It draws one field per property of an object schema, in the schema's order, from the schema
 * alone: `enum` -> a select, string -> a text box (a one-line input when the schema limits it
 * with a pattern or a short maxLength), integer/number -> a number box, boolean -> a checkbox,
 * an array of strings -> a comma-separated list, anything else (objects, arrays of objects,
 * JSON Schemas, oneOf...) -> a YAML text box. A field the format gains tomorrow appears here
 * without a change. Descriptions become the help text and `default`s the placeholders.
 *
 * A field writes only when the person edits it: an empty box removes the key (the format's
 * default applies), so an unedited definition comes back exactly as it went in. Values the
 * builder marks as floats with no fraction (StepwiseSchemaForm.FloatNum: `2.0`, which JSON in a
 * browser would turn into `2`) keep being floats.
 */
(function () {
  "use strict";

  class FloatNum {
    constructor(value) { this.value = value; }
    toString() { return Number.isInteger(this.value) ? `${this.value}.0` : String(this.value); }
  }

  /* The value with every FloatNum as a plain number (for YAML and comparisons). */
  function plain(value) {
    if (value instanceof FloatNum) return value.value;
    if (Array.isArray(value)) return value.map(plain);
    if (value && typeof value === "object") {
      const out = {};
      for (const [k, v] of Object.entries(value)) out[k] = plain(v);
      return out;
    }
    return value;
  }

  /* `fresh` (just read from YAML) with the FloatNum marks of `before` kept where the number did
   * not change: editing one field in YAML does not turn the other `2.0`s into `2`. */
  function remark(fresh, before) {
    if (before instanceof FloatNum && typeof fresh === "number" && fresh === before.value) return before;
    if (Array.isArray(fresh) && Array.isArray(before)) return fresh.map((v, i) => remark(v, before[i]));
    if (fresh && typeof fresh === "object" && before && typeof before === "object" && !Array.isArray(fresh)) {
      const out = {};
      for (const [k, v] of Object.entries(fresh)) out[k] = remark(v, before[k]);
      return out;
    }
    return fresh;
  }

  /* JSON text of a definition, writing FloatNums as `2.0`. */
  function stringify(value) {
    if (value instanceof FloatNum) return value.toString();
    if (Array.isArray(value)) return `[${value.map(stringify).join(",")}]`;
    if (value && typeof value === "object") {
      return `{${Object.entries(value).filter(([, v]) => v !== undefined)
        .map(([k, v]) => `${JSON.stringify(k)}:${stringify(v)}`).join(",")}}`;
    }
    return JSON.stringify(value);
  }

  /* A canonical text (sorted keys) for comparing two values. */
  function canonical(value) {
    if (value instanceof FloatNum) return String(value.value);
    if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
    if (value && typeof value === "object") {
      return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
    }
    return JSON.stringify(value);
  }

  function toYaml(value) {
    return window.jsyaml.dump(plain(value), { lineWidth: 100, noRefs: true });
  }

  function resolve(schema, root) {
    let s = schema || {};
    for (let depth = 0; s.$ref && depth < 20; depth++) {
      const parts = s.$ref.replace(/^#\//, "").split("/");
      let target = root;
      for (const p of parts) target = target && target[p];
      const rest = Object.assign({}, s);
      delete rest.$ref;
      s = Object.assign({}, target || {}, rest);
    }
    return s;
  }

  function types(schema) {
    if (Array.isArray(schema.type)) return schema.type;
    return schema.type ? [schema.type] : [];
  }

  function kindOf(schema, root) {
    if (schema.enum) return "enum";
    if (schema.const !== undefined) return "const";
    const t = types(schema).filter((x) => x !== "null");
    if (schema.oneOf || schema.anyOf || t.length !== 1) return "yaml";
    if (t[0] === "string") return "string";
    if (t[0] === "integer" || t[0] === "number") return "number";
    if (t[0] === "boolean") return "boolean";
    if (t[0] === "array") {
      const items = resolve(schema.items, root);
      const it = types(items).filter((x) => x !== "null");
      if (it.length === 1 && it[0] === "string" && !items.enum) return "list";
    }
    return "yaml";
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, v);
    }
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function placeholderOf(schema) {
    if (schema.default === undefined || schema.default === "") return "";
    return typeof schema.default === "object" ? JSON.stringify(schema.default) : `default: ${schema.default}`;
  }

  /* Draw the fields of `schema` (an object schema) for `value` into `container`.
   * onChange(key, newValue) is called on an edit; newValue undefined means "remove the key".
   * options.skip: property names drawn elsewhere (the canvas draws `after`);
   * options.readOnly: names shown but not editable; options.onlySchema: leave out the keys
   * the schema does not list (drawn elsewhere); options.suggest: {name: [values]} for a
   * datalist (models, tools); options.idPrefix names the inputs (field-<prefix>-<key>). */
  function render(container, schema, root, value, onChange, options) {
    options = options || {};
    schema = resolve(schema, root);
    const required = new Set(schema.required || []);
    const skip = new Set(options.skip || []);
    const readOnly = new Set(options.readOnly || []);
    const prefix = options.idPrefix || "f";
    const props = Object.assign({}, schema.properties || {});
    // Keys the schema does not list (a newer server, a typo) are still shown, as YAML.
    if (!options.onlySchema) for (const key of Object.keys(value || {})) if (!(key in props)) props[key] = {};
    // Required fields first (a tool step's `tool` before its ten optional ones), each group
    // in the schema's order.
    const entries = Object.entries(props).sort((a, b) => Number(required.has(b[0])) - Number(required.has(a[0])));
    for (const [key, raw] of entries) {
      if (skip.has(key)) continue;
      const prop = resolve(raw, root);
      const kind = kindOf(prop, root);
      const id = `field-${prefix}-${key}`;
      const row = el("div", { class: `sf-row sf-${kind}`, "data-key": key });
      const label = el("label", { for: id }, key + (required.has(key) ? " *" : ""));
      row.appendChild(label);
      const current = value ? value[key] : undefined;
      let input;
      if (kind === "enum" || kind === "const") {
        input = el("select", { id });
        const choices = kind === "enum" ? prop.enum : [prop.const];
        input.appendChild(el("option", { value: "" }, required.has(key) ? "— choose —" : placeholderOf(prop) || "—"));
        choices.forEach((choice, i) => {
          const o = el("option", { value: String(i) }, choice === null ? "null" : String(choice));
          if (current !== undefined && canonical(current) === canonical(choice)) o.selected = true;
          input.appendChild(o);
        });
        input.addEventListener("change", () => onChange(key, input.value === "" ? undefined : choices[Number(input.value)]));
      } else if (kind === "boolean") {
        input = el("input", { id, type: "checkbox" });
        input.checked = current === true;
        input.addEventListener("change", () => onChange(key, input.checked));
      } else if (kind === "number") {
        input = el("input", { id, type: "text", inputmode: "decimal", placeholder: placeholderOf(prop) });
        input.value = current === undefined || current === null ? (current === null ? "null" : "") : String(current);
        input.addEventListener("change", () => {
          const text = input.value.trim();
          if (text === "") return onChange(key, undefined);
          if (text === "null") return onChange(key, null);
          const n = Number(text);
          if (!Number.isFinite(n)) { input.setCustomValidity("a number"); input.reportValidity(); return; }
          input.setCustomValidity("");
          onChange(key, /[.eE]/.test(text) && Number.isInteger(n) ? new FloatNum(n) : n);
        });
      } else if (kind === "list") {
        input = el("input", { id, type: "text", placeholder: "comma-separated" });
        input.value = Array.isArray(current) ? current.join(", ") : "";
        input.addEventListener("change", () => {
          const text = input.value.trim();
          onChange(key, text === "" ? undefined : text.split(",").map((x) => x.trim()).filter(Boolean));
        });
      } else if (kind === "string") {
        const short = prop.pattern || prop.format || (prop.maxLength && prop.maxLength <= 100) || options.suggest?.[key];
        input = short ? el("input", { id, type: "text", placeholder: placeholderOf(prop) })
          : el("textarea", { id, rows: 3, placeholder: placeholderOf(prop) });
        input.value = typeof current === "string" ? current : (current === undefined ? "" : String(current));
        if (options.suggest?.[key]) {
          const list = el("datalist", { id: `${id}-list` });
          for (const s of options.suggest[key]) list.appendChild(el("option", { value: s }));
          row.appendChild(list);
          input.setAttribute("list", `${id}-list`);
        }
        input.addEventListener("change", () => onChange(key, input.value === "" && !required.has(key) ? undefined : input.value));
      } else {
        const box = el("textarea", { id, rows: 4, class: "sf-yaml", spellcheck: "false",
                                     placeholder: prop.default !== undefined ? `YAML; default ${JSON.stringify(prop.default)}` : "YAML" });
        box.value = current === undefined ? "" : toYaml(current);
        const err = el("div", { class: "sf-error" });
        box.addEventListener("change", () => {
          const text = box.value.trim();
          if (text === "") { err.textContent = ""; return onChange(key, undefined); }
          try {
            const parsed = window.jsyaml.load(text);
            err.textContent = "";
            onChange(key, remark(parsed, current));
          } catch (e) {
            err.textContent = `Not YAML: ${e.reason || e.message}`;
          }
        });
        if (readOnly.has(key)) box.disabled = true;
        row.appendChild(box);
        row.appendChild(err);
        input = null;
      }
      if (input) {
        if (readOnly.has(key)) input.disabled = true;
        row.appendChild(input);
      }
      if (prop.description) row.appendChild(el("div", { class: "sf-help" }, prop.description));
      container.appendChild(row);
    }
  }

  window.StepwiseSchemaForm = { render, resolve, FloatNum, plain, remark, stringify, canonical, toYaml };
})();
