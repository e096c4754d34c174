"""Tests of the SDK against a real daemon.

They need AGENTBOX_HOST and AGENTBOX_API_KEY (a tenant's full key over TCP)
and, for some, AGENTBOX_TEST_QUOTA_KEY (a tenant allowed one sandbox),
AGENTBOX_TEST_REVOKED_KEY and AGENTBOX_TEST_UNIX_HOST: test/python_sdk_test.go
starts a private daemon and sets them all. Without AGENTBOX_HOST they skip.
"""

import base64
import datetime
import io
import os
import tarfile
import tempfile
import threading
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


class DaemonTest(unittest.TestCase):
    def setUp(self):
        self.client = agentbox.Client()

    def sandbox(self, **kw):
        sb = self.client.create(TEMPLATE, **kw)
        self.addCleanup(sb.delete, missing_ok=True)
        return sb


class TestSeedExample(DaemonTest):
    def test_seed_example_verbatim(self):
        # The seed's example, verbatim but for the template argument. The
        # busybox template has no Python: a shim "python" stands in for it.
        client = self.client
        with client.sandbox(template=TEMPLATE) as sb:
            sb.write_file("/usr/local/bin/python", '#!/bin/sh\necho "analysed $1"; cat "$1"\n', mode=0o755)
            sb.write_file("/root/my_analysis.py", "print(42)\n")
            result = sb.run("python my_analysis.py")
            print(result.stdout)
            self.assertEqual(result.exit_code, 0, result.stderr)
            self.assertEqual(result.stdout, "analysed my_analysis.py\nprint(42)\n")
            sid = sb.id
        with self.assertRaises(agentbox.NotFound):
            client.get(sid)


