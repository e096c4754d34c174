// Scripted flows of the real E2B JavaScript SDK against `agentbox serve
// --e2b` (driven by test/e2b_test.go). Environment: E2B_API_URL and
// E2B_SANDBOX_URL (the E2B listener), E2B_API_KEY (tenant A's key),
// OTHER_SANDBOX (a sandbox of tenant B), RUN (a unique label value).
// Prints one JSON line with the ids it made; any failed check throws.
import { Sandbox, CommandExitError, SandboxNotFoundError } from 'e2b'

const step = (name) => process.stderr.write(`step: ${name}\n`)
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`)
}
async function rejects(p, cls, what) {
  try {
    await p
  } catch (e) {
    check(e instanceof cls, `${what}: got ${e && e.constructor && e.constructor.name}: ${e && e.message}, want ${cls.name}`)
    return e
  }
  throw new Error(`check failed: ${what}: no error, want ${cls.name}`)
}

const run = process.env.RUN
const made = []

step('create with metadata and timeout')
const sbx = await Sandbox.create({ metadata: { suite: 'e2b', run }, timeoutMs: 120_000 })
made.push(sbx.sandboxId)

step('commands.run with streaming callbacks')
let out = ''
let errOut = ''
const r = await sbx.commands.run('echo hello; echo oops >&2; whoami; pwd', {
  onStdout: (d) => { out += d },
  onStderr: (d) => { errOut += d },
})
check(r.exitCode === 0, `exit code ${r.exitCode}`)
check(out.includes('hello') && r.stdout.includes('hello'), `stdout ${JSON.stringify(out)}`)
check(errOut.includes('oops') && r.stderr.includes('oops'), `stderr ${JSON.stringify(errOut)}`)
check(r.stdout.includes('\nuser\n') && r.stdout.includes('/home/user'), `default user and cwd: ${JSON.stringify(r.stdout)}`)
const asRoot = await sbx.commands.run('whoami', { user: 'root' })
check(asRoot.stdout.trim() === 'root', `user root: ${JSON.stringify(asRoot.stdout)}`)
const env = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' }, cwd: '/tmp' })
check(env.stdout.trim() === 'bar', `envs: ${JSON.stringify(env.stdout)}`)

step('non-zero exit')
const e = await rejects(sbx.commands.run('echo partial; exit 3'), CommandExitError, 'exit 3')
check(e.exitCode === 3 && e.stdout.includes('partial'), `CommandExitError ${e.exitCode} ${JSON.stringify(e.stdout)}`)

step('background command with stdin and wait')
const bg = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
check(bg.pid > 0, `pid ${bg.pid}`)
await sbx.commands.sendStdin(bg.pid, 'abc\n')
const bgRes = await bg.wait()
check(bgRes.stdout.includes('got:abc'), `background stdout ${JSON.stringify(bgRes.stdout)}`)

step('closeStdin')
const cat = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(cat.pid, 'piped')
await sbx.commands.closeStdin(cat.pid)
const catRes = await cat.wait()
check(catRes.stdout === 'piped', `cat ${JSON.stringify(catRes.stdout)}`)

step('list and kill')
const sleeper = await sbx.commands.run('sleep 600', { background: true })
const procs = await sbx.commands.list()
check(procs.some((p) => p.pid === sleeper.pid), `list has ${sleeper.pid}: ${JSON.stringify(procs)}`)
check(await sbx.commands.kill(sleeper.pid), 'kill returned false')
await rejects(sleeper.wait(), CommandExitError, 'wait of a killed command')

step('files')
await sbx.files.write('/home/user/a.txt', 'hello file')
check((await sbx.files.read('/home/user/a.txt')) === 'hello file', 'read back')
await sbx.files.write('rel.txt', 'relative')
check((await sbx.commands.run('cat /home/user/rel.txt')).stdout === 'relative', 'relative path is under /home/user')
const bytes = await sbx.files.read('/home/user/a.txt', { format: 'bytes' })
check(bytes.length === 10, `bytes ${bytes.length}`)
check(await sbx.files.makeDir('/home/user/d/e'), 'makeDir new')
check(!(await sbx.files.makeDir('/home/user/d/e')), 'makeDir existing is false')
check(await sbx.files.exists('/home/user/a.txt'), 'exists')
check(!(await sbx.files.exists('/home/user/nope')), 'not exists')
const entries = await sbx.files.list('/home/user')
const names = entries.map((x) => x.name)
check(names.includes('a.txt') && names.includes('d'), `list ${JSON.stringify(names)}`)
check(entries.find((x) => x.name === 'd').type === 'dir', `dir type ${JSON.stringify(entries.find((x) => x.name === 'd'))}`)
const moved = await sbx.files.rename('/home/user/a.txt', '/home/user/b.txt')
check(moved.path === '/home/user/b.txt', `rename ${JSON.stringify(moved)}`)
await sbx.files.remove('/home/user/b.txt')
check(!(await sbx.files.exists('/home/user/b.txt')), 'removed')
const info1 = await sbx.files.getInfo('/home/user/d')
check(info1.type === 'dir', `getInfo ${JSON.stringify(info1)}`)

step('watchDir')
await sbx.files.makeDir('/home/user/w')
const seen = []
let notify = () => {}
const watch = await sbx.files.watchDir('/home/user/w', (ev) => { seen.push(ev); notify() }, { recursive: true })
const waitFor = (pred, what) => new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`check failed: no ${what} event: ${JSON.stringify(seen)}`)), 10_000)
  notify = () => { if (seen.some(pred)) { clearTimeout(timer); resolve() } }
  notify()
})
await sbx.files.write('/home/user/w/new.txt', 'watched')
await waitFor((ev) => ev.name === 'new.txt' && ev.type === 'create', 'create')
await sbx.files.makeDir('/home/user/w/sub')
await waitFor((ev) => ev.name === 'sub' && ev.type === 'create', 'create of sub')
await sbx.commands.run('echo deep > /home/user/w/sub/deep.txt')
await waitFor((ev) => ev.name === 'sub/deep.txt', 'recursive create')
await sbx.files.rename('/home/user/w/new.txt', '/home/user/w/renamed.txt')
await waitFor((ev) => ev.name === 'new.txt' && ev.type === 'rename', 'rename')
await sbx.files.remove('/home/user/w/renamed.txt')
await waitFor((ev) => ev.name === 'renamed.txt' && ev.type === 'remove', 'remove')
await watch.stop()

step('getInfo, list, setTimeout')
const info = await sbx.getInfo()
check(info.sandboxId === sbx.sandboxId && info.metadata.suite === 'e2b' && info.state === 'running', `info ${JSON.stringify(info)}`)
const page = Sandbox.list({ query: { metadata: { run } } })
const listed = await page.nextItems()
check(listed.length === 1 && listed[0].sandboxId === sbx.sandboxId, `list by metadata ${JSON.stringify(listed)}`)
await sbx.setTimeout(600_000)
const info2 = await sbx.getInfo()
check(info2.endAt.getTime() > info.endAt.getTime() + 400_000, `setTimeout: end ${info.endAt} -> ${info2.endAt}`)

step('metrics')
const metrics = await sbx.getMetrics()
check(metrics.length >= 1 && metrics[0].memUsed > 0, `metrics ${JSON.stringify(metrics)}`)

step('pty')
let ptyOut = ''
const dec = new TextDecoder()
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { ptyOut += dec.decode(d) } })
await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((6*7)); exit\n'))
await pty.wait().catch(() => {})
check(ptyOut.includes('pty-42'), `pty output ${JSON.stringify(ptyOut)}`)
check(ptyOut.includes('30 100'), `pty size ${JSON.stringify(ptyOut)}`)

step('pause and connect')
await sbx.files.write('/home/user/keep.txt', 'kept')
check(await sbx.pause(), 'pause')
check((await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 'paused state')
const again = await Sandbox.connect(sbx.sandboxId)
check((await again.files.read('/home/user/keep.txt')) === 'kept', 'files intact after resume')
check((await Sandbox.getInfo(sbx.sandboxId)).state === 'running', 'running after connect')

step('snapshot')
const snap = await again.createSnapshot()
check(snap.snapshotId, `snapshot ${JSON.stringify(snap)}`)
await again.files.write('/home/user/keep.txt', 'changed after snapshot')
const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
made.push(fromSnap.sandboxId)
check((await fromSnap.files.read('/home/user/keep.txt')) === 'kept', 'snapshot files')
const snaps = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
check(snaps.some((s) => s.snapshotId === snap.snapshotId), `listSnapshots ${JSON.stringify(snaps)}`)

step('fork')
const forks = await again.fork({ count: 1 })
check(forks.length === 1 && !(forks[0] instanceof Error), `fork ${forks}`)
made.push(forks[0].sandboxId)
check((await forks[0].files.read('/home/user/keep.txt')) === 'changed after snapshot', 'fork files')
check((await forks[0].commands.run('echo forked')).stdout.trim() === 'forked', 'fork runs commands')

step('not found and other tenant')
await rejects(Sandbox.getInfo('nosuchsandbx'), SandboxNotFoundError, 'unknown id getInfo')
await rejects(Sandbox.connect('nosuchsandbx'), SandboxNotFoundError, 'unknown id connect')
const other = process.env.OTHER_SANDBOX
await rejects(Sandbox.getInfo(other), SandboxNotFoundError, "another tenant's getInfo")
await rejects(Sandbox.connect(other), SandboxNotFoundError, "another tenant's connect")
check(!(await Sandbox.kill(other)), "another tenant's kill is false")
check(!(await Sandbox.kill('nosuchsandbx')), 'unknown kill is false')

step('kill and delete snapshot')
await forks[0].kill()
await fromSnap.kill()
check(!(await Sandbox.kill(fromSnap.sandboxId)), 'killed twice is false')
check(await Sandbox.deleteSnapshot(snap.snapshotId), 'deleteSnapshot')
check(!(await Sandbox.deleteSnapshot(snap.snapshotId)), 'deleteSnapshot again is false')
console.log(JSON.stringify({ sandbox: sbx.sandboxId, made }))
