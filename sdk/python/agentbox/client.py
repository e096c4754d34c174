"""Client: one agentbox daemon."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import errors
from ._http import Transport, env_config, quote
from .ops import Operations
from .sandbox import Sandbox

__all__ = ["Client"]


class Client(Operations):
    """A client of one agentbox daemon's HTTP API v1. Thread-safe.

    With no arguments it reads the environment exactly as the Go SDK and the
    CLI do: AGENTBOX_HOST (default ``unix:///run/agentbox/agentbox.sock``;
    also ``http://host:port``, ``https://host:port`` or a bare ``host:port``),
    AGENTBOX_API_KEY (sent as a bearer key; needed over TCP) and
    AGENTBOX_CA_CERT (a PEM file https hosts are verified against instead of
    the system roots). Arguments override the environment.

    ``timeout`` bounds each socket operation (connect, one read); None (the
    default) waits as long as a command runs. Creating a Client does not
    contact the daemon.
    """

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, *,
                 ca_cert: Optional[str] = None, timeout: Optional[float] = None) -> None:
        env_host, env_key, env_ca = env_config()
        self._t = Transport(host or env_host, env_key if api_key is None else api_key,
                            ca_cert or env_ca, timeout)

    @property
    def host(self) -> str:
        """The daemon address the client was configured with."""
        return self._t.host

    def __repr__(self) -> str:
        return "Client(host=%r)" % self.host

    # --- daemon --------------------------------------------------------

    def health(self) -> bool:
        """True when the daemon answers and reports itself healthy."""
        return (self._t.call("GET", "/health") or {}).get("status") == "ok"

    def info(self) -> Dict[str, Any]:
        """The daemon's version, backend and capabilities."""
        return self._t.call("GET", "/info") or {}

    # --- sandboxes -----------------------------------------------------

    def create(self, template: Optional[str] = None, *, name: Optional[str] = None,
               env: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
               resources: Optional[Dict[str, Any]] = None, timeout: Optional[int] = None,
               hostname: Optional[str] = None, network: Optional[Dict[str, Any]] = None,
               lifecycle: Optional[str] = None, persistent: bool = False,
               idle: Optional[Dict[str, Any]] = None, runtime: Optional[str] = None) -> Sandbox:
        """Create and start a sandbox; returns once it runs.

        template defaults to the daemon's ("busybox"). name is unique among
        your live sandboxes and usable wherever an id is; creating a name
        that exists returns that sandbox (woken). persistent=True is
        lifecycle="persistent": idle, it hibernates instead of being
        deleted. resources: {"cpus":..., "memory_bytes":..., "disk_bytes":...};
        timeout: hard lifetime in seconds; network: {"mode": "egress",
        "allow": [...]} (see Sandbox.set_network).
        """
        spec: Dict[str, Any] = {}
        for k, v in (("template", template), ("name", name), ("env", env), ("labels", labels),
                     ("resources", resources), ("timeout_seconds", timeout), ("hostname", hostname),
                     ("network", network), ("idle", idle), ("runtime", runtime)):
            if v:
                spec[k] = v
        if persistent:
            lifecycle = "persistent"
        if lifecycle:
            spec["lifecycle"] = lifecycle
        return Sandbox(self, self._t.call("POST", "/sandboxes", json_body=spec))

    def sandbox(self, template: Optional[str] = None, **spec: Any) -> Sandbox:
        """Create a sandbox (see create) for use in a with block, which
        deletes it on exit, also when the body raises::

            with client.sandbox(template="debian") as sb:
                print(sb.run("python3 my_analysis.py").stdout)
        """
        return self.create(template, **spec)

    def get(self, id_or_name: str) -> Sandbox:
        """The sandbox id_or_name; NotFound when there is none."""
        return Sandbox(self, self._t.call("GET", "/sandboxes/" + quote(id_or_name)))

    def handle(self, id_or_name: str) -> Sandbox:
        """A handle on a sandbox without contacting the daemon."""
        return Sandbox(self, {"id": id_or_name})

    def list(self, labels: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        """The sandboxes carrying every label in labels (all when empty)."""
        q = {"label": ["%s=%s" % (k, labels[k]) for k in sorted(labels)]} if labels else None
        out = self._t.call("GET", "/sandboxes", query=q) or {}
        return [Sandbox(self, i) for i in out.get("sandboxes") or []]

    # --- checkpoints, diff -------------------------------------------

    def checkpoint(self, cid: str) -> Dict[str, Any]:
        """One checkpoint (id or name)."""
        return self._t.call("GET", "/checkpoints/" + quote(cid)) or {}

    def checkpoints(self) -> List[Dict[str, Any]]:
        """Every checkpoint, oldest first."""
        return (self._t.call("GET", "/checkpoints") or {}).get("checkpoints") or []

    def delete_checkpoint(self, cid: str) -> None:
        """Delete a checkpoint; Conflict while a sandbox runs on it."""
        self._t.call("DELETE", "/checkpoints/" + quote(cid))

    def fork(self, cid: str, n: int = 1, *, labels: Optional[Dict[str, str]] = None,
             env: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        """Create n sandboxes from checkpoint cid."""
        req: Dict[str, Any] = {"count": n}
        if labels:
            req["labels"] = labels
        if env:
            req["env"] = env
        res = self._t.call("POST", "/checkpoints/" + quote(cid) + "/fork", json_body=req) or {}
        return [Sandbox(self, i) for i in res.get("sandboxes") or []]

    def diff(self, from_ref: str, to_ref: str, *, unified: bool = False,
             include_identity: bool = False) -> Dict[str, Any]:
        """Compare two filesystem states. A ref is "sandbox:<id>",
        "checkpoint:<id|name>", "template:<name>[@<v>]", or a bare id or name."""
        q: Dict[str, Any] = {"from": from_ref, "to": to_ref}
        if unified:
            q["unified"] = True
        if include_identity:
            q["include_identity"] = True
        return self._t.call("GET", "/diff", query=q) or {}

    # --- templates -----------------------------------------------------

    def templates(self) -> List[Dict[str, Any]]:
        """The templates the daemon knows, built or not."""
        return (self._t.call("GET", "/templates") or {}).get("templates") or []

    def template(self, name: str) -> Dict[str, Any]:
        return self._t.call("GET", "/templates/" + quote(name)) or {}

    def template_versions(self, name: str) -> List[Dict[str, Any]]:
        """The saved versions of template name, oldest first."""
        return (self._t.call("GET", "/templates/" + quote(name) + "/versions") or {}).get("versions") or []

    def build_template(self, spec: Union[str, Dict[str, Any]], *, force: bool = False,
                       progress: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Dict[str, Any]:
        """Build a template and return it once built.

        spec is a known template's name, or a spec {"name":..., "base":
        "busybox", "steps": [{"run": "..."}], "env": {...}}. progress gets
        every event of the build stream (dicts with type "step", "log",
        then "done" or "error") as it arrives. A failed build raises the
        APIError of its error event.
        """
        req: Dict[str, Any] = {"name": spec} if isinstance(spec, str) else {"spec": spec}
        if force:
            req["force"] = True
        with self._t.send("POST", "/templates/build", json_body=req) as r:
            for ev in r.events():
                if progress is not None:
                    progress(ev)
                if ev.get("type") == "done":
                    return ev.get("template") or {}
                if ev.get("type") == "error":
                    raise errors.error_from_event(ev.get("error"))
            raise errors.StreamTruncated(r.host, r.op, EOFError("build stream ended before its final event"))

    # --- secrets -------------------------------------------------------

    def set_secret(self, name: str, value: Union[str, bytes]) -> Dict[str, Any]:
        """Store value under name (write-only: no call returns it)."""
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return self._t.call("PUT", "/secrets/" + quote(name), body=data,
                            content_type="application/octet-stream") or {}

    def secrets(self) -> List[Dict[str, Any]]:
        """The stored secrets' names and times (never values)."""
        return (self._t.call("GET", "/secrets") or {}).get("secrets") or []

    def delete_secret(self, name: str) -> None:
        self._t.call("DELETE", "/secrets/" + quote(name))

    # --- service URLs ------------------------------------------------

    def exposures(self) -> List[Dict[str, Any]]:
        """Every live exposure (service URL) of the caller, without tokens."""
        return (self._t.call("GET", "/exposures") or {}).get("exposures") or []

    def revoke_exposure(self, exposure_id: str) -> None:
        """End an exposure: its token stops working at once."""
        self._t.call("DELETE", "/exposures/" + quote(exposure_id))

    # --- tenants and keys (admin) ------------------------------------

    def tenants(self) -> List[Dict[str, Any]]:
        return (self._t.call("GET", "/tenants") or {}).get("tenants") or []

    def create_tenant(self, tenant_id: str, quotas: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        req: Dict[str, Any] = {"id": tenant_id}
        if quotas:
            req["quotas"] = quotas
        return self._t.call("POST", "/tenants", json_body=req) or {}

    def tenant(self, tenant_id: str) -> Dict[str, Any]:
        return self._t.call("GET", "/tenants/" + quote(tenant_id)) or {}

    def update_tenant(self, tenant_id: str, quotas: Dict[str, Any]) -> Dict[str, Any]:
        return self._t.call("PATCH", "/tenants/" + quote(tenant_id), json_body={"quotas": quotas}) or {}

    def delete_tenant(self, tenant_id: str) -> None:
        self._t.call("DELETE", "/tenants/" + quote(tenant_id))

    def create_api_key(self, tenant: str = "", scope: str = "", name: str = "") -> Dict[str, Any]:
        """Mint a key; the answer carries the key itself ("key") once."""
        req = {k: v for k, v in (("tenant", tenant), ("scope", scope), ("name", name)) if v}
        return self._t.call("POST", "/keys", json_body=req) or {}

    def api_keys(self) -> List[Dict[str, Any]]:
        return (self._t.call("GET", "/keys") or {}).get("keys") or []

    def revoke_api_key(self, key_id: str) -> None:
        self._t.call("DELETE", "/keys/" + quote(key_id))
