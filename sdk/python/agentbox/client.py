"""Client: one agentbox daemon (blocking)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from . import _api as api
from ._http import Transport, env_config
from ._model import build_done, build_truncated
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

    def _wrap(self, infos: List[Dict[str, Any]]) -> List[Sandbox]:
        return [Sandbox(self, i) for i in infos]

    # --- daemon --------------------------------------------------------

    def health(self) -> bool:
        """True when the daemon answers and reports itself healthy."""
        return self._t.do(api.health())

    def info(self) -> Dict[str, Any]:
        """The daemon's version, backend and capabilities."""
        return self._t.do(api.info())

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
        return Sandbox(self, self._t.do(api.create(template, name, env, labels, resources, timeout, hostname,
                                                   network, lifecycle, persistent, idle, runtime)))

    def sandbox(self, template: Optional[str] = None, **spec: Any) -> Sandbox:
        """Create a sandbox (see create) for use in a with block, which
        deletes it on exit, also when the body raises::

            with client.sandbox(template="debian") as sb:
                print(sb.run("python3 my_analysis.py").stdout)
        """
        return self.create(template, **spec)

    def get(self, id_or_name: str) -> Sandbox:
        """The sandbox id_or_name; NotFound when there is none."""
        return Sandbox(self, self._t.do(api.get(id_or_name)))

    def handle(self, id_or_name: str) -> Sandbox:
        """A handle on a sandbox without contacting the daemon."""
        return Sandbox(self, {"id": id_or_name})

    def list(self, labels: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        """The sandboxes carrying every label in labels (all when empty)."""
        return self._wrap(self._t.do(api.list_sandboxes(labels)))

    # --- checkpoints, diff -------------------------------------------

    def checkpoint(self, cid: str) -> Dict[str, Any]:
        """One checkpoint (id or name)."""
        return self._t.do(api.checkpoint(cid))

    def checkpoints(self) -> List[Dict[str, Any]]:
        """Every checkpoint, oldest first."""
        return self._t.do(api.checkpoints())

    def delete_checkpoint(self, cid: str) -> None:
        """Delete a checkpoint; Conflict while a sandbox runs on it."""
        self._t.do(api.delete_checkpoint(cid))

    def fork(self, cid: str, n: int = 1, *, labels: Optional[Dict[str, str]] = None,
             env: Optional[Dict[str, str]] = None) -> List[Sandbox]:
        """Create n sandboxes from checkpoint cid."""
        return self._wrap(self._t.do(api.fork_checkpoint(cid, n, labels, env)))

    def diff(self, from_ref: str, to_ref: str, *, unified: bool = False,
             include_identity: bool = False) -> Dict[str, Any]:
        """Compare two filesystem states. A ref is "sandbox:<id>",
        "checkpoint:<id|name>", "template:<name>[@<v>]", or a bare id or name."""
        return self._t.do(api.diff(from_ref, to_ref, unified, include_identity))

    def compare(self, a: str, b: str) -> Dict[str, Any]:
        """Two sandboxes side by side: their runs paired in record order
        with the first divergence, and the diff of their files from a to b."""
        return self._t.do(api.compare(a, b))

    # --- templates -----------------------------------------------------

    def templates(self) -> List[Dict[str, Any]]:
        """The templates the daemon knows, built or not."""
        return self._t.do(api.templates())

    def template(self, name: str) -> Dict[str, Any]:
        return self._t.do(api.template(name))

    def template_versions(self, name: str) -> List[Dict[str, Any]]:
        """The saved versions of template name, oldest first."""
        return self._t.do(api.template_versions(name))

    def build_template(self, spec: Union[str, Dict[str, Any]], *, force: bool = False,
                       progress: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Dict[str, Any]:
        """Build a template and return it once built.

        spec is a known template's name, or a spec {"name":..., "base":
        "busybox", "steps": [{"run": "..."}], "env": {...}}. progress gets
        every event of the build stream (dicts with type "step", "log",
        then "done" or "error") as it arrives. A failed build raises the
        APIError of its error event.
        """
        with self._t.send(api.build_template(spec, force)) as r:
            for ev in r.events():
                if progress is not None:
                    progress(ev)
                t = build_done(ev)
                if t is not None:
                    return t
            raise build_truncated(r.host, r.op)

    # --- secrets -------------------------------------------------------

    def set_secret(self, name: str, value: Union[str, bytes]) -> Dict[str, Any]:
        """Store value under name (write-only: no call returns it)."""
        return self._t.do(api.set_secret(name, value))

    def secrets(self) -> List[Dict[str, Any]]:
        """The stored secrets' names and times (never values)."""
        return self._t.do(api.secrets())

    def delete_secret(self, name: str) -> None:
        self._t.do(api.delete_secret(name))

    # --- service URLs ------------------------------------------------

    def exposures(self) -> List[Dict[str, Any]]:
        """Every live exposure (service URL) of the caller, without tokens."""
        return self._t.do(api.exposures())

    def exposure_link(self, exposure_id: str) -> Dict[str, Any]:
        """The exposure with a fresh "browser_url" (10 minutes); no token."""
        return self._t.do(api.exposure_link(exposure_id))

    def revoke_exposure(self, exposure_id: str) -> None:
        """End an exposure: its token stops working at once."""
        self._t.do(api.revoke_exposure(exposure_id))

    # --- tenants and keys (admin) ------------------------------------

    def tenants(self) -> List[Dict[str, Any]]:
        return self._t.do(api.tenants())

    def create_tenant(self, tenant_id: str, quotas: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return self._t.do(api.create_tenant(tenant_id, quotas))

    def tenant(self, tenant_id: str) -> Dict[str, Any]:
        return self._t.do(api.tenant(tenant_id))

    def update_tenant(self, tenant_id: str, quotas: Dict[str, Any]) -> Dict[str, Any]:
        return self._t.do(api.update_tenant(tenant_id, quotas))

    def delete_tenant(self, tenant_id: str) -> None:
        self._t.do(api.delete_tenant(tenant_id))

    def create_api_key(self, tenant: str = "", scope: str = "", name: str = "") -> Dict[str, Any]:
        """Mint a key; the answer carries the key itself ("key") once."""
        return self._t.do(api.create_api_key(tenant, scope, name))

    def api_keys(self) -> List[Dict[str, Any]]:
        return self._t.do(api.api_keys())

    def revoke_api_key(self, key_id: str) -> None:
        self._t.do(api.revoke_api_key(key_id))
