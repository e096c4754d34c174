"""The response models and stream logic both clients share.

Result and Secret, the exec request body, the exec/attach stream state
machine (:class:`Follower`), the build stream's final event, the sandbox
description both Sandbox types keep, and the tar helpers of directory
uploads and downloads. Nothing here does I/O on the network: the blocking
and the asyncio clients feed it what they read.
"""

from __future__ import annotations

import base64
import json
import codecs
import os
import tarfile
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import errors

#: A streaming callback: called with each piece of output, decoded as UTF-8
#: (a multi-byte character split across pieces is kept whole). On the
#: asyncio client it may also be a coroutine function (then it is awaited).
OutputCallback = Callable[[str], Any]

Data = Union[str, bytes, bytearray, memoryview]

#: The pending callback invocations of a stream, in order.
Pending = List[Tuple[Callable[[Any], Any], Any]]


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


def to_bytes(data: Data) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def is_data(data: Any) -> bool:
    return isinstance(data, (str, bytes, bytearray, memoryview))


def body(data: Union[Data, Iterable[bytes], BinaryIO]) -> Any:
    """A request body from bytes or str (sent whole), a binary file (read
    and streamed in 64 KiB pieces) or an iterable of bytes (streamed)."""
    if is_data(data):
        return to_bytes(data)  # type: ignore[arg-type]
    if hasattr(data, "read"):
        return iter(lambda: data.read(64 << 10), b"")  # type: ignore[union-attr]
    return data


def exec_request(command: Union[str, Sequence[str]], *, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None, user: Optional[str] = None, stdin: Optional[Data] = None,
                 stdin_open: bool = False, timeout: Optional[float] = None,
                 secrets: Optional[Sequence[Union[str, Secret]]] = None, token: bool = False,
                 private: bool = False, tty: Optional[Dict[str, int]] = None,
                 checkpoint_before: bool = False, rollback_on_failure: bool = False,
                 background: bool = False, output_schema: Optional[Any] = None) -> Dict[str, Any]:
    """The JSON body of POST /sandboxes/{id}/exec (api.ExecRequest).

    output_schema (a JSON Schema as a dict, or its JSON text) makes the
    daemon validate the command's stdout at the boundary: output that does
    not conform raises an APIError with code "failed_precondition" and
    reason "output_schema_mismatch" instead of returning the raw text."""
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
        req["stdin"] = base64.b64encode(to_bytes(stdin)).decode("ascii")
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
    if output_schema is not None:
        req["output_schema"] = json.loads(output_schema) if isinstance(output_schema, (str, bytes)) else output_schema
    return req


class _Sink:
    def __init__(self, cb: Optional[OutputCallback], pending: Pending) -> None:
        self.buf = bytearray()
        self.cb = cb
        self.pending = pending
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> None:
        self.buf += data
        if self.cb is not None:
            s = self.dec.decode(data)
            if s:
                self.pending.append((self.cb, s))

    def flush(self) -> None:
        if self.cb is not None:
            s = self.dec.decode(b"", final=True)
            if s:
                self.pending.append((self.cb, s))


class Follower:
    """The state of one exec or attach stream, fed its events in order.

    After each feed, the caller invokes the callbacks take() hands back (in
    order); when feed returns True the stream is over and outcome() gives
    the Result or raises the stream's error. A stream that ends first is
    reported with eof(), after which outcome() raises StreamTruncated.
    """

    def __init__(self, pid: int, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback],
                 on_start: Optional[Callable[[int], Any]] = None) -> None:
        self._pending: Pending = []
        self._out, self._err = _Sink(on_stdout, self._pending), _Sink(on_stderr, self._pending)
        self._on_start = on_start
        self._started = pid != 0
        self._error: Optional[errors.AgentboxError] = None
        self.result = Result(pid=pid)
        if pid and on_start is not None:
            self._pending.append((on_start, pid))

    def take(self) -> Pending:
        """The callbacks to invoke now, in order."""
        p = list(self._pending)
        del self._pending[:]
        return p

    def _start(self, pid: Any) -> None:
        if not self._started:
            self._started = True
            if pid:
                self.result.pid = int(pid)
            if self._on_start is not None:
                self._pending.append((self._on_start, self.result.pid))

    def _collect(self) -> None:
        self._out.flush()
        self._err.flush()
        self.result.stdout_bytes, self.result.stderr_bytes = bytes(self._out.buf), bytes(self._err.buf)

    def feed(self, ev: Dict[str, Any]) -> bool:
        """Take one event; True when it was the final one."""
        t = ev.get("type")
        if t == "started":
            self._start(ev.get("pid"))
        elif t in ("stdout", "stderr"):
            self._start(ev.get("pid"))
            data = base64.b64decode(ev.get("data") or "")
            (self._out if t == "stdout" else self._err).write(data)
        elif t == "exit":
            self._collect()
            res = self.result
            code = ev.get("exit_code")
            res.exit_code = -1 if code is None else int(code)
            res.signal = ev.get("signal") or ""
            res.timed_out = bool(ev.get("timed_out"))
            res.oom_killed = bool(ev.get("oom_killed"))
            res.checkpoint = ev.get("checkpoint") or ""
            res.rolled_back = bool(ev.get("rolled_back"))
            return True
        elif t == "error":
            self._collect()
            self._error = errors.error_from_event(ev.get("error"))
            return True
        # Unknown event types come from a newer daemon; skip them.
        return False

    def eof(self, host: str, op: str) -> None:
        """The stream ended before its final event."""
        self._collect()
        self._error = errors.StreamTruncated(host, op, EOFError("stream ended before its final event"))

    def outcome(self) -> Result:
        if self._error is not None:
            raise self._error
        return self.result


