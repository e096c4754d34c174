// agentbox code interpreter: the JavaScript driver (docs/CODE-INTERPRETER.md).
//
// Run as `node -e <this file>` by the Go server (internal/codeinterp), one
// process per context, with the protocol of the Python driver: requests on
// fd 3, events on fd 4 (one JSON object per line), the cell's output on
// fds 1 and 2, the marker on both after each cell, then "done".
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');
const readline = require('readline');

const MARK = process.env.AGENTBOX_CODE_MARKER || '';
delete process.env.AGENTBOX_CODE_MARKER;
const send = (obj) => fs.writeSync(4, JSON.stringify(obj) + '\n');
process.on('SIGINT', () => {}); // an interrupt between cells is ignored
globalThis.require = require;

let n = 0;
const queue = [];
let busy = false;

async function run(req) {
  n++;
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    let value = vm.runInThisContext(req.code || '', { filename: `<cell-${n}>`, breakOnSigint: true });
    if (value && typeof value.then === 'function') value = await value;
    if (value !== undefined) {
      const ev = { type: 'result', is_main_result: true, text: util.inspect(value) };
      if (value !== null && typeof value === 'object') {
        try { ev.json = JSON.parse(JSON.stringify(value)); } catch (e) { /* not JSON */ }
      }
      send(ev);
    }
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e));
    send({ type: 'error', name: err.name || 'Error', value: err.message || String(e), traceback: err.stack || String(e) });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
  const marked = [1, 2].map((fd) => { try { fs.writeSync(fd, MARK); return true; } catch (e) { return false; } });
  send({ type: 'done', count: n, marked });
}

async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) await run(queue.shift());
  busy = false;
}

const rl = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }) });
rl.on('line', (line) => {
  let req;
  try { req = JSON.parse(line); } catch (e) { return; }
  queue.push(req);
  drain();
});
rl.on('close', () => process.exit(0));
send({ type: 'ready', pid: process.pid });