class TestClient(DaemonTest):
    def test_health_info(self):
        self.assertTrue(self.client.health())
        info = self.client.info()
        self.assertIn("version", info)

    def test_create_get_list_delete(self):
        label = uniq("l")
        sb = self.sandbox(labels={"suite": label}, env={"GREETING": "hi"}, hostname="pybox")
        self.assertEqual(sb.state, "running")
        got = self.client.get(sb.id)
        self.assertEqual(got.id, sb.id)
        self.assertEqual(got.info["labels"], {"suite": label})
        self.assertEqual([s.id for s in self.client.list({"suite": label})], [sb.id])
        self.assertIn(sb.id, [s.id for s in self.client.list()])
        self.assertEqual(sb.run("echo $GREETING; hostname").stdout, "hi\npybox\n")
        self.assertEqual(sb.refresh()["id"], sb.id)
        sb.delete()
        with self.assertRaises(agentbox.NotFound) as cm:
            sb.refresh()
        e = cm.exception
        self.assertEqual((e.status, e.code), (404, "not_found"))
        self.assertTrue(e.request_id)
        with self.assertRaises(agentbox.NotFound):
            sb.delete()
        sb.delete(missing_ok=True)

    def test_with_deletes_on_exception(self):
        class Boom(Exception):
            pass
        sid = None
        with self.assertRaises(Boom):
            with self.client.sandbox(template=TEMPLATE) as sb:
                sid = sb.id
                raise Boom()
        with self.assertRaises(agentbox.NotFound):
            self.client.get(sid)

    def test_names_and_persistent(self):
        name = uniq("py-persist")
        sb = self.sandbox(name=name, persistent=True)
        self.assertEqual(sb.name, name)
        self.assertEqual(sb.info["lifecycle"], "persistent")
        # The same name again returns the same sandbox; a differing option is a conflict.
        self.assertEqual(self.client.create(TEMPLATE, name=name).id, sb.id)
        with self.assertRaises(agentbox.Conflict) as cm:
            self.client.create(TEMPLATE, name=name, lifecycle="session")
        self.assertEqual(cm.exception.status, 409)
        # Names work wherever ids do.
        h = self.client.handle(name)
        h.write_file("/root/keep", "kept")
        sb.hibernate()
        self.assertEqual(self.client.get(name).id, sb.id)
        self.assertEqual(h.run("cat /root/keep").stdout, "kept")
        sb.pause()
        self.assertEqual(self.client.get(name).state, "paused")
        sb.resume()
        self.assertEqual(sb.state, "running")
        causes = [t.get("to") for t in sb.transitions()]
        self.assertTrue(causes, "no transitions recorded")

    def test_errors(self):
        with self.assertRaises(agentbox.NotFound):
            self.client.get("no-such-sandbox")
        with self.assertRaises(agentbox.InvalidArgument) as cm:
            self.client.create("no/such/template!")
        self.assertEqual(cm.exception.status, 400)
        sb = self.sandbox()
        with self.assertRaises(agentbox.NotFound) as cm:
            sb.run(["/no/such/binary"])
        self.assertEqual(cm.exception.reason, agentbox.REASON_COMMAND_NOT_FOUND)

    def test_revoked_key_is_unauthorized(self):
        key = os.environ.get("AGENTBOX_TEST_REVOKED_KEY")
        if not key:
            self.skipTest("AGENTBOX_TEST_REVOKED_KEY not set")
        with self.assertRaises(agentbox.Unauthorized) as cm:
            agentbox.Client(api_key=key).list()
        e = cm.exception
        self.assertEqual((e.status, e.code), (401, "unauthenticated"))
        self.assertTrue(e.request_id)
        with self.assertRaises(agentbox.Unauthorized):
            agentbox.Client(api_key="wrong").create(TEMPLATE)
        # A streamed upload refused before its body is read is still a 401.
        with self.assertRaises(agentbox.Unauthorized):
            agentbox.Client(api_key=key).stage_runner(io.BytesIO(os.urandom(16 << 20)))

    def test_quota_is_429_with_retry_after(self):
        key = os.environ.get("AGENTBOX_TEST_QUOTA_KEY")
        if not key:
            self.skipTest("AGENTBOX_TEST_QUOTA_KEY not set")
        c = agentbox.Client(api_key=key)
        with c.sandbox(template=TEMPLATE):
            with self.assertRaises(agentbox.QuotaExceeded) as cm:
                c.create(TEMPLATE)
            e = cm.exception
            self.assertEqual((e.status, e.code), (429, "resource_exhausted"))
            self.assertIsNotNone(e.retry_after)
            self.assertGreater(e.retry_after, 0)
            self.assertTrue(e.request_id)

    def test_admin_tenants_and_keys(self):
        host = os.environ.get("AGENTBOX_TEST_UNIX_HOST")
        if not host:
            self.skipTest("AGENTBOX_TEST_UNIX_HOST not set")
        admin = agentbox.Client(host, api_key="")
        tid = uniq("pyten")
        t = admin.create_tenant(tid, {"max_sandboxes": 3})
        self.assertEqual(t["id"], tid)
        with self.assertRaises(agentbox.Conflict):
            admin.create_tenant(tid)
        self.assertIn(tid, [x["id"] for x in admin.tenants()])
        self.assertEqual(admin.update_tenant(tid, {"max_sandboxes": 1})["quotas"]["max_sandboxes"], 1)
        self.assertEqual(admin.tenant(tid)["quotas"]["max_sandboxes"], 1)
        k = admin.create_api_key(tid, scope="read", name="py")
        self.assertTrue(k["key"])
        self.assertIn(k["id"], [x["id"] for x in admin.api_keys()])
        ro = agentbox.Client(api_key=k["key"])
        self.assertEqual(ro.list(), [])
        with self.assertRaises(agentbox.PermissionDenied) as cm:
            ro.create(TEMPLATE)
        self.assertEqual(cm.exception.status, 403)
        # Another tenant's sandbox is refused as an unknown one.
        mine = self.sandbox()
        with self.assertRaises(agentbox.NotFound):
            ro.get(mine.id)
        admin.revoke_api_key(k["id"])
        with self.assertRaises(agentbox.Unauthorized):
            ro.list()
        admin.delete_tenant(tid)
        with self.assertRaises(agentbox.NotFound):
            admin.tenant(tid)

    def test_unix_socket(self):
        host = os.environ.get("AGENTBOX_TEST_UNIX_HOST")
        if not host:
            self.skipTest("AGENTBOX_TEST_UNIX_HOST not set")
        c = agentbox.Client(host, api_key="")
        self.assertTrue(c.health())
        with c.sandbox(template=TEMPLATE) as sb:
            self.assertEqual(sb.run("echo unix").stdout, "unix\n")

    def test_tls(self):
        host, ca = os.environ.get("AGENTBOX_TEST_TLS_HOST"), os.environ.get("AGENTBOX_TEST_TLS_CA")
        if not host or not ca:
            self.skipTest("AGENTBOX_TEST_TLS_HOST not set")
        c = agentbox.Client(host, ca_cert=ca)
        self.assertTrue(c.health())
        out = []
        with c.sandbox(template=TEMPLATE) as sb:
            self.assertEqual(sb.run("echo tls", on_stdout=out.append).stdout, "tls\n")
        self.assertEqual(out, ["tls\n"])
        with self.assertRaises(agentbox.TransportError) as cm:
            agentbox.Client(host).health()  # the test CA is not in the system roots
        self.assertIn("CERTIFICATE", str(cm.exception).upper())


