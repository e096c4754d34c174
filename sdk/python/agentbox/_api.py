"""Every API call of the SDK, once, for both clients.

Each function returns the :class:`Call` of one SDK method: its HTTP
method, path, query and body, and how its JSON answer becomes the method's
result. Client/Sandbox/Process (blocking) and AsyncClient/AsyncSandbox/
AsyncProcess (asyncio) are thin typed shells over these: a method is
``return self._t.do(api.x(...))`` in one and ``return await
self._t.do(api.x(...))`` in the other, plus wrapping sandbox descriptions
into the client's own Sandbox type.

To add an SDK method: add its Call here, then a method on the blocking class
and the same (async def) on the asyncio one; tests/test_offline.py fails
until both exist with the same parameters, and until a daemon test of each
calls it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from typing import Any, Dict, List, Optional, Sequence, Union

from ._http import Body, Call, _none, field, quote

Obj = Dict[str, Any]
Objs = List[Dict[str, Any]]

HOOK_SIGNATURE_HEADER = "X-Agentbox-Signature"
HOOK_TIMESTAMP_HEADER = "X-Agentbox-Timestamp"
OCTETS = "application/octet-stream"


def sign_hook(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Agentbox-Signature of a webhook delivery:
    "sha256=" + hex HMAC-SHA256 of "<timestamp>.<body>" keyed by secret."""
    m = hmac.new(secret.encode("utf-8"), b"%d." % timestamp, hashlib.sha256)
    m.update(body)
    return "sha256=" + m.hexdigest()


def _health(d: Any) -> bool:
    return (d or {}).get("status") == "ok"


def _str_field(key: str) -> Any:
    return lambda d: str((d or {}).get(key) or "")


def _sb(sid: str, sub: str = "") -> str:
    return "/sandboxes/" + quote(sid) + sub


def _proc(sid: str, pid: int, sub: str) -> str:
    return _sb(sid, "/processes/%d%s" % (pid, sub))


# --- daemon -------------------------------------------------------------

def health() -> Call[bool]:
    return Call("GET", "/health", decode=_health)


def info() -> Call[Obj]:
    return Call("GET", "/info")


# --- sandboxes ----------------------------------------------------------

def create(template: Optional[str], name: Optional[str], env: Optional[Dict[str, str]],
           labels: Optional[Dict[str, str]], resources: Optional[Dict[str, Any]], timeout: Optional[int],
           hostname: Optional[str], network: Optional[Dict[str, Any]], lifecycle: Optional[str],
           persistent: bool, idle: Optional[Dict[str, Any]], runtime: Optional[str]) -> Call[Obj]:
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
    return Call("POST", "/sandboxes", json_body=spec)


def get(id_or_name: str) -> Call[Obj]:
    return Call("GET", _sb(id_or_name))


def list_sandboxes(labels: Optional[Dict[str, str]]) -> Call[Objs]:
    q = {"label": ["%s=%s" % (k, labels[k]) for k in sorted(labels)]} if labels else None
    return Call("GET", "/sandboxes", query=q, decode=field("sandboxes"))


def delete(sid: str) -> Call[None]:
    return Call("DELETE", _sb(sid), decode=_none)


def lifecycle(sid: str, verb: str) -> Call[Obj]:
    """pause, resume or hibernate; answers the sandbox's description."""
    return Call("POST", _sb(sid, "/" + verb))


def transitions(sid: str) -> Call[Objs]:
    return Call("GET", _sb(sid, "/transitions"), decode=field("transitions"))


# --- checkpoints, fork, diff, merge -------------------------------------

def checkpoint(cid: str) -> Call[Obj]:
    return Call("GET", "/checkpoints/" + quote(cid))


def checkpoints() -> Call[Objs]:
    return Call("GET", "/checkpoints", decode=field("checkpoints"))


def delete_checkpoint(cid: str) -> Call[None]:
    return Call("DELETE", "/checkpoints/" + quote(cid), decode=_none)


