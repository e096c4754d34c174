// Drives agentbox's MCP server with the official TypeScript MCP client.
// Run by test/mcp_test.go, from a copy of this directory whose
// node_modules was installed with `npm ci` from package-lock.json.
//
//   node client.mjs stdio AGENTBOX_BIN   (AGENTBOX_HOST/AGENTBOX_API_KEY in env)
//   node client.mjs http URL KEY
//
// Env OTHER_SANDBOX is another tenant's sandbox id, which must be refused
// exactly like an unknown id. Prints one JSON line {"sandbox": id} on
// success; any failed check throws (exit status 1, reason on stderr).
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, a, b] = process.argv.slice(2);
let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: a, args: ["mcp"], env: process.env, stderr: "inherit" });
} else if (mode === "http") {
  transport = new StreamableHTTPClientTransport(new URL(a), { requestInit: { headers: { Authorization: `Bearer ${b}` } } });
} else {
  throw new Error(`usage: client.mjs stdio BIN | http URL KEY`);
}

const client = new Client({ name: "agentbox-mcp-test", version: "1.0.0" });
await client.connect(transport);

// Tools, with their schemas.
const { tools } = await client.listTools();
const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
for (const name of ["sandbox_create", "sandbox_list", "sandbox_delete", "sandbox_exec", "file_read", "file_write",
  "file_list", "checkpoint_create", "checkpoint_restore", "sandbox_fork", "sandbox_diff"]) {
  const t = byName[name];
  assert.ok(t, `tool ${name} missing`);
  assert.ok(t.description, `tool ${name} has no description`);
  assert.equal(t.inputSchema.type, "object", `tool ${name} input schema`);
  assert.equal(t.outputSchema?.type, "object", `tool ${name} output schema`);
}
assert.deepEqual(byName.sandbox_exec.inputSchema.required.sort(), ["command", "sandbox"]);
assert.equal(byName.sandbox_exec.outputSchema.properties.untrusted.type, "boolean");

async function call(name, args) {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) {
    throw new Error(`${name}: ${r.content.map((c) => c.text).join("")}`);
  }
  return r;
}
async function callError(name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.ok(r.isError, `${name} ${JSON.stringify(args)} succeeded, want an error`);
  return r.content.map((c) => c.text).join("");
}

const created = await call("sandbox_create", { template: "busybox" });
const id = created.structuredContent.id;
assert.match(id, /^[a-z0-9][a-z0-9-]*$/);
try {
  // A command: exit code, both streams, output marked untrusted.
  let r = await call("sandbox_exec", { sandbox: id, command: "echo hello; echo oops >&2; exit 3", timeout_seconds: 60 });
  assert.equal(r.structuredContent.exit_code, 3);
  assert.equal(r.structuredContent.stdout, "hello\n");
  assert.equal(r.structuredContent.stderr, "oops\n");
  assert.equal(r.structuredContent.untrusted, true);
  const text = r.content.map((c) => c.text).join("");
  assert.ok(text.includes("<untrusted-sandbox-data>\nhello\n"), `exec text not marked untrusted: ${text}`);
  // Output is bounded.
  r = await call("sandbox_exec", { sandbox: id, command: "yes | head -c 200000", max_output_bytes: 1000 });
  assert.equal(r.structuredContent.stdout.length, 1000);
  assert.equal(r.structuredContent.stdout_truncated, true);
  // A timeout.
  r = await call("sandbox_exec", { sandbox: id, command: "sleep 30", timeout_seconds: 1 });
  assert.equal(r.structuredContent.timed_out, true);

  // Files.
  await call("file_write", { sandbox: id, path: "/root/notes.txt", content: "version 1\n" });
  r = await call("file_read", { sandbox: id, path: "/root/notes.txt" });
  assert.equal(r.structuredContent.content, "version 1\n");
  assert.equal(r.structuredContent.untrusted, true);
  r = await call("file_list", { sandbox: id, path: "/root" });
  assert.ok(r.structuredContent.entries.some((e) => e.name === "notes.txt"), "file_list misses notes.txt");

  // Checkpoint and restore.
  const ck = await call("checkpoint_create", { sandbox: id, name: "v1" });
  assert.ok(ck.structuredContent.id);
  await call("file_write", { sandbox: id, path: "/root/notes.txt", content: "version 2\n" });
  r = await call("sandbox_diff", { from: `checkpoint:${ck.structuredContent.id}`, to: `sandbox:${id}` });
  assert.ok(r.structuredContent.diff.changes.some((c) => c.path === "/root/notes.txt"), "diff misses notes.txt");
  await call("checkpoint_restore", { sandbox: id, checkpoint: "v1" });
  r = await call("file_read", { sandbox: id, path: "/root/notes.txt" });
  assert.equal(r.structuredContent.content, "version 1\n");

  // Another tenant's sandbox is refused exactly like an unknown one.
  const other = process.env.OTHER_SANDBOX;
  assert.ok(other, "OTHER_SANDBOX not set");
  const unknown = "zzzzzzzzzzzz";
  for (const [name, args] of [
    ["sandbox_exec", { command: "true" }],
    ["file_read", { path: "/etc/hostname" }],
    ["file_write", { path: "/tmp/x", content: "x" }],
    ["checkpoint_create", {}],
    ["sandbox_delete", {}],
  ]) {
    const e1 = (await callError(name, { ...args, sandbox: other })).replaceAll(other, "<id>");
    const e2 = (await callError(name, { ...args, sandbox: unknown })).replaceAll(unknown, "<id>");
    assert.equal(e1, e2, `${name}: another tenant's sandbox answered differently from an unknown one`);
    assert.match(e1, /not found/);
  }
  r = await call("sandbox_list", {});
  assert.ok(!r.structuredContent.sandboxes.some((s) => s.id === other), "sandbox_list shows another tenant's sandbox");
  assert.ok(r.structuredContent.sandboxes.some((s) => s.id === id), "sandbox_list misses the sandbox");
} finally {
  await call("sandbox_delete", { sandbox: id });
}
const r = await call("sandbox_list", {});
assert.ok(!r.structuredContent.sandboxes.some((s) => s.id === id), "deleted sandbox still listed");
await client.close();
console.log(JSON.stringify({ sandbox: id }));
