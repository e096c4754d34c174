"""Sandbox, Process and Result: what a Client hands out."""

from __future__ import annotations

import base64
import codecs
import io
import os
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, BinaryIO, Callable, Dict, Iterable, Iterator, List,
                    Optional, Sequence, Union)

from . import errors
from ._http import Response, quote

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Sandbox", "Process", "Result", "Secret", "OutputCallback"]

#: A streaming callback: called with each piece of output, decoded as UTF-8
#: (a multi-byte character split across pieces is kept whole).
OutputCallback = Callable[[str], Any]

Data = Union[str, bytes, bytearray, memoryview]


@dataclass
class Result:
    """How a command ended. A non-zero exit_code is not an exception.

    stdout and stderr are the output decoded as UTF-8 (invalid bytes
    replaced); stdout_bytes and stderr_bytes are the raw bytes. Output that
    went to a callback is collected too.
    """

    exit_code: int = -1
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    pid: int = 0
    signal: str = ""          #: e.g. "KILL" when killed by a signal
    timed_out: bool = False   #: killed because its timeout expired
    oom_killed: bool = False  #: killed by the sandbox's out-of-memory killer
    checkpoint: str = ""      #: checkpoint taken before the command (checkpoint_before)
    rolled_back: bool = False  #: the sandbox was put back to it (rollback_on_failure)

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


@dataclass
class Secret:
    """A stored secret put into one command's environment as ``env``
    (default: the secret's name). Its value is redacted from the output."""

    name: str
    env: str = ""


def _b(data: Data) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _body(data: Union[Data, Iterable[bytes], BinaryIO]) -> Any:
    """A request body from bytes or str (sent whole), a binary file (read
    and streamed in 64 KiB pieces) or an iterable of bytes (streamed)."""
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        return _b(data)
    if hasattr(data, "read"):
        return iter(lambda: data.read(64 << 10), b"")  # type: ignore[union-attr]
    return data


class _Sink:
    def __init__(self, cb: Optional[OutputCallback]) -> None:
        self.buf = bytearray()
        self.cb = cb
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> None:
        self.buf += data
        if self.cb is not None:
            s = self.dec.decode(data)
            if s:
                self.cb(s)

    def flush(self) -> None:
        if self.cb is not None:
            s = self.dec.decode(b"", final=True)
            if s:
                self.cb(s)


def exec_request(command: Union[str, Sequence[str]], *, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None, user: Optional[str] = None, stdin: Optional[Data] = None,
                 stdin_open: bool = False, timeout: Optional[float] = None,
                 secrets: Optional[Sequence[Union[str, Secret]]] = None, token: bool = False,
                 private: bool = False, tty: Optional[Dict[str, int]] = None,
                 checkpoint_before: bool = False, rollback_on_failure: bool = False,
                 background: bool = False) -> Dict[str, Any]:
    """The JSON body of POST /sandboxes/{id}/exec (api.ExecRequest)."""
    req: Dict[str, Any] = {}
    if isinstance(command, str):
        req["command"] = command
    else:
        req["cmd"] = list(command)
    if env:
        req["env"] = dict(env)
    if cwd:
        req["cwd"] = cwd
    if user:
        req["user"] = user
    if stdin is not None:
        req["stdin"] = base64.b64encode(_b(stdin)).decode("ascii")
    if stdin_open:
        req["stdin_open"] = True
    if timeout:
        req["timeout_seconds"] = float(timeout)
    if secrets:
        req["secrets"] = [{"name": s} if isinstance(s, str) else {"name": s.name, "env": s.env}
                          for s in secrets]
    if token:
        req["token"] = True
    if private:
        req["private"] = True
    if tty:
        req["tty"] = dict(tty)
    if rollback_on_failure:
        checkpoint_before = True
        req["rollback_on_failure"] = True
    if checkpoint_before:
        req["checkpoint_before"] = True
    if background:
        req["background"] = True
    return req