def _fork_req(n: int, labels: Optional[Dict[str, str]], env: Optional[Dict[str, str]]) -> Obj:
    req: Dict[str, Any] = {"count": n}
    if labels:
        req["labels"] = labels
    if env:
        req["env"] = env
    return req


def fork_checkpoint(cid: str, n: int, labels: Optional[Dict[str, str]],
                    env: Optional[Dict[str, str]]) -> Call[Objs]:
    return Call("POST", "/checkpoints/" + quote(cid) + "/fork", json_body=_fork_req(n, labels, env),
                decode=field("sandboxes"))


def diff(from_ref: str, to_ref: str, unified: bool, include_identity: bool) -> Call[Obj]:
    q: Dict[str, Any] = {"from": from_ref, "to": to_ref}
    if unified:
        q["unified"] = True
    if include_identity:
        q["include_identity"] = True
    return Call("GET", "/diff", query=q)


def sandbox_checkpoint(sid: str, name: str, labels: Optional[Dict[str, str]],
                       memory: bool = False, allow_secrets_in_memory: bool = False) -> Call[Obj]:
    req: Dict[str, Any] = {}
    if name:
        req["name"] = name
    if labels:
        req["labels"] = labels
    if memory:
        req["memory"] = True
    if allow_secrets_in_memory:
        req["allow_secrets_in_memory"] = True
    return Call("POST", _sb(sid, "/checkpoints"), json_body=req)


def sandbox_checkpoints(sid: str) -> Call[Objs]:
    return Call("GET", _sb(sid, "/checkpoints"), decode=field("checkpoints"))


def restore(sid: str, checkpoint: str) -> Call[Obj]:
    return Call("POST", _sb(sid, "/restore"), json_body={"checkpoint": checkpoint})


def fork(sid: str, n: int, labels: Optional[Dict[str, str]], env: Optional[Dict[str, str]]) -> Call[Objs]:
    return Call("POST", _sb(sid, "/fork"), json_body=_fork_req(n, labels, env), decode=field("sandboxes"))


def merge(sid: str, source: str, strategy: str, resolutions: Optional[Dict[str, str]], dry_run: bool,
          include_identity: bool) -> Call[Obj]:
    req: Dict[str, Any] = {"from": source}
    if strategy:
        req["strategy"] = strategy
    if resolutions:
        req["resolutions"] = resolutions
    if dry_run:
        req["dry_run"] = True
    if include_identity:
        req["include_identity"] = True
    return Call("POST", _sb(sid, "/merge"), json_body=req)


def tree_hash(sid: str) -> Call[str]:
    return Call("GET", _sb(sid, "/treehash"), decode=_str_field("tree_hash"))


def save_template(sid: str, name: str) -> Call[Obj]:
    return Call("POST", _sb(sid, "/template"), json_body={"name": name})


def upgrade(sid: str, runner: str, runner_hash: str) -> Call[Obj]:
    req: Dict[str, Any] = {}
    if runner:
        req["runner"] = runner
    if runner_hash:
        req["runner_hash"] = runner_hash
    return Call("POST", _sb(sid, "/upgrade"), json_body=req)


# --- network, events ----------------------------------------------------

def set_network(sid: str, mode: str, allow: Optional[Sequence[str]], deny: Optional[Sequence[str]],
                credentials: Optional[Sequence[Dict[str, Any]]]) -> Call[Obj]:
    spec: Dict[str, Any] = {"mode": mode}
    if allow:
        spec["allow"] = list(allow)
    if deny:
        spec["deny"] = list(deny)
    if credentials:
        spec["credentials"] = list(credentials)
    return Call("PUT", _sb(sid, "/network"), json_body=spec)


def egress_log(sid: str, limit: int) -> Call[Objs]:
    return Call("GET", _sb(sid, "/egress"), query={"limit": limit} if limit > 0 else None,
                decode=field("records"))


