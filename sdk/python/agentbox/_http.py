"""The transport-independent half of the HTTP client, and the blocking transport.

What both clients share lives here: the daemon address (:class:`Endpoint`),
the description of one API call (:class:`Call`: method, path, query, body
and how to decode the JSON answer), the request line and headers built from
it (:func:`prepare`), and the NDJSON event decoding of streams. The
blocking :class:`Transport` sends a Call with http.client; the asyncio one
(``_aio_http.py``) sends the same Call over asyncio streams. Error mapping is
errors.py's, for both.

The blocking transport opens a connection per call, so a Client is safe to
use from several threads at once and a long exec stream never blocks
another call.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import urllib.parse
from typing import (Any, AsyncIterable, Callable, Dict, Generic, Iterable, Iterator, List, Mapping,
                    Optional, Tuple, TypeVar, Union)

from . import errors

API_VERSION = "v1"
DEFAULT_HOST = "unix:///run/agentbox/agentbox.sock"
ENV_HOST = "AGENTBOX_HOST"
ENV_API_KEY = "AGENTBOX_API_KEY"
ENV_CA_CERT = "AGENTBOX_CA_CERT"
USER_AGENT = "agentbox-python/" + API_VERSION

#: Maximum length of one NDJSON event line (as the Go SDK).
MAX_EVENT_LINE = 8 << 20
#: How much of an error response is read for its message.
MAX_ERROR_BODY = 4 << 20

#: A request body: bytes (sent with a Content-Length), or an iterable of
#: bytes (sent chunked; the asyncio transport also takes an async iterable).
Body = Union[None, bytes, Iterable[bytes], AsyncIterable[bytes]]
Query = Optional[Mapping[str, Union[str, int, float, bool, List[str]]]]

T = TypeVar("T")


def _obj(d: Any) -> Dict[str, Any]:
    return d or {}


def _none(d: Any) -> None:
    return None


def field(key: str) -> Callable[[Any], List[Dict[str, Any]]]:
    """A decoder that takes the list under key of a JSON object (or [])."""
    def decode(d: Any) -> List[Dict[str, Any]]:
        return list((d or {}).get(key) or [])
    return decode


class Call(Generic[T]):
    """One API call, independent of the transport that sends it.

    decode turns the JSON answer (None when empty) into the call's result;
    the default gives a dict ({} for an empty answer). A Call for a
    streamed answer (exec, files, builds) is sent with Transport.send and
    its decode is not used.
    """

    __slots__ = ("method", "path", "query", "json_body", "body", "content_type", "headers", "decode")

    def __init__(self, method: str, path: str, *, query: Query = None, json_body: Any = None,
                 body: Body = None, content_type: str = "", headers: Optional[Dict[str, str]] = None,
                 decode: Callable[[Any], T] = _obj) -> None:  # type: ignore[assignment]
        self.method, self.path, self.query = method, path, query
        self.json_body, self.body, self.content_type = json_body, body, content_type
        self.headers, self.decode = headers, decode

    @property
    def op(self) -> str:
        """The call as errors name it, e.g. "GET /sandboxes"."""
        return "%s %s" % (self.method, self.path)

    def __repr__(self) -> str:
        return "Call(%s)" % self.op


def fmt_query(query: Query) -> str:
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


class Endpoint:
    """A daemon address: unix://path, http://host:port[/prefix],
    https://host:port[/prefix] or a bare host:port (http)."""

    def __init__(self, host: Optional[str], api_key: Optional[str], ca_cert: Optional[str]) -> None:
        host = host or DEFAULT_HOST
        self.host = host
        self.api_key = api_key or ""
        self.ca_cert = ca_cert
        self.socket = ""
        self.ssl: Optional[ssl.SSLContext] = None
        if host.startswith("unix://"):
            self.socket = host[len("unix://"):]
            if not self.socket:
                raise ValueError("agentbox: host %r: empty socket path" % host)
            self.scheme, self.netloc, self.prefix = "http", "agentbox", ""
        elif host.startswith("http://") or host.startswith("https://"):
            u = urllib.parse.urlsplit(host)
            if not u.netloc:
                raise ValueError("agentbox: host %r has no address" % host)
            self.scheme, self.netloc, self.prefix = u.scheme, u.netloc, u.path.rstrip("/")
            if u.scheme == "https":
                self.ssl = ssl.create_default_context(cafile=ca_cert) if ca_cert else ssl.create_default_context()
        elif "://" in host:
            raise ValueError("agentbox: host %r: unsupported scheme (want unix://, http:// or https://)" % host)
        else:
            self.scheme, self.netloc, self.prefix = "http", host, ""

    def address(self) -> Tuple[str, int]:
        """The (host, port) of a TCP endpoint."""
        u = urllib.parse.urlsplit("//" + self.netloc)
        return u.hostname or "", u.port or (443 if self.scheme == "https" else 80)