class TestExec(DaemonTest):
    def setUp(self):
        super().setUp()
        self.sb = self.sandbox()

    def test_run_result(self):
        r = self.sb.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.ok), ("out\n", "err\n", 3, False))
        self.assertEqual(r.stdout_bytes, b"out\n")
        self.assertGreater(r.pid, 0)
        self.assertTrue(self.sb.run(["true"]).ok)
        self.assertEqual(self.sb.exec(["echo", "a b"]).stdout, "a b\n")  # argv, no shell

    def test_options(self):
        self.sb.mkdir("/work/sub", parents=True)
        r = self.sb.run("pwd; echo $A; id -u", env={"A": "b"}, cwd="/work/sub", user="1000")
        self.assertEqual(r.stdout, "/work/sub\nb\n1000\n", r.stderr)

    def test_stdin(self):
        self.assertEqual(self.sb.run("tr a-z A-Z", stdin="hello\n").stdout, "HELLO\n")
        self.assertEqual(self.sb.run("wc -c", stdin=bytes(range(256)) * 4).stdout.strip(), "1024")

    def test_timeout(self):
        t0 = time.monotonic()
        r = self.sb.run("echo started; sleep 60", timeout=1)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertTrue(r.timed_out)
        self.assertNotEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, "started\n")

    def test_streaming_callbacks(self):
        out, err, started = [], [], []
        main = threading.get_ident()
        r = self.sb.run("for i in 1 2 3; do echo o$i; echo e$i >&2; done; printf '\\303\\251'",
                        on_stdout=out.append, on_stderr=err.append, on_start=started.append)
        self.assertEqual("".join(out), "o1\no2\no3\n\u00e9")
        self.assertEqual("".join(err), "e1\ne2\ne3\n")
        self.assertEqual(r.stdout, "o1\no2\no3\n\u00e9")
        self.assertEqual(started, [r.pid])
        self.assertEqual(threading.get_ident(), main)

    def test_output_streams_live(self):
        # The callback sees "ready" while the command still waits for its
        # input, and answers it: output that arrived only at the end would
        # leave the command waiting until its timeout.
        pid = []

        def on_stdout(s):
            if "ready" in s:
                self.sb.process(pid[0]).write_stdin("hi\n", close=True)
        r = self.sb.run("echo ready; read x; echo got $x", stdin_open=True, timeout=60,
                        on_start=pid.append, on_stdout=on_stdout)
        self.assertFalse(r.timed_out)
        self.assertEqual(r.stdout, "ready\ngot hi\n")

    def test_tty_token_private(self):
        p = self.sb.start("stty size; read x; stty size", tty={"rows": 24, "cols": 80}, stdin_open=True)
        p.resize(30, 100)
        p.write_stdin("\n")
        r = p.attach()
        self.assertIn("30 100", r.stdout)
        self.assertEqual(p.info.get("tty"), True)
        r = self.sb.run('[ -n "$AGENTBOX_RUN_TOKEN" ] && echo token', token=True, private=True)
        self.assertEqual(r.stdout, "token\n")

    def test_secrets(self):
        name = "PYSEC_" + uuid.uuid4().hex[:6].upper()
        value = "s3cr3t-" + uuid.uuid4().hex
        info = self.client.set_secret(name, value)
        self.assertEqual(info["name"], name)
        self.addCleanup(self._forget_secret, name)
        self.assertIn(name, [s["name"] for s in self.client.secrets()])
        r = self.sb.run('[ "$' + name + '" = "' + value + '" ] && echo match; echo "$' + name + '"',
                        secrets=[name])
        self.assertIn("match", r.stdout)
        self.assertNotIn(value, r.stdout)  # redacted from the output
        r = self.sb.run('[ "$TOK" = "' + value + '" ] && echo match', secrets=[agentbox.Secret(name, "TOK")])
        self.assertEqual(r.stdout, "match\n")
        self.assertEqual(self.sb.run('echo "x$' + name + '"').stdout, "x\n")  # not in other commands
        self.client.delete_secret(name)
        with self.assertRaises(agentbox.NotFound):
            self.client.delete_secret(name)

    def _forget_secret(self, name):
        try:
            self.client.delete_secret(name)
        except agentbox.NotFound:
            pass

    def test_background_attach_stdin_kill(self):
        p = self.sb.start("echo ready; read line; echo got $line; echo bye >&2", stdin_open=True)
        self.assertGreater(p.pid, 0)
        p.write_stdin("hello\n", close=True)
        r = p.attach(replay=True)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("ready\ngot hello\n", "bye\n", 0))
        self.assertIn(p.pid, [q["pid"] for q in self.sb.processes()])

        p = self.sb.start(["sleep", "300"])
        p.kill()
        r = self.sb.attach(p.pid)
        self.assertEqual((r.exit_code, r.signal), (-1, "KILL"))

        p = self.sb.start("cat", stdin_open=True)
        p.write_stdin(io.BytesIO(b"streamed"))
        p.close_stdin()
        self.assertEqual(self.sb.process(p.pid).wait().stdout, "streamed")

        p = self.sb.start(["sleep", "300"])
        p.signal("TERM")
        self.assertEqual(p.attach().signal, "TERM")
        with self.assertRaises(agentbox.NotFound):
            self.sb.process(99999).signal("KILL")

    def test_rollback_on_failure(self):
        self.sb.write_file("/root/f", "before")
        r = self.sb.run("echo after > /root/f; exit 1", rollback_on_failure=True)
        self.assertTrue(r.rolled_back)
        self.assertTrue(r.checkpoint)
        self.assertEqual(self.sb.read_text("/root/f"), "before")