def _event_query(types: Optional[Sequence[str]], run: str, since: Optional[str], until: Optional[str],
                 after: int, limit: int) -> Dict[str, Any]:
    q: Dict[str, Any] = {}
    if types:
        q["type"] = ",".join(types)
    if run:
        q["run"] = run
    if since:
        q["since"] = since
    if until:
        q["until"] = until
    if after:
        q["after"] = after
    if limit:
        q["limit"] = limit
    return q


def events(sid: str, types: Optional[Sequence[str]] = None, run: str = "", since: Optional[str] = None,
           until: Optional[str] = None, after: int = 0, limit: int = 0) -> Call[Objs]:
    """The flight record (docs/AUDIT.md), filtered."""
    q = _event_query(types, run, since, until, after, limit)
    return Call("GET", _sb(sid, "/events"), query=q or None, decode=field("events"))


def follow_events(sid: str, types: Optional[Sequence[str]] = None, run: str = "", since: Optional[str] = None,
                  until: Optional[str] = None, after: int = 0, limit: int = 0) -> Call[None]:
    """The flight record, then each new event: a JSON-lines stream."""
    q = _event_query(types, run, since, until, after, limit)
    q["follow"] = True
    q["format"] = "jsonl"
    return Call("GET", _sb(sid, "/events"), query=q)


def verify_audit(sid: str) -> Call[Obj]:
    return Call("GET", _sb(sid, "/audit/verify"))


# --- replay, compare, artifacts ------------------------------------------

#: Header on every artifact answer: the body is data produced in a sandbox.
UNTRUSTED_HEADER = "X-Agentbox-Untrusted"
UNTRUSTED_SANDBOX_OUTPUT = "sandbox-output"


def replay(sid: str, checkpoint: str, runs: Optional[Sequence[str]], since: int, continue_: bool,
           ignore_paths: Optional[Sequence[str]], step_timeout: Optional[float], keep: bool) -> Call[Obj]:
    req: Dict[str, Any] = {"checkpoint": checkpoint}
    if runs:
        req["runs"] = list(runs)
    if since:
        req["since"] = int(since)
    if continue_:
        req["continue"] = True
    if ignore_paths:
        req["ignore_paths"] = list(ignore_paths)
    if step_timeout:
        req["step_timeout_seconds"] = float(step_timeout)
    if keep:
        req["keep"] = True
    return Call("POST", _sb(sid, "/replay"), json_body=req)


def compare(a: str, b: str) -> Call[Obj]:
    return Call("GET", "/compare", query={"a": a, "b": b})


def artifact_file(sid: str, path: str) -> Call[Any]:
    return Call("GET", _sb(sid, "/artifacts/file"), query={"path": path})


def artifact_diff(sid: str, from_ref: str, unified: bool) -> Call[Obj]:
    q: Dict[str, Any] = {"from": from_ref}
    if unified:
        q["unified"] = True
    return Call("GET", _sb(sid, "/artifacts/diff"), query=q)


def run_report(sid: str, run: str) -> Call[Obj]:
    return Call("GET", _sb(sid, "/artifacts/report"), query={"run": run})


def check_untrusted(headers: Any, what: str) -> None:
    """Refuse an artifact answer the daemon did not mark as sandbox output."""
    got = headers.get(UNTRUSTED_HEADER) if headers is not None else None
    if got != UNTRUSTED_SANDBOX_OUTPUT:
        raise ValueError("%s: the daemon did not mark it as sandbox output" % what)


# --- exec and processes -------------------------------------------------

def exec_(sid: str, req: Obj) -> Call[Obj]:
    """POST /exec with an exec_request body: a stream, or with background
    the started process's description."""
    return Call("POST", _sb(sid, "/exec"), json_body=req)


def processes(sid: str) -> Call[Objs]:
    return Call("GET", _sb(sid, "/processes"), decode=field("processes"))


# --- code interpreter ---------------------------------------------------

