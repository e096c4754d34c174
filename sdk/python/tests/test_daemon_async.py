"""Tests of the asyncio client (AsyncClient) against a real daemon.

The environment is test_daemon.py's (test/python_sdk_test.go sets it);
without AGENTBOX_HOST they skip. tests/test_offline.py checks that every
public method of AsyncClient, AsyncSandbox and AsyncProcess is called here.
"""

import asyncio
import base64
import datetime
import io
import os
import tarfile
import tempfile
import time
import unittest
import uuid

import agentbox

HOST = os.environ.get("AGENTBOX_HOST", "")
TEMPLATE = "busybox"


def setUpModule():
    if not HOST:
        raise unittest.SkipTest("AGENTBOX_HOST is not set (test/python_sdk_test.go runs these against a daemon)")


def uniq(prefix):
    return prefix + "-" + uuid.uuid4().hex[:8]


def env(name):
    return os.environ.get(name, "")


class AsyncDaemonTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.client = agentbox.AsyncClient()

    async def sandbox(self, **kw):
        sb = await self.client.create(TEMPLATE, **kw)
        self.addAsyncCleanup(sb.delete, missing_ok=True)
        return sb

    def admin(self):
        host = env("AGENTBOX_TEST_UNIX_HOST")
        if not host:
            self.skipTest("AGENTBOX_TEST_UNIX_HOST not set")
        return agentbox.AsyncClient(host, api_key="")


