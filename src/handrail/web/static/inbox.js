// handrail inbox: live updates, the schema check of edited arguments, the remember preview.
// Served by the app itself (CSP: script-src 'self'); no inline script anywhere. Values from
// the server reach the page either as server-rendered, escaped HTML or through textContent.
"use strict";

(function () {
  const POLL_MS = Number(document.body.dataset.pollMs || 1500);

  // ------------------------------------------------------------ live fragments
  function liveFragment(container) {
    let etag = '"' + container.dataset.version + '"';
    async function tick() {
      try {
        const headers = { "If-None-Match": etag };
        const response = await fetch(container.dataset.live, { headers, credentials: "same-origin" });
        if (response.status === 401) { window.location.assign("/login"); return; }
        if (response.status === 200) {
          etag = response.headers.get("ETag");
          replaceKeepingFocus(container, await response.text());
        }
      } catch (e) { /* the server may be restarting: try again next tick */ }
      window.setTimeout(tick, POLL_MS);
    }
    window.setTimeout(tick, POLL_MS);
  }

  function replaceKeepingFocus(container, html) {
    const active = document.activeElement;
    const focusedId = active && container.contains(active) ? active.id : null;
    // The ticks of a selection survive the list's refresh (an item gone is simply gone).
    const picked = Array.from(container.querySelectorAll("input.pick:checked")).map(
      function (box) { return box.value; });
    container.innerHTML = html;
    container.querySelectorAll("input.pick").forEach(function (box) {
      if (picked.indexOf(box.value) !== -1) box.checked = true;
    });
    // The region replaced is not a live region (a new one is not announced); this one stays.
    const note = document.getElementById("live-note");
    const summary = container.querySelector("#count, #run-status");
    if (note && summary) note.textContent = summary.textContent;
    if (focusedId) {
      const again = document.getElementById(focusedId);
      if (again) again.focus();
    }
  }

  document.querySelectorAll("#items[data-live], #run[data-live]").forEach(liveFragment);

  // ---------------------------------------------- an item decided elsewhere
  const stateBox = document.getElementById("item-state");
  if (stateBox && stateBox.dataset.state === "open") {
    async function watch() {
      try {
        const response = await fetch(stateBox.dataset.live, { credentials: "same-origin" });
        if (response.status === 401) { window.location.assign("/login"); return; }
        if (response.ok) {
          const state = await response.json();
          if (state.state !== "open") { showDecided(state); return; }
        }
      } catch (e) { /* try again */ }
      window.setTimeout(watch, POLL_MS);
    }
    window.setTimeout(watch, POLL_MS);
  }

  function showDecided(state) {
    const banner = stateBox.querySelector(".decided");
    banner.textContent = "Already decided by " + (state.decided_by || "someone") + " at " +
      state.decided_at + (state.decision ? ": " + state.decision : "") + ".";
    banner.hidden = false;
    stateBox.dataset.state = state.state;
    const decide = document.getElementById("decide");
    if (decide) {
      decide.querySelectorAll("button, input, textarea, select").forEach(function (el) {
        el.disabled = true;
      });
    }
  }

  // ------------------------------------------------------ remember preview
  const pattern = document.getElementById("remember_pattern");
  const preview = document.getElementById("remember-preview");
  if (pattern && preview) {
    pattern.addEventListener("input", function () {
      preview.textContent = "";
      preview.append("If checked, saved as: allow " + preview.dataset.act + " ");
      const code = document.createElement("code");
      code.textContent = pattern.value;
      preview.append(code, " for the rest of run " + preview.dataset.run + ".");
    });
  }

  // ------------------------------------------- schema check before sending
  function guard(formId, fieldId, errorsId) {
    const form = document.getElementById(formId);
    if (!form || !form.dataset.schema) return;
    let schema;
    try { schema = JSON.parse(form.dataset.schema); } catch (e) { return; }
    form.addEventListener("submit", function (event) {
      const field = document.getElementById(fieldId);
      const errors = document.getElementById(errorsId);
      let value;
      let problems = [];
      try { value = JSON.parse(field.value); } catch (e) { problems = ["not valid JSON: " + e.message]; }
      if (!problems.length) problems = validate(value, schema, schema, "");
      if (problems.length) {
        event.preventDefault();
        errors.textContent = "";
        const intro = document.createElement("p");
        intro.textContent = "Not sent: the arguments do not fit the tool's schema.";
        const list = document.createElement("ul");
        problems.slice(0, 20).forEach(function (p) {
          const li = document.createElement("li");
          li.textContent = p;
          list.append(li);
        });
        errors.append(intro, list);
        field.setAttribute("aria-invalid", "true");
        field.focus();
      } else {
        field.removeAttribute("aria-invalid");
        errors.textContent = "";
      }
    });
  }
  guard("edit-form", "edited", "edit-errors");
  guard("form-answer", "answer", "answer-errors");

  // A subset of JSON Schema, enough to catch mistakes before they are sent; the server
  // validates again with the tool itself, and the policy re-checks what it touches.
  function typeOf(v) {
    if (v === null) return "null";
    if (Array.isArray(v)) return "array";
    if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
    return typeof v;
  }

  function resolve(schema, root) {
    let seen = 0;
    while (schema && typeof schema.$ref === "string" && schema.$ref.startsWith("#/") && seen < 32) {
      let target = root;
      for (const part of schema.$ref.slice(2).split("/")) {
        target = target ? target[part.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined;
      }
      schema = target;
      seen += 1;
    }
    return schema || {};
  }

  function validate(value, schema, root, path) {
    schema = resolve(schema, root);
    if (schema === true || schema === undefined) return [];
    if (schema === false) return [(path || "the value") + " is not allowed"];
    const at = path || "the arguments";
    const out = [];
    const type = typeOf(value);
    if (schema.type !== undefined) {
      const types = Array.isArray(schema.type) ? schema.type : [schema.type];
      const ok = types.some(function (t) { return t === type || (t === "number" && type === "integer"); });
      if (!ok) return [at + " must be " + types.join(" or ") + ", not " + type];
    }
    if (schema.enum && !schema.enum.some(function (e) { return JSON.stringify(e) === JSON.stringify(value); })) {
      out.push(at + " must be one of " + schema.enum.map(function (e) { return JSON.stringify(e); }).join(", "));
    }
    if ("const" in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) {
      out.push(at + " must be " + JSON.stringify(schema.const));
    }
    if (type === "string") {
      const n = Array.from(value).length;
      if (schema.minLength !== undefined && n < schema.minLength) out.push(at + " is shorter than " + schema.minLength + " characters");
      if (schema.maxLength !== undefined && n > schema.maxLength) out.push(at + " is longer than " + schema.maxLength + " characters");
      if (typeof schema.pattern === "string") {
        try { if (!new RegExp(schema.pattern, "u").test(value)) out.push(at + " does not match " + schema.pattern); } catch (e) { /* the server decides */ }
      }
    }
    if (type === "integer" || type === "number") {
      if (schema.minimum !== undefined && value < schema.minimum) out.push(at + " must be at least " + schema.minimum);
      if (schema.maximum !== undefined && value > schema.maximum) out.push(at + " must be at most " + schema.maximum);
      if (typeof schema.exclusiveMinimum === "number" && value <= schema.exclusiveMinimum) out.push(at + " must be more than " + schema.exclusiveMinimum);
      if (typeof schema.exclusiveMaximum === "number" && value >= schema.exclusiveMaximum) out.push(at + " must be less than " + schema.exclusiveMaximum);
    }
    if (type === "array") {
      if (schema.minItems !== undefined && value.length < schema.minItems) out.push(at + " needs at least " + schema.minItems + " items");
      if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push(at + " takes at most " + schema.maxItems + " items");
      if (schema.items && typeof schema.items === "object") {
        value.forEach(function (v, i) { out.push.apply(out, validate(v, schema.items, root, at + "[" + i + "]")); });
      }
    }
    if (type === "object") {
      const props = schema.properties || {};
      (schema.required || []).forEach(function (name) {
        if (!Object.prototype.hasOwnProperty.call(value, name)) out.push(at + " lacks the required field " + JSON.stringify(name));
      });
      Object.keys(value).forEach(function (name) {
        const sub = path ? path + "." + name : name;
        if (Object.prototype.hasOwnProperty.call(props, name)) {
          out.push.apply(out, validate(value[name], props[name], root, sub));
        } else if (schema.additionalProperties === false) {
          out.push("unknown field " + JSON.stringify(name) + (path ? " in " + path : ""));
        } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
          out.push.apply(out, validate(value[name], schema.additionalProperties, root, sub));
        }
      });
    }
    if (Array.isArray(schema.allOf)) {
      schema.allOf.forEach(function (s) { out.push.apply(out, validate(value, s, root, path)); });
    }
    const alternatives = schema.anyOf || schema.oneOf;
    if (Array.isArray(alternatives)) {
      const fits = alternatives.some(function (s) { return validate(value, s, root, path).length === 0; });
      if (!fits) out.push(at + " matches none of the allowed shapes");
    }
    return out;
  }
})();
