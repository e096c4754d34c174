// A live terminal in the sandbox: a shell on a PTY over the WebSocket of
// GET /v1/sandboxes/{id}/terminal (docs/CONSOLE.md), drawn by term.js.
import { el } from "./dom.js";
import * as api from "./api.js";
import { Screen, keyBytes } from "./term.js";

const rows = 24, cols = 100;

export async function terminalPage(sb, body) {
  const out = el("pre", { class: "terminal", id: "terminal", tabIndex: 0, "aria-label": "terminal" });
  const status = el("p", { class: "muted", id: "terminal-status" }, "connecting…");
  body.replaceChildren(status, out);

  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}/v1/sandboxes/${api.enc(sb.id)}/terminal?rows=${rows}&cols=${cols}`, api.wsProtocols());
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder();
  const send = (s) => { if (ws.readyState === WebSocket.OPEN && s) ws.send(enc.encode(s)); };
  const screen = new Screen(rows, cols, send);
  let pending = false;
  const draw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; out.textContent = screen.text(); });
  };

  ws.onopen = () => { status.textContent = "connected"; out.focus(); };
  ws.onmessage = (m) => {
    if (typeof m.data === "string") {
      const c = JSON.parse(m.data);
      status.textContent = c.type === "exit" ? `shell exited (${c.exit_code})` : `error: ${c.error}`;
      return;
    }
    screen.write(new Uint8Array(m.data));
    draw();
  };
  ws.onclose = (e) => { if (status.textContent === "connected" || status.textContent === "connecting…") status.textContent = `disconnected${e.reason ? ": " + e.reason : ""}`; };
  out.addEventListener("keydown", (e) => {
    const b = keyBytes(e);
    if (b) { e.preventDefault(); send(b); }
  });
  out.addEventListener("paste", (e) => { e.preventDefault(); send(e.clipboardData.getData("text")); });
  return () => ws.close();
}