class TestAsyncClient(AsyncDaemonTest):
    async def test_seed_example(self):
        async with self.client.sandbox(template=TEMPLATE) as sb:
            self.assertIsInstance(sb, agentbox.AsyncSandbox)
            await sb.write_file("/usr/local/bin/python", '#!/bin/sh\necho "analysed $1"\n', mode=0o755)
            result = await sb.run("python my_analysis.py")
            self.assertEqual((result.exit_code, result.stdout), (0, "analysed my_analysis.py\n"))
            sid = sb.id
        with self.assertRaises(agentbox.NotFound):
            await self.client.get(sid)

    async def test_health_info(self):
        self.assertTrue(await self.client.health())
        self.assertIn("version", await self.client.info())

    async def test_create_get_list_delete(self):
        label = uniq("l")
        sb = await self.sandbox(labels={"suite": label}, env={"GREETING": "hi"}, hostname="pybox")
        self.assertEqual(sb.state, "running")
        got = await self.client.get(sb.id)
        self.assertIsInstance(got, agentbox.AsyncSandbox)
        self.assertEqual(got.info["labels"], {"suite": label})
        self.assertEqual([s.id for s in await self.client.list({"suite": label})], [sb.id])
        self.assertIn(sb.id, [s.id for s in await self.client.list()])
        self.assertEqual((await sb.run("echo $GREETING; hostname")).stdout, "hi\npybox\n")
        self.assertEqual((await sb.refresh())["id"], sb.id)
        await sb.delete()
        with self.assertRaises(agentbox.NotFound) as cm:
            await sb.refresh()
        e = cm.exception
        self.assertEqual((e.status, e.code), (404, "not_found"))
        self.assertTrue(e.request_id)
        with self.assertRaises(agentbox.NotFound):
            await sb.delete()
        await sb.delete(missing_ok=True)
        other = await self.client.sandbox(template=TEMPLATE)  # awaited: no delete on exit
        self.assertEqual((await self.client.get(other.id)).id, other.id)
        await other.kill()
        with self.assertRaises(agentbox.NotFound):
            await self.client.get(other.id)

    async def test_async_with_deletes_on_exception(self):
        sid = None
        with self.assertRaises(ZeroDivisionError):
            async with self.client.sandbox(template=TEMPLATE) as sb:
                sid = sb.id
                1 / 0
        with self.assertRaises(agentbox.NotFound):
            await self.client.get(sid)

    async def test_async_with_deletes_on_cancellation(self):
        ids = []
        entered = asyncio.Event()

        async def body():
            async with self.client.sandbox(template=TEMPLATE) as sb:
                ids.append(sb.id)
                entered.set()
                await asyncio.sleep(600)
        task = asyncio.ensure_future(body())
        await asyncio.wait_for(entered.wait(), 120)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        with self.assertRaises(agentbox.NotFound):
            await self.client.get(ids[0])

    async def test_async_with_cancelled_while_creating(self):
        # Cancelled at any point of its creation, async with leaves no
        # sandbox behind (test_transport.py cancels it deterministically in
        # the window where the daemon has made it but not yet answered).
        label = uniq("cancel")
        for delay in (0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1):
            async def body():
                async with self.client.sandbox(template=TEMPLATE, labels={"t": label}):
                    await asyncio.sleep(600)
            task = asyncio.ensure_future(body())
            await asyncio.sleep(delay)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
        self.assertEqual(await self.client.list({"t": label}), [])

    async def test_names_and_persistent(self):
        name = uniq("apy-persist")
        sb = await self.sandbox(name=name, persistent=True)
        self.assertEqual((sb.name, sb.info["lifecycle"]), (name, "persistent"))
        self.assertEqual((await self.client.create(TEMPLATE, name=name)).id, sb.id)
        with self.assertRaises(agentbox.Conflict) as cm:
            await self.client.create(TEMPLATE, name=name, lifecycle="session")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "conflict"))
        h = self.client.handle(name)
        await h.write_file("/root/keep", "kept")
        await sb.hibernate()
        self.assertEqual((await self.client.get(name)).id, sb.id)
        self.assertEqual((await h.run("cat /root/keep")).stdout, "kept")
        await sb.pause()
        self.assertEqual((await self.client.get(name)).state, "paused")
        await sb.resume()
        self.assertEqual(sb.state, "running")
        self.assertTrue(await sb.transitions(), "no transitions recorded")

    async def test_errors(self):
        with self.assertRaises(agentbox.NotFound):
            await self.client.get("no-such-sandbox")
        with self.assertRaises(agentbox.InvalidArgument) as cm:
            await self.client.create("no/such/template!")
        self.assertEqual(cm.exception.status, 400)
        sb = await self.sandbox()
        with self.assertRaises(agentbox.NotFound) as cm:
            await sb.run(["/no/such/binary"])
        self.assertEqual((cm.exception.status, cm.exception.reason), (404, agentbox.REASON_COMMAND_NOT_FOUND))
        with self.assertRaises(agentbox.TransportError):
            await agentbox.AsyncClient("unix:///nonexistent/agentbox.sock").health()

    async def test_revoked_key_is_unauthorized(self):
        key = env("AGENTBOX_TEST_REVOKED_KEY")
        if not key:
            self.skipTest("AGENTBOX_TEST_REVOKED_KEY not set")
        with self.assertRaises(agentbox.Unauthorized) as cm:
            await agentbox.AsyncClient(api_key=key).list()
        e = cm.exception
        self.assertEqual((e.status, e.code), (401, "unauthenticated"))
        self.assertTrue(e.request_id)
        with self.assertRaises(agentbox.Unauthorized):
            await agentbox.AsyncClient(api_key="wrong").create(TEMPLATE)
        # A streamed upload refused before its body is read is still a 401.
        with self.assertRaises(agentbox.Unauthorized):
            await agentbox.AsyncClient(api_key=key).stage_runner(io.BytesIO(os.urandom(16 << 20)))

    async def test_quota_is_429_with_retry_after(self):
        key = env("AGENTBOX_TEST_QUOTA_KEY")
        if not key:
            self.skipTest("AGENTBOX_TEST_QUOTA_KEY not set")
        c = agentbox.AsyncClient(api_key=key)
        async with c.sandbox(template=TEMPLATE):
            with self.assertRaises(agentbox.QuotaExceeded) as cm:
                await c.create(TEMPLATE)
            e = cm.exception
            self.assertEqual((e.status, e.code), (429, "resource_exhausted"))
            self.assertIsNotNone(e.retry_after)
            self.assertGreater(e.retry_after, 0)
            self.assertTrue(e.request_id)

    async def test_admin_tenants_and_keys(self):
        admin = self.admin()
        tid = uniq("apyten")
        self.assertEqual((await admin.create_tenant(tid, {"max_sandboxes": 3}))["id"], tid)
        with self.assertRaises(agentbox.Conflict):
            await admin.create_tenant(tid)
        self.assertIn(tid, [x["id"] for x in await admin.tenants()])
        self.assertEqual((await admin.update_tenant(tid, {"max_sandboxes": 1}))["quotas"]["max_sandboxes"], 1)
        self.assertEqual((await admin.tenant(tid))["quotas"]["max_sandboxes"], 1)
        k = await admin.create_api_key(tid, scope="read", name="apy")
        self.assertIn(k["id"], [x["id"] for x in await admin.api_keys()])
        ro = agentbox.AsyncClient(api_key=k["key"])
        self.assertEqual(await ro.list(), [])
        with self.assertRaises(agentbox.PermissionDenied):
            await ro.create(TEMPLATE)
        mine = await self.sandbox()
        with self.assertRaises(agentbox.NotFound):
            await ro.get(mine.id)
        await admin.revoke_api_key(k["id"])
        with self.assertRaises(agentbox.Unauthorized):
            await ro.list()
        await admin.delete_tenant(tid)
        with self.assertRaises(agentbox.NotFound):
            await admin.tenant(tid)

    async def test_unix_socket(self):
        admin = self.admin()
        self.assertTrue(await admin.health())
        async with admin.sandbox(template=TEMPLATE) as sb:
            self.assertEqual((await sb.run("echo unix")).stdout, "unix\n")

    async def test_tls(self):
        host, ca = env("AGENTBOX_TEST_TLS_HOST"), env("AGENTBOX_TEST_TLS_CA")
        if not host or not ca:
            self.skipTest("AGENTBOX_TEST_TLS_HOST not set")
        c = agentbox.AsyncClient(host, ca_cert=ca)
        self.assertTrue(await c.health())
        out = []
        async with c.sandbox(template=TEMPLATE) as sb:
            self.assertEqual((await sb.run("echo tls", on_stdout=out.append)).stdout, "tls\n")
            big = os.urandom(1 << 20)
            await sb.write_file("/root/big", (big[i:i + 4096] for i in range(0, len(big), 4096)))
            self.assertEqual(await sb.read_file("/root/big"), big)
        self.assertEqual(out, ["tls\n"])
        with self.assertRaises(agentbox.TransportError) as cm:
            await agentbox.AsyncClient(host).health()  # the test CA is not in the system roots
        self.assertIn("CERTIFICATE", str(cm.exception).upper())


