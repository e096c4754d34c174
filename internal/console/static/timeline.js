// A sandbox's live timeline from the flight recorder (GET .../events):
// runs with the file, network and package effects recorded for them,
// lifecycle events between; filters by kind; follow streams new events.
import { el, time, bytes, errorBox } from "./dom.js";
import * as api from "./api.js";

// kinds maps a filter to the event types it shows.
const kinds = {
  runs: (t) => t === "run.started" || t === "run.ended",
  files: (t) => t === "file.changed",
  network: (t) => t === "network",
  packages: (t) => t === "package",
  lifecycle: (t) => !["run.started", "run.ended", "file.changed", "network", "package"].includes(t),
};

function describe(ev) {
  switch (ev.type) {
    case "run.started": return [el("span", { class: "mono" }, ev.run.command || ""), ev.run.cwd ? ` in ${ev.run.cwd}` : ""];
    case "run.ended": {
      const r = ev.run || {};
      const how = r.signal ? `signal ${r.signal}` : `exit ${r.exit_code ?? "?"}`;
      return [`${how} after ${(r.duration_ms || 0).toFixed(0)} ms`, r.excerpt ? el("pre", { class: "excerpt" }, r.excerpt) : null];
    }
    case "file.changed": {
      const f = ev.file;
      return [el("span", { class: f.change }, f.change), " ", el("span", { class: "mono file-path" }, f.path), f.kind ? ` (${f.kind}, ${bytes(f.size)})` : ""];
    }
    case "network": {
      const n = ev.egress;
      return [`${n.decision} `, el("span", { class: "mono" }, [n.method, n.destination, n.path].filter(Boolean).join(" ")), n.reason ? ` — ${n.reason}` : ""];
    }
    case "package": {
      const p = ev.package;
      return [`${p.action} ${p.manager} `, el("span", { class: "mono" }, `${p.name} ${p.version || ""}`)];
    }
    case "transition": {
      const t = ev.transition || {};
      return [`${t.from} → ${t.to}`, t.cause ? ` (${t.cause})` : ""];
    }
    default:
      return [ev.detail || ev.message || ev.cause || "", ev.error ? el("span", { class: "error" }, ` ${ev.error}`) : ""];
  }
}

function row(ev) {
  const fail = ev.error || (ev.type === "run.ended" && ev.run && ev.run.exit_code !== 0);
  return el("li", { class: `event ${ev.type.startsWith("run.") ? "run" : ""} ${fail ? "fail" : ""}`, "data-type": ev.type, "data-seq": ev.seq },
    el("span", { class: "time" }, time(ev.time)), el("span", { class: "kind" }, ev.type), describe(ev));
}

export async function timelinePage(sb, body) {
  const state = { events: [], on: Object.fromEntries(Object.keys(kinds).map((k) => [k, true])), abort: null };
  const list = el("ol", { id: "timeline", class: "timeline" });
  const status = el("span", { class: "muted", id: "follow-status" });

  // Runs group their effects: the events of a run follow its start.
  function render() {
    const shown = state.events.filter((ev) => Object.entries(kinds).some(([k, f]) => state.on[k] && f(ev.type)));
    const groups = new Map();
    const top = [];
    for (const ev of shown) {
      if (ev.run_id && ev.type !== "run.started" && groups.has(ev.run_id)) {
        groups.get(ev.run_id).append(row(ev));
        continue;
      }
      const r = row(ev);
      if (ev.type === "run.started" && ev.run_id) {
        const effects = el("ul", { class: "effects", "data-run": ev.run_id });
        r.append(effects);
        groups.set(ev.run_id, effects);
      }
      top.push(r);
    }
    list.replaceChildren(...top);
    if (top.length === 0) list.append(el("li", { class: "muted" }, "No events."));
  }

  const filters = el("div", { class: "filters" },
    Object.keys(kinds).map((k) => el("label", {},
      el("input", { type: "checkbox", checked: true, id: `filter-${k}`, onchange: (e) => { state.on[k] = e.target.checked; render(); } }), ` ${k}`)),
    el("label", {}, el("input", { type: "checkbox", id: "follow", onchange: (e) => (e.target.checked ? start() : stop()) }), " follow"),
    status);

  const base = `/v1/sandboxes/${api.enc(sb.id)}/events`;
  function add(ev) { state.events.push(ev); }
  function stop() { if (state.abort) { state.abort.abort(); state.abort = null; } status.textContent = ""; }
  function start() {
    stop();
    const ctl = new AbortController();
    state.abort = ctl;
    const after = state.events.length ? state.events[state.events.length - 1].seq || 0 : 0;
    status.textContent = "following…";
    api.follow(`${base}?follow=1&format=jsonl&after=${after}`, (ev) => { add(ev); render(); }, ctl.signal)
      .then(() => { if (state.abort === ctl) status.textContent = "stream ended"; })
      .catch((e) => { if (!ctl.signal.aborted) status.textContent = `follow stopped: ${e.message || e}`; });
  }

  body.replaceChildren(filters, list);
  try {
    const res = await api.get(base);
    (res.events || []).forEach(add);
    render();
  } catch (e) {
    body.append(errorBox(e));
  }
  return stop;
}
