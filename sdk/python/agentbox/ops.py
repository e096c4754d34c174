"""The Client's operator calls: runs and usage, schedules and webhooks,
warm pools, template import/export, garbage collection, guest runners.

They are methods of Client (mixed in here to keep client.py about
sandboxes); their answers are the API's JSON objects as dicts.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import time
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Union

from ._http import Transport, quote

__all__ = ["Operations", "sign_hook"]

HOOK_SIGNATURE_HEADER = "X-Agentbox-Signature"
HOOK_TIMESTAMP_HEADER = "X-Agentbox-Timestamp"


def sign_hook(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Agentbox-Signature of a webhook delivery:
    "sha256=" + hex HMAC-SHA256 of "<timestamp>.<body>" keyed by secret."""
    m = hmac.new(secret.encode("utf-8"), b"%d." % timestamp, hashlib.sha256)
    m.update(body)
    return "sha256=" + m.hexdigest()


def _stream(data: Union[bytes, BinaryIO, Iterable[bytes]]) -> Any:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return iter(lambda: data.read(64 << 10), b"")  # type: ignore[union-attr]
    return data


def _usage_query(sandbox: str, since: Optional[datetime.datetime]) -> Dict[str, Any]:
    q: Dict[str, Any] = {}
    if sandbox:
        q["sandbox"] = sandbox
    if since is not None:
        if since.tzinfo is None:
            since = since.replace(tzinfo=datetime.timezone.utc)
        q["since"] = since.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return q


def _action(template: str, command: Union[str, List[str], None], kw: Dict[str, Any]) -> Dict[str, Any]:
    a: Dict[str, Any] = {k: v for k, v in kw.items() if v}
    if template:
        a["template"] = template
    if isinstance(command, str):
        a["command"] = command
    elif command:
        a["cmd"] = list(command)
    if "timeout" in a:
        a["timeout_seconds"] = float(a.pop("timeout"))
    return a


