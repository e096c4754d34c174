// Drives the code interpreter through `agentbox serve --e2b` with the real
// @e2b/code-interpreter SDK (test/code_test.go, TestCodeInterpreter/E2B):
// E2B_API_URL and E2B_SANDBOX_URL point at the E2B listener, E2B_API_KEY is
// a tenant's key. Sandbox.create() takes E2B's default template,
// code-interpreter-v1. Prints one JSON line; any failed check throws.
import { Sandbox } from '@e2b/code-interpreter'

const step = (name) => process.stderr.write(`step: ${name}\n`)
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`)
}

step('create (code-interpreter-v1)')
const sbx = await Sandbox.create({ timeoutMs: 600_000 })
const out = { sandbox: sbx.sandboxId }

step('state across cells')
let e = await sbx.runCode('x = 6*7')
check(!e.error && e.results.length === 0, `x = 6*7: ${JSON.stringify(e)}`)
let onResult = 0
e = await sbx.runCode('x', { onResult: () => onResult++ })
check(e.text === '42' && onResult === 1, `x: text ${JSON.stringify(e.text)}, onResult ${onResult}`)

step('user and working directory')
e = await sbx.runCode('import getpass, os\nprint(getpass.getuser(), os.getcwd())')
check(e.logs.stdout.join('') === 'user /home/user\n', `user and cwd: ${JSON.stringify(e.logs)}`)

step('onStdout')
const streamed = []
e = await sbx.runCode('print("streamed")', { onStdout: (m) => streamed.push(m.line) })
check(streamed.join('') === 'streamed\n', `onStdout: ${JSON.stringify(streamed)}`)

step('matplotlib PNG')
const pngs = []
e = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()', { onResult: (r) => { if (r.png) pngs.push(r.png) } })
const png = e.results.find((r) => r.png)
check(png && pngs.length === 1, `plot: ${e.results.length} results, onResult PNGs ${pngs.length}, error ${JSON.stringify(e.error)}`)
const bytes = Buffer.from(png.png, 'base64')
check(bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'PNG signature')

step('error with traceback')
let onError = ''
e = await sbx.runCode('def f():\n    raise ValueError("no good")\nf()', { onError: (err) => { onError = err.name } })
check(e.error && e.error.name === 'ValueError' && e.error.value === 'no good' && e.error.traceback.includes('in f'), `error: ${JSON.stringify(e.error)}`)
check(onError === 'ValueError', `onError: ${onError}`)

step('a context of its own')
const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
check(ctx.id && ctx.language === 'python' && ctx.cwd === '/tmp', `context: ${JSON.stringify(ctx)}`)
e = await sbx.runCode('import os\nprint(os.getcwd())\nx', { context: ctx })
check(e.logs.stdout.join('') === '/tmp\n' && e.error && e.error.name === 'NameError', `run in the context: ${JSON.stringify(e)}`)
const contexts = await sbx.listCodeContexts()
check(contexts.length === 2, `contexts: ${JSON.stringify(contexts)}`)
await sbx.removeCodeContext(ctx.id)

step('envd next to the code interpreter')
const r = await sbx.commands.run('echo $((6*7))')
check(r.stdout === '42\n', `commands.run: ${JSON.stringify(r.stdout)}`)

console.log(JSON.stringify(out))