class TestFiles(DaemonTest):
    def setUp(self):
        super().setUp()
        self.sb = self.sandbox()

    def test_files(self):
        sb = self.sb
        st = sb.write_file("/data/a/b.txt", "hello", mode=0o600)
        self.assertEqual(st.get("size"), 5)
        self.assertEqual(sb.read_file("/data/a/b.txt"), b"hello")
        self.assertEqual(sb.stat("/data/a/b.txt")["mode"] & 0o777, 0o600)
        big = os.urandom(3 << 20)
        sb.write_file("/data/big", io.BytesIO(big))
        self.assertEqual(sb.read_file("/data/big"), big)
        with sb.open_file("/data/big") as f:
            self.assertEqual(b"".join(f.iter_chunks()), big)
        sb.write_file("/data/gen", (bytes([i]) * 10 for i in range(3)))
        self.assertEqual(sb.read_file("/data/gen"), b"\0" * 10 + b"\1" * 10 + b"\2" * 10)
        sb.mkdir("/data/d")
        with self.assertRaises(agentbox.NotFound):
            sb.mkdir("/data/x/y")
        sb.mkdir("/data/x/y", parents=True)
        self.assertEqual(sorted(e["name"] for e in sb.ls("/data")), ["a", "big", "d", "gen", "x"])
        self.assertEqual(sb.stat("/data/d")["type"], "dir")
        self.assertEqual([e["name"] for e in sb.list_dir("/data/x")], ["y"])
        sb.move("/data/a/b.txt", "/data/d/c.txt")
        self.assertFalse(sb.exists("/data/a/b.txt"))
        self.assertEqual(sb.read_text("/data/d/c.txt"), "hello")
        with self.assertRaises(agentbox.APIError):
            sb.remove("/data/d")
        sb.remove("/data/d", recursive=True)
        self.assertFalse(sb.exists("/data/d"))
        with self.assertRaises(agentbox.NotFound):
            sb.read_file("/nope")

    def test_upload_download_dir(self):
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            os.makedirs(os.path.join(src, "pkg", "sub"))
            with open(os.path.join(src, "pkg", "sub", "m.py"), "w") as f:
                f.write("x = 1\n")
            with open(os.path.join(src, "top.txt"), "w") as f:
                f.write("top\n")
            self.sb.upload_dir(src, "/proj")
            self.assertEqual(self.sb.run("cat /proj/top.txt /proj/pkg/sub/m.py").stdout, "top\nx = 1\n")
            self.sb.run("echo made > /proj/pkg/new")
            self.sb.download_dir("/proj", dst)
            with open(os.path.join(dst, "pkg", "new")) as f:
                self.assertEqual(f.read(), "made\n")
            with open(os.path.join(dst, "pkg", "sub", "m.py")) as f:
                self.assertEqual(f.read(), "x = 1\n")
        raw = self.sb.download_tar("/proj")
        names = tarfile.open(fileobj=io.BytesIO(raw)).getnames()
        self.assertIn("top.txt", [n.lstrip("./") for n in names])
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("t.txt")
            ti.size = 2
            tf.addfile(ti, io.BytesIO(b"ok"))
        self.sb.upload_tar("/tarred", buf.getvalue())
        self.assertEqual(self.sb.read_text("/tarred/t.txt"), "ok")