class Operations:
    _t: Transport

    # --- runs and usage -----------------------------------------------

    def runs(self, *, sandbox: str = "", trigger: str = "", limit: int = 0) -> List[Dict[str, Any]]:
        """Run records, newest first; trigger is "api", "schedule", "webhook", ..."""
        q: Dict[str, Any] = {k: v for k, v in (("sandbox", sandbox), ("trigger", trigger)) if v}
        if limit > 0:
            q["limit"] = limit
        return (self._t.call("GET", "/runs", query=q) or {}).get("runs") or []

    def get_run(self, run_id: str) -> Dict[str, Any]:
        """One run record."""
        return self._t.call("GET", "/runs/" + quote(run_id)) or {}

    def usage(self, sandbox: str = "", since: Optional[datetime.datetime] = None) -> Dict[str, Any]:
        """Metered usage per tenant and sandbox."""
        return self._t.call("GET", "/usage", query=_usage_query(sandbox, since)) or {}

    def export_usage(self, sandbox: str = "", since: Optional[datetime.datetime] = None) -> Iterator[Dict[str, Any]]:
        """The usage records, one dict each, streamed."""
        with self._t.send("GET", "/usage/export", query=_usage_query(sandbox, since)) as r:
            yield from r.events()

    # --- schedules and webhooks ----------------------------------------

    def create_schedule(self, cron: str, command: Union[str, List[str], None] = None, *, template: str = "",
                        timezone: str = "", missed_run_policy: str = "", **action: Any) -> Dict[str, Any]:
        """Run command on a cron schedule (in a new sandbox of template, or
        in the sandbox name=...; env, cwd, timeout, lifecycle as for run)."""
        req = _action(template, command, action)
        req["cron"] = cron
        if timezone:
            req["timezone"] = timezone
        if missed_run_policy:
            req["missed_run_policy"] = missed_run_policy
        return self._t.call("POST", "/schedules", json_body=req) or {}

    def schedules(self) -> List[Dict[str, Any]]:
        return (self._t.call("GET", "/schedules") or {}).get("schedules") or []

    def schedule(self, schedule_id: str) -> Dict[str, Any]:
        return self._t.call("GET", "/schedules/" + quote(schedule_id)) or {}

    def delete_schedule(self, schedule_id: str) -> None:
        self._t.call("DELETE", "/schedules/" + quote(schedule_id))

    def trigger_schedule(self, schedule_id: str) -> Dict[str, Any]:
        """Run a schedule's action now; returns the run record."""
        return self._t.call("POST", "/schedules/" + quote(schedule_id) + "/trigger") or {}

    def create_hook(self, command: Union[str, List[str], None] = None, *, template: str = "",
                    **action: Any) -> Dict[str, Any]:
        """A webhook that runs command with the delivered body on stdin; the
        answer carries its signing "secret" once."""
        return self._t.call("POST", "/hooks", json_body=_action(template, command, action)) or {}

    def hooks(self) -> List[Dict[str, Any]]:
        return (self._t.call("GET", "/hooks") or {}).get("hooks") or []

    def delete_hook(self, hook_id: str) -> None:
        self._t.call("DELETE", "/hooks/" + quote(hook_id))

    def deliver_hook(self, hook_id: str, secret: str, body: Union[str, bytes], *, wait: bool = False) -> Dict[str, Any]:
        """Deliver body to a webhook, signed with its secret now; with wait,
        the answer is the finished run."""
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        ts = int(time.time())
        return self.deliver_hook_signed(hook_id, str(ts), sign_hook(secret, ts, data), data, wait=wait)

    def deliver_hook_signed(self, hook_id: str, timestamp: str, signature: str, body: bytes, *,
                            wait: bool = False) -> Dict[str, Any]:
        """deliver_hook with a given timestamp and signature (as a relay would)."""
        return self._t.call("POST", "/hooks/" + quote(hook_id), query={"wait": True} if wait else None,
                            body=bytes(body), content_type="application/octet-stream",
                            headers={HOOK_TIMESTAMP_HEADER: timestamp, HOOK_SIGNATURE_HEADER: signature}) or {}

    # --- pools, storage, runners ---------------------------------------

    def set_pool(self, template: str, size: int) -> Dict[str, Any]:
        """Keep size sandboxes of template warm (0 turns the pool off)."""
        return self._t.call("PUT", "/templates/" + quote(template) + "/pool", json_body={"size": size}) or {}

    def pools(self) -> List[Dict[str, Any]]:
        return (self._t.call("GET", "/pools") or {}).get("pools") or []

    def export_template(self, name: str, out: Optional[BinaryIO] = None) -> bytes:
        """Template name as an OCI image tar: written to out (then b"") or returned."""
        return self._download("/templates/" + quote(name) + "/export", out)

    def export_checkpoint(self, cid: str, out: Optional[BinaryIO] = None) -> bytes:
        """Checkpoint cid as an OCI image tar: written to out (then b"") or returned."""
        return self._download("/checkpoints/" + quote(cid) + "/export", out)

    def _download(self, path: str, out: Optional[BinaryIO]) -> bytes:
        with self._t.send("GET", path) as r:
            if out is None:
                return r.read()
            for chunk in r.iter_chunks():
                out.write(chunk)
            return b""

    def import_template(self, name: str, archive: Union[bytes, BinaryIO, Iterable[bytes]]) -> Dict[str, Any]:
        """Import an OCI image tar (streamed) as template name."""
        return self._t.call("POST", "/templates/import", query={"name": name}, body=_stream(archive),
                            content_type="application/x-tar") or {}

    def import_template_dir(self, name: str, host_dir: str) -> Dict[str, Any]:
        """Import the OCI layout directory host_dir, a path on the daemon's host."""
        return self._t.call("POST", "/templates/import", query={"name": name}, json_body={"path": host_dir}) or {}

    def collect_garbage(self, min_age: Optional[float] = None) -> Dict[str, Any]:
        """Remove unreferenced layers older than min_age seconds (None: the daemon's default)."""
        req: Dict[str, Any] = {}
        if min_age is not None:
            req["min_age_seconds"] = int(min_age)
        return self._t.call("POST", "/gc", json_body=req) or {}

    def stage_runner(self, binary: Union[bytes, BinaryIO, Iterable[bytes]]) -> Dict[str, Any]:
        """Stage and validate an agentbox binary as a guest runner (streamed)."""
        return self._t.call("POST", "/runners", body=_stream(binary), content_type="application/octet-stream") or {}

    def runners(self) -> List[Dict[str, Any]]:
        return (self._t.call("GET", "/runners") or {}).get("runners") or []


