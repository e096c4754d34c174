"""The Client's operator calls: runs and usage, schedules and webhooks,
warm pools, template import/export, garbage collection, guest runners.

They are methods of Client (mixed in here to keep client.py about
sandboxes); their answers are the API's JSON objects as dicts. The
asyncio twin is aio_ops.py.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Union

from . import _api as api
from ._api import sign_hook
from ._http import Transport
from ._model import body
from .sandbox import _download

__all__ = ["Operations", "sign_hook"]


class Operations:
    _t: Transport

    # --- runs and usage -----------------------------------------------

    def runs(self, *, sandbox: str = "", trigger: str = "", limit: int = 0) -> List[Dict[str, Any]]:
        """Run records, newest first; trigger is "api", "schedule", "webhook", ..."""
        return self._t.do(api.runs(sandbox, trigger, limit))

    def get_run(self, run_id: str) -> Dict[str, Any]:
        """One run record."""
        return self._t.do(api.get_run(run_id))

    def usage(self, sandbox: str = "", since: Optional[datetime.datetime] = None) -> Dict[str, Any]:
        """Metered usage per tenant and sandbox."""
        return self._t.do(api.usage(sandbox, since))

    def export_usage(self, sandbox: str = "", since: Optional[datetime.datetime] = None) -> Iterator[Dict[str, Any]]:
        """The usage records, one dict each, streamed."""
        with self._t.send(api.export_usage(sandbox, since)) as r:
            yield from r.events()

    # --- schedules and webhooks ----------------------------------------

    def create_schedule(self, cron: str, command: Union[str, List[str], None] = None, *, template: str = "",
                        timezone: str = "", missed_run_policy: str = "", **action: Any) -> Dict[str, Any]:
        """Run command on a cron schedule (in a new sandbox of template, or
        in the sandbox name=...; env, cwd, timeout, lifecycle as for run)."""
        return self._t.do(api.create_schedule(cron, command, template, timezone, missed_run_policy, action))

    def schedules(self) -> List[Dict[str, Any]]:
        return self._t.do(api.schedules())

    def schedule(self, schedule_id: str) -> Dict[str, Any]:
        return self._t.do(api.schedule(schedule_id))

    def delete_schedule(self, schedule_id: str) -> None:
        self._t.do(api.delete_schedule(schedule_id))

    def trigger_schedule(self, schedule_id: str) -> Dict[str, Any]:
        """Run a schedule's action now; returns the run record."""
        return self._t.do(api.trigger_schedule(schedule_id))

    def create_hook(self, command: Union[str, List[str], None] = None, *, template: str = "",
                    **action: Any) -> Dict[str, Any]:
        """A webhook that runs command with the delivered body on stdin; the
        answer carries its signing "secret" once."""
        return self._t.do(api.create_hook(command, template, action))

    def hooks(self) -> List[Dict[str, Any]]:
        return self._t.do(api.hooks())

    def delete_hook(self, hook_id: str) -> None:
        self._t.do(api.delete_hook(hook_id))

    def deliver_hook(self, hook_id: str, secret: str, body: Union[str, bytes], *, wait: bool = False) -> Dict[str, Any]:
        """Deliver body to a webhook, signed with its secret now; with wait,
        the answer is the finished run."""
        return self._t.do(api.deliver_hook(hook_id, secret, body, wait, int(time.time())))

    def deliver_hook_signed(self, hook_id: str, timestamp: str, signature: str, body: bytes, *,
                            wait: bool = False) -> Dict[str, Any]:
        """deliver_hook with a given timestamp and signature (as a relay would)."""
        return self._t.do(api.deliver_hook_signed(hook_id, timestamp, signature, body, wait))

    # --- pools, storage, runners ---------------------------------------

    def set_pool(self, template: str, size: int, runtime: Optional[str] = None) -> Dict[str, Any]:
        """Keep size sandboxes of template warm (0 turns the pool off), on
        backend runtime (default: the one a create of the template naming
        none runs on); a template may have a pool per backend."""
        return self._t.do(api.set_pool(template, size, runtime))

    def pools(self) -> List[Dict[str, Any]]:
        return self._t.do(api.pools())

    def export_template(self, name: str, out: Optional[BinaryIO] = None) -> bytes:
        """Template name as an OCI image tar: written to out (then b"") or returned."""
        return _download(self._t.send(api.export_template(name)), out)

    def export_checkpoint(self, cid: str, out: Optional[BinaryIO] = None) -> bytes:
        """Checkpoint cid as an OCI image tar: written to out (then b"") or returned."""
        return _download(self._t.send(api.export_checkpoint(cid)), out)

    def import_template(self, name: str, archive: Union[bytes, BinaryIO, Iterable[bytes]]) -> Dict[str, Any]:
        """Import an OCI image tar (streamed) as template name."""
        return self._t.do(api.import_template(name, body(archive)))

    def import_template_dir(self, name: str, host_dir: str) -> Dict[str, Any]:
        """Import the OCI layout directory host_dir, a path on the daemon's host."""
        return self._t.do(api.import_template_dir(name, host_dir))

    def collect_garbage(self, min_age: Optional[float] = None) -> Dict[str, Any]:
        """Remove unreferenced layers older than min_age seconds (None: the daemon's default)."""
        return self._t.do(api.collect_garbage(min_age))

    def stage_runner(self, binary: Union[bytes, BinaryIO, Iterable[bytes]]) -> Dict[str, Any]:
        """Stage and validate an agentbox binary as a guest runner (streamed)."""
        return self._t.do(api.stage_runner(body(binary)))

    def runners(self) -> List[Dict[str, Any]]:
        return self._t.do(api.runners())
