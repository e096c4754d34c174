// Drives agentbox's code server with the real @e2b/code-interpreter SDK,
// talking to it directly (sandboxUrl = the server's URL, argv[2]), and
// prints what the SDK made of each answer as one JSON object.
import { Sandbox } from '@e2b/code-interpreter'

const sb = new Sandbox({ sandboxId: 'local', sandboxUrl: process.argv[2], envdVersion: '0.2.0', apiKey: 'unused' })
const out = {}
let onResult = 0
const streamed = []
await sb.runCode('x = 6*7')
let e = await sb.runCode('x', { onResult: () => onResult++ })
out.text = e.text
out.executionCount = e.executionCount
out.onResult = onResult
e = await sb.runCode('print("out")\n{"a": 1}', { onStdout: (m) => streamed.push(m.line) })
out.streamed = streamed
out.logs = e.logs
out.json = e.results[0].json
e = await sb.runCode('1/0', { onError: (err) => { out.onError = err.name } })
out.error = { name: e.error.name, value: e.error.value, traceback: e.error.traceback }
const ctx = await sb.createCodeContext({ language: 'python', cwd: '/tmp' })
out.context = ctx
e = await sb.runCode('x', { context: ctx })
out.otherContextError = e.error && e.error.name
out.contexts = (await sb.listCodeContexts()).length
await sb.restartCodeContext(ctx)
await sb.removeCodeContext(ctx.id)
try {
  await sb.runCode('1', { context: ctx })
} catch (err) {
  out.removed = err.constructor.name
}
e = await sb.runCode('echo $((2+3))', { language: 'bash' })
out.bash = e.logs.stdout.join('')
console.log(JSON.stringify(out))