class Prepared:
    """A Call made concrete: the request target, headers and body."""

    __slots__ = ("method", "target", "headers", "body", "chunked", "op")

    def __init__(self, method: str, target: str, headers: Dict[str, str], body: Body,
                 chunked: bool, op: str) -> None:
        self.method, self.target, self.headers = method, target, headers
        self.body, self.chunked, self.op = body, chunked, op


def prepare(ep: Endpoint, call: "Call[Any]") -> Prepared:
    """The request of call to ep: versioned path, auth and body headers."""
    target = ep.prefix + "/" + API_VERSION + call.path + fmt_query(call.query)
    hdrs = {"Agentbox-Version": API_VERSION, "User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if ep.api_key:
        hdrs["Authorization"] = "Bearer " + ep.api_key
    if call.headers:
        hdrs.update(call.headers)
    body, content_type, chunked = call.body, call.content_type, False
    if call.json_body is not None:
        body = json.dumps(call.json_body).encode("utf-8")
        content_type = "application/json"
    if body is not None:
        if content_type:
            hdrs["Content-Type"] = content_type
        if isinstance(body, (bytes, bytearray, memoryview)):
            body = bytes(body)
            hdrs["Content-Length"] = str(len(body))
        else:
            hdrs["Transfer-Encoding"] = "chunked"
            chunked = True
    elif call.method in ("POST", "PUT", "PATCH"):
        hdrs["Content-Length"] = "0"
    return Prepared(call.method, target, hdrs, body, chunked, call.op)


def decode_json(data: bytes, host: str, op: str) -> Any:
    """The JSON value of a response body; None when it is empty."""
    if not data.strip():
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise errors.TransportError(host, op, ValueError("decoding response: %s" % e)) from e


def decode_event(line: bytes, host: str, op: str) -> Optional[Dict[str, Any]]:
    """The event of one NDJSON line read with a limit of MAX_EVENT_LINE+1
    bytes; None for a blank line or a non-object. A line over the limit or
    one that is not JSON is a StreamTruncated."""
    if len(line) > MAX_EVENT_LINE:
        raise errors.StreamTruncated(host, op, ValueError("event line too long"))
    if not line.strip():
        return None
    try:
        ev = json.loads(line.decode("utf-8"))
    except ValueError as e:
        raise errors.StreamTruncated(host, op, ValueError("decoding stream event: %s" % e)) from e
    return ev if isinstance(ev, dict) else None


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


class Transport:
    """Sends API calls to one daemon, blocking. Safe for concurrent use."""

    def __init__(self, host: Optional[str], api_key: Optional[str], ca_cert: Optional[str],
                 timeout: Optional[float]) -> None:
        self.ep = Endpoint(host, api_key, ca_cert)
        self.host = self.ep.host
        self.api_key = self.ep.api_key
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPConnection:
        ep = self.ep
        if ep.socket:
            return _UnixConnection(ep.socket, self.timeout)
        if ep.scheme == "https":
            return http.client.HTTPSConnection(ep.netloc, timeout=self.timeout, context=ep.ssl)
        return http.client.HTTPConnection(ep.netloc, timeout=self.timeout)

    def send(self, call: "Call[Any]") -> "Response":
        """Perform call; returns the open Response of a 2xx answer.

        Any other status raises the typed APIError; a failure to connect
        or to read raises TransportError. The caller closes the Response.
        """
        p = prepare(self.ep, call)
        conn = self._connect()
        try:
            try:
                conn.request(p.method, p.target, body=p.body, headers=p.headers,  # type: ignore[arg-type]
                             encode_chunked=p.chunked)
            except OSError as e:
                # The daemon may answer (say 401) without reading a streamed
                # body and hang up while it is sent: its answer is still there.
                if not conn.sock:
                    raise
                try:
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    raise e from None
                if 200 <= resp.status <= 299:
                    raise e
            else:
                resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise errors.TransportError(self.host, p.op, e) from e
        if not 200 <= resp.status <= 299:
            try:
                raw = resp.read(MAX_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                conn.close()
            raise errors.error_from_response(resp.status, resp.headers, raw)
        return Response(self.host, p.op, conn, resp)

    def do(self, call: "Call[T]") -> T:
        """send, then decode the JSON answer with call.decode."""
        with self.send(call) as r:
            return call.decode(r.json())


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
        return decode_json(self.read(), self.host, self.op)

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
            ev = decode_event(line, self.host, self.op)
            if ev is not None:
                yield ev


def env_config() -> Tuple[str, str, Optional[str]]:
    """(host, api_key, ca_cert) from the environment, as the Go SDK reads them."""
    return (os.environ.get(ENV_HOST) or DEFAULT_HOST, os.environ.get(ENV_API_KEY, ""),
            os.environ.get(ENV_CA_CERT) or None)