class TestCheckpoints(DaemonTest):
    def test_checkpoint_restore_fork_diff_merge(self):
        sb = self.sandbox()
        sb.write_file("/root/state", "v1")
        ck = sb.checkpoint("py-v1", labels={"k": "v"})
        self.assertTrue(ck["id"])
        self.assertEqual(ck["name"], "py-v1")
        self.assertIn(ck["id"], [c["id"] for c in sb.checkpoints()])
        self.assertIn(ck["id"], [c["id"] for c in self.client.checkpoints()])
        self.assertEqual(self.client.checkpoint(ck["id"])["id"], ck["id"])
        sb.write_file("/root/state", "v2")
        res = sb.restore("py-v1")
        self.assertEqual(res["checkpoint"], ck["id"])
        self.assertEqual(sb.read_text("/root/state"), "v1")

        forks = sb.fork(2, labels={"fork": "yes"})
        for f in forks:
            self.addCleanup(f.delete, missing_ok=True)
        self.assertEqual(len(forks), 2)
        self.assertEqual(forks[0].read_text("/root/state"), "v1")
        more = self.client.fork(ck["id"], 1, env={"E": "1"})
        self.addCleanup(more[0].delete, missing_ok=True)
        self.assertEqual(more[0].run("cat /root/state; echo; echo $E").stdout, "v1\n1\n")

        a, b = forks
        b.write_file("/root/added", "from b")
        b.write_file("/root/state", "b")
        d = self.client.diff("sandbox:" + a.id, "sandbox:" + b.id, unified=True)
        paths = {c["path"]: c["change"] for c in d["changes"]}
        self.assertEqual(paths.get("/root/added"), "added")
        self.assertEqual(paths.get("/root/state"), "modified")
        self.assertTrue(b.tree_hash())
        self.assertNotEqual(a.tree_hash(), b.tree_hash())

        a.write_file("/root/state", "a")
        with self.assertRaises(agentbox.MergeConflict) as cm:
            a.merge(b.id)
        self.assertEqual(cm.exception.status, 409)
        self.assertIn("/root/state", [c["path"] for c in cm.exception.conflicts])
        self.assertEqual(a.read_text("/root/state"), "a")
        dry = a.merge(b.id, strategy="theirs", dry_run=True)
        self.assertTrue(dry["applied"])
        self.assertFalse(a.exists("/root/added"))
        a.merge(b.id, resolutions={"/root/state": "ours"})
        self.assertEqual((a.read_text("/root/state"), a.read_text("/root/added")), ("a", "from b"))

        for f in forks:
            f.delete()
        with self.assertRaises(agentbox.Conflict):
            self.client.delete_checkpoint(ck["id"])  # more[0] runs on it
        more[0].delete()
        sb.delete()
        self.client.delete_checkpoint(ck["id"])
        with self.assertRaises(agentbox.NotFound):
            self.client.checkpoint(ck["id"])


