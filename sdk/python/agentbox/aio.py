"""AsyncClient: the SDK on asyncio.

Every method of Client, Sandbox and Process is available as a coroutine of
the same name and arguments on AsyncClient, AsyncSandbox and AsyncProcess.
Each call runs the synchronous implementation in the loop's default thread
executor (one connection per call, so calls run concurrently); the event
loop is never blocked.

Cancellation: cancelling the awaiting task shuts the call's connection down
at once, so the worker thread is freed and the daemon sees the client go
(an exec stream's command keeps running in the sandbox, as after any lost
connection; kill it through a Process handle if needed). ``async with``
deletes the sandbox on exit, also when the body raised or was cancelled.

Streaming callbacks (on_stdout, on_stderr, on_start, progress) are called
on the event loop's thread, in order, before the awaited call returns; a
callback may be a plain function or a coroutine function (then it is
scheduled as a task).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import socket
from typing import Any, Callable, Dict, List, Optional

from ._http import _active
from .client import Client
from .sandbox import Process, Sandbox

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncProcess"]

_CALLBACKS = ("on_stdout", "on_stderr", "on_start", "progress")


def _wrap(v: Any) -> Any:
    if isinstance(v, Sandbox):
        return AsyncSandbox(v)
    if isinstance(v, Process):
        return AsyncProcess(v)
    if isinstance(v, list) and v and isinstance(v[0], Sandbox):
        return [AsyncSandbox(s) for s in v]
    return v


def _on_loop(loop: asyncio.AbstractEventLoop, cb: Callable[..., Any]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        if inspect.iscoroutinefunction(cb):
            loop.call_soon_threadsafe(lambda: loop.create_task(cb(*args)))
        else:
            loop.call_soon_threadsafe(cb, *args)
    return call


def _shutdown(conns: List[Any]) -> None:
    for c in list(conns):
        sock = getattr(c, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


async def _call(fn: Callable[..., Any], *args: Any, _cancellable: bool = True, **kw: Any) -> Any:
    loop = asyncio.get_running_loop()
    for k in _CALLBACKS:
        if kw.get(k) is not None:
            kw[k] = _on_loop(loop, kw[k])
    conns: List[Any] = []

    def run() -> Any:
        _active.set(conns)
        return fn(*args, **kw)

    ctx = contextvars.copy_context()
    fut = loop.run_in_executor(None, functools.partial(ctx.run, run))
    try:
        return _wrap(await asyncio.shield(fut) if not _cancellable else await fut)
    except asyncio.CancelledError:
        if _cancellable:
            _shutdown(conns)
        raise


class _Proxy:
    _sync: Any

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if name.startswith("_") or not callable(attr):
            return attr

        @functools.wraps(attr)
        async def method(*args: Any, **kw: Any) -> Any:
            return await _call(attr, *args, **kw)
        return method


class AsyncProcess(_Proxy):
    """Process on asyncio: ``await p.attach()``, ``await p.kill()``, ..."""

    def __init__(self, p: Process) -> None:
        self._sync = p
        self.pid = p.pid
        self.info = p.info

    @property
    def sandbox(self) -> "AsyncSandbox":
        return AsyncSandbox(self._sync.sandbox)

    def __repr__(self) -> str:
        return "Async" + repr(self._sync)


class AsyncSandbox(_Proxy):
    """Sandbox on asyncio: ``await sb.run(...)``; ``async with`` deletes it."""

    def __init__(self, sb: Sandbox) -> None:
        self._sync = sb
        self.id = sb.id

    @property
    def info(self) -> Dict[str, Any]:
        return self._sync.info

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def state(self) -> str:
        return self._sync.state

    @property
    def sync(self) -> Sandbox:
        """The synchronous Sandbox behind this one."""
        return self._sync

    def process(self, pid: int) -> AsyncProcess:
        return AsyncProcess(self._sync.process(pid))

    def __repr__(self) -> str:
        return "Async" + repr(self._sync)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # Not cancellable: the sandbox is deleted even when the task was.
        await _call(self._sync.delete, missing_ok=True, _cancellable=False)


class _Creating:
    """What AsyncClient.sandbox returns: await it, or use it in async with."""

    def __init__(self, client: Client, args: Any, kw: Dict[str, Any]) -> None:
        self._c, self._args, self._kw = client, args, kw
        self._sb: Optional[AsyncSandbox] = None

    def __await__(self) -> Any:
        return _call(self._c.create, *self._args, **self._kw).__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sb = await _call(self._c.create, *self._args, **self._kw)
        return self._sb

    async def __aexit__(self, *exc: Any) -> None:
        if self._sb is not None:
            await self._sb.__aexit__(*exc)


class AsyncClient(_Proxy):
    """Client on asyncio; takes Client's arguments (and reads the same
    environment). Every Client method is a coroutine here::

        async with AsyncClient().sandbox(template="busybox") as sb:
            res = await sb.run("echo hi")
    """

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, **kw: Any) -> None:
        self._sync = Client(host, api_key, **kw)

    @property
    def host(self) -> str:
        return self._sync.host

    @property
    def sync(self) -> Client:
        """The synchronous Client behind this one."""
        return self._sync

    def sandbox(self, template: Optional[str] = None, **spec: Any) -> _Creating:
        """Create a sandbox: ``async with client.sandbox(...) as sb`` deletes
        it on exit; ``sb = await client.sandbox(...)`` does not."""
        return _Creating(self._sync, (template,), spec)

    def handle(self, id_or_name: str) -> AsyncSandbox:
        return AsyncSandbox(self._sync.handle(id_or_name))

    def __repr__(self) -> str:
        return "AsyncClient(host=%r)" % self.host