def follow(resp: Response, pid: int, on_stdout: Optional[OutputCallback],
           on_stderr: Optional[OutputCallback], on_start: Optional[Callable[[int], Any]] = None) -> Result:
    """Read an exec or attach stream to its final event."""
    out, err = _Sink(on_stdout), _Sink(on_stderr)
    res = Result(pid=pid)
    started = [pid != 0]
    if pid and on_start:
        on_start(pid)

    def start(p: Any) -> None:
        if not started[0]:
            started[0] = True
            if p:
                res.pid = int(p)
            if on_start:
                on_start(res.pid)

    def collect() -> None:
        out.flush()
        err.flush()
        res.stdout_bytes, res.stderr_bytes = bytes(out.buf), bytes(err.buf)

    for ev in resp.events():
        t = ev.get("type")
        if t == "started":
            start(ev.get("pid"))
        elif t in ("stdout", "stderr"):
            start(ev.get("pid"))
            data = base64.b64decode(ev.get("data") or "")
            (out if t == "stdout" else err).write(data)
        elif t == "exit":
            collect()
            code = ev.get("exit_code")
            res.exit_code = -1 if code is None else int(code)
            res.signal = ev.get("signal") or ""
            res.timed_out = bool(ev.get("timed_out"))
            res.oom_killed = bool(ev.get("oom_killed"))
            res.checkpoint = ev.get("checkpoint") or ""
            res.rolled_back = bool(ev.get("rolled_back"))
            return res
        elif t == "error":
            collect()
            raise errors.error_from_event(ev.get("error"))
        # Unknown event types come from a newer daemon; skip them.
    collect()
    raise errors.StreamTruncated(resp.host, resp.op, EOFError("stream ended before its final event"))


class Process:
    """A process started through exec (see Sandbox.start). Thread-safe."""

    def __init__(self, sandbox: "Sandbox", pid: int, info: Optional[Dict[str, Any]] = None) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.info: Dict[str, Any] = info or {"pid": pid}

    def __repr__(self) -> str:
        return "Process(sandbox=%r, pid=%d)" % (self.sandbox.id, self.pid)

    def _path(self, sub: str) -> str:
        return self.sandbox._path("/processes/%d%s" % (self.pid, sub))

    def attach(self, *, replay: bool = True, on_stdout: Optional[OutputCallback] = None,
               on_stderr: Optional[OutputCallback] = None) -> Result:
        """Follow the process until it exits; with replay, the output
        buffered since it started comes first."""
        resp = self.sandbox._t.send("GET", self._path("/attach"), query={"replay": replay})
        with resp:
            return follow(resp, self.pid, on_stdout, on_stderr)

    def wait(self) -> Result:
        """Attach with replay and return the Result once it exits."""
        return self.attach(replay=True)

    def signal(self, sig: Union[str, int] = "TERM") -> None:
        """Send sig ("TERM", "KILL", "INT", ... or a number)."""
        self.sandbox._t.call("POST", self._path("/signal"), json_body={"signal": str(sig)})

    def kill(self) -> None:
        """Send SIGKILL."""
        self.signal("KILL")

    def write_stdin(self, data: Union[Data, Iterable[bytes], BinaryIO], *, close: bool = False) -> None:
        """Write data (bytes, str, an iterable of bytes or a binary file,
        streamed) to the process's stdin; close it after when close is set.
        The process must have been started with stdin_open=True."""
        body = _body(data)
        self.sandbox._t.call("POST", self._path("/stdin"), query={"close": close}, body=body,
                             content_type="application/octet-stream")

    def close_stdin(self) -> None:
        """Close the process's stdin (EOF)."""
        self.write_stdin(b"", close=True)

    def resize(self, rows: int, cols: int) -> None:
        """Change the size of the process's terminal."""
        self.sandbox._t.call("POST", self._path("/resize"), json_body={"rows": rows, "cols": cols})


