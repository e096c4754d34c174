"""Tests of the SDK that need no daemon: configuration and error decoding."""

import inspect
import os
import typing
import unittest
from unittest import mock

import agentbox
from agentbox import errors
from agentbox._http import Endpoint


class TestConfig(unittest.TestCase):
    def test_env(self):
        env = {"AGENTBOX_HOST": "http://127.0.0.1:9", "AGENTBOX_API_KEY": "k1", "AGENTBOX_CA_CERT": ""}
        with mock.patch.dict(os.environ, env):
            c = agentbox.Client()
            self.assertEqual(c.host, "http://127.0.0.1:9")
            self.assertEqual(c._t.api_key, "k1")
            self.assertEqual(agentbox.Client(api_key="").host, "http://127.0.0.1:9")
            self.assertEqual(agentbox.Client(api_key="")._t.api_key, "")

    def test_default_host(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(agentbox.Client().host, agentbox.DEFAULT_HOST)

    def test_hosts(self):
        ep = Endpoint("unix:///x.sock", "", None)
        self.assertEqual(ep.socket, "/x.sock")
        ep = Endpoint("https://h:8443/prefix/", "", None)
        self.assertEqual((ep.scheme, ep.netloc, ep.prefix, ep.address()), ("https", "h:8443", "/prefix", ("h", 8443)))
        ep = Endpoint("h:80", "", None)
        self.assertEqual((ep.scheme, ep.netloc, ep.address()), ("http", "h:80", ("h", 80)))
        self.assertEqual(Endpoint("https://[::1]", "", None).address(), ("::1", 443))
        for bad in ("unix://", "ftp://h", "http://"):
            with self.assertRaises(ValueError, msg=bad):
                Endpoint(bad, "", None)
            with self.assertRaises(ValueError, msg=bad):
                agentbox.AsyncClient(bad)

    def test_async_env(self):
        env = {"AGENTBOX_HOST": "http://127.0.0.1:9", "AGENTBOX_API_KEY": "k1", "AGENTBOX_CA_CERT": ""}
        with mock.patch.dict(os.environ, env):
            c = agentbox.AsyncClient()
            self.assertEqual((c.host, c._t.api_key), ("http://127.0.0.1:9", "k1"))
            self.assertEqual(agentbox.AsyncClient(api_key="")._t.api_key, "")

    def test_unreachable(self):
        c = agentbox.Client("unix:///nonexistent/agentbox.sock")
        with self.assertRaises(agentbox.TransportError) as cm:
            c.list()
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertIn("GET /sandboxes", str(cm.exception))


class TestErrors(unittest.TestCase):
    def test_by_code(self):
        body = b'{"code":"not_found","message":"no sandbox x","request_id":"r1"}'
        e = errors.error_from_response(404, {}, body)
        self.assertIsInstance(e, agentbox.NotFound)
        self.assertEqual((e.status, e.code, e.message, e.request_id), (404, "not_found", "no sandbox x", "r1"))
        e = errors.error_from_response(409, {}, b'{"code":"already_exists","message":"m"}')
        self.assertIsInstance(e, agentbox.AlreadyExists)
        self.assertIsInstance(e, agentbox.Conflict)

    def test_status_fallback_and_retry_after(self):
        e = errors.error_from_response(429, {"Retry-After": "7", "X-Request-Id": "r2"}, b"slow down")
        self.assertIsInstance(e, agentbox.QuotaExceeded)
        self.assertEqual((e.retry_after, e.request_id, e.message), (7.0, "r2", "slow down"))
        self.assertIsNone(errors.parse_retry_after("0"))
        self.assertIsNone(errors.parse_retry_after("garbage"))
        self.assertIsNone(errors.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"))
        self.assertGreater(errors.parse_retry_after("Wed, 21 Oct 2099 07:28:00 GMT"), 0)

    def test_stream_error(self):
        e = errors.error_from_event({"code": "not_found", "message": "m", "reason": "command_not_found"})
        self.assertIsInstance(e, agentbox.NotFound)
        self.assertEqual((e.status, e.reason), (0, agentbox.REASON_COMMAND_NOT_FOUND))


# The blocking classes and their asyncio twins.
PAIRS = ((agentbox.Client, agentbox.AsyncClient), (agentbox.Sandbox, agentbox.AsyncSandbox),
         (agentbox.Process, agentbox.AsyncProcess))
# Methods that do no I/O: plain functions on both sides.
NO_IO = {"sandbox", "handle", "process"}


def public_methods(cls):
    """name -> function of cls's public methods, inherited ones included."""
    out = {}
    for c in reversed(cls.__mro__):
        if not c.__module__.startswith("agentbox"):
            continue
        for n, v in vars(c).items():
            if not n.startswith("_") and inspect.isfunction(v):
                out[n] = v
    return out


class TestCoverage(unittest.TestCase):
    def check_called(self, classes, test_file):
        # Every public method is called in test_file (as ".name(", or
        # handed on as ".name,").
        with open(os.path.join(os.path.dirname(__file__), test_file)) as f:
            tests = f.read()
        missing = [cls.__name__ + "." + name for cls in classes for name in public_methods(cls)
                   if "." + name + "(" not in tests and "." + name + "," not in tests]
        self.assertEqual(missing, [], "methods no test in %s calls" % test_file)

    def test_every_public_method_is_called_by_a_daemon_test(self):
        self.check_called([p[0] for p in PAIRS], "test_daemon.py")

    def test_every_async_method_is_called_by_an_async_daemon_test(self):
        self.check_called([p[1] for p in PAIRS], "test_daemon_async.py")


class TestAsyncMirror(unittest.TestCase):
    """The asyncio classes mirror the blocking ones method for method."""

    def test_same_methods_and_parameters(self):
        for sync_cls, async_cls in PAIRS:
            s, a = public_methods(sync_cls), public_methods(async_cls)
            self.assertEqual(sorted(set(s) - set(a)), [], "%s lacks" % async_cls.__name__)
            self.assertEqual(sorted(set(a) - set(s)), [], "%s has extra" % async_cls.__name__)
            for name in s:
                with self.subTest(cls=async_cls.__name__, method=name):
                    ps = inspect.signature(s[name]).parameters
                    pa = inspect.signature(a[name]).parameters
                    self.assertEqual([(p.name, p.kind, p.default) for p in ps.values()],
                                     [(p.name, p.kind, p.default) for p in pa.values()])

    def test_async_methods_are_coroutines(self):
        for _, async_cls in PAIRS:
            for name, fn in public_methods(async_cls).items():
                with self.subTest(cls=async_cls.__name__, method=name):
                    native = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
                    self.assertEqual(native, name not in NO_IO)

    def test_type_hints_throughout(self):
        for cls in [c for pair in PAIRS for c in pair]:
            for name, fn in public_methods(cls).items():
                with self.subTest(cls=cls.__name__, method=name):
                    hints = typing.get_type_hints(fn)
                    self.assertIn("return", hints)
                    for p in list(inspect.signature(fn).parameters)[1:]:
                        if p not in ("options", "spec", "action"):
                            self.assertIn(p, hints)

    def test_no_threads(self):
        # The asyncio client is native: it never hands a call to a thread
        # pool (only local file reads and tar packing run off the loop).
        src = ""
        for mod in ("aio", "aio_ops", "_aio_http"):
            with open(os.path.join(os.path.dirname(agentbox.__file__), mod + ".py")) as f:
                src += f.read()
        for banned in ("run_in_executor", "to_thread", "http.client.HTTPConnection", "threading"):
            self.assertNotIn(banned, src)


if __name__ == "__main__":
    unittest.main()