def run_code(sid: str, code: str, language: Optional[str], context: Optional[str],
             env: Optional[Dict[str, str]], timeout: Optional[float]) -> Call[Any]:
    """POST /code: a stream of code events (CodeFollower)."""
    req: Dict[str, Any] = {"code": code}
    for k, v in (("language", language), ("context", context), ("env", env), ("timeout_seconds", timeout)):
        if v:
            req[k] = v
    return Call("POST", _sb(sid, "/code"), json_body=req)


def create_code_context(sid: str, language: Optional[str], cwd: Optional[str]) -> Call[Obj]:
    req: Dict[str, Any] = {}
    for k, v in (("language", language), ("cwd", cwd)):
        if v:
            req[k] = v
    return Call("POST", _sb(sid, "/code/contexts"), json_body=req)


def code_contexts(sid: str) -> Call[Objs]:
    return Call("GET", _sb(sid, "/code/contexts"), decode=field("contexts"))


def delete_code_context(sid: str, context: str) -> Call[None]:
    return Call("DELETE", _sb(sid, "/code/contexts/" + quote(context)), decode=_none)


def restart_code_context(sid: str, context: str) -> Call[None]:
    return Call("POST", _sb(sid, "/code/contexts/" + quote(context) + "/restart"), decode=_none)


def attach(sid: str, pid: int, replay: bool) -> Call[Any]:
    return Call("GET", _proc(sid, pid, "/attach"), query={"replay": replay})


def signal(sid: str, pid: int, sig: Union[str, int]) -> Call[None]:
    return Call("POST", _proc(sid, pid, "/signal"), json_body={"signal": str(sig)}, decode=_none)


def write_stdin(sid: str, pid: int, body: Body, close: bool) -> Call[None]:
    return Call("POST", _proc(sid, pid, "/stdin"), query={"close": close}, body=body, content_type=OCTETS,
                decode=_none)


def resize(sid: str, pid: int, rows: int, cols: int) -> Call[None]:
    return Call("POST", _proc(sid, pid, "/resize"), json_body={"rows": rows, "cols": cols}, decode=_none)


# --- files --------------------------------------------------------------

def read_file(sid: str, path: str) -> Call[Any]:
    return Call("GET", _sb(sid, "/files"), query={"path": path})


def write_file(sid: str, path: str, body: Body, mode: int) -> Call[Obj]:
    q = {"path": path, "mode": "%04o" % (mode & 0o7777), "parents": True}
    return Call("PUT", _sb(sid, "/files"), query=q, body=body, content_type=OCTETS)


def stat(sid: str, path: str) -> Call[Obj]:
    return Call("GET", _sb(sid, "/fs/stat"), query={"path": path})


def list_dir(sid: str, path: str) -> Call[Objs]:
    return Call("GET", _sb(sid, "/fs/list"), query={"path": path}, decode=field("entries"))


def mkdir(sid: str, path: str, parents: bool) -> Call[Obj]:
    return Call("POST", _sb(sid, "/fs/mkdir"), json_body={"path": path, "parents": parents})


def move(sid: str, src: str, dst: str) -> Call[None]:
    return Call("POST", _sb(sid, "/fs/move"), json_body={"from": src, "to": dst}, decode=_none)


def remove(sid: str, path: str, recursive: bool) -> Call[None]:
    return Call("DELETE", _sb(sid, "/fs"), query={"path": path, "recursive": recursive}, decode=_none)


def download_tar(sid: str, path: str) -> Call[Any]:
    return Call("GET", _sb(sid, "/fs/archive"), query={"path": path})


def upload_tar(sid: str, path: str, body: Body) -> Call[None]:
    return Call("PUT", _sb(sid, "/fs/archive"), query={"path": path}, body=body,
                content_type="application/x-tar", decode=_none)


# --- templates ----------------------------------------------------------

def templates() -> Call[Objs]:
    return Call("GET", "/templates", decode=field("templates"))


def template(name: str) -> Call[Obj]:
    return Call("GET", "/templates/" + quote(name))


