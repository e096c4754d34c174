// The console's router and its top-level pages: login, the sandboxes
// list, a sandbox's tabs (timeline.js, files.js, tree.js, terminal.js) and
// the admin's tenants page.
import { el, mount, age, bytes, errorBox } from "./dom.js";
import * as api from "./api.js";
import { timelinePage } from "./timeline.js";
import { filesPage } from "./files.js";
import { treePage } from "./tree.js";
import { terminalPage } from "./terminal.js";

// cleanup of the current page (open streams, sockets), run on navigation.
let leave = null;

async function authenticated() {
  try {
    await api.get("/v1/info");
    return true;
  } catch (e) {
    if (e.status === 401) return false;
    throw e;
  }
}

function loginPage(message) {
  document.getElementById("nav").hidden = true;
  const input = el("input", { type: "password", id: "api-key", name: "api-key", autocomplete: "off", required: true, placeholder: "API key" });
  const status = el("p", { class: "error", role: "alert" }, message || "");
  const form = el("form", {
    class: "login card", id: "login",
    onsubmit: async (ev) => {
      ev.preventDefault();
      api.setKey(input.value.trim());
      input.value = "";
      try {
        if (await authenticated()) { location.hash = "#/"; route(); return; }
        api.clearKey();
        status.textContent = "That key was not accepted.";
      } catch (e) {
        api.clearKey();
        status.textContent = String(e.message || e);
      }
    },
  },
  el("h1", {}, "Log in"),
  el("p", { class: "muted" }, "The key is kept in this tab's session storage only and sent as a bearer token to the API."),
  el("label", { for: "api-key" }, "API key"), input,
  el("p", {}, el("button", { type: "submit", class: "primary", id: "login-submit" }, "Log in")),
  status);
  mount(form);
  input.focus();
}

async function sandboxesPage() {
  mount(el("h1", {}, "Sandboxes"), el("p", { class: "muted" }, "Loading…"));
  const [list, usage] = await Promise.all([
    api.get("/v1/sandboxes"),
    api.get("/v1/usage").catch(() => null),
  ]);
  const byBox = new Map();
  for (const u of (usage && usage.sandboxes) || []) byBox.set(u.sandbox, u.totals);
  const rows = (list.sandboxes || []).map((s) => {
    const u = byBox.get(s.id) || {};
    return el("tr", { "data-sandbox": s.id },
      el("td", {}, el("a", { href: `#/sandbox/${api.enc(s.id)}/timeline`, class: "mono sandbox-link" }, s.id)),
      el("td", {}, s.name || ""),
      el("td", {}, el("span", { class: `state state-${s.state}` }, s.state)),
      el("td", {}, s.backend || ""),
      el("td", {}, s.template || ""),
      el("td", { title: s.created_at }, age(s.created_at)),
      el("td", {}, String(u.runs || 0)),
      el("td", {}, (u.cpu_seconds || 0).toFixed(2)),
      el("td", {}, bytes(s.disk && s.disk.used_bytes)),
      el("td", {}, bytes(u.egress_bytes)));
  });
  mount(
    el("h1", {}, "Sandboxes"),
    rows.length === 0 ? el("p", { class: "muted" }, "No sandboxes.") :
      el("table", { id: "sandboxes" },
        el("thead", {}, el("tr", {}, ["ID", "Name", "State", "Backend", "Template", "Age", "Runs", "CPU s", "Disk", "Egress"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
}

async function tenantsPage() {
  mount(el("h1", {}, "Tenants"), el("p", { class: "muted" }, "Loading…"));
  let tenants;
  try {
    tenants = await api.get("/v1/tenants");
  } catch (e) {
    if (e.status === 403) { mount(el("h1", {}, "Tenants"), el("p", { class: "muted" }, "Tenants are shown to the admin key only.")); return; }
    throw e;
  }
  const [usage, secrets] = await Promise.all([api.get("/v1/usage"), api.get("/v1/secrets").catch(() => ({ secrets: [] }))]);
  const byTenant = new Map();
  for (const u of usage.tenants || []) byTenant.set(u.tenant, u.totals);
  const ids = new Set([...(tenants.tenants || []).map((t) => t.id), ...byTenant.keys()]);
  mount(
    el("h1", {}, "Tenants"),
    el("table", { id: "tenants" },
      el("thead", {}, el("tr", {}, ["Tenant", "Runs", "CPU s", "Memory GB·s", "Egress"].map((h) => el("th", {}, h)))),
      el("tbody", {}, [...ids].sort().map((id) => {
        const u = byTenant.get(id) || {};
        return el("tr", {}, el("td", {}, id), el("td", {}, String(u.runs || 0)), el("td", {}, (u.cpu_seconds || 0).toFixed(2)),
          el("td", {}, (u.memory_gb_seconds || 0).toFixed(2)), el("td", {}, bytes(u.egress_bytes)));
      }))),
    el("h2", {}, "Secrets"),
    el("p", { class: "muted" }, "Names only: values are never sent to the console."),
    el("ul", { id: "secrets" }, (secrets.secrets || []).map((s) => el("li", { class: "mono" }, s.name, s.tenant ? ` (${s.tenant})` : ""))));
}

const tabs = { timeline: timelinePage, files: filesPage, tree: treePage, terminal: terminalPage };

async function sandboxPage(id, tab) {
  const sb = await api.get(`/v1/sandboxes/${api.enc(id)}`);
  const body = el("div", { id: "tab-body" });
  mount(
    el("h1", {}, "Sandbox ", el("span", { class: "mono" }, sb.id), sb.name ? ` (${sb.name})` : ""),
    el("p", { class: "muted" }, el("span", { class: `state state-${sb.state}` }, sb.state), ` · ${sb.backend} · ${sb.template} · created ${age(sb.created_at)} ago`),
    el("nav", { class: "tabs" }, Object.keys(tabs).map((t) =>
      el("a", { href: `#/sandbox/${api.enc(sb.id)}/${t}`, class: t === tab ? "active" : "", id: `tab-${t}` }, t[0].toUpperCase() + t.slice(1)))),
    body);
  return tabs[tab](sb, body);
}

async function route() {
  if (leave) { try { leave(); } catch { /* already gone */ } leave = null; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (!(await authenticated())) { loginPage(api.key() ? "The key is no longer accepted." : ""); api.clearKey(); return; }
    document.getElementById("nav").hidden = false;
    document.getElementById("logout").hidden = !api.key();
    if (parts[0] === "sandbox" && parts[1]) leave = await sandboxPage(parts[1], tabs[parts[2]] ? parts[2] : "timeline");
    else if (parts[0] === "tenants") await tenantsPage();
    else await sandboxesPage();
  } catch (e) {
    mount(errorBox(e));
  }
}

document.getElementById("logout").addEventListener("click", () => { api.clearKey(); location.hash = "#/"; route(); });
window.addEventListener("hashchange", route);
route();