class TestAsyncExec(AsyncDaemonTest):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.sb = await self.sandbox()

    async def test_run_result_and_options(self):
        r = await self.sb.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.ok), ("out\n", "err\n", 3, False))
        self.assertGreater(r.pid, 0)
        self.assertEqual((await self.sb.exec(["echo", "a b"])).stdout, "a b\n")
        await self.sb.mkdir("/work/sub", parents=True)
        r = await self.sb.run("pwd; echo $A; id -u", env={"A": "b"}, cwd="/work/sub", user="1000")
        self.assertEqual(r.stdout, "/work/sub\nb\n1000\n", r.stderr)
        r = await self.sb.run('[ -n "$AGENTBOX_RUN_TOKEN" ] && echo token', token=True, private=True)
        self.assertEqual(r.stdout, "token\n")

    async def test_stdin(self):
        self.assertEqual((await self.sb.run("tr a-z A-Z", stdin="hello\n")).stdout, "HELLO\n")
        self.assertEqual((await self.sb.run("wc -c", stdin=bytes(range(256)) * 4)).stdout.strip(), "1024")

    async def test_timeout(self):
        r = await self.sb.run("echo started; sleep 60", timeout=1)
        self.assertTrue(r.timed_out)
        self.assertNotEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, "started\n")
        # The client's own timeout bounds each read: a silent command
        # outlasting it breaks the stream off.
        slow = agentbox.AsyncClient(timeout=1).handle(self.sb.id)
        with self.assertRaises(agentbox.StreamTruncated):
            await slow.run("sleep 30")

    async def test_cancellation_closes_the_call(self):
        pids = []
        with self.assertRaises(asyncio.TimeoutError):
            await asyncio.wait_for(self.sb.run("echo x; sleep 300", on_start=pids.append), 2)
        # The command outlives the cancelled call, as after a lost
        # connection; the client is unharmed and the process can be killed.
        self.assertEqual(len(pids), 1)
        self.assertEqual([q["running"] for q in await self.sb.processes() if q["pid"] == pids[0]], [True])
        p = self.sb.process(pids[0])
        await p.kill()
        self.assertEqual((await p.attach()).signal, "KILL")
        # A cancelled attach leaves the process running.
        p = await self.sb.start(["sleep", "300"])
        task = asyncio.ensure_future(p.attach())
        await asyncio.sleep(0.5)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        self.assertEqual([q["running"] for q in await self.sb.processes() if q["pid"] == p.pid], [True])
        await p.kill()
        self.assertEqual((await p.wait()).signal, "KILL")

    async def test_streaming_callbacks(self):
        out, err, started = [], [], []

        async def on_stderr(s):
            await asyncio.sleep(0)
            err.append(s)
        r = await self.sb.run("for i in 1 2 3; do echo o$i; echo e$i >&2; done; printf '\\303\\251'",
                              on_stdout=out.append, on_stderr=on_stderr, on_start=started.append)
        self.assertEqual("".join(out), "o1\no2\no3\n\u00e9")
        self.assertEqual("".join(err), "e1\ne2\ne3\n")
        self.assertEqual((r.stdout, started), ("o1\no2\no3\n\u00e9", [r.pid]))

    async def test_output_streams_live(self):
        # An async callback sees "ready" while the command still waits for
        # its input, and answers it with another call on the same client.
        pid = []

        async def on_stdout(s):
            if "ready" in s:
                await self.sb.process(pid[0]).write_stdin("hi\n", close=True)
        r = await self.sb.run("echo ready; read x; echo got $x", stdin_open=True, timeout=60,
                              on_start=pid.append, on_stdout=on_stdout)
        self.assertFalse(r.timed_out)
        self.assertEqual(r.stdout, "ready\ngot hi\n")

    async def test_concurrent_runs_on_one_client(self):
        # Each command waits until all N have started: run one at a time,
        # the first would give up (exit 1) after a minute.
        n = 6
        await self.sb.mkdir("/tmp/c")
        script = ("touch /tmp/c/{i}; t=0; while [ $(ls /tmp/c | wc -l) -lt %d ]; do "
                  "sleep 0.1; t=$((t+1)); [ $t -gt 600 ] && exit 1; done; echo {i}") % n
        rs = await asyncio.gather(*(self.sb.run(script.format(i=i)) for i in range(n)))
        self.assertEqual([(r.exit_code, r.stdout) for r in rs], [(0, "%d\n" % i) for i in range(n)])
        # Mixed calls interleave on the same client too.
        got = await asyncio.gather(self.sb.stat("/tmp/c"), self.client.health(), self.sb.list_dir("/tmp/c"),
                                   self.sb.run("echo mixed"))
        self.assertEqual((got[0]["type"], got[1], len(got[2]), got[3].stdout), ("dir", True, n, "mixed\n"))

    async def test_tty_resize(self):
        p = await self.sb.start("stty size; read x; stty size", tty={"rows": 24, "cols": 80}, stdin_open=True)
        await p.resize(30, 100)
        await p.write_stdin("\n")
        self.assertIn("30 100", (await p.attach()).stdout)

    async def test_secrets(self):
        name = "APYSEC_" + uuid.uuid4().hex[:6].upper()
        value = "s3cr3t-" + uuid.uuid4().hex
        self.assertEqual((await self.client.set_secret(name, value))["name"], name)
        self.assertIn(name, [s["name"] for s in await self.client.secrets()])
        r = await self.sb.run('[ "$TOK" = "' + value + '" ] && echo match; echo "$TOK"',
                              secrets=[agentbox.Secret(name, "TOK")])
        self.assertIn("match", r.stdout)
        self.assertNotIn(value, r.stdout)
        await self.client.delete_secret(name)
        with self.assertRaises(agentbox.NotFound):
            await self.client.delete_secret(name)

    async def test_background_attach_stdin_kill(self):
        p = await self.sb.start("echo ready; read line; echo got $line; echo bye >&2", stdin_open=True)
        self.assertIsInstance(p, agentbox.AsyncProcess)
        await p.write_stdin("hello\n", close=True)
        r = await p.attach(replay=True)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("ready\ngot hello\n", "bye\n", 0))
        self.assertIn(p.pid, [q["pid"] for q in await self.sb.processes()])

        p = await self.sb.start("cat", stdin_open=True)

        async def gen():
            for part in (b"str", b"eamed"):
                yield part
        await p.write_stdin(gen())
        await p.write_stdin(io.BytesIO(b" file"))
        await p.close_stdin()
        self.assertEqual((await self.sb.attach(p.pid)).stdout, "streamed file")

        p = await self.sb.start(["sleep", "300"])
        await p.signal("TERM")
        self.assertEqual((await p.wait()).signal, "TERM")
        with self.assertRaises(agentbox.NotFound):
            await self.sb.process(99999).signal("KILL")

    async def test_rollback_on_failure(self):
        await self.sb.write_file("/root/f", "before")
        r = await self.sb.run("echo after > /root/f; exit 1", rollback_on_failure=True)
        self.assertTrue(r.rolled_back and r.checkpoint)
        self.assertEqual(await self.sb.read_text("/root/f"), "before")


