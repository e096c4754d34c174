// The file browser: a sandbox's directories and files (the files API),
// and the diff between two of its states (GET /v1/diff): a checkpoint
// against the live files, or two checkpoints.
import { el, bytes, errorBox } from "./dom.js";
import * as api from "./api.js";

const maxView = 64 << 10;

export async function filesPage(sb, body) {
  const ref = `/v1/sandboxes/${api.enc(sb.id)}`;
  const listing = el("div", { id: "listing" });
  const viewer = el("div", { id: "viewer" });
  const diffOut = el("div", { id: "diff" });

  async function open(path) {
    listing.replaceChildren(el("p", { class: "muted" }, "Loading…"));
    try {
      const res = await api.get(`${ref}/fs/list?path=${api.enc(path)}`);
      const entries = (res.entries || res.files || []).slice().sort((a, b) => a.name.localeCompare(b.name));
      const up = path === "/" ? null : path.replace(/\/[^/]+\/?$/, "") || "/";
      listing.replaceChildren(
        el("p", { class: "mono", id: "cwd" }, path),
        el("ul", { class: "entries" },
          up ? el("li", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); open(up); } }, "..")) : null,
          entries.map((f) => el("li", { "data-name": f.name },
            el("a", { href: "#", class: "mono entry", onclick: (e) => { e.preventDefault(); f.type === "dir" ? open(f.path) : view(f.path); } }, f.name + (f.type === "dir" ? "/" : "")),
            f.type === "dir" ? "" : el("span", { class: "muted" }, ` ${bytes(f.size)}`)))));
    } catch (e) {
      listing.replaceChildren(errorBox(e));
    }
  }

  async function view(path) {
    viewer.replaceChildren(el("p", { class: "muted" }, "Loading…"));
    try {
      const { text, clipped } = await api.text(`${ref}/files?path=${api.enc(path)}`, maxView);
      viewer.replaceChildren(el("h2", { class: "mono" }, path), el("pre", { id: "file-content" }, text));
      if (clipped) viewer.append(el("p", { class: "muted" }, "(first 64 KiB)"));
    } catch (e) {
      viewer.replaceChildren(errorBox(e));
    }
  }

  const checkpoints = ((await api.get(`${ref}/checkpoints`)).checkpoints || []);
  const opt = (value, label) => el("option", { value }, label);
  const cpOpts = () => checkpoints.map((c) => opt(`checkpoint:${c.id}`, `checkpoint ${c.name || c.id}`));
  const from = el("select", { id: "diff-from" }, cpOpts(), opt(`template:${sb.template}`, `template ${sb.template}`));
  const to = el("select", { id: "diff-to" }, opt(`sandbox:${sb.id}`, "live files"), cpOpts());

  async function diff() {
    diffOut.replaceChildren(el("p", { class: "muted" }, "Comparing…"));
    try {
      const d = await api.get(`/v1/diff?from=${api.enc(from.value)}&to=${api.enc(to.value)}&unified=true`);
      diffOut.replaceChildren(
        el("p", {}, `${d.added} added, ${d.modified} modified, ${d.deleted} deleted`),
        el("ul", { class: "changes", id: "changes" }, (d.changes || []).map((c) => el("li", { "data-path": c.path },
          el("span", { class: c.change }, c.change), " ", el("span", { class: "mono change-path" }, c.path),
          c.unified ? el("pre", { class: "unified" }, c.unified) : c.binary ? el("span", { class: "muted" }, " (binary)") : null))));
    } catch (e) {
      diffOut.replaceChildren(errorBox(e));
    }
  }

  body.replaceChildren(
    el("div", { class: "split" },
      el("section", { class: "card" }, el("h2", {}, "Files"), listing),
      el("section", { class: "card" }, viewer)),
    el("section", { class: "card" },
      el("h2", {}, "Diff"),
      el("div", { class: "filters" }, "from ", from, " to ", to, el("button", { type: "button", id: "diff-run", class: "primary", onclick: diff }, "Compare")),
      diffOut));
  await open("/");
  if (checkpoints.length) await diff();
  return null;
}
