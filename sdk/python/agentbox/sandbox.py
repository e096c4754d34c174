"""Sandbox and Process: the handles a Client hands out (blocking)."""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from . import _api as api
from . import errors
from ._http import Response
from ._model import (CodeFollower, Data, Execution, Follower, OutputCallback, Result, SandboxState, Secret,
                     body, exec_request, extract_tar, tar_dir)

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Sandbox", "Process", "Result", "Secret", "OutputCallback", "Execution"]


def follow(resp: Response, f: Follower) -> Result:
    """Read an exec or attach stream to its final event."""
    for ev in resp.events():
        done = f.feed(ev)
        for cb, arg in f.take():
            cb(arg)
        if done:
            return f.outcome()
    f.eof(resp.host, resp.op)
    for cb, arg in f.take():
        cb(arg)
    return f.outcome()


def _download(resp: Response, out: Optional[BinaryIO]) -> bytes:
    with resp:
        if out is None:
            return resp.read()
        for chunk in resp.iter_chunks():
            out.write(chunk)
        return b""


class Process:
    """A process started through exec (see Sandbox.start). Thread-safe."""

    def __init__(self, sandbox: "Sandbox", pid: int, info: Optional[Dict[str, Any]] = None) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.info: Dict[str, Any] = info or {"pid": pid}
        self._t = sandbox._t

    def __repr__(self) -> str:
        return "%s(sandbox=%r, pid=%d)" % (type(self).__name__, self.sandbox.id, self.pid)

    def attach(self, *, replay: bool = True, on_stdout: Optional[OutputCallback] = None,
               on_stderr: Optional[OutputCallback] = None) -> Result:
        """Follow the process until it exits; with replay, the output
        buffered since it started comes first."""
        with self._t.send(api.attach(self.sandbox.id, self.pid, replay)) as resp:
            return follow(resp, Follower(self.pid, on_stdout, on_stderr))

    def wait(self) -> Result:
        """Attach with replay and return the Result once it exits."""
        return self.attach(replay=True)

    def signal(self, sig: Union[str, int] = "TERM") -> None:
        """Send sig ("TERM", "KILL", "INT", ... or a number)."""
        self._t.do(api.signal(self.sandbox.id, self.pid, sig))

    def kill(self) -> None:
        """Send SIGKILL."""
        self.signal("KILL")

    def write_stdin(self, data: Union[Data, Iterable[bytes], BinaryIO], *, close: bool = False) -> None:
        """Write data (bytes, str, an iterable of bytes or a binary file,
        streamed) to the process's stdin; close it after when close is set.
        The process must have been started with stdin_open=True."""
        self._t.do(api.write_stdin(self.sandbox.id, self.pid, body(data), close))

    def close_stdin(self) -> None:
        """Close the process's stdin (EOF)."""
        self.write_stdin(b"", close=True)

    def resize(self, rows: int, cols: int) -> None:
        """Change the size of the process's terminal."""
        self._t.do(api.resize(self.sandbox.id, self.pid, rows, cols))


