"""The asyncio transport: a small HTTP/1.1 client on asyncio streams.

It sends the same :class:`Call` the blocking transport does (request line
and headers from ``_http.prepare``, errors from errors.py) over
``asyncio.open_unix_connection`` or ``asyncio.open_connection`` (with the
endpoint's ssl context for https). Each call has a connection of its own,
closed when its response is (``Connection: close``), so any number of
coroutines can run calls concurrently on one client and a long exec stream
never holds up another call.

Request bodies are sent with a Content-Length (bytes) or chunked (an
iterable or async iterable of bytes); response bodies are read by
Content-Length, chunked, or to the end of the connection, and can be
streamed; the answer is read while the body is still being sent.
``timeout`` bounds the connect, each piece of the body, and each read.
Cancelling the awaiting task closes the connection at once (the response
is closed in a finally), so the daemon sees the client go.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import ssl
from typing import Any, AsyncIterator, Awaitable, Dict, Optional, Tuple, TypeVar

from . import errors
from ._http import (MAX_ERROR_BODY, MAX_EVENT_LINE, Call, Endpoint, Prepared, decode_event, decode_json,
                    prepare)

T = TypeVar("T")

_READ = 64 << 10
#: Longest status line or header block accepted from the daemon.
_MAX_HEAD = 1 << 20

# What a broken connection raises from asyncio streams.
_NET_ERRORS = (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError,
               ValueError, asyncio.TimeoutError)


class _Protocol(Exception):
    """The daemon's answer is not HTTP/1.1 as this client reads it."""


