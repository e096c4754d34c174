// DOM helpers. Everything a sandbox produced is untrusted: it reaches the
// page only as text nodes (strings passed to el become text, never HTML).
// No module of the console parses HTML (console_test.go checks for the
// sinks).

// props are the element properties el sets; anything else throws, so no
// caller can reach a property that parses markup.
const props = new Set(["href", "type", "id", "name", "value", "checked", "placeholder", "tabIndex", "title", "autocomplete", "required"]);

// el creates an element: attrs sets properties (from props; on* become
// listeners, "class" the class name, "data-*", "aria-*", "for" and
// "role" attributes), children are nodes or strings (as text).
export function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k.startsWith("data-") || k === "for" || k === "role" || k.startsWith("aria-")) e.setAttribute(k, String(v));
    else if (props.has(k)) e[k] = v;
    else throw new Error(`el: property ${k} is not allowed`);
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// mount replaces the content of the main element.
export function mount(...children) {
  const main = document.getElementById("main");
  main.replaceChildren();
  append(main, children);
  return main;
}

export function age(t) {
  if (!t) return "";
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

export function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

export function time(t) {
  return t ? new Date(t).toLocaleTimeString() : "";
}

export function errorBox(err) {
  return el("p", { class: "error", role: "alert" }, String(err && err.message ? err.message : err));
}
