"""The HTTP transport: one daemon, over a unix socket, http or https.

Each call opens its own connection (http.client), so a Client is safe to use
from several threads at once and a long exec stream never blocks another
call. The connection of a call in progress is registered in the
``_active`` context variable when one is set, so that the asyncio wrapper can
close it to cancel the call.
"""

from __future__ import annotations

import contextvars
import http.client
import json
import os
import socket
import ssl
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from . import errors

API_VERSION = "v1"
DEFAULT_HOST = "unix:///run/agentbox/agentbox.sock"
ENV_HOST = "AGENTBOX_HOST"
ENV_API_KEY = "AGENTBOX_API_KEY"
ENV_CA_CERT = "AGENTBOX_CA_CERT"
USER_AGENT = "agentbox-python/" + API_VERSION

#: Maximum length of one NDJSON event line (as the Go SDK).
MAX_EVENT_LINE = 8 << 20

Body = Union[None, bytes, Iterable[bytes]]
Query = Optional[Mapping[str, Union[str, int, float, bool, List[str]]]]

# _active, when set, is a list the transport appends the connection of the
# call in progress to (see aio.py).
_active: contextvars.ContextVar[Optional[List[http.client.HTTPConnection]]] = contextvars.ContextVar(
    "agentbox_active_connections", default=None)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("agentbox", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.timeout is not None:
                s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _fmt_query(query: Query) -> str:
    if not query:
        return ""
    pairs: List[Tuple[str, str]] = []
    for k, v in query.items():
        vals = v if isinstance(v, list) else [v]
        for item in vals:
            if isinstance(item, bool):
                item = "true" if item else "false"
            pairs.append((k, str(item)))
    return "?" + urllib.parse.urlencode(pairs)


def quote(segment: str) -> str:
    """Escape one path segment (an id, a name)."""
    return urllib.parse.quote(str(segment), safe="")


class Transport:
    """Sends API requests to one daemon. Safe for concurrent use."""

    def __init__(self, host: Optional[str], api_key: Optional[str], ca_cert: Optional[str],
                 timeout: Optional[float]) -> None:
        host = host or DEFAULT_HOST
        self.host = host
        self.api_key = api_key or ""
        self.timeout = timeout
        self._socket = ""
        self._ssl: Optional[ssl.SSLContext] = None
        if host.startswith("unix://"):
            self._socket = host[len("unix://"):]
            if not self._socket:
                raise ValueError("agentbox: host %r: empty socket path" % host)
            self._scheme, self._netloc, self._prefix = "http", "agentbox", ""
        elif host.startswith("http://") or host.startswith("https://"):
            u = urllib.parse.urlsplit(host)
            if not u.netloc:
                raise ValueError("agentbox: host %r has no address" % host)
            self._scheme, self._netloc, self._prefix = u.scheme, u.netloc, u.path.rstrip("/")
            if u.scheme == "https":
                self._ssl = ssl.create_default_context(cafile=ca_cert) if ca_cert else ssl.create_default_context()
        elif "://" in host:
            raise ValueError("agentbox: host %r: unsupported scheme (want unix://, http:// or https://)" % host)
        else:
            self._scheme, self._netloc, self._prefix = "http", host, ""

    def _connect(self) -> http.client.HTTPConnection:
        if self._socket:
            return _UnixConnection(self._socket, self.timeout)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._netloc, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self._netloc, timeout=self.timeout)

    def send(self, method: str, path: str, *, query: Query = None, json_body: Any = None,
             body: Body = None, content_type: str = "", headers: Optional[Dict[str, str]] = None
             ) -> "Response":
        """Perform a request; returns the open Response of a 2xx answer.

        Any other status raises the typed APIError; a failure to connect
        or to read raises TransportError. The caller closes the Response.
        """
        op = "%s %s" % (method, path)
        target = self._prefix + "/" + API_VERSION + path + _fmt_query(query)
        hdrs = {"Agentbox-Version": API_VERSION, "User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if self.api_key:
            hdrs["Authorization"] = "Bearer " + self.api_key
        if headers:
            hdrs.update(headers)
        chunked = False
        if json_body is not None:
            body = json.dumps(json_body).encode("utf-8")
            content_type = "application/json"
        if body is not None:
            if content_type:
                hdrs["Content-Type"] = content_type
            if isinstance(body, (bytes, bytearray, memoryview)):
                hdrs["Content-Length"] = str(len(body))
            else:
                hdrs["Transfer-Encoding"] = "chunked"
                chunked = True
        elif method in ("POST", "PUT", "PATCH"):
            hdrs["Content-Length"] = "0"
        conn = self._connect()
        active = _active.get()
        if active is not None:
            active.append(conn)
        try:
            conn.request(method, target, body=body, headers=hdrs, encode_chunked=chunked)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise errors.TransportError(self.host, op, e) from e
        if not 200 <= resp.status <= 299:
            try:
                raw = resp.read(4 << 20)
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                conn.close()
            raise errors.error_from_response(resp.status, resp.headers, raw)
        return Response(self.host, op, conn, resp)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """send, then decode the JSON answer (None when empty)."""
        with self.send(method, path, **kw) as r:
            return r.json()


class Response:
    """An open 2xx response; a context manager that closes its connection."""

    def __init__(self, host: str, op: str, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        self.host, self.op, self._conn, self.raw = host, op, conn, resp
        self.status = resp.status
        self.headers = resp.headers

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def _fail(self, e: BaseException) -> errors.TransportError:
        return errors.TransportError(self.host, self.op, e)

    def read(self, n: int = -1) -> bytes:
        try:
            return self.raw.read() if n < 0 else self.raw.read(n)
        except (OSError, http.client.HTTPException) as e:
            raise self._fail(e) from e

    def json(self) -> Any:
        data = self.read()
        if not data.strip():
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError as e:
            raise self._fail(ValueError("decoding response: %s" % e)) from e

    def iter_chunks(self, size: int = 64 << 10) -> Iterator[bytes]:
        while True:
            b = self.read1(size)
            if not b:
                return
            yield b

    def read1(self, size: int) -> bytes:
        try:
            return self.raw.read1(size)
        except (OSError, http.client.HTTPException) as e:
            raise self._fail(e) from e

    def events(self) -> Iterator[Dict[str, Any]]:
        """Yield the NDJSON events of a stream, one per non-empty line.

        Raises StreamTruncated when the stream breaks off (a cut-off line,
        a lost connection); a clean end of stream simply stops.
        """
        while True:
            try:
                line = self.raw.readline(MAX_EVENT_LINE + 1)
            except (OSError, http.client.HTTPException) as e:
                raise errors.StreamTruncated(self.host, self.op, e) from e
            if not line:
                return
            if len(line) > MAX_EVENT_LINE:
                raise errors.StreamTruncated(self.host, self.op, ValueError("event line too long"))
            if not line.strip():
                continue
            try:
                ev = json.loads(line.decode("utf-8"))
            except ValueError as e:
                raise errors.StreamTruncated(self.host, self.op, ValueError("decoding stream event: %s" % e)) from e
            if isinstance(ev, dict):
                yield ev


def env_config() -> Tuple[str, str, Optional[str]]:
    """(host, api_key, ca_cert) from the environment, as the Go SDK reads them."""
    return (os.environ.get(ENV_HOST) or DEFAULT_HOST, os.environ.get(ENV_API_KEY, ""),
            os.environ.get(ENV_CA_CERT) or None)