class TestAsyncFiles(AsyncDaemonTest):
    async def test_files(self):
        sb = await self.sandbox()
        st = await sb.write_file("/data/a/b.txt", "hello", mode=0o600)
        self.assertEqual(st.get("size"), 5)
        self.assertEqual(await sb.read_file("/data/a/b.txt"), b"hello")
        self.assertEqual((await sb.stat("/data/a/b.txt"))["mode"] & 0o777, 0o600)
        big = os.urandom(3 << 20)
        await sb.write_file("/data/big", io.BytesIO(big))
        self.assertEqual(await sb.read_file("/data/big"), big)
        async with await sb.open_file("/data/big") as f:
            self.assertEqual(b"".join([c async for c in f.iter_chunks()]), big)
        await sb.write_file("/data/gen", (bytes([i]) * 10 for i in range(3)))
        self.assertEqual(await sb.read_file("/data/gen"), b"\0" * 10 + b"\1" * 10 + b"\2" * 10)
        await sb.mkdir("/data/d")
        with self.assertRaises(agentbox.NotFound):
            await sb.mkdir("/data/x/y")
        await sb.mkdir("/data/x/y", parents=True)
        self.assertEqual(sorted(e["name"] for e in await sb.ls("/data")), ["a", "big", "d", "gen", "x"])
        self.assertEqual([e["name"] for e in await sb.list_dir("/data/x")], ["y"])
        await sb.move("/data/a/b.txt", "/data/d/c.txt")
        self.assertFalse(await sb.exists("/data/a/b.txt"))
        self.assertEqual(await sb.read_text("/data/d/c.txt"), "hello")
        with self.assertRaises(agentbox.APIError):
            await sb.remove("/data/d")
        await sb.remove("/data/d", recursive=True)
        self.assertFalse(await sb.exists("/data/d"))
        with self.assertRaises(agentbox.NotFound):
            await sb.read_file("/nope")

    async def test_upload_download_dir(self):
        sb = await self.sandbox()
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            os.makedirs(os.path.join(src, "pkg"))
            with open(os.path.join(src, "pkg", "m.py"), "w") as f:
                f.write("x = 1\n")
            await sb.upload_dir(src, "/proj")
            self.assertEqual((await sb.run("cat /proj/pkg/m.py")).stdout, "x = 1\n")
            await sb.run("echo made > /proj/pkg/new")
            await sb.download_dir("/proj", dst)
            with open(os.path.join(dst, "pkg", "new")) as f:
                self.assertEqual(f.read(), "made\n")
        raw = await sb.download_tar("/proj")
        self.assertIn("pkg/m.py", [n.lstrip("./") for n in tarfile.open(fileobj=io.BytesIO(raw)).getnames()])
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("t.txt")
            ti.size = 2
            tf.addfile(ti, io.BytesIO(b"ok"))
        await sb.upload_tar("/tarred", buf.getvalue())
        self.assertEqual(await sb.read_text("/tarred/t.txt"), "ok")


