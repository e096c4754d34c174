"""Tests of the transports against a scripted HTTP server (no daemon).

The server (FakeDaemon) listens on a unix socket of its own; each test
gives it a handler that reads the request and writes raw HTTP/1.1 bytes,
so framing the daemon never produces (bodies split byte by byte, chunk
boundaries inside an event line, early answers, connections cut off) is
covered too.
"""

import asyncio
import base64
import io
import json
import os
import random
import shutil
import tempfile
import unittest
from unittest import mock

import agentbox
from agentbox import _aio_http, _http


class Req:
    def __init__(self, method, target, headers, reader):
        self.method, self.target, self.headers, self.reader = method, target, headers, reader

    async def body(self):
        if "chunked" in self.headers.get("transfer-encoding", ""):
            out = b""
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    return out
                out += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
        n = int(self.headers.get("content-length", "0"))
        return await self.reader.readexactly(n) if n else b""


def chunked(data, sizes):
    """data in HTTP chunks of the given sizes (cycled), then the last chunk."""
    out, i, k = b"", 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        k += 1
        out += b"%x\r\n" % len(data[i:i + n]) + data[i:i + n] + b"\r\n"
        i += n
    return out + b"0\r\n\r\n"


def head(status=200, headers=None):
    h = "HTTP/1.1 %d X\r\n" % status + "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
    return (h + "\r\n").encode()


async def dribble(writer, data, pieces):
    """Write data in pieces of the given sizes (cycled), draining after each."""
    i, k = 0, 0
    while i < len(data):
        n = pieces[k % len(pieces)]
        k += 1
        writer.write(data[i:i + n])
        await writer.drain()
        i += n