class TestTemplatesNetwork(DaemonTest):
    def test_templates(self):
        names = [t["name"] for t in self.client.templates()]
        self.assertIn(TEMPLATE, names)
        self.assertEqual(self.client.template(TEMPLATE)["name"], TEMPLATE)
        events = []
        name = uniq("pytmpl")
        t = self.client.build_template({"name": name, "base": TEMPLATE,
                                        "steps": [{"run": "echo built > /etc/built"}]},
                                       progress=events.append)
        self.assertEqual(t["name"], name)
        self.assertTrue(t["built"])
        self.assertEqual(events[-1]["type"], "done")
        self.assertIn("step", [e["type"] for e in events])
        with self.client.sandbox(template=name) as sb:
            self.assertEqual(sb.run("cat /etc/built").stdout, "built\n")
            sb.write_file("/etc/saved", "yes")
            v = sb.save_template(name + "-saved")
            self.assertEqual(v["version"], 1)
        self.assertEqual(len(self.client.template_versions(name + "-saved")), 1)
        with self.assertRaises(agentbox.APIError) as cm:
            self.client.build_template({"name": uniq("pyfail"), "base": TEMPLATE, "steps": [{"run": "exit 7"}]})
        self.assertTrue(cm.exception.message)

    def test_network(self):
        sb = self.sandbox()
        self.assertEqual((sb.info.get("network") or {}).get("mode", "none"), "none")
        sb.set_network("egress", allow=["example.com:443"])
        self.assertEqual(sb.info["network"]["mode"], "egress")
        self.assertEqual(sb.refresh()["network"]["allow"], ["example.com:443"])
        self.assertEqual(sb.egress_log(10), [])
        sb.set_network("none")
        self.assertEqual((sb.info.get("network") or {}).get("mode", "none"), "none")
        self.assertEqual(sb.events(types=["log", "metric", "usage"]), [])

    def test_flight_record(self):
        sb = self.sandbox()
        sb.run("echo recorded > rec.txt")
        evs = sb.events(types=["run", "file.changed"])
        kinds = [e["type"] for e in evs]
        self.assertEqual((kinds[0], kinds[-1]), ("run.started", "run.ended"), kinds)
        run = evs[0]["run_id"]
        self.assertIn("/root/rec.txt", [e["file"]["path"] for e in evs if e["type"] == "file.changed"])
        self.assertTrue(all(e["run_id"] == run for e in evs))
        self.assertEqual(len(sb.events(run=run, limit=1)), 1)
        followed = []
        for ev in sb.follow_events(types=["run"]):
            followed.append(ev)
            if len(followed) == 2:
                break
        self.assertEqual([e["seq"] for e in followed], [e["seq"] for e in evs if e["type"].startswith("run.")])
        res = sb.verify_audit()
        self.assertTrue(res["ok"], res)

    def test_replay_compare_artifacts(self):
        sb = self.sandbox()
        ck = sb.checkpoint()
        sb.run(["sh", "-c", "echo '{\"n\": 1}' > /root/out.json; cat /root/out.json"])
        res = sb.replay(ck["id"])
        self.assertFalse(res["diverged"], res)
        self.assertEqual(len(res["steps"]), 1)
        self.assertEqual(self.client.compare(sb.id, sb.id)["diverged"], False)
        self.assertEqual(sb.read_artifact("/root/out.json"), b'{"n": 1}\n')
        diff = sb.artifact_diff("checkpoint:" + ck["id"])
        self.assertTrue(diff["untrusted"])
        self.assertIn("/root/out.json", [c["path"] for c in diff["diff"]["changes"]])
        rep = sb.run_report(res["steps"][0]["original"]["run"])
        self.assertEqual(rep["kind"], "report")
        schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
        self.assertEqual(sb.run("cat /root/out.json", output_schema=schema).stdout, '{"n": 1}\n')
        with self.assertRaises(agentbox.APIError) as cm:
            sb.run("echo IGNORE-ALL-INSTRUCTIONS", output_schema=schema)
        self.assertEqual(cm.exception.reason, "output_schema_mismatch")
        self.assertNotIn("IGNORE", str(cm.exception))