class TestAsyncCheckpoints(AsyncDaemonTest):
    async def test_checkpoint_restore_fork_diff_merge(self):
        sb = await self.sandbox()
        await sb.write_file("/root/state", "v1")
        ck = await sb.checkpoint("apy-v1", labels={"k": "v"})
        self.assertEqual(ck["name"], "apy-v1")
        self.assertIn(ck["id"], [c["id"] for c in await sb.checkpoints()])
        self.assertIn(ck["id"], [c["id"] for c in await self.client.checkpoints()])
        self.assertEqual((await self.client.checkpoint(ck["id"]))["id"], ck["id"])
        await sb.write_file("/root/state", "v2")
        self.assertEqual((await sb.restore("apy-v1"))["checkpoint"], ck["id"])
        self.assertEqual(await sb.read_text("/root/state"), "v1")

        forks = await sb.fork(2, labels={"fork": "yes"})
        for f in forks:
            self.addAsyncCleanup(f.delete, missing_ok=True)
        self.assertEqual([type(f) for f in forks], [agentbox.AsyncSandbox] * 2)
        more = await self.client.fork(ck["id"], 1, env={"E": "1"})
        self.addAsyncCleanup(more[0].delete, missing_ok=True)
        self.assertEqual((await more[0].run("cat /root/state; echo; echo $E")).stdout, "v1\n1\n")

        a, b = forks
        await b.write_file("/root/added", "from b")
        await b.write_file("/root/state", "b")
        d = await self.client.diff("sandbox:" + a.id, "sandbox:" + b.id, unified=True)
        paths = {c["path"]: c["change"] for c in d["changes"]}
        self.assertEqual((paths.get("/root/added"), paths.get("/root/state")), ("added", "modified"))
        self.assertNotEqual(await a.tree_hash(), await b.tree_hash())

        await a.write_file("/root/state", "a")
        with self.assertRaises(agentbox.MergeConflict) as cm:
            await a.merge(b.id)
        self.assertEqual(cm.exception.status, 409)
        self.assertIn("/root/state", [c["path"] for c in cm.exception.conflicts])
        self.assertTrue((await a.merge(b.id, strategy="theirs", dry_run=True))["applied"])
        self.assertFalse(await a.exists("/root/added"))
        await a.merge(b.id, resolutions={"/root/state": "ours"})
        self.assertEqual(await a.read_text("/root/added"), "from b")

        for f in forks:
            await f.delete()
        with self.assertRaises(agentbox.Conflict):
            await self.client.delete_checkpoint(ck["id"])  # more[0] runs on it
        await more[0].delete()
        await sb.delete()
        await self.client.delete_checkpoint(ck["id"])
        with self.assertRaises(agentbox.NotFound):
            await self.client.checkpoint(ck["id"])


