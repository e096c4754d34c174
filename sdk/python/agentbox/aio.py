"""AsyncClient: the SDK on asyncio, natively.

AsyncClient, AsyncSandbox and AsyncProcess have every method of Client,
Sandbox and Process, with the same names, parameters and results, as
coroutines (``export_usage`` is an async iterator). They send the same
requests (built once, in _api.py) over asyncio streams (_aio_http.py): no
threads, one connection per call, so any number of tasks can run commands
on one client at once.

Streaming callbacks (on_stdout, on_stderr, on_start, progress) may be plain
functions or coroutine functions; they are called (and awaited) on the
loop, in order, before the call returns. Cancelling a task closes its
call's connection at once: a command it ran keeps running in the sandbox,
as after any lost connection (give run a timeout, or kill the process).
``async with client.sandbox(...) as sb`` deletes the sandbox on exit, also
when the body raised or was cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, Dict, Generator, List, Optional, Union

from . import _api as api
from ._aio_http import AsyncTransport
from ._http import Endpoint, env_config
from ._model import build_done, build_truncated
from .aio_ops import AsyncOperations
from .aio_sandbox import AsyncProcess, AsyncSandbox

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncProcess"]


class _Creating(Awaitable[AsyncSandbox]):
    """What AsyncClient.sandbox returns: await it for a sandbox, or use it
    in ``async with``, which deletes the sandbox on exit."""

    def __init__(self, create: Callable[[], Awaitable[AsyncSandbox]]) -> None:
        self._create = create
        self._sb: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._create().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        # Cancelled while the daemon creates it, the sandbox would be made
        # with no one to delete it: wait for the answer, delete, re-raise.
        task = asyncio.ensure_future(self._create())
        try:
            self._sb = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            if not task.cancelled() and task.exception() is None:
                await task.result().__aexit__(None, None, None)
            raise
        return self._sb

    async def __aexit__(self, *exc: Any) -> None:
        if self._sb is not None:
            await self._sb.__aexit__(*exc)


class AsyncClient(AsyncOperations):
    """A client of one agentbox daemon on asyncio; takes Client's arguments
    and reads the same environment (AGENTBOX_HOST, AGENTBOX_API_KEY,
    AGENTBOX_CA_CERT)::

        client = AsyncClient()
        async with client.sandbox(template="busybox") as sb:
            res = await sb.run("echo hi")

    ``timeout`` bounds the connect, each piece of a body sent and each
    read of a call. Creating an
    AsyncClient does not contact the daemon; it holds no connection between
    calls, so there is nothing to close.
    """

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, *,
                 ca_cert: Optional[str] = None, timeout: Optional[float] = None) -> None:
        env_host, env_key, env_ca = env_config()
        ep = Endpoint(host or env_host, env_key if api_key is None else api_key, ca_cert or env_ca)
        self._t = AsyncTransport(ep, timeout)

    @property
    def host(self) -> str:
        """The daemon address the client was configured with."""
        return self._t.host

    def __repr__(self) -> str:
        return "AsyncClient(host=%r)" % self.host

    def _wrap(self, infos: List[Dict[str, Any]]) -> List[AsyncSandbox]:
        return [AsyncSandbox(self, i) for i in infos]

    # --- daemon --------------------------------------------------------

    async def health(self) -> bool:
        """True when the daemon answers and reports itself healthy."""
        return await self._t.do(api.health())

    async def info(self) -> Dict[str, Any]:
        """The daemon's version, backend and capabilities."""
        return await self._t.do(api.info())

    # --- sandboxes -----------------------------------------------------

    async def create(self, template: Optional[str] = None, *, name: Optional[str] = None,
                     env: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
                     resources: Optional[Dict[str, Any]] = None, timeout: Optional[int] = None,
                     hostname: Optional[str] = None, network: Optional[Dict[str, Any]] = None,
                     lifecycle: Optional[str] = None, persistent: bool = False,
                     idle: Optional[Dict[str, Any]] = None, runtime: Optional[str] = None) -> AsyncSandbox:
        """Create and start a sandbox; returns once it runs (see Client.create)."""
        return AsyncSandbox(self, await self._t.do(api.create(template, name, env, labels, resources, timeout,
                                                              hostname, network, lifecycle, persistent, idle,
                                                              runtime)))

    def sandbox(self, template: Optional[str] = None, **spec: Any) -> _Creating:
        """Create a sandbox (see create): ``async with client.sandbox(...) as
        sb`` deletes it on exit, also when the body raises or is cancelled;
        ``sb = await client.sandbox(...)`` does not."""
        return _Creating(lambda: self.create(template, **spec))

    async def get(self, id_or_name: str) -> AsyncSandbox:
        """The sandbox id_or_name; NotFound when there is none."""
        return AsyncSandbox(self, await self._t.do(api.get(id_or_name)))

    def handle(self, id_or_name: str) -> AsyncSandbox:
        """A handle on a sandbox without contacting the daemon."""
        return AsyncSandbox(self, {"id": id_or_name})

    async def list(self, labels: Optional[Dict[str, str]] = None) -> List[AsyncSandbox]:
        """The sandboxes carrying every label in labels (all when empty)."""
        return self._wrap(await self._t.do(api.list_sandboxes(labels)))

    # --- checkpoints, diff -------------------------------------------

    async def checkpoint(self, cid: str) -> Dict[str, Any]:
        """One checkpoint (id or name)."""
        return await self._t.do(api.checkpoint(cid))

    async def checkpoints(self) -> List[Dict[str, Any]]:
        """Every checkpoint, oldest first."""
        return await self._t.do(api.checkpoints())

    async def delete_checkpoint(self, cid: str) -> None:
        """Delete a checkpoint; Conflict while a sandbox runs on it."""
        await self._t.do(api.delete_checkpoint(cid))

    async def fork(self, cid: str, n: int = 1, *, labels: Optional[Dict[str, str]] = None,
                   env: Optional[Dict[str, str]] = None) -> List[AsyncSandbox]:
        """Create n sandboxes from checkpoint cid."""
        return self._wrap(await self._t.do(api.fork_checkpoint(cid, n, labels, env)))

    async def diff(self, from_ref: str, to_ref: str, *, unified: bool = False,
                   include_identity: bool = False) -> Dict[str, Any]:
        """Compare two filesystem states (see Client.diff)."""
        return await self._t.do(api.diff(from_ref, to_ref, unified, include_identity))

    async def compare(self, a: str, b: str) -> Dict[str, Any]:
        """Two sandboxes side by side (see Client.compare)."""
        return await self._t.do(api.compare(a, b))

    # --- templates -----------------------------------------------------

    async def templates(self) -> List[Dict[str, Any]]:
        """The templates the daemon knows, built or not."""
        return await self._t.do(api.templates())

    async def template(self, name: str) -> Dict[str, Any]:
        return await self._t.do(api.template(name))

    async def template_versions(self, name: str) -> List[Dict[str, Any]]:
        """The saved versions of template name, oldest first."""
        return await self._t.do(api.template_versions(name))

    async def build_template(self, spec: Union[str, Dict[str, Any]], *, force: bool = False,
                             progress: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Dict[str, Any]:
        """Build a template and return it once built (see Client.build_template);
        progress may be a plain or a coroutine function."""
        async with await self._t.send(api.build_template(spec, force)) as r:
            async for ev in r.events():
                if progress is not None:
                    res = progress(ev)
                    if inspect.isawaitable(res):
                        await res
                t = build_done(ev)
                if t is not None:
                    return t
            raise build_truncated(r.host, r.op)

    # --- secrets -------------------------------------------------------

    async def set_secret(self, name: str, value: Union[str, bytes]) -> Dict[str, Any]:
        """Store value under name (write-only: no call returns it)."""
        return await self._t.do(api.set_secret(name, value))

    async def secrets(self) -> List[Dict[str, Any]]:
        """The stored secrets' names and times (never values)."""
        return await self._t.do(api.secrets())

    async def delete_secret(self, name: str) -> None:
        await self._t.do(api.delete_secret(name))

    # --- service URLs ------------------------------------------------

    async def exposures(self) -> List[Dict[str, Any]]:
        """Every live exposure (service URL) of the caller, without tokens."""
        return await self._t.do(api.exposures())

    async def exposure_link(self, exposure_id: str) -> Dict[str, Any]:
        """The exposure with a fresh "browser_url" (10 minutes); no token."""
        return await self._t.do(api.exposure_link(exposure_id))

    async def revoke_exposure(self, exposure_id: str) -> None:
        """End an exposure: its token stops working at once."""
        await self._t.do(api.revoke_exposure(exposure_id))

    # --- tenants and keys (admin) ------------------------------------

    async def tenants(self) -> List[Dict[str, Any]]:
        return await self._t.do(api.tenants())

    async def create_tenant(self, tenant_id: str, quotas: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return await self._t.do(api.create_tenant(tenant_id, quotas))

    async def tenant(self, tenant_id: str) -> Dict[str, Any]:
        return await self._t.do(api.tenant(tenant_id))

    async def update_tenant(self, tenant_id: str, quotas: Dict[str, Any]) -> Dict[str, Any]:
        return await self._t.do(api.update_tenant(tenant_id, quotas))

    async def delete_tenant(self, tenant_id: str) -> None:
        await self._t.do(api.delete_tenant(tenant_id))

    async def create_api_key(self, tenant: str = "", scope: str = "", name: str = "") -> Dict[str, Any]:
        """Mint a key; the answer carries the key itself ("key") once."""
        return await self._t.do(api.create_api_key(tenant, scope, name))

    async def api_keys(self) -> List[Dict[str, Any]]:
        return await self._t.do(api.api_keys())

    async def revoke_api_key(self, key_id: str) -> None:
        await self._t.do(api.revoke_api_key(key_id))