class Sandbox(SandboxState):
    """A handle on one sandbox; a context manager that deletes it on exit
    (also when the body raises). Thread-safe.

    ``id`` is the sandbox's id (or, for a handle from Client.handle, the
    name or id given: the daemon resolves names wherever ids are taken).
    ``info`` is the description as of the last create, get or refresh.
    """

    def __init__(self, client: "Client", info: Dict[str, Any]) -> None:
        super().__init__(info)
        self.client = client
        self._t = client._t

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete(missing_ok=True)

    def _wrap(self, infos: List[Dict[str, Any]]) -> List["Sandbox"]:
        return [Sandbox(self.client, i) for i in infos]

    # --- lifecycle -----------------------------------------------------

    def refresh(self) -> Dict[str, Any]:
        """Fetch and return the current description."""
        self._set(self._t.do(api.get(self.id)))
        return self.info

    def delete(self, *, missing_ok: bool = False) -> None:
        """Stop the sandbox, kill everything in it and remove it."""
        try:
            self._t.do(api.delete(self.id))
        except errors.NotFound:
            if not missing_ok:
                raise

    kill = delete

    def pause(self) -> None:
        """Freeze every process; the next exec, file or attach call resumes it."""
        self._set(self._t.do(api.lifecycle(self.id, "pause")))

    def resume(self) -> None:
        """Bring a paused, hibernated or stopped sandbox back to running."""
        self._set(self._t.do(api.lifecycle(self.id, "resume")))

    def hibernate(self) -> None:
        """Stop every process, keeping the filesystem; the next call wakes it."""
        self._set(self._t.do(api.lifecycle(self.id, "hibernate")))

    def transitions(self) -> List[Dict[str, Any]]:
        """The newest state transitions, oldest first."""
        return self._t.do(api.transitions(self.id))

    # --- exec ----------------------------------------------------------

    def run(self, command: Union[str, Sequence[str]], *, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, on_start: Optional[Callable[[int], Any]] = None,
            **options: Any) -> Result:
        """Run command and wait for it.

        A str runs with ``/bin/sh -c``; a list is the argv. Options: env,
        cwd, user, stdin (str or bytes, then EOF), stdin_open, timeout
        (seconds: the command is killed and Result.timed_out set), secrets
        (names or Secret), token, private, tty, checkpoint_before,
        rollback_on_failure, output_schema (a JSON Schema the stdout must
        conform to: APIError with reason "output_schema_mismatch" otherwise,
        no output). on_stdout/on_stderr get output as it arrives;
        on_start gets the pid once it runs.
        """
        req = exec_request(command, **options)
        req.pop("background", None)
        with self._t.send(api.exec_(self.id, req)) as resp:
            return follow(resp, Follower(0, on_stdout, on_stderr, on_start))

    exec = run

    def start(self, command: Union[str, Sequence[str]], **options: Any) -> Process:
        """Start command in the background and return at once; follow it
        with Process.attach (the daemon buffers its output). Takes run's
        options, plus stdin_open=True to feed it with Process.write_stdin."""
        info = self._t.do(api.exec_(self.id, exec_request(command, background=True, **options)))
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
        return self._t.do(api.processes(self.id))

    # --- code interpreter ----------------------------------------------

    def run_code(self, code: str, *, language: Optional[str] = None, context: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                 on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
                 on_result: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Execution:
        """Run a cell in the sandbox's code interpreter (docs/CODE-INTERPRETER.md).

        Variables persist between cells of a context: the default one of
        language (python, javascript, bash; python when neither is given)
        or context, an id from create_code_context. timeout (seconds)
        interrupts the cell. Callbacks get output and results as they come.
        """
        f = CodeFollower(on_stdout, on_stderr, on_result)
        with self._t.send(api.run_code(self.id, code, language, context, env, timeout)) as resp:
            for ev in resp.events():
                done = f.feed(ev)
                for cb, arg in f.take():
                    cb(arg)
                if done:
                    return f.outcome()
            f.eof(resp.host, resp.op)
        return f.outcome()

    def create_code_context(self, *, language: Optional[str] = None, cwd: Optional[str] = None) -> Dict[str, Any]:
        """Create a code context ({"id", "language", "cwd"})."""
        return self._t.do(api.create_code_context(self.id, language, cwd))

    def code_contexts(self) -> List[Dict[str, Any]]:
        """The code contexts."""
        return self._t.do(api.code_contexts(self.id))

    def delete_code_context(self, context: str) -> None:
        """End a code context."""
        self._t.do(api.delete_code_context(self.id, context))

    def restart_code_context(self, context: str) -> None:
        """Restart a code context: its state is lost."""
        self._t.do(api.restart_code_context(self.id, context))

    # --- files ---------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        """The whole content of the file at path."""
        with self._t.send(api.read_file(self.id, path)) as r:
            return r.read()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read_file(path).decode(encoding)

    def open_file(self, path: str) -> Response:
        """Stream the file at path: read() / iter_chunks(); close it after."""
        return self._t.send(api.read_file(self.id, path))

    def write_file(self, path: str, data: Union[Data, Iterable[bytes], BinaryIO], mode: int = 0o644) -> Dict[str, Any]:
        """Write data (bytes, str, an iterable of bytes or a binary file,
        streamed) to path, creating missing parents; returns its stat."""
        return self._t.do(api.write_file(self.id, path, body(data), mode))

    def stat(self, path: str) -> Dict[str, Any]:
        """Describe path (symlinks not followed): name, path, type, size, mode, ..."""
        return self._t.do(api.stat(self.id, path))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except errors.NotFound:
            return False

    def list_dir(self, path: str) -> List[Dict[str, Any]]:
        """The entries of directory path."""
        return self._t.do(api.list_dir(self.id, path))

    ls = list_dir

    def mkdir(self, path: str, *, parents: bool = False) -> Dict[str, Any]:
        """Create directory path (0755), and its missing parents with parents."""
        return self._t.do(api.mkdir(self.id, path, parents))

    def move(self, src: str, dst: str) -> None:
        """Rename src to dst."""
        self._t.do(api.move(self.id, src, dst))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Delete path; a non-empty directory only with recursive."""
        self._t.do(api.remove(self.id, path, recursive))

    def download_tar(self, path: str, out: Optional[BinaryIO] = None) -> bytes:
        """The directory at path as a tar archive (entries relative to path):
        written to out when given (then b"" is returned), else returned."""
        return _download(self._t.send(api.download_tar(self.id, path)), out)

    def download_dir(self, path: str, local_dir: str) -> None:
        """Download the directory at path into local_dir (created if missing).

        The archive comes from inside the sandbox: entries that would land
        outside local_dir, and devices, are refused (ValueError).
        """
        with tempfile.TemporaryFile() as f:
            self.download_tar(path, f)
            extract_tar(f, local_dir)

    def upload_tar(self, path: str, archive: Union[bytes, BinaryIO, Iterable[bytes]]) -> None:
        """Extract a tar archive (bytes, a binary file or an iterable of
        bytes, streamed) under directory path (created if missing)."""
        self._t.do(api.upload_tar(self.id, path, body(archive)))

    def upload_dir(self, local_dir: str, path: str) -> None:
        """Upload the local directory local_dir's contents under path."""
        with tempfile.TemporaryFile() as f:
            tar_dir(local_dir, f)
            self.upload_tar(path, f)

    # --- checkpoints, fork, merge ------------------------------------

    def checkpoint(self, name: str = "", *, labels: Optional[Dict[str, str]] = None,
                   memory: bool = False, allow_secrets_in_memory: bool = False) -> Dict[str, Any]:
        """Save the sandbox's filesystem (its processes go on); returns the checkpoint.

        memory=True also saves its memory and processes (gvisor sandboxes):
        restore and fork then continue them where they were. It is refused
        while a process started with secrets runs, or once the sandbox's
        guest has started one (until a restore from a filesystem
        checkpoint), unless allow_secrets_in_memory=True."""
        return self._t.do(api.sandbox_checkpoint(self.id, name, labels, memory, allow_secrets_in_memory))

    def checkpoints(self) -> List[Dict[str, Any]]:
        """This sandbox's checkpoints, oldest first."""
        return self._t.do(api.sandbox_checkpoints(self.id))

    def restore(self, checkpoint: str) -> Dict[str, Any]:
        """Put the sandbox back to a checkpoint (id or name): processes are
        stopped, files are as they were. Returns the daemon's RestoreResult."""
        res = self._t.do(api.restore(self.id, checkpoint))
        self._set(res.get("sandbox"))
        return res

    def fork(self, n: int = 1, *, labels: Optional[Dict[str, str]] = None,
             env: Optional[Dict[str, str]] = None) -> List["Sandbox"]:
        """Checkpoint the sandbox and create n sandboxes from it."""
        return self._wrap(self._t.do(api.fork(self.id, n, labels, env)))

    def merge(self, source: str, *, strategy: str = "", resolutions: Optional[Dict[str, str]] = None,
              dry_run: bool = False, include_identity: bool = False) -> Dict[str, Any]:
        """Apply the changes sandbox source made since the common fork point.

        strategy: "fail" (default), "ours" or "theirs"; resolutions choose a
        side per path. Unresolved conflicts raise MergeConflict (nothing
        applied); its .conflicts lists them.
        """
        return self._t.do(api.merge(self.id, source, strategy, resolutions, dry_run, include_identity))

    def tree_hash(self) -> str:
        """The content hash of the sandbox's filesystem."""
        return self._t.do(api.tree_hash(self.id))

    def save_template(self, name: str) -> Dict[str, Any]:
        """Freeze the filesystem as a new version of template name."""
        return self._t.do(api.save_template(self.id, name))

    def upgrade(self, runner: str = "", *, runner_hash: str = "") -> Dict[str, Any]:
        """Restart the sandbox's guest on another runner (a binary path on
        the daemon's host, or a staged runner's hash; neither: the daemon's
        own), keeping its files. Returns the daemon's UpgradeResult."""
        res = self._t.do(api.upgrade(self.id, runner, runner_hash))
        self._set(res.get("sandbox"))
        return res

    # --- service URLs ------------------------------------------------

    def expose(self, port: int, *, ttl: Optional[float] = None) -> Dict[str, Any]:
        """Give port inside the sandbox an authenticated URL (a service URL).

        Returns the exposure: send its "token" as the X-Agentbox-Token
        header (or "Authorization: Bearer") to its "url", or open its
        "browser_url" (good for 10 minutes, exchanged for a cookie). ttl is
        in seconds (None: the daemon's default, 24 hours). A request wakes
        a sleeping sandbox; deleting the sandbox or
        Client.revoke_exposure ends the token.
        """
        return self._t.do(api.expose(self.id, port, ttl))

    def exposures(self) -> List[Dict[str, Any]]:
        """This sandbox's live exposures (without tokens)."""
        return self._t.do(api.exposures(self.id))

    # --- network, events ----------------------------------------------

    def set_network(self, mode: str = "egress", *, allow: Optional[Sequence[str]] = None,
                    deny: Optional[Sequence[str]] = None,
                    credentials: Optional[Sequence[Dict[str, Any]]] = None) -> None:
        """Replace the network mode ("none" or "egress") and egress policy."""
        self._set(self._t.do(api.set_network(self.id, mode, allow, deny, credentials)))

    def egress_log(self, limit: int = 0) -> List[Dict[str, Any]]:
        """Up to limit (0: all kept) of the newest egress records, oldest first."""
        return self._t.do(api.egress_log(self.id, limit))

    def events(self, *, types: Optional[Sequence[str]] = None, run: str = "", since: Optional[str] = None,
               until: Optional[str] = None, after: int = 0, limit: int = 0) -> List[Dict[str, Any]]:
        """The sandbox's flight record, oldest first (docs/AUDIT.md): runs,
        the files and packages they changed, network decisions, lifecycle
        operations and transitions, limit events, and the events programs
        sent through the API bridge. Filters: types ("run" selects
        run.started and run.ended), run id, since/until (RFC 3339), events
        after a sequence number, limit."""
        return self._t.do(api.events(self.id, types, run, since, until, after, limit))

    def follow_events(self, *, types: Optional[Sequence[str]] = None, run: str = "", since: Optional[str] = None,
                      until: Optional[str] = None, after: int = 0, limit: int = 0) -> Iterator[Dict[str, Any]]:
        """Yield the sandbox's recorded events (filters as for events), then
        each new one as it is recorded, until the sandbox is deleted (its
        delete event is the last) or the caller stops iterating."""
        with self._t.send(api.follow_events(self.id, types, run, since, until, after, limit)) as r:
            yield from r.events()

    def verify_audit(self) -> Dict[str, Any]:
        """Check the sandbox's flight record (hash chain and signed heads):
        {"ok": bool, "events": n, "problem": "..."}; a record that does not
        verify is ok False, not an exception."""
        return self._t.do(api.verify_audit(self.id))

    # --- replay and artifacts -------------------------------------------

    def replay(self, checkpoint: str, *, runs: Optional[Sequence[str]] = None, since: int = 0,
               continue_: bool = False, ignore_paths: Optional[Sequence[str]] = None,
               step_timeout: Optional[float] = None, keep: bool = False) -> Dict[str, Any]:
        """Re-run this sandbox's recorded runs (runs, else every one after
        checkpoint was taken) in a fresh fork of checkpoint and compare each
        with its original: {"steps": [...], "diverged": bool,
        "first_divergence": index}. The fork is deleted unless keep."""
        return self._t.do(api.replay(self.id, checkpoint, runs, since, continue_, ignore_paths, step_timeout, keep))

    def read_artifact(self, path: str) -> bytes:
        """A finished file as untrusted sandbox output (data, never
        instructions); ValueError if the daemon did not mark it so."""
        with self._t.send(api.artifact_file(self.id, path)) as r:
            api.check_untrusted(r.headers, "artifact " + path)
            return r.read()

    def artifact_diff(self, from_ref: str, *, unified: bool = False) -> Dict[str, Any]:
        """The sandbox's files against from_ref as an untrusted artifact:
        {"untrusted": True, "origin": "sandbox:<id>", "kind": "diff", "diff": {...}}."""
        return self._t.do(api.artifact_diff(self.id, from_ref, unified))

    def run_report(self, run: str) -> Dict[str, Any]:
        """One recorded run with its effects as an untrusted artifact."""
        return self._t.do(api.run_report(self.id, run))
