// The checkpoint and fork tree of a sandbox: its checkpoints, oldest
// first, each with the sandboxes forked from it (by the console, which
// labels its forks console/forked-from=<checkpoint id>), and the actions
// restore (in place), fork and delete.
import { el, age, bytes, errorBox } from "./dom.js";
import * as api from "./api.js";

export const forkLabel = "console/forked-from";

export async function treePage(sb, body) {
  const status = el("p", { id: "tree-status", role: "status" });
  const tree = el("div", { class: "tree", id: "tree" });
  const name = el("input", { type: "text", id: "checkpoint-name", placeholder: "name (optional)" });

  async function act(what, fn) {
    status.textContent = `${what}…`;
    status.className = "muted";
    try {
      const msg = await fn();
      status.textContent = msg || `${what}: done`;
      status.className = "";
      await load();
    } catch (e) {
      status.textContent = `${what} failed: ${e.message || e}`;
      status.className = "error";
    }
  }

  async function load() {
    const [cps, boxes] = await Promise.all([
      api.get(`/v1/sandboxes/${api.enc(sb.id)}/checkpoints`),
      api.get("/v1/sandboxes"),
    ]);
    const forks = new Map();
    for (const s of boxes.sandboxes || []) {
      const from = s.labels && s.labels[forkLabel];
      if (from) (forks.get(from) || forks.set(from, []).get(from)).push(s);
    }
    const items = (cps.checkpoints || []).map((c) => el("li", { "data-checkpoint": c.id },
      el("span", { class: "node" },
        el("span", { class: "mono" }, c.name || c.id), el("span", { class: "muted" }, `${c.implicit ? `implicit (${c.implicit}) · ` : ""}${bytes(c.size_bytes)} · ${age(c.created_at)} ago`),
        el("button", { type: "button", class: "restore", onclick: () => act(`Restore to ${c.name || c.id}`, async () => {
          const r = await api.post(`/v1/sandboxes/${api.enc(sb.id)}/restore`, { checkpoint: c.id });
          return `Restored to ${c.name || c.id} in ${r.duration_ms} ms`;
        }) }, "Restore"),
        el("button", { type: "button", class: "fork", onclick: () => act(`Fork ${c.name || c.id}`, async () => {
          const r = await api.post(`/v1/checkpoints/${api.enc(c.id)}/fork`, { count: 1, labels: { [forkLabel]: c.id } });
          return `Forked: ${r.sandboxes.map((s) => s.id).join(", ")}`;
        }) }, "Fork"),
        el("button", { type: "button", class: "danger delete", onclick: () => act(`Delete ${c.name || c.id}`, async () => {
          await api.del(`/v1/checkpoints/${api.enc(c.id)}`);
        }) }, "Delete")),
      (forks.get(c.id) || []).length ? el("ul", {}, forks.get(c.id).map((f) => el("li", {},
        "fork ", el("a", { class: "mono", href: `#/sandbox/${api.enc(f.id)}/tree` }, f.id), ` · ${f.state}`))) : null));
    tree.replaceChildren(el("ul", {}, el("li", {},
      el("span", { class: "node" }, el("strong", { class: "mono" }, sb.id), el("span", { class: "muted" }, `template ${sb.template}`)),
      items.length ? el("ul", {}, items) : el("p", { class: "muted" }, "No checkpoints."))));
  }

  body.replaceChildren(
    el("div", { class: "filters" }, name,
      el("button", { type: "button", id: "checkpoint-create", class: "primary", onclick: () => act("Checkpoint", async () => {
        const c = await api.post(`/v1/sandboxes/${api.enc(sb.id)}/checkpoints`, name.value ? { name: name.value } : {});
        name.value = "";
        return `Checkpoint ${c.name || c.id} taken`;
      }) }, "Checkpoint now")),
    status, tree);
  try { await load(); } catch (e) { body.append(errorBox(e)); }
  return null;
}