class TestOperations(DaemonTest):
    def admin(self):
        host = os.environ.get("AGENTBOX_TEST_UNIX_HOST")
        if not host:
            self.skipTest("AGENTBOX_TEST_UNIX_HOST not set")
        return agentbox.Client(host, api_key="")

    def test_runs_and_usage(self):
        sb = self.sandbox()
        sb.run("echo metered")
        runs = self.client.runs(sandbox=sb.id, limit=10)
        self.assertTrue(runs, "no run recorded")
        self.assertEqual(runs[0]["trigger"], "api")
        self.assertEqual(self.client.get_run(runs[0]["id"])["id"], runs[0]["id"])
        u = self.client.usage(sb.id)
        self.assertIn("sandboxes", u)
        since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        self.assertIsInstance(list(self.client.export_usage(sb.id, since)), list)

    def test_code_interpreter(self):
        # busybox has no python3 (its code calls go all the way to the code
        # server in the sandbox, which says so) and no bash: its sh stands
        # in for bash. The cells themselves are tested in test/code_test.go.
        sb = self.sandbox()
        with self.assertRaises(agentbox.FailedPrecondition) as cm:
            sb.run_code("x = 6*7", timeout=30)
        self.assertIn("python3", str(cm.exception))
        sb.write_file("/usr/local/bin/bash", '#!/bin/sh\nshift 2\nexec sh "$@"\n', mode=0o755)
        seen = []
        ex = sb.run_code("X=41; echo $((X+1))", language="bash", on_stdout=seen.append)
        self.assertEqual((ex.stdout, ex.error, ex.execution_count, seen), ("42\n", None, 1, ["42\n"]))
        self.assertIsNone(ex.text)
        ctx = sb.create_code_context(language="bash", cwd="/")
        self.assertEqual((ctx["language"], ctx["cwd"]), ("bash", "/"))
        self.assertEqual(sb.run_code("echo ${X:-unset}; false", context=ctx["id"]).error["name"], "ExitStatus")
        self.assertIn(ctx["id"], [c["id"] for c in sb.code_contexts()])
        sb.restart_code_context(ctx["id"])
        sb.delete_code_context(ctx["id"])
        with self.assertRaises(agentbox.NotFound):
            sb.delete_code_context(ctx["id"])
        runs = self.client.runs(sandbox=sb.id, limit=20)
        self.assertTrue(any("code-client" in (r.get("cmd") or []) for r in runs), runs)

    def test_schedules_and_hooks(self):
        s = self.client.create_schedule("0 0 1 1 *", "echo scheduled", template=TEMPLATE)
        self.assertEqual(self.client.schedule(s["id"])["cron"], "0 0 1 1 *")
        self.assertIn(s["id"], [x["id"] for x in self.client.schedules()])
        r = self.client.trigger_schedule(s["id"])
        self.assertEqual(r["trigger"], "schedule")
        self.client.delete_schedule(s["id"])
        with self.assertRaises(agentbox.NotFound):
            self.client.schedule(s["id"])

        h = self.client.create_hook("cat", template=TEMPLATE)
        self.assertTrue(h["secret"])
        self.assertIn(h["id"], [x["id"] for x in self.client.hooks()])
        r = self.client.deliver_hook(h["id"], h["secret"], "payload", wait=True)
        self.assertEqual(r["trigger"], "webhook")
        self.assertEqual(base64.b64decode(r.get("output") or ""), b"payload")
        ts = int(time.time())
        with self.assertRaises(agentbox.Unauthorized):
            self.client.deliver_hook_signed(h["id"], str(ts), agentbox.sign_hook("wrong", ts, b"x"), b"x")
        self.client.delete_hook(h["id"])

    def test_pools_storage_runners(self):
        admin = self.admin()
        p = admin.set_pool(TEMPLATE, 1)
        self.assertEqual((p.get("size"), p.get("runtime")), (1, "native"))
        self.assertIn((TEMPLATE, "native"), [(x.get("template"), x.get("runtime")) for x in admin.pools()])
        admin.set_pool(TEMPLATE, 0, runtime="native")

        with admin.sandbox(template=TEMPLATE) as sb:
            sb.write_file("/root/exported", "yes")
            ck = sb.checkpoint("py-export")
            img = admin.export_checkpoint(ck["id"])
            name = uniq("pyimport")
            t = admin.import_template(name, io.BytesIO(img))
            self.assertEqual(t["name"], name)
            buf = io.BytesIO()
            admin.export_template(name, buf)
            with tempfile.TemporaryDirectory() as layout:
                tarfile.open(fileobj=io.BytesIO(buf.getvalue())).extractall(layout)
                t2 = admin.import_template_dir(name + "-dir", layout)
            self.assertEqual(t2["id"], t["id"])
            with admin.sandbox(template=name) as sb2:
                self.assertEqual(sb2.read_text("/root/exported"), "yes")

            bin_path = os.environ.get("AGENTBOX_TEST_BIN")
            if bin_path:
                with open(bin_path, "rb") as f:
                    r = admin.stage_runner(f)
                self.assertTrue(r["hash"])
                self.assertIn(r["hash"], [x["hash"] for x in admin.runners()])
                res = sb.upgrade(runner_hash=r["hash"])
                self.assertIn("changed", res)
                self.assertEqual(sb.run("echo still").stdout, "still\n")
            res = sb.upgrade()
            self.assertEqual(sb.read_text("/root/exported"), "yes")
        self.assertIn("removed_layers", admin.collect_garbage(0))


class TestServiceURLs(DaemonTest):
    def test_expose_fetch_revoke(self):
        import urllib.error
        import urllib.request
        sb = self.sandbox()
        sb.start("mkdir -p /www && echo hello-service > /www/index.html && exec httpd -f -p 8080 -h /www")
        x = sb.expose(8080, ttl=600)
        self.assertTrue(x["token"].startswith("abt1."))
        self.assertTrue(x["url"].endswith(x["path"]))
        req = urllib.request.Request(x["url"] + "index.html", headers={"X-Agentbox-Token": x["token"]})
        body = b""
        for _ in range(50):  # httpd may still be starting
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    body = r.read()
                break
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                time.sleep(0.1)
        self.assertEqual(body, b"hello-service\n")
        self.assertEqual([e["id"] for e in sb.exposures()], [x["id"]])
        self.assertIn(x["id"], [e["id"] for e in self.client.exposures()])
        self.assertNotIn("token", sb.exposures()[0])
        link = self.client.exposure_link(x["id"])
        self.assertIn("agentbox_token=abl1.", link["browser_url"])
        self.assertNotIn("token", link)
        self.client.revoke_exposure(x["id"])
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(cm.exception.code, 404)


if __name__ == "__main__":
    unittest.main()
