"""Tests of the SDK that need no daemon: configuration and error decoding."""

import os
import unittest
from unittest import mock

import agentbox
from agentbox import errors
from agentbox._http import Transport


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
        t = Transport("unix:///x.sock", "", None, None)
        self.assertEqual(t._socket, "/x.sock")
        t = Transport("https://h:8443/prefix/", "", None, None)
        self.assertEqual((t._scheme, t._netloc, t._prefix), ("https", "h:8443", "/prefix"))
        t = Transport("h:80", "", None, None)
        self.assertEqual((t._scheme, t._netloc), ("http", "h:80"))
        for bad in ("unix://", "ftp://h", "http://"):
            with self.assertRaises(ValueError, msg=bad):
                Transport(bad, "", None, None)

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


class TestCoverage(unittest.TestCase):
    def test_every_public_method_is_called_by_a_daemon_test(self):
        # Every public method of Client, Sandbox and Process is called in
        # test_daemon.py (as ".name(", or handed on as ".name,").
        with open(os.path.join(os.path.dirname(__file__), "test_daemon.py")) as f:
            tests = f.read()
        missing = []
        for cls in (agentbox.Client, agentbox.Sandbox, agentbox.Process):
            names = {n: v for c in cls.__mro__ if c.__module__.startswith("agentbox")
                     for n, v in vars(c).items()}
            for name, v in names.items():
                if name.startswith("_") or not callable(v):
                    continue
                if "." + name + "(" not in tests and "." + name + "," not in tests:
                    missing.append(cls.__name__ + "." + name)
        self.assertEqual(missing, [], "methods no daemon test calls")


if __name__ == "__main__":
    unittest.main()
