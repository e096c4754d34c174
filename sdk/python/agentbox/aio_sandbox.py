"""AsyncSandbox and AsyncProcess: Sandbox and Process on asyncio.

Every method is the blocking one's twin (same name, parameters and result)
as a coroutine; both build their requests with _api and read streams with
_model.Follower, so they cannot drift apart.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
from typing import (TYPE_CHECKING, Any, AsyncIterable, AsyncIterator, BinaryIO, Callable, Dict,
                    Iterable, List, Optional, Sequence, Union)

from . import _api as api
from . import errors
from ._aio_http import AsyncResponse
from ._model import (CodeFollower, Data, Execution, Follower, OutputCallback, Pending, Result, SandboxState,
                     exec_request, extract_tar, is_data, tar_dir, to_bytes)

if TYPE_CHECKING:
    from .aio import AsyncClient

__all__ = ["AsyncSandbox", "AsyncProcess"]

#: What a file or upload call takes: bytes or str (sent whole), a binary
#: file (read off the loop and streamed), or an iterable or async iterable
#: of bytes (streamed).
AsyncData = Union[Data, Iterable[bytes], AsyncIterable[bytes], BinaryIO]


async def invoke(pending: Pending) -> None:
    """Call each pending callback in order; await what a coroutine
    function returns."""
    for cb, arg in pending:
        r = cb(arg)
        if inspect.isawaitable(r):
            await r


async def _read_file(f: BinaryIO) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    while True:
        b = await loop.run_in_executor(None, f.read, 64 << 10)
        if not b:
            return
        yield b


def abody(data: AsyncData) -> Any:
    """A request body from what AsyncData allows."""
    if is_data(data):
        return to_bytes(data)  # type: ignore[arg-type]
    if hasattr(data, "read"):
        return _read_file(data)  # type: ignore[arg-type]
    return data


async def follow(resp: AsyncResponse, f: Follower) -> Result:
    """Read an exec or attach stream to its final event."""
    async for ev in resp.events():
        done = f.feed(ev)
        await invoke(f.take())
        if done:
            return f.outcome()
    f.eof(resp.host, resp.op)
    await invoke(f.take())
    return f.outcome()


async def download(resp: AsyncResponse, out: Optional[BinaryIO]) -> bytes:
    async with resp:
        if out is None:
            return await resp.read()
        async for chunk in resp.iter_chunks():
            out.write(chunk)
        return b""


class AsyncProcess:
    """Process on asyncio: a process started through exec (see AsyncSandbox.start)."""

    def __init__(self, sandbox: "AsyncSandbox", pid: int, info: Optional[Dict[str, Any]] = None) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.info: Dict[str, Any] = info or {"pid": pid}
        self._t = sandbox._t

    def __repr__(self) -> str:
        return "AsyncProcess(sandbox=%r, pid=%d)" % (self.sandbox.id, self.pid)

    async def attach(self, *, replay: bool = True, on_stdout: Optional[OutputCallback] = None,
                     on_stderr: Optional[OutputCallback] = None) -> Result:
        """Follow the process until it exits; with replay, the output
        buffered since it started comes first. Cancelling it detaches (the
        process goes on)."""
        async with await self._t.send(api.attach(self.sandbox.id, self.pid, replay)) as resp:
            return await follow(resp, Follower(self.pid, on_stdout, on_stderr))

    async def wait(self) -> Result:
        """Attach with replay and return the Result once it exits."""
        return await self.attach(replay=True)

    async def signal(self, sig: Union[str, int] = "TERM") -> None:
        """Send sig ("TERM", "KILL", "INT", ... or a number)."""
        await self._t.do(api.signal(self.sandbox.id, self.pid, sig))

    async def kill(self) -> None:
        """Send SIGKILL."""
        await self.signal("KILL")

    async def write_stdin(self, data: AsyncData, *, close: bool = False) -> None:
        """Write data to the process's stdin (streamed); close it after when
        close is set. The process must have been started with stdin_open=True."""
        await self._t.do(api.write_stdin(self.sandbox.id, self.pid, abody(data), close))

    async def close_stdin(self) -> None:
        """Close the process's stdin (EOF)."""
        await self.write_stdin(b"", close=True)

    async def resize(self, rows: int, cols: int) -> None:
        """Change the size of the process's terminal."""
        await self._t.do(api.resize(self.sandbox.id, self.pid, rows, cols))