def template_versions(name: str) -> Call[Objs]:
    return Call("GET", "/templates/" + quote(name) + "/versions", decode=field("versions"))


def build_template(spec: Union[str, Dict[str, Any]], force: bool) -> Call[Any]:
    req: Dict[str, Any] = {"name": spec} if isinstance(spec, str) else {"spec": spec}
    if force:
        req["force"] = True
    return Call("POST", "/templates/build", json_body=req)


# --- secrets ------------------------------------------------------------

def set_secret(name: str, value: Union[str, bytes]) -> Call[Obj]:
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return Call("PUT", "/secrets/" + quote(name), body=data, content_type=OCTETS)


def secrets() -> Call[Objs]:
    return Call("GET", "/secrets", decode=field("secrets"))


def delete_secret(name: str) -> Call[None]:
    return Call("DELETE", "/secrets/" + quote(name), decode=_none)


# --- service URLs -------------------------------------------------------

def expose(sid: str, port: int, ttl: Optional[float]) -> Call[Obj]:
    req: Dict[str, Any] = {"port": int(port)}
    if ttl is not None:
        req["ttl_seconds"] = int(ttl)
    return Call("POST", _sb(sid, "/exposures"), json_body=req)


def exposures(sid: str = "") -> Call[Objs]:
    return Call("GET", "/exposures", query={"sandbox": sid} if sid else None, decode=field("exposures"))


def exposure_link(exposure_id: str) -> Call[Obj]:
    return Call("POST", "/exposures/" + quote(exposure_id) + "/link")


def revoke_exposure(exposure_id: str) -> Call[None]:
    return Call("DELETE", "/exposures/" + quote(exposure_id), decode=_none)


# --- tenants and keys (admin) -------------------------------------------

def tenants() -> Call[Objs]:
    return Call("GET", "/tenants", decode=field("tenants"))


def create_tenant(tenant_id: str, quotas: Optional[Dict[str, Any]]) -> Call[Obj]:
    req: Dict[str, Any] = {"id": tenant_id}
    if quotas:
        req["quotas"] = quotas
    return Call("POST", "/tenants", json_body=req)


def tenant(tenant_id: str) -> Call[Obj]:
    return Call("GET", "/tenants/" + quote(tenant_id))


def update_tenant(tenant_id: str, quotas: Dict[str, Any]) -> Call[Obj]:
    return Call("PATCH", "/tenants/" + quote(tenant_id), json_body={"quotas": quotas})


def delete_tenant(tenant_id: str) -> Call[None]:
    return Call("DELETE", "/tenants/" + quote(tenant_id), decode=_none)


def create_api_key(tenant: str, scope: str, name: str) -> Call[Obj]:
    req = {k: v for k, v in (("tenant", tenant), ("scope", scope), ("name", name)) if v}
    return Call("POST", "/keys", json_body=req)


def api_keys() -> Call[Objs]:
    return Call("GET", "/keys", decode=field("keys"))


def revoke_api_key(key_id: str) -> Call[None]:
    return Call("DELETE", "/keys/" + quote(key_id), decode=_none)


# --- runs and usage -----------------------------------------------------

def runs(sandbox: str, trigger: str, limit: int) -> Call[Objs]:
    q: Dict[str, Any] = {k: v for k, v in (("sandbox", sandbox), ("trigger", trigger)) if v}
    if limit > 0:
        q["limit"] = limit
    return Call("GET", "/runs", query=q, decode=field("runs"))


def get_run(run_id: str) -> Call[Obj]:
    return Call("GET", "/runs/" + quote(run_id))


def _usage_query(sandbox: str, since: Optional[datetime.datetime]) -> Dict[str, Any]:
    q: Dict[str, Any] = {}
    if sandbox:
        q["sandbox"] = sandbox
    if since is not None:
        if since.tzinfo is None:
            since = since.replace(tzinfo=datetime.timezone.utc)
        q["since"] = since.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return q