class FakeDaemon:
    def __init__(self, handler):
        self.handler = handler
        self.requests = []
        self.closed = asyncio.Event()  # set when a client closed its connection first

    async def __aenter__(self):
        self.dir = tempfile.mkdtemp()
        path = os.path.join(self.dir, "d.sock")
        self.server = await asyncio.start_unix_server(self._conn, path)
        self.client = agentbox.AsyncClient("unix://" + path, api_key="k")
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()
        shutil.rmtree(self.dir)

    async def _conn(self, reader, writer):
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines[1:] if ln)}
            req = Req(method, target, headers, reader)
            self.requests.append(req)
            await self.handler(req, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went, or the test is over
        finally:
            writer.close()


def events(*evs):
    return b"".join(json.dumps(e).encode() + b"\n" for e in evs)


class TestTransport(unittest.IsolatedAsyncioTestCase):
    async def test_request_and_content_length(self):
        async def h(req, w):
            body = await req.body()
            w.write(head(200, {"Content-Length": len(body) + 2}) + b"[" + body + b"]")
        async with FakeDaemon(h) as d:
            got = await d.client._t.do(_http.Call("POST", "/x", json_body={"a": 1}, decode=lambda v: v))
            self.assertEqual(got, [{"a": 1}])
            r = d.requests[0]
            self.assertEqual((r.method, r.target), ("POST", "/v1/x"))
            self.assertEqual((r.headers["authorization"], r.headers["agentbox-version"]), ("Bearer k", "v1"))
            self.assertEqual(r.headers["content-type"], "application/json")

    async def test_chunked_stream_split_anywhere(self):
        # Events whose lines cross chunk boundaries, sent a few bytes at a
        # time: the exec stream still decodes, with callbacks in order.
        stream = events({"type": "started", "pid": 7}, {"type": "stdout", "data": "aGVsbG8K"},
                        {"type": "stderr", "data": "w6k="}, {"type": "exit", "exit_code": 3})

        async def h(req, w):
            await req.body()
            w.write(head(200, {"Transfer-Encoding": "chunked"}))
            await dribble(w, chunked(stream, [5, 1, 17, 64]), [3, 1, 7])
        async with FakeDaemon(h) as d:
            out, err = [], []

            async def on_err(s):
                err.append(s)
            r = await d.client.handle("sb").run("x", on_stdout=out.append, on_stderr=on_err)
            self.assertEqual((r.pid, r.exit_code, r.stdout, r.stderr), (7, 3, "hello\n", "\u00e9"))
            self.assertEqual((out, err), (["hello\n"], ["\u00e9"]))
            self.assertEqual(d.requests[0].target, "/v1/sandboxes/sb/exec")

    async def test_big_event_line(self):
        # One event of several MiB (under the line limit), in many chunks.
        data = os.urandom(3 << 20)
        stream = events({"type": "stdout", "pid": 2, "data": base64.b64encode(data).decode()},
                        {"type": "exit", "exit_code": 0})

        async def h(req, w):
            await req.body()
            w.write(head(200, {"Transfer-Encoding": "chunked"}) + chunked(stream, [70000, 3]))
        async with FakeDaemon(h) as d:
            r = await d.client.handle("s").run("x")
            self.assertEqual((r.exit_code, r.stdout_bytes), (0, data))

    async def test_random_framing(self):
        rnd = random.Random(15)
        for _ in range(30):
            data = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 3000)))
            sizes = [rnd.randint(1, 700) for _ in range(4)]
            pieces = [rnd.randint(1, 300) for _ in range(4)]
            framing = rnd.choice(["chunked", "length", "eof"])

            async def h(req, w):
                if framing == "chunked":
                    w.write(head(200, {"Transfer-Encoding": "chunked"}))
                    await dribble(w, chunked(data, sizes), pieces)
                elif framing == "length":
                    w.write(head(200, {"Content-Length": len(data)}))
                    await dribble(w, data, pieces)
                else:
                    w.write(head(200))
                    await dribble(w, data, pieces)
            async with FakeDaemon(h) as d:
                with self.subTest(framing=framing, n=len(data)):
                    self.assertEqual(await d.client.handle("s").read_file("/f"), data)

    async def test_streamed_request_bodies(self):
        async def h(req, w):
            body = await req.body()
            te = req.headers.get("transfer-encoding", "")
            out = json.dumps({"te": te, "n": len(body), "body": body.decode()}).encode()
            w.write(head(200, {"Content-Length": len(out)}) + out)

        async def agen():
            for p in (b"as", b"", b"ync"):
                yield p
        async with FakeDaemon(h) as d:
            sb = d.client.handle("s")
            self.assertEqual(await sb.write_file("/f", "whole"), {"te": "", "n": 5, "body": "whole"})
            self.assertEqual(await sb.write_file("/f", (p for p in [b"it", b"er"])),
                             {"te": "chunked", "n": 4, "body": "iter"})
            self.assertEqual(await sb.write_file("/f", agen()), {"te": "chunked", "n": 5, "body": "async"})
            self.assertEqual(await sb.write_file("/f", io.BytesIO(b"f" * 200000)),
                             {"te": "chunked", "n": 200000, "body": "f" * 200000})

    async def test_error_mapping(self):
        async def h(req, w):
            body = b'{"code":"resource_exhausted","message":"slow down","request_id":"r9"}'
            w.write(head(429, {"Retry-After": "7", "Transfer-Encoding": "chunked"}) + chunked(body, [10]))
        async with FakeDaemon(h) as d:
            with self.assertRaises(agentbox.QuotaExceeded) as cm:
                await d.client.create()
            e = cm.exception
            self.assertEqual((e.status, e.retry_after, e.request_id, e.message), (429, 7.0, "r9", "slow down"))

    async def test_early_answer_to_a_streamed_upload(self):
        # The daemon refuses before reading the body, then hangs up as Go's
        # net/http does (a half close, a pause, a close with the body
        # unread): the caller gets the 401, not a broken pipe.
        async def h(req, w):
            w.write(head(401, {"Content-Length": 2}) + b"no")
            await w.drain()
            w.write_eof()
            await asyncio.sleep(0.5)
        async with FakeDaemon(h) as d:
            with self.assertRaises(agentbox.Unauthorized):
                await d.client.stage_runner(b"x" * 100 for _ in range(50000))

    async def test_early_answer_to_a_streamed_upload_blocking(self):
        # The same for the blocking client (in a thread: the server runs on
        # this loop).
        async def h(req, w):
            w.write(head(401, {"Content-Length": 2}) + b"no")
            await w.drain()
            w.write_eof()
            await asyncio.sleep(0.5)
        async with FakeDaemon(h) as d:
            c = agentbox.Client(d.client.host, api_key="k")
            call = asyncio.get_running_loop().run_in_executor(
                None, c.stage_runner, (b"x" * 100 for _ in range(50000)))
            with self.assertRaises(agentbox.Unauthorized):
                await asyncio.wait_for(call, 30)

    async def test_timeout_bounds_each_read(self):
        async def h(req, w):
            await req.reader.read()  # until the client gives up
        async with FakeDaemon(h) as d:
            c = agentbox.AsyncClient(d.client.host, api_key="", timeout=0.2)
            with self.assertRaises(agentbox.TransportError):
                await c.health()

    async def test_timeout_spares_a_slow_upload(self):
        # The body takes longer than the timeout to produce and send, but no
        # single piece does: the call succeeds.
        async def h(req, w):
            body = await req.body()
            out = b'{"n": %d}' % len(body)
            w.write(head(200, {"Content-Length": len(out)}) + out)
        async with FakeDaemon(h) as d:
            c = agentbox.AsyncClient(d.client.host, api_key="", timeout=2)

            async def pieces():
                for _ in range(5):
                    await asyncio.sleep(0.6)
                    yield b"y" * 1000
            self.assertEqual(await c.import_template("t", pieces()), {"n": 5000})

    async def test_cancellation_closes_the_connection(self):
        async def h(req, w):
            await req.body()
            ev = events({"type": "started", "pid": 1})
            w.write(head(200, {"Transfer-Encoding": "chunked"}) + b"%x\r\n" % len(ev) + ev + b"\r\n")
            await w.drain()
            if await req.reader.read() == b"":
                d.closed.set()
        async with FakeDaemon(h) as d:
            started = asyncio.Event()
            task = asyncio.ensure_future(d.client.handle("s").run("x", on_start=lambda pid: started.set()))
            await asyncio.wait_for(started.wait(), 10)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(d.closed.wait(), 10)

    async def test_async_with_cancelled_while_creating(self):
        # The task is cancelled while the daemon creates the sandbox: the
        # client still takes the answer and deletes what was created.
        arrived, cancelled, deleted = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def h(req, w):
            await req.body()
            if req.method == "POST" and req.target == "/v1/sandboxes":
                arrived.set()
                await cancelled.wait()
                out = b'{"id":"sb1","state":"running"}'
                w.write(head(201, {"Content-Length": len(out)}) + out)
            elif req.method == "DELETE" and req.target == "/v1/sandboxes/sb1":
                deleted.set()
                w.write(head(204))
        async with FakeDaemon(h) as d:
            async def body():
                async with d.client.sandbox():
                    await asyncio.sleep(600)
            task = asyncio.ensure_future(body())
            await asyncio.wait_for(arrived.wait(), 10)
            task.cancel()
            cancelled.set()
            with self.assertRaises(asyncio.CancelledError):
                await task
            self.assertTrue(deleted.is_set())

    async def test_truncated_streams(self):
        cases = {
            "no final event": events({"type": "started", "pid": 1}),
            "cut inside a chunk": b"",
            "bad json": b"{not json}\n",
        }
        for name, body in cases.items():
            async def h(req, w, name=name, body=body):
                w.write(head(200, {"Transfer-Encoding": "chunked"}))
                if name == "cut inside a chunk":
                    w.write(b"40\r\n" + events({"type": "started"})[:10])
                else:
                    w.write(chunked(body, [8]))
            async with FakeDaemon(h) as d:
                with self.subTest(name), self.assertRaises(agentbox.StreamTruncated):
                    await d.client.handle("s").process(1).attach()

    async def test_event_line_too_long(self):
        async def h(req, w):
            w.write(head(200, {"Transfer-Encoding": "chunked"}) + chunked(b"{" + b" " * 300 + b"}\n", [50]))
        with mock.patch.object(_http, "MAX_EVENT_LINE", 100), mock.patch.object(_aio_http, "MAX_EVENT_LINE", 100):
            async with FakeDaemon(h) as d:
                with self.assertRaises(agentbox.StreamTruncated) as cm:
                    await d.client.build_template("x")
                self.assertIn("too long", str(cm.exception))

    async def test_bad_status_line(self):
        async def h(req, w):
            w.write(b"SSH-2.0-nope\r\n\r\n")
        async with FakeDaemon(h) as d:
            with self.assertRaises(agentbox.TransportError):
                await d.client.health()

    async def test_calls_run_concurrently(self):
        # Each answer waits until all n requests have arrived: calls sent
        # one after another would never complete.
        n = 8
        arrived = asyncio.Event()

        async def h(req, w):
            if len(d.requests) == n:
                arrived.set()
            await arrived.wait()
            out = b'{"status":"ok"}'
            w.write(head(200, {"Content-Length": len(out)}) + out)
        async with FakeDaemon(h) as d:
            got = await asyncio.wait_for(asyncio.gather(*(d.client.health() for _ in range(n))), 30)
            self.assertEqual(got, [True] * n)


if __name__ == "__main__":
    unittest.main()