class TestAsyncTemplatesNetwork(AsyncDaemonTest):
    async def test_templates(self):
        self.assertIn(TEMPLATE, [t["name"] for t in await self.client.templates()])
        self.assertEqual((await self.client.template(TEMPLATE))["name"], TEMPLATE)
        events, async_events = [], []

        async def progress(ev):
            await asyncio.sleep(0)
            async_events.append(ev)
        name = uniq("apytmpl")
        spec = {"name": name, "base": TEMPLATE, "steps": [{"run": "echo built > /etc/built"}]}
        t = await self.client.build_template(spec, progress=events.append)
        self.assertTrue(t["built"])
        self.assertEqual(events[-1]["type"], "done")
        self.assertIn("step", [e["type"] for e in events])
        await self.client.build_template(spec, force=True, progress=progress)
        self.assertEqual(async_events[-1]["type"], "done")
        async with self.client.sandbox(template=name) as sb:
            self.assertEqual((await sb.run("cat /etc/built")).stdout, "built\n")
            self.assertEqual((await sb.save_template(name + "-saved"))["version"], 1)
        self.assertEqual(len(await self.client.template_versions(name + "-saved")), 1)
        with self.assertRaises(agentbox.APIError) as cm:
            await self.client.build_template({"name": uniq("apyfail"), "base": TEMPLATE, "steps": [{"run": "exit 7"}]})
        self.assertTrue(cm.exception.message)

    async def test_network(self):
        sb = await self.sandbox()
        await sb.set_network("egress", allow=["example.com:443"])
        self.assertEqual(sb.info["network"]["mode"], "egress")
        self.assertEqual((await sb.refresh())["network"]["allow"], ["example.com:443"])
        self.assertEqual(await sb.egress_log(10), [])
        await sb.set_network("none")
        self.assertEqual((sb.info.get("network") or {}).get("mode", "none"), "none")
        self.assertEqual(await sb.events(types=["log", "metric", "usage"]), [])

    async def test_flight_record(self):
        sb = await self.sandbox()
        await sb.run("echo recorded > rec.txt")
        evs = await sb.events(types=["run", "file.changed"])
        kinds = [e["type"] for e in evs]
        self.assertEqual((kinds[0], kinds[-1]), ("run.started", "run.ended"), kinds)
        self.assertIn("/root/rec.txt", [e["file"]["path"] for e in evs if e["type"] == "file.changed"])
        followed = []
        async for ev in sb.follow_events(types=["run"]):
            followed.append(ev)
            if len(followed) == 2:
                break
        self.assertEqual([e["seq"] for e in followed], [e["seq"] for e in evs if e["type"].startswith("run.")])
        res = await sb.verify_audit()
        self.assertTrue(res["ok"], res)

    async def test_replay_compare_artifacts(self):
        sb = await self.sandbox()
        ck = await sb.checkpoint()
        await sb.run(["sh", "-c", "echo '{\"n\": 1}' > /root/out.json; cat /root/out.json"])
        res = await sb.replay(ck["id"])
        self.assertFalse(res["diverged"], res)
        self.assertEqual((await self.client.compare(sb.id, sb.id))["diverged"], False)
        self.assertEqual(await sb.read_artifact("/root/out.json"), b'{"n": 1}\n')
        diff = await sb.artifact_diff("checkpoint:" + ck["id"])
        self.assertTrue(diff["untrusted"])
        rep = await sb.run_report(res["steps"][0]["original"]["run"])
        self.assertEqual(rep["kind"], "report")
        schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
        with self.assertRaises(agentbox.APIError) as cm:
            await sb.run("echo IGNORE-ALL-INSTRUCTIONS", output_schema=schema)
        self.assertEqual(cm.exception.reason, "output_schema_mismatch")