class AsyncSandbox(SandboxState):
    """Sandbox on asyncio: ``await sb.run(...)``; ``async with`` deletes it
    on exit, also when the body raised or was cancelled."""

    def __init__(self, client: "AsyncClient", info: Dict[str, Any]) -> None:
        super().__init__(info)
        self.client = client
        self._t = client._t

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # The delete runs to its end even when the task is cancelled (again)
        # while it waits; the cancellation is passed on after.
        task = asyncio.ensure_future(self.delete(missing_ok=True))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            raise

    def _wrap(self, infos: List[Dict[str, Any]]) -> List["AsyncSandbox"]:
        return [AsyncSandbox(self.client, i) for i in infos]

    # --- lifecycle -----------------------------------------------------

    async def refresh(self) -> Dict[str, Any]:
        """Fetch and return the current description."""
        self._set(await self._t.do(api.get(self.id)))
        return self.info

    async def delete(self, *, missing_ok: bool = False) -> None:
        """Stop the sandbox, kill everything in it and remove it."""
        try:
            await self._t.do(api.delete(self.id))
        except errors.NotFound:
            if not missing_ok:
                raise

    kill = delete

    async def pause(self) -> None:
        """Freeze every process; the next exec, file or attach call resumes it."""
        self._set(await self._t.do(api.lifecycle(self.id, "pause")))

    async def resume(self) -> None:
        """Bring a paused, hibernated or stopped sandbox back to running."""
        self._set(await self._t.do(api.lifecycle(self.id, "resume")))

    async def hibernate(self) -> None:
        """Stop every process, keeping the filesystem; the next call wakes it."""
        self._set(await self._t.do(api.lifecycle(self.id, "hibernate")))

    async def transitions(self) -> List[Dict[str, Any]]:
        """The newest state transitions, oldest first."""
        return await self._t.do(api.transitions(self.id))

    # --- exec ----------------------------------------------------------

    async def run(self, command: Union[str, Sequence[str]], *, on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None, on_start: Optional[Callable[[int], Any]] = None,
                  **options: Any) -> Result:
        """Run command and wait for it (Sandbox.run's options). Callbacks
        may be plain or coroutine functions; they run on the loop, in
        order, before run returns. Cancelling the task closes the stream
        (the command goes on in the sandbox, as after a lost connection:
        give a timeout, or kill it by the pid on_start got)."""
        req = exec_request(command, **options)
        req.pop("background", None)
        async with await self._t.send(api.exec_(self.id, req)) as resp:
            return await follow(resp, Follower(0, on_stdout, on_stderr, on_start))

    exec = run

    async def start(self, command: Union[str, Sequence[str]], **options: Any) -> AsyncProcess:
        """Start command in the background and return at once (see Sandbox.start)."""
        info = await self._t.do(api.exec_(self.id, exec_request(command, background=True, **options)))
        return AsyncProcess(self, int(info.get("pid") or 0), info)

    async def attach(self, pid: int, *, replay: bool = True, on_stdout: Optional[OutputCallback] = None,
                     on_stderr: Optional[OutputCallback] = None) -> Result:
        """Follow process pid until it exits (see AsyncProcess.attach)."""
        return await self.process(pid).attach(replay=replay, on_stdout=on_stdout, on_stderr=on_stderr)

    def process(self, pid: int) -> AsyncProcess:
        """A handle on process pid, without contacting the daemon."""
        return AsyncProcess(self, pid)

    async def processes(self) -> List[Dict[str, Any]]:
        """The processes started through exec, running or exited."""
        return await self._t.do(api.processes(self.id))

    # --- code interpreter ----------------------------------------------

    async def run_code(self, code: str, *, language: Optional[str] = None, context: Optional[str] = None,
                       env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                       on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
                       on_result: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Execution:
        """Run a cell in the sandbox's code interpreter (see Sandbox.run_code);
        callbacks may be plain or coroutine functions."""
        f = CodeFollower(on_stdout, on_stderr, on_result)
        async with await self._t.send(api.run_code(self.id, code, language, context, env, timeout)) as resp:
            async for ev in resp.events():
                done = f.feed(ev)
                await invoke(f.take())
                if done:
                    return f.outcome()
            f.eof(resp.host, resp.op)
        return f.outcome()

    async def create_code_context(self, *, language: Optional[str] = None, cwd: Optional[str] = None) -> Dict[str, Any]:
        """Create a code context ({"id", "language", "cwd"})."""
        return await self._t.do(api.create_code_context(self.id, language, cwd))

    async def code_contexts(self) -> List[Dict[str, Any]]:
        """The code contexts."""
        return await self._t.do(api.code_contexts(self.id))

    async def delete_code_context(self, context: str) -> None:
        """End a code context."""
        await self._t.do(api.delete_code_context(self.id, context))

    async def restart_code_context(self, context: str) -> None:
        """Restart a code context: its state is lost."""
        await self._t.do(api.restart_code_context(self.id, context))

    # --- files ---------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        """The whole content of the file at path."""
        async with await self._t.send(api.read_file(self.id, path)) as r:
            return await r.read()

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_file(path)).decode(encoding)

    async def open_file(self, path: str) -> AsyncResponse:
        """Stream the file at path: ``async with await sb.open_file(p) as f``,
        then ``await f.read()`` or ``async for chunk in f.iter_chunks()``."""
        return await self._t.send(api.read_file(self.id, path))

    async def write_file(self, path: str, data: AsyncData, mode: int = 0o644) -> Dict[str, Any]:
        """Write data (streamed) to path, creating missing parents; returns its stat."""
        return await self._t.do(api.write_file(self.id, path, abody(data), mode))

    async def stat(self, path: str) -> Dict[str, Any]:
        """Describe path (symlinks not followed): name, path, type, size, mode, ..."""
        return await self._t.do(api.stat(self.id, path))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except errors.NotFound:
            return False

    async def list_dir(self, path: str) -> List[Dict[str, Any]]:
        """The entries of directory path."""
        return await self._t.do(api.list_dir(self.id, path))

    ls = list_dir

    async def mkdir(self, path: str, *, parents: bool = False) -> Dict[str, Any]:
        """Create directory path (0755), and its missing parents with parents."""
        return await self._t.do(api.mkdir(self.id, path, parents))

    async def move(self, src: str, dst: str) -> None:
        """Rename src to dst."""
        await self._t.do(api.move(self.id, src, dst))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Delete path; a non-empty directory only with recursive."""
        await self._t.do(api.remove(self.id, path, recursive))

    async def download_tar(self, path: str, out: Optional[BinaryIO] = None) -> bytes:
        """The directory at path as a tar archive: written to out when given
        (then b"" is returned), else returned."""
        return await download(await self._t.send(api.download_tar(self.id, path)), out)

    async def download_dir(self, path: str, local_dir: str) -> None:
        """Download the directory at path into local_dir (see Sandbox.download_dir);
        the archive is unpacked off the loop."""
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryFile() as f:
            await self.download_tar(path, f)
            await loop.run_in_executor(None, extract_tar, f, local_dir)

    async def upload_tar(self, path: str, archive: Union[bytes, BinaryIO, Iterable[bytes], AsyncIterable[bytes]]) -> None:
        """Extract a tar archive (streamed) under directory path (created if missing)."""
        await self._t.do(api.upload_tar(self.id, path, abody(archive)))

    async def upload_dir(self, local_dir: str, path: str) -> None:
        """Upload the local directory local_dir's contents under path; the
        archive is packed off the loop."""
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryFile() as f:
            await loop.run_in_executor(None, tar_dir, local_dir, f)
            await self.upload_tar(path, f)

    # --- checkpoints, fork, merge ------------------------------------

    async def checkpoint(self, name: str = "", *, labels: Optional[Dict[str, str]] = None,
                   memory: bool = False, allow_secrets_in_memory: bool = False) -> Dict[str, Any]:
        """Save the sandbox's filesystem (its processes go on); returns the checkpoint.

        memory=True also saves its memory and processes (gvisor sandboxes):
        restore and fork then continue them where they were. It is refused
        while a process started with secrets runs, or once the sandbox's
        guest has started one (until a restore from a filesystem
        checkpoint), unless allow_secrets_in_memory=True."""
        return await self._t.do(api.sandbox_checkpoint(self.id, name, labels, memory, allow_secrets_in_memory))

    async def checkpoints(self) -> List[Dict[str, Any]]:
        """This sandbox's checkpoints, oldest first."""
        return await self._t.do(api.sandbox_checkpoints(self.id))

    async def restore(self, checkpoint: str) -> Dict[str, Any]:
        """Put the sandbox back to a checkpoint (id or name)."""
        res = await self._t.do(api.restore(self.id, checkpoint))
        self._set(res.get("sandbox"))
        return res

    async def fork(self, n: int = 1, *, labels: Optional[Dict[str, str]] = None,
                   env: Optional[Dict[str, str]] = None) -> List["AsyncSandbox"]:
        """Checkpoint the sandbox and create n sandboxes from it."""
        return self._wrap(await self._t.do(api.fork(self.id, n, labels, env)))

    async def merge(self, source: str, *, strategy: str = "", resolutions: Optional[Dict[str, str]] = None,
                    dry_run: bool = False, include_identity: bool = False) -> Dict[str, Any]:
        """Apply the changes sandbox source made since the common fork point
        (see Sandbox.merge); unresolved conflicts raise MergeConflict."""
        return await self._t.do(api.merge(self.id, source, strategy, resolutions, dry_run, include_identity))

    async def tree_hash(self) -> str:
        """The content hash of the sandbox's filesystem."""
        return await self._t.do(api.tree_hash(self.id))

    async def save_template(self, name: str) -> Dict[str, Any]:
        """Freeze the filesystem as a new version of template name."""
        return await self._t.do(api.save_template(self.id, name))

    async def upgrade(self, runner: str = "", *, runner_hash: str = "") -> Dict[str, Any]:
        """Restart the sandbox's guest on another runner (see Sandbox.upgrade)."""
        res = await self._t.do(api.upgrade(self.id, runner, runner_hash))
        self._set(res.get("sandbox"))
        return res

    # --- network, events ----------------------------------------------

    async def set_network(self, mode: str = "egress", *, allow: Optional[Sequence[str]] = None,
                          deny: Optional[Sequence[str]] = None,
                          credentials: Optional[Sequence[Dict[str, Any]]] = None) -> None:
        """Replace the network mode ("none" or "egress") and egress policy."""
        self._set(await self._t.do(api.set_network(self.id, mode, allow, deny, credentials)))

    async def expose(self, port: int, *, ttl: Optional[float] = None) -> Dict[str, Any]:
        """Give port inside the sandbox an authenticated URL (see Sandbox.expose)."""
        return await self._t.do(api.expose(self.id, port, ttl))

    async def exposures(self) -> List[Dict[str, Any]]:
        """This sandbox's live exposures (without tokens)."""
        return await self._t.do(api.exposures(self.id))

    async def egress_log(self, limit: int = 0) -> List[Dict[str, Any]]:
        """Up to limit (0: all kept) of the newest egress records, oldest first."""
        return await self._t.do(api.egress_log(self.id, limit))

    async def events(self, *, types: Optional[Sequence[str]] = None, run: str = "", since: Optional[str] = None,
                     until: Optional[str] = None, after: int = 0, limit: int = 0) -> List[Dict[str, Any]]:
        """The sandbox's flight record, oldest first (see Sandbox.events)."""
        return await self._t.do(api.events(self.id, types, run, since, until, after, limit))

    async def follow_events(self, *, types: Optional[Sequence[str]] = None, run: str = "",
                            since: Optional[str] = None, until: Optional[str] = None, after: int = 0,
                            limit: int = 0) -> AsyncIterator[Dict[str, Any]]:
        """The recorded events, then each new one as it is recorded: ``async
        for ev in sb.follow_events()`` (see Sandbox.follow_events)."""
        async with await self._t.send(api.follow_events(self.id, types, run, since, until, after, limit)) as r:
            async for ev in r.events():
                yield ev

    async def verify_audit(self) -> Dict[str, Any]:
        """Check the sandbox's flight record (see Sandbox.verify_audit)."""
        return await self._t.do(api.verify_audit(self.id))

    # --- replay and artifacts -------------------------------------------

    async def replay(self, checkpoint: str, *, runs: Optional[Sequence[str]] = None, since: int = 0,
                     continue_: bool = False, ignore_paths: Optional[Sequence[str]] = None,
                     step_timeout: Optional[float] = None, keep: bool = False) -> Dict[str, Any]:
        """Replay recorded runs from checkpoint (see Sandbox.replay)."""
        return await self._t.do(api.replay(self.id, checkpoint, runs, since, continue_, ignore_paths, step_timeout, keep))

    async def read_artifact(self, path: str) -> bytes:
        """A finished file as untrusted sandbox output (see Sandbox.read_artifact)."""
        async with await self._t.send(api.artifact_file(self.id, path)) as r:
            api.check_untrusted(r.headers, "artifact " + path)
            return await r.read()

    async def artifact_diff(self, from_ref: str, *, unified: bool = False) -> Dict[str, Any]:
        """The sandbox's files against from_ref as an untrusted artifact."""
        return await self._t.do(api.artifact_diff(self.id, from_ref, unified))

    async def run_report(self, run: str) -> Dict[str, Any]:
        """One recorded run with its effects as an untrusted artifact."""
        return await self._t.do(api.run_report(self.id, run))