def _settle(task: "asyncio.Future[Any]") -> None:
    """Stop task, or take its exception so it is not reported as lost."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


class AsyncTransport:
    """Sends API calls to one daemon on asyncio. Safe for concurrent use
    by any number of tasks (of one event loop at a time)."""

    def __init__(self, ep: Endpoint, timeout: Optional[float]) -> None:
        self.ep = ep
        self.host = ep.host
        self.api_key = ep.api_key
        self.timeout = timeout

    async def _wait(self, aw: Awaitable[T]) -> T:
        if self.timeout is None:
            return await aw
        return await asyncio.wait_for(aw, self.timeout)

    async def _open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ep = self.ep
        if ep.socket:
            return await self._wait(asyncio.open_unix_connection(ep.socket, limit=_MAX_HEAD))
        host, port = ep.address()
        if ep.scheme == "https":
            return await self._wait(asyncio.open_connection(host, port, ssl=ep.ssl, server_hostname=host,
                                                            limit=_MAX_HEAD))
        return await self._wait(asyncio.open_connection(host, port, limit=_MAX_HEAD))

    async def send(self, call: "Call[Any]") -> "AsyncResponse":
        """Perform call; returns the open AsyncResponse of a 2xx answer.

        Any other status raises the typed APIError; a failure to connect or
        to read raises TransportError. The caller closes the response
        (``async with``, or aclose()).
        """
        p = prepare(self.ep, call)
        try:
            reader, writer = await self._open()
        except _NET_ERRORS as e:
            raise errors.TransportError(self.host, p.op, e) from e
        resp: Optional[AsyncResponse] = None
        sending: Optional["asyncio.Future[None]"] = None
        heading: Optional["asyncio.Future[AsyncResponse]"] = None
        try:
            # The body goes out while the answer is awaited: the daemon may
            # answer (say 401) without reading a streamed body, and close.
            # The timeout applies to each piece of the body, and to the
            # answer once the body is out.
            self._write_head(writer, p)
            sending = asyncio.ensure_future(self._write_body(writer, p))
            heading = asyncio.ensure_future(self._head(reader, writer, p))
            await asyncio.wait([sending, heading], return_when=asyncio.FIRST_COMPLETED)
            try:
                resp = await self._wait(heading)
            except (_Protocol,) + _NET_ERRORS as e:
                cause: BaseException = e
                if sending.done() and not sending.cancelled() and sending.exception() is not None:
                    cause = sending.exception()  # type: ignore[assignment]
                raise errors.TransportError(self.host, p.op, cause) from cause
            if not 200 <= resp.status <= 299:
                _settle(sending)
                try:
                    raw = await resp.read(MAX_ERROR_BODY)
                except errors.TransportError:
                    raw = b""
                raise errors.error_from_response(resp.status, resp.headers, raw)
            try:
                await sending
            except _NET_ERRORS as e:
                raise errors.TransportError(self.host, p.op, e) from e
            return resp
        except BaseException:
            # Any failure, and cancellation, drops the connection at once.
            for task in (sending, heading):
                if task is not None:
                    _settle(task)
            if resp is not None:
                resp.abort()
            else:
                writer.transport.abort()
            raise

    def _write_head(self, writer: asyncio.StreamWriter, p: Prepared) -> None:
        head = ["%s %s HTTP/1.1" % (p.method, p.target), "Host: " + self.ep.netloc, "Connection: close"]
        head += ["%s: %s" % kv for kv in p.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))

    async def _write_body(self, writer: asyncio.StreamWriter, p: Prepared) -> None:
        if p.body is None:
            pass
        elif not p.chunked:
            writer.write(p.body)  # type: ignore[arg-type]
        elif hasattr(p.body, "__aiter__"):
            async for chunk in p.body:  # type: ignore[union-attr]
                await self._chunk(writer, chunk)
        else:
            for chunk in p.body:  # type: ignore[union-attr]
                await self._chunk(writer, chunk)
        if p.chunked:
            writer.write(b"0\r\n\r\n")
        await self._wait(writer.drain())

    async def _chunk(self, writer: asyncio.StreamWriter, chunk: bytes) -> None:
        if chunk:
            writer.write(b"%x\r\n" % len(chunk))
            writer.write(bytes(chunk))
            writer.write(b"\r\n")
            await self._wait(writer.drain())

    async def _head(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    p: Prepared) -> "AsyncResponse":
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            line, _, rest = raw.partition(b"\r\n")
            parts = line.decode("latin-1").split(None, 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise _Protocol("bad status line %r" % line[:100])
            status = int(parts[1])
            headers = http.client.parse_headers(io.BytesIO(rest))
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and other interim answers
            return AsyncResponse(self, p, reader, writer, status, headers)

    async def do(self, call: "Call[T]") -> T:
        """send, then decode the JSON answer with call.decode."""
        async with await self.send(call) as r:
            return call.decode(await r.json())


class AsyncResponse:
    """An open response; an async context manager that closes its
    connection. read() / read1() / iter_chunks() / events() read its body."""

    def __init__(self, t: AsyncTransport, p: Prepared, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, status: int, headers: http.client.HTTPMessage) -> None:
        self._t, self._r, self._w = t, reader, writer
        self.host, self.op = t.host, p.op
        self.status = status
        self.headers = headers
        self._buf = bytearray()  # body bytes read ahead by readline
        self._eof = p.method == "HEAD" or status in (204, 304)
        te = (headers.get("Transfer-Encoding") or "").lower()
        self._chunked = "chunked" in te
        self._chunk_left = 0
        self._left: Optional[int] = None  # bytes of a Content-Length body still to read
        if not self._chunked and headers.get("Content-Length") is not None:
            try:
                self._left = int(headers.get("Content-Length") or "0")
            except ValueError:
                self._left = None
            if self._left == 0:
                self._eof = True

    async def __aenter__(self) -> "AsyncResponse":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def abort(self) -> None:
        """Drop the connection now (no goodbye)."""
        self._w.transport.abort()

    async def aclose(self) -> None:
        """Close the connection. Safe to call again."""
        self.abort()

    def _fail(self, e: BaseException) -> errors.TransportError:
        return errors.TransportError(self.host, self.op, e)

    async def _piece(self, n: int) -> bytes:
        """Up to n bytes of the body off the wire; b"" at its end."""
        if self._eof:
            return b""
        wait = self._t._wait
        if self._chunked:
            if self._chunk_left == 0:
                line = await wait(self._r.readline())
                if not line.endswith(b"\n"):
                    raise EOFError("connection closed in the chunked body")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise _Protocol("bad chunk size line %r" % line[:40]) from None
                if size == 0:
                    while True:  # trailers, up to the blank line
                        tl = await wait(self._r.readline())
                        if tl in (b"\r\n", b"\n", b""):
                            break
                    self._eof = True
                    return b""
                self._chunk_left = size
            data = await wait(self._r.read(min(n, self._chunk_left)))
            if not data:
                raise EOFError("connection closed in a chunk")
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await wait(self._r.readexactly(2))
            return data
        if self._left is not None:
            data = await wait(self._r.read(min(n, self._left)))
            if not data:
                raise EOFError("connection closed with %d bytes of the body unread" % self._left)
            self._left -= len(data)
            if self._left == 0:
                self._eof = True
            return data
        data = await wait(self._r.read(n))
        if not data:
            self._eof = True
        return data

    async def read1(self, n: int = _READ) -> bytes:
        """Up to n bytes of the body, as soon as some are there; b"" at its end."""
        if self._buf:
            data = bytes(self._buf[:n])
            del self._buf[:n]
            return data
        try:
            return await self._piece(n)
        except (_Protocol,) + _NET_ERRORS as e:
            raise self._fail(e) from e

    async def read(self, n: int = -1) -> bytes:
        """The rest of the body (at most n bytes when n >= 0)."""
        out = bytearray()
        while n < 0 or len(out) < n:
            b = await self.read1(_READ if n < 0 else min(_READ, n - len(out)))
            if not b:
                break
            out += b
        return bytes(out)

    async def json(self) -> Any:
        return decode_json(await self.read(), self.host, self.op)

    async def iter_chunks(self, size: int = _READ) -> AsyncIterator[bytes]:
        """The body in pieces of up to size bytes, as they arrive."""
        while True:
            b = await self.read1(size)
            if not b:
                return
            yield b

    async def _readline(self, limit: int) -> bytes:
        """The next line of the body with its newline, or the rest at its
        end; limit+1 bytes when the line is longer than limit."""
        scanned = 0
        while True:
            i = self._buf.find(b"\n", scanned)
            if i >= 0 or len(self._buf) > limit:
                end = i + 1 if 0 <= i < limit + 1 else limit + 1
                line = bytes(self._buf[:end])
                del self._buf[:end]
                return line
            scanned = len(self._buf)
            more = await self._piece(_READ)
            if not more:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += more

    async def events(self) -> AsyncIterator[Dict[str, Any]]:
        """The NDJSON events of a stream, one per non-empty line.

        Raises StreamTruncated when the stream breaks off (a cut-off line,
        a lost connection); a clean end of stream simply stops.
        """
        while True:
            try:
                line = await self._readline(MAX_EVENT_LINE)
            except (_Protocol,) + _NET_ERRORS as e:
                raise errors.StreamTruncated(self.host, self.op, e) from e
            if not line:
                return
            ev = decode_event(line, self.host, self.op)
            if ev is not None:
                yield ev