class Sandbox:
    """A handle on one sandbox; a context manager that deletes it on exit
    (also when the body raises). Thread-safe.

    ``id`` is the sandbox's id (or, for a handle from Client.sandbox_handle,
    the name or id given: the daemon resolves names wherever ids are taken).
    ``info`` is the description as of the last create, get or refresh.
    """

    def __init__(self, client: "Client", info: Dict[str, Any]) -> None:
        self.client = client
        self._t = client._t
        self.id: str = info["id"]
        self._mu = threading.Lock()
        self._info = info

    def __repr__(self) -> str:
        return "Sandbox(id=%r)" % self.id

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete(missing_ok=True)

    @property
    def info(self) -> Dict[str, Any]:
        with self._mu:
            return dict(self._info)

    @property
    def name(self) -> str:
        return str(self.info.get("name") or "")

    @property
    def state(self) -> str:
        return str(self.info.get("state") or "")

    def _set(self, info: Optional[Dict[str, Any]]) -> None:
        if info:
            with self._mu:
                self._info = info

    def _path(self, sub: str = "") -> str:
        return "/sandboxes/" + quote(self.id) + sub

    # --- lifecycle -----------------------------------------------------

    def refresh(self) -> Dict[str, Any]:
        """Fetch and return the current description."""
        self._set(self._t.call("GET", self._path()))
        return self.info

    def delete(self, *, missing_ok: bool = False) -> None:
        """Stop the sandbox, kill everything in it and remove it."""
        try:
            self._t.call("DELETE", self._path())
        except errors.NotFound:
            if not missing_ok:
                raise

    kill = delete

    def pause(self) -> None:
        """Freeze every process; the next exec, file or attach call resumes it."""
        self._set(self._t.call("POST", self._path("/pause")))

    def resume(self) -> None:
        """Bring a paused, hibernated or stopped sandbox back to running."""
        self._set(self._t.call("POST", self._path("/resume")))

    def hibernate(self) -> None:
        """Stop every process, keeping the filesystem; the next call wakes it."""
        self._set(self._t.call("POST", self._path("/hibernate")))

    def transitions(self) -> List[Dict[str, Any]]:
        """The newest state transitions, oldest first."""
        return (self._t.call("GET", self._path("/transitions")) or {}).get("transitions") or []

    # --- exec ----------------------------------------------------------

    def run(self, command: Union[str, Sequence[str]], *, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, on_start: Optional[Callable[[int], Any]] = None,
            **options: Any) -> Result:
        """Run command and wait for it.

        A str runs with ``/bin/sh -c``; a list is the argv. Options: env,
        cwd, user, stdin (str or bytes, then EOF), timeout (seconds: the
        command is killed and Result.timed_out set), secrets (names or
        Secret), token, private, tty, checkpoint_before,
        rollback_on_failure. on_stdout/on_stderr get output as it arrives;
        on_start gets the pid once it runs.
        """
        req = exec_request(command, **options)
        req.pop("background", None)
        resp = self._t.send("POST", self._path("/exec"), json_body=req)
        with resp:
            return follow(resp, 0, on_stdout, on_stderr, on_start)

    exec = run

    def start(self, command: Union[str, Sequence[str]], **options: Any) -> Process:
        """Start command in the background and return at once; follow it
        with Process.attach (the daemon buffers its output). Takes run's
        options, plus stdin_open=True to feed it with Process.write_stdin."""
        req = exec_request(command, background=True, **options)
        info = self._t.call("POST", self._path("/exec"), json_body=req) or {}
        return Process(self, int(info.get("pid") or 0), info)

    def attach(self, pid: int, *, replay: bool = True, on_stdout: Optional[OutputCallback] = None,
               on_stderr: Optional[OutputCallback] = None) -> Result:
        """Follow process pid until it exits (see Process.attach)."""
        return self.process(pid).attach(replay=replay, on_stdout=on_stdout, on_stderr=on_stderr)

    def process(self, pid: int) -> Process:
        """A handle on process pid, without contacting the daemon."""
        return Process(self, pid)

    def processes(self) -> List[Dict[str, Any]]:
        """The processes started through exec, running or exited."""
        return (self._t.call("GET", self._path("/processes")) or {}).get("processes") or []

    # --- files ---------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        """The whole content of the file at path."""
        with self._t.send("GET", self._path("/files"), query={"path": path}) as r:
            return r.read()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read_file(path).decode(encoding)

    def open_file(self, path: str) -> Response:
        """Stream the file at path: read() / iter_chunks(); close it after."""
        return self._t.send("GET", self._path("/files"), query={"path": path})

    def write_file(self, path: str, data: Union[Data, Iterable[bytes], BinaryIO], mode: int = 0o644) -> Dict[str, Any]:
        """Write data (bytes, str, an iterable of bytes or a binary file,
        streamed) to path, creating missing parents; returns its stat."""
        body = _body(data)
        q = {"path": path, "mode": "%04o" % (mode & 0o7777), "parents": True}
        return self._t.call("PUT", self._path("/files"), query=q, body=body,
                            content_type="application/octet-stream") or {}

    def stat(self, path: str) -> Dict[str, Any]:
        """Describe path (symlinks not followed): name, path, type, size, mode, ..."""
        return self._t.call("GET", self._path("/fs/stat"), query={"path": path}) or {}

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except errors.NotFound:
            return False

    def list_dir(self, path: str) -> List[Dict[str, Any]]:
        """The entries of directory path."""
        return (self._t.call("GET", self._path("/fs/list"), query={"path": path}) or {}).get("entries") or []

    ls = list_dir

    def mkdir(self, path: str, *, parents: bool = False) -> Dict[str, Any]:
        """Create directory path (0755), and its missing parents with parents."""
        return self._t.call("POST", self._path("/fs/mkdir"), json_body={"path": path, "parents": parents}) or {}

    def move(self, src: str, dst: str) -> None:
        """Rename src to dst."""
        self._t.call("POST", self._path("/fs/move"), json_body={"from": src, "to": dst})

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Delete path; a non-empty directory only with recursive."""
        self._t.call("DELETE", self._path("/fs"), query={"path": path, "recursive": recursive})

    def download_tar(self, path: str, out: Optional[BinaryIO] = None) -> bytes:
        """The directory at path as a tar archive (entries relative to path):
        written to out when given (then b"" is returned), else returned."""
        with self._t.send("GET", self._path("/fs/archive"), query={"path": path}) as r:
            if out is None:
                return r.read()
            for chunk in r.iter_chunks():
                out.write(chunk)
            return b""

    def download_dir(self, path: str, local_dir: str) -> None:
        """Download the directory at path into local_dir (created if missing).

        The archive comes from inside the sandbox: entries that would land
        outside local_dir, and devices, are refused (ValueError).
        """
        with tempfile.TemporaryFile() as f:
            self.download_tar(path, f)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r:") as tf:
                _safe_extract(tf, local_dir)

    def upload_tar(self, path: str, archive: Union[bytes, BinaryIO, Iterable[bytes]]) -> None:
        """Extract a tar archive (bytes, a binary file or an iterable of
        bytes, streamed) under directory path (created if missing)."""
        body: Any
        if isinstance(archive, (bytes, bytearray, memoryview)):
            body = bytes(archive)
        elif hasattr(archive, "read"):
            body = iter(lambda: archive.read(64 << 10), b"")  # type: ignore[union-attr]
        else:
            body = archive
        self._t.call("PUT", self._path("/fs/archive"), query={"path": path}, body=body,
                     content_type="application/x-tar")

    def upload_dir(self, local_dir: str, path: str) -> None:
        """Upload the local directory local_dir's contents under path."""
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w:") as tf:
                for entry in sorted(os.listdir(local_dir)):
                    tf.add(os.path.join(local_dir, entry), arcname=entry)
            f.seek(0)
            self.upload_tar(path, f)

    # --- checkpoints, fork, merge ------------------------------------

    def checkpoint(self, name: str = "", *, labels: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Save the sandbox's filesystem (its processes go on); returns the checkpoint."""
        req: Dict[str, Any] = {}
        if name:
            req["name"] = name
        if labels:
            req["labels"] = labels
        return self._t.call("POST", self._path("/checkpoints"), json_body=req) or {}

    def checkpoints(self) -> List[Dict[str, Any]]:
        """This sandbox's checkpoints, oldest first."""
        return (self._t.call("GET", self._path("/checkpoints")) or {}).get("checkpoints") or []

    def restore(self, checkpoint: str) -> Dict[str, Any]:
        """Put the sandbox back to a checkpoint (id or name): processes are
        stopped, files are as they were. Returns the daemon's RestoreResult."""
        res = self._t.call("POST", self._path("/restore"), json_body={"checkpoint": checkpoint}) or {}
        self._set(res.get("sandbox"))
        return res

    def fork(self, n: int = 1, *, labels: Optional[Dict[str, str]] = None,
             env: Optional[Dict[str, str]] = None) -> List["Sandbox"]:
        """Checkpoint the sandbox and create n sandboxes from it."""
        res = self._t.call("POST", self._path("/fork"), json_body=_fork_req(n, labels, env)) or {}
        return [Sandbox(self.client, i) for i in res.get("sandboxes") or []]

    def merge(self, source: str, *, strategy: str = "", resolutions: Optional[Dict[str, str]] = None,
              dry_run: bool = False, include_identity: bool = False) -> Dict[str, Any]:
        """Apply the changes sandbox source made since the common fork point.

        strategy: "fail" (default), "ours" or "theirs"; resolutions choose a
        side per path. Unresolved conflicts raise MergeConflict (nothing
        applied); its .conflicts lists them.
        """
        req: Dict[str, Any] = {"from": source}
        if strategy:
            req["strategy"] = strategy
        if resolutions:
            req["resolutions"] = resolutions
        if dry_run:
            req["dry_run"] = True
        if include_identity:
            req["include_identity"] = True
        return self._t.call("POST", self._path("/merge"), json_body=req) or {}

    def tree_hash(self) -> str:
        """The content hash of the sandbox's filesystem."""
        return str((self._t.call("GET", self._path("/treehash")) or {}).get("tree_hash") or "")

    def save_template(self, name: str) -> Dict[str, Any]:
        """Freeze the filesystem as a new version of template name."""
        return self._t.call("POST", self._path("/template"), json_body={"name": name}) or {}

    def upgrade(self, runner: str = "", *, runner_hash: str = "") -> Dict[str, Any]:
        """Restart the sandbox's guest on another runner (a binary path on
        the daemon's host, or a staged runner's hash; neither: the daemon's
        own), keeping its files. Returns the daemon's UpgradeResult."""
        req: Dict[str, Any] = {}
        if runner:
            req["runner"] = runner
        if runner_hash:
            req["runner_hash"] = runner_hash
        res = self._t.call("POST", self._path("/upgrade"), json_body=req) or {}
        self._set(res.get("sandbox"))
        return res

    # --- network, events ----------------------------------------------

    def set_network(self, mode: str = "egress", *, allow: Optional[Sequence[str]] = None,
                    deny: Optional[Sequence[str]] = None,
                    credentials: Optional[Sequence[Dict[str, Any]]] = None) -> None:
        """Replace the network mode ("none" or "egress") and egress policy."""
        spec: Dict[str, Any] = {"mode": mode}
        if allow:
            spec["allow"] = list(allow)
        if deny:
            spec["deny"] = list(deny)
        if credentials:
            spec["credentials"] = list(credentials)
        self._set(self._t.call("PUT", self._path("/network"), json_body=spec))

    def egress_log(self, limit: int = 0) -> List[Dict[str, Any]]:
        """Up to limit (0: all kept) of the newest egress records, oldest first."""
        q = {"limit": limit} if limit > 0 else None
        return (self._t.call("GET", self._path("/egress"), query=q) or {}).get("records") or []

    def events(self, *, types: Optional[Sequence[str]] = None, run: str = "",
               since: Optional[str] = None, until: Optional[str] = None,
               after: int = 0, limit: int = 0) -> List[Dict[str, Any]]:
        """The sandbox's flight record, oldest first (docs/AUDIT.md): runs,
        the files and packages they changed, network decisions, lifecycle
        operations and transitions, limit events, and the events programs
        sent through the API bridge. Filters: types ("run" selects
        run.started and run.ended), run id, since/until (RFC 3339), events
        after a sequence number, limit."""
        q = _event_query(types, run, since, until, after, limit)
        return (self._t.call("GET", self._path("/events"), query=q) or {}).get("events") or []

    def export_events(self, out: BinaryIO, **filters: Any) -> None:
        """Write the sandbox's events (filters as for events) to out as
        JSON lines, one event per line."""
        q = _event_query(**filters)
        q["format"] = "jsonl"
        with self._t.send("GET", self._path("/events"), query=q) as r:
            for chunk in r.iter_chunks():
                out.write(chunk)

    def follow_events(self, **filters: Any) -> Iterator[Dict[str, Any]]:
        """Yield the sandbox's recorded events (filters as for events), then
        each new one as it is recorded, until the sandbox is deleted (its
        delete event is the last) or the caller stops iterating."""
        q = _event_query(**filters)
        q["follow"] = True
        q["format"] = "jsonl"
        with self._t.send("GET", self._path("/events"), query=q) as r:
            yield from r.events()

    def verify_audit(self) -> Dict[str, Any]:
        """Check the sandbox's flight record (hash chain and signed heads):
        {"ok": bool, "events": n, "problem": "..."}; a record that does not
        verify is ok False, not an exception."""
        return self._t.call("GET", self._path("/audit/verify")) or {}


def _event_query(types: Optional[Sequence[str]] = None, run: str = "", since: Optional[str] = None,
                 until: Optional[str] = None, after: int = 0, limit: int = 0) -> Dict[str, Any]:
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


def _fork_req(n: int, labels: Optional[Dict[str, str]], env: Optional[Dict[str, str]]) -> Dict[str, Any]:
    req: Dict[str, Any] = {"count": n}
    if labels:
        req["labels"] = labels
    if env:
        req["env"] = env
    return req


def _safe_extract(tf: tarfile.TarFile, dest: str) -> None:
    root = os.path.realpath(dest)
    os.makedirs(root, exist_ok=True)
    for m in tf.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        if target != root and not target.startswith(root + os.sep):
            raise ValueError("archive entry %r leaves %s" % (m.name, dest))
        if m.isdev():
            raise ValueError("archive entry %r is a device" % m.name)
        if m.issym() or m.islnk():
            link = m.linkname if m.issym() else os.path.join(root, m.linkname)
            lt = os.path.realpath(os.path.join(os.path.dirname(target), link) if m.issym() else link)
            if lt != root and not lt.startswith(root + os.sep):
                raise ValueError("archive link %r points outside %s" % (m.name, dest))
    if hasattr(tarfile, "data_filter"):  # 3.12+, and security releases of 3.9-3.11
        tf.extractall(root, filter="data")
        return
    for m in tf.getmembers():
        m.mode &= 0o777
        tf.extract(m, root, set_attrs=not m.issym(), numeric_owner=False)