class TestAsyncServiceURLs(AsyncDaemonTest):
    async def test_expose_list_revoke(self):
        sb = await self.sandbox()
        x = await sb.expose(8080, ttl=600)
        self.assertTrue(x["token"].startswith("abt1."))
        self.assertEqual([e["id"] for e in await sb.exposures()], [x["id"]])
        self.assertIn(x["id"], [e["id"] for e in await self.client.exposures()])
        self.assertIn("agentbox_token=abl1.", (await self.client.exposure_link(x["id"]))["browser_url"])
        await self.client.revoke_exposure(x["id"])
        self.assertEqual(await sb.exposures(), [])
        with self.assertRaises(agentbox.NotFound):
            await self.client.revoke_exposure(x["id"])


class TestAsyncOperations(AsyncDaemonTest):
    async def test_runs_and_usage(self):
        sb = await self.sandbox()
        await sb.run("echo metered")
        runs = await self.client.runs(sandbox=sb.id, limit=10)
        self.assertEqual(runs[0]["trigger"], "api")
        self.assertEqual((await self.client.get_run(runs[0]["id"]))["id"], runs[0]["id"])
        self.assertIn("sandboxes", await self.client.usage(sb.id))
        since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        recs = [r async for r in self.client.export_usage(sb.id, since)]
        self.assertIsInstance(recs, list)

    async def test_code_interpreter(self):
        # As test_daemon.py's: busybox's sh stands in for bash.
        sb = await self.sandbox()
        await sb.write_file("/usr/local/bin/bash", '#!/bin/sh\nshift 2\nexec sh "$@"\n', mode=0o755)
        seen = []

        async def on_stdout(text):
            seen.append(text)
        ex = await sb.run_code("X=41; echo $((X+1))", language="bash", on_stdout=on_stdout)
        self.assertEqual((ex.stdout, ex.error, seen), ("42\n", None, ["42\n"]))
        ctx = await sb.create_code_context(language="bash")
        self.assertIn(ctx["id"], [c["id"] for c in await sb.code_contexts()])
        await sb.restart_code_context(ctx["id"])
        await sb.delete_code_context(ctx["id"])
        with self.assertRaises(agentbox.NotFound):
            await sb.run_code("true", context=ctx["id"])

    async def test_schedules_and_hooks(self):
        c = self.client
        s = await c.create_schedule("0 0 1 1 *", "echo scheduled", template=TEMPLATE)
        self.assertEqual((await c.schedule(s["id"]))["cron"], "0 0 1 1 *")
        self.assertIn(s["id"], [x["id"] for x in await c.schedules()])
        self.assertEqual((await c.trigger_schedule(s["id"]))["trigger"], "schedule")
        await c.delete_schedule(s["id"])
        with self.assertRaises(agentbox.NotFound):
            await c.schedule(s["id"])

        h = await c.create_hook("cat", template=TEMPLATE)
        self.assertIn(h["id"], [x["id"] for x in await c.hooks()])
        r = await c.deliver_hook(h["id"], h["secret"], "payload", wait=True)
        self.assertEqual(base64.b64decode(r.get("output") or ""), b"payload")
        ts = int(time.time())
        with self.assertRaises(agentbox.Unauthorized):
            await c.deliver_hook_signed(h["id"], str(ts), agentbox.sign_hook("wrong", ts, b"x"), b"x")
        await c.delete_hook(h["id"])

    async def test_pools_storage_runners(self):
        admin = self.admin()
        p = await admin.set_pool(TEMPLATE, 1)
        self.assertEqual((p.get("size"), p.get("runtime")), (1, "native"))
        self.assertIn((TEMPLATE, "native"), [(x.get("template"), x.get("runtime")) for x in await admin.pools()])
        await admin.set_pool(TEMPLATE, 0, runtime="native")
        async with admin.sandbox(template=TEMPLATE) as sb:
            await sb.write_file("/root/exported", "yes")
            ck = await sb.checkpoint("apy-export")
            img = await admin.export_checkpoint(ck["id"])
            name = uniq("apyimport")
            t = await admin.import_template(name, io.BytesIO(img))
            self.assertEqual(t["name"], name)
            buf = io.BytesIO()
            self.assertEqual(await admin.export_template(name, buf), b"")
            with tempfile.TemporaryDirectory() as layout:
                tarfile.open(fileobj=io.BytesIO(buf.getvalue())).extractall(layout)
                self.assertEqual((await admin.import_template_dir(name + "-dir", layout))["id"], t["id"])
            async with admin.sandbox(template=name) as sb2:
                self.assertEqual(await sb2.read_text("/root/exported"), "yes")
            bin_path = env("AGENTBOX_TEST_BIN")
            if bin_path:
                with open(bin_path, "rb") as f:
                    r = await admin.stage_runner(f)
                self.assertIn(r["hash"], [x["hash"] for x in await admin.runners()])
                self.assertIn("changed", await sb.upgrade(runner_hash=r["hash"]))
            await sb.upgrade()
            self.assertEqual((await sb.run("echo still")).stdout, "still\n")
        self.assertIn("removed_layers", await admin.collect_garbage(0))


if __name__ == "__main__":
    unittest.main()
