// API v1 from the browser. The key lives in sessionStorage only (gone
// when the tab closes, never in a cookie: the API stays free of ambient
// credentials and so of CSRF) and is sent as "Authorization: Bearer".
// Over the unix socket the daemon needs no key (local mode).

const KEY = "agentbox.apiKey";

export function key() { return sessionStorage.getItem(KEY) || ""; }
export function setKey(k) { sessionStorage.setItem(KEY, k); }
export function clearKey() { sessionStorage.removeItem(KEY); }

export class APIError extends Error {
  constructor(status, body) {
    super(body && body.message ? `${body.message} (HTTP ${status}${body.request_id ? ", request " + body.request_id : ""})` : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

function headers(extra) {
  const h = new Headers(extra || {});
  const k = key();
  if (k) h.set("Authorization", "Bearer " + k);
  return h;
}

// call sends a request and returns the decoded JSON (null for 204).
export async function call(method, path, body, opts = {}) {
  const init = { method, headers: headers(opts.headers), cache: "no-store", credentials: "omit", signal: opts.signal };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers.set("Content-Type", "application/json");
  }
  const res = await fetch(path, init);
  if (!res.ok) {
    let b = null;
    try { b = await res.json(); } catch { /* not JSON */ }
    throw new APIError(res.status, b);
  }
  if (res.status === 204) return null;
  const ct = res.headers.get("Content-Type") || "";
  return ct.includes("json") ? res.json() : res.text();
}

export const get = (p, o) => call("GET", p, undefined, o);
export const post = (p, b, o) => call("POST", p, b === undefined ? {} : b, o);
export const del = (p, o) => call("DELETE", p, undefined, o);

// text fetches a file as text (at most limit bytes shown).
export async function text(path, limit) {
  const res = await fetch(path, { headers: headers(), cache: "no-store", credentials: "omit" });
  if (!res.ok) {
    let b = null;
    try { b = await res.json(); } catch { /* not JSON */ }
    throw new APIError(res.status, b);
  }
  const buf = await res.arrayBuffer();
  const clipped = buf.byteLength > limit;
  return { text: new TextDecoder("utf-8", { fatal: false }).decode(clipped ? buf.slice(0, limit) : buf), clipped };
}

// follow reads a JSON-lines stream (follow=1&format=jsonl), calling onItem
// for each line until the stream ends or signal aborts.
export async function follow(path, onItem, signal) {
  const res = await fetch(path, { headers: headers(), cache: "no-store", credentials: "omit", signal });
  if (!res.ok) {
    let b = null;
    try { b = await res.json(); } catch { /* not JSON */ }
    throw new APIError(res.status, b);
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) onItem(JSON.parse(line));
    }
  }
}

// wsProtocols are the subprotocols of the terminal's WebSocket: the
// protocol, and the key (browsers cannot set headers on a WebSocket).
export function wsProtocols() {
  const p = ["agentbox.terminal.v1"];
  const k = key();
  if (k) {
    const b = btoa(String.fromCharCode(...new TextEncoder().encode(k)));
    p.push("agentbox.bearer." + b.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, ""));
  }
  return p;
}

export const enc = encodeURIComponent;