def usage(sandbox: str, since: Optional[datetime.datetime]) -> Call[Obj]:
    return Call("GET", "/usage", query=_usage_query(sandbox, since))


def export_usage(sandbox: str, since: Optional[datetime.datetime]) -> Call[Any]:
    return Call("GET", "/usage/export", query=_usage_query(sandbox, since))


# --- schedules and webhooks ---------------------------------------------

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


def create_schedule(cron: str, command: Union[str, List[str], None], template: str, timezone: str,
                    missed_run_policy: str, action: Dict[str, Any]) -> Call[Obj]:
    req = _action(template, command, action)
    req["cron"] = cron
    if timezone:
        req["timezone"] = timezone
    if missed_run_policy:
        req["missed_run_policy"] = missed_run_policy
    return Call("POST", "/schedules", json_body=req)


def schedules() -> Call[Objs]:
    return Call("GET", "/schedules", decode=field("schedules"))


def schedule(schedule_id: str) -> Call[Obj]:
    return Call("GET", "/schedules/" + quote(schedule_id))


def delete_schedule(schedule_id: str) -> Call[None]:
    return Call("DELETE", "/schedules/" + quote(schedule_id), decode=_none)


def trigger_schedule(schedule_id: str) -> Call[Obj]:
    return Call("POST", "/schedules/" + quote(schedule_id) + "/trigger")


def create_hook(command: Union[str, List[str], None], template: str, action: Dict[str, Any]) -> Call[Obj]:
    return Call("POST", "/hooks", json_body=_action(template, command, action))


def hooks() -> Call[Objs]:
    return Call("GET", "/hooks", decode=field("hooks"))


def delete_hook(hook_id: str) -> Call[None]:
    return Call("DELETE", "/hooks/" + quote(hook_id), decode=_none)


def deliver_hook_signed(hook_id: str, timestamp: str, signature: str, body: bytes, wait: bool) -> Call[Obj]:
    return Call("POST", "/hooks/" + quote(hook_id), query={"wait": True} if wait else None, body=bytes(body),
                content_type=OCTETS,
                headers={HOOK_TIMESTAMP_HEADER: timestamp, HOOK_SIGNATURE_HEADER: signature})


def deliver_hook(hook_id: str, secret: str, body: Union[str, bytes], wait: bool, now: int) -> Call[Obj]:
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    return deliver_hook_signed(hook_id, str(now), sign_hook(secret, now, data), data, wait)


# --- pools, storage, runners --------------------------------------------

def set_pool(template: str, size: int, runtime: Optional[str] = None) -> Call[Obj]:
    body: Dict[str, Any] = {"size": size}
    if runtime:
        body["runtime"] = runtime
    return Call("PUT", "/templates/" + quote(template) + "/pool", json_body=body)


def pools() -> Call[Objs]:
    return Call("GET", "/pools", decode=field("pools"))


def export_template(name: str) -> Call[Any]:
    return Call("GET", "/templates/" + quote(name) + "/export")


def export_checkpoint(cid: str) -> Call[Any]:
    return Call("GET", "/checkpoints/" + quote(cid) + "/export")


def import_template(name: str, body: Body) -> Call[Obj]:
    return Call("POST", "/templates/import", query={"name": name}, body=body, content_type="application/x-tar")


def import_template_dir(name: str, host_dir: str) -> Call[Obj]:
    return Call("POST", "/templates/import", query={"name": name}, json_body={"path": host_dir})


def collect_garbage(min_age: Optional[float]) -> Call[Obj]:
    req: Dict[str, Any] = {}
    if min_age is not None:
        req["min_age_seconds"] = int(min_age)
    return Call("POST", "/gc", json_body=req)


def stage_runner(body: Body) -> Call[Obj]:
    return Call("POST", "/runners", body=body, content_type=OCTETS)


def runners() -> Call[Objs]:
    return Call("GET", "/runners", decode=field("runners"))
