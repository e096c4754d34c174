"""The AsyncClient's operator calls: ops.py's Operations on asyncio."""

from __future__ import annotations

import datetime
import time
from typing import Any, AsyncIterable, AsyncIterator, BinaryIO, Dict, Iterable, List, Optional, Union

from . import _api as api
from ._aio_http import AsyncTransport
from .aio_sandbox import abody, download

__all__ = ["AsyncOperations"]

Archive = Union[bytes, BinaryIO, Iterable[bytes], AsyncIterable[bytes]]


class AsyncOperations:
    _t: AsyncTransport

    # --- runs and usage -----------------------------------------------

    async def runs(self, *, sandbox: str = "", trigger: str = "", limit: int = 0) -> List[Dict[str, Any]]:
        """Run records, newest first; trigger is "api", "schedule", "webhook", ..."""
        return await self._t.do(api.runs(sandbox, trigger, limit))

    async def get_run(self, run_id: str) -> Dict[str, Any]:
        """One run record."""
        return await self._t.do(api.get_run(run_id))

    async def usage(self, sandbox: str = "", since: Optional[datetime.datetime] = None) -> Dict[str, Any]:
        """Metered usage per tenant and sandbox."""
        return await self._t.do(api.usage(sandbox, since))

    async def export_usage(self, sandbox: str = "",
                           since: Optional[datetime.datetime] = None) -> AsyncIterator[Dict[str, Any]]:
        """The usage records, one dict each, streamed: ``async for rec in
        client.export_usage()``."""
        async with await self._t.send(api.export_usage(sandbox, since)) as r:
            async for ev in r.events():
                yield ev

    # --- schedules and webhooks ----------------------------------------

    async def create_schedule(self, cron: str, command: Union[str, List[str], None] = None, *, template: str = "",
                              timezone: str = "", missed_run_policy: str = "", **action: Any) -> Dict[str, Any]:
        """Run command on a cron schedule (see Client.create_schedule)."""
        return await self._t.do(api.create_schedule(cron, command, template, timezone, missed_run_policy, action))

    async def schedules(self) -> List[Dict[str, Any]]:
        return await self._t.do(api.schedules())

    async def schedule(self, schedule_id: str) -> Dict[str, Any]:
        return await self._t.do(api.schedule(schedule_id))

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._t.do(api.delete_schedule(schedule_id))

    async def trigger_schedule(self, schedule_id: str) -> Dict[str, Any]:
        """Run a schedule's action now; returns the run record."""
        return await self._t.do(api.trigger_schedule(schedule_id))

    async def create_hook(self, command: Union[str, List[str], None] = None, *, template: str = "",
                          **action: Any) -> Dict[str, Any]:
        """A webhook that runs command with the delivered body on stdin; the
        answer carries its signing "secret" once."""
        return await self._t.do(api.create_hook(command, template, action))

    async def hooks(self) -> List[Dict[str, Any]]:
        return await self._t.do(api.hooks())

    async def delete_hook(self, hook_id: str) -> None:
        await self._t.do(api.delete_hook(hook_id))

    async def deliver_hook(self, hook_id: str, secret: str, body: Union[str, bytes], *,
                           wait: bool = False) -> Dict[str, Any]:
        """Deliver body to a webhook, signed with its secret now; with wait,
        the answer is the finished run."""
        return await self._t.do(api.deliver_hook(hook_id, secret, body, wait, int(time.time())))

    async def deliver_hook_signed(self, hook_id: str, timestamp: str, signature: str, body: bytes, *,
                                  wait: bool = False) -> Dict[str, Any]:
        """deliver_hook with a given timestamp and signature (as a relay would)."""
        return await self._t.do(api.deliver_hook_signed(hook_id, timestamp, signature, body, wait))

    # --- pools, storage, runners ---------------------------------------

    async def set_pool(self, template: str, size: int, runtime: Optional[str] = None) -> Dict[str, Any]:
        """Keep size sandboxes of template warm (0 turns the pool off), on
        backend runtime (default: the one a create of the template naming
        none runs on); a template may have a pool per backend."""
        return await self._t.do(api.set_pool(template, size, runtime))

    async def pools(self) -> List[Dict[str, Any]]:
        return await self._t.do(api.pools())

    async def export_template(self, name: str, out: Optional[BinaryIO] = None) -> bytes:
        """Template name as an OCI image tar: written to out (then b"") or returned."""
        return await download(await self._t.send(api.export_template(name)), out)

    async def export_checkpoint(self, cid: str, out: Optional[BinaryIO] = None) -> bytes:
        """Checkpoint cid as an OCI image tar: written to out (then b"") or returned."""
        return await download(await self._t.send(api.export_checkpoint(cid)), out)

    async def import_template(self, name: str, archive: Archive) -> Dict[str, Any]:
        """Import an OCI image tar (streamed) as template name."""
        return await self._t.do(api.import_template(name, abody(archive)))

    async def import_template_dir(self, name: str, host_dir: str) -> Dict[str, Any]:
        """Import the OCI layout directory host_dir, a path on the daemon's host."""
        return await self._t.do(api.import_template_dir(name, host_dir))

    async def collect_garbage(self, min_age: Optional[float] = None) -> Dict[str, Any]:
        """Remove unreferenced layers older than min_age seconds (None: the daemon's default)."""
        return await self._t.do(api.collect_garbage(min_age))

    async def stage_runner(self, binary: Archive) -> Dict[str, Any]:
        """Stage and validate an agentbox binary as a guest runner (streamed)."""
        return await self._t.do(api.stage_runner(abody(binary)))

    async def runners(self) -> List[Dict[str, Any]]:
        return await self._t.do(api.runners())