@dataclass
class Execution:
    """The outcome of a cell run by run_code (docs/CODE-INTERPRETER.md).

    results are the result events (dicts with "text", "html", "png"
    (base64), "json", ... and "is_main_result" for the value of the last
    expression); error is the error event ("name", "value", "traceback")
    when the code raised, else None: an exception in the code is data, not
    an exception of run_code.
    """

    stdout: str = ""
    stderr: str = ""
    results: List[Dict[str, Any]] = field(default_factory=list)
    error: Optional[Dict[str, Any]] = None
    execution_count: int = 0

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the last expression's value)."""
        for r in self.results:
            if r.get("is_main_result"):
                return r.get("text")
        return None


class CodeFollower:
    """The state of one code stream, fed its events in order, as Follower
    is of an exec stream: take() hands back the callbacks to invoke after
    each feed; when feed returns True, outcome() gives the Execution or
    raises the stream's error."""

    def __init__(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback],
                 on_result: Optional[Callable[[Dict[str, Any]], Any]]) -> None:
        self._pending: Pending = []
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_result = on_result
        self._out: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        self._error: Optional[errors.AgentboxError] = None
        self.execution = Execution()

    def take(self) -> Pending:
        p = list(self._pending)
        del self._pending[:]
        return p

    def _collect(self) -> None:
        self.execution.stdout = "".join(self._out["stdout"])
        self.execution.stderr = "".join(self._out["stderr"])

    def feed(self, ev: Dict[str, Any]) -> bool:
        """Take one event; True when it was the final one."""
        t = ev.get("type")
        if t in ("stdout", "stderr"):
            text = ev.get("text") or ""
            self._out[t].append(text)
            cb = self._on[t]
            if cb is not None:
                self._pending.append((cb, text))
        elif t == "result":
            self.execution.results.append(ev)
            if self._on_result is not None:
                self._pending.append((self._on_result, ev))
        elif t == "error":
            self.execution.error = ev
        elif t == "number_of_executions":
            self.execution.execution_count = int(ev.get("execution_count") or 0)
        elif t == "stream_error":
            self._collect()
            self._error = errors.error_from_event(ev.get("error"))
            return True
        elif t == "end_of_execution":
            self._collect()
            return True
        return False

    def eof(self, host: str, op: str) -> None:
        self._collect()
        self._error = errors.StreamTruncated(host, op, EOFError("stream ended before its final event"))

    def outcome(self) -> Execution:
        if self._error is not None:
            raise self._error
        return self.execution


def build_done(ev: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The built template when ev is a build stream's "done" event; raises
    the APIError of an "error" event; None for any other event."""
    if ev.get("type") == "done":
        return ev.get("template") or {}
    if ev.get("type") == "error":
        raise errors.error_from_event(ev.get("error"))
    return None


def build_truncated(host: str, op: str) -> errors.StreamTruncated:
    return errors.StreamTruncated(host, op, EOFError("build stream ended before its final event"))


class SandboxState:
    """The description of a sandbox as of the last call that returned it;
    what Sandbox and AsyncSandbox share. Thread-safe."""

    def __init__(self, info: Dict[str, Any]) -> None:
        self.id: str = info["id"]
        self._mu = threading.Lock()  # guards _info
        self._info = info

    def __repr__(self) -> str:
        return "%s(id=%r)" % (type(self).__name__, self.id)

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


def tar_dir(local_dir: str, f: BinaryIO) -> None:
    """Write local_dir's contents to f as a tar archive (entries relative)."""
    with tarfile.open(fileobj=f, mode="w:") as tf:
        for entry in sorted(os.listdir(local_dir)):
            tf.add(os.path.join(local_dir, entry), arcname=entry)
    f.seek(0)


def extract_tar(f: BinaryIO, dest: str) -> None:
    """Extract the untrusted tar archive f into dest: entries or links that
    would land outside dest, and devices, are refused (ValueError)."""
    f.seek(0)
    with tarfile.open(fileobj=f, mode="r:") as tf:
        _safe_extract(tf, dest)


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
