# agentbox code interpreter: the Python driver (docs/CODE-INTERPRETER.md).
#
# Run as `python3 -c <this file>` by the Go server (internal/codeinterp),
# one process per context. Requests arrive on fd 3 and events leave on
# fd 4, one JSON object per line; fds 1 and 2 are the cell's stdout and
# stderr, passed through as they are written. After each cell the driver
# writes the marker (env AGENTBOX_CODE_MARKER) to fds 1 and 2 and then a
# "done" event, so the server knows where the cell's output ends.
import ast
import asyncio
import base64
import builtins
import json
import linecache
import os
import sys
import traceback
import warnings

_ctl_in = os.fdopen(os.dup(3), "r", encoding="utf-8", errors="replace")
_ctl_out = os.dup(4)
os.close(3)
os.close(4)
_MARK = os.environ.pop("AGENTBOX_CODE_MARKER", "").encode()
_DRIVER = sys._getframe().f_code.co_filename

class _Lines:
    """Line-buffered output where a print is one write of text and newline
    together (a line-buffered TextIOWrapper before Python 3.12 flushes
    "a" and "\n" as two writes, which reach the client as two stdout
    events): the stream buffers, and a write holding a newline flushes it.
    The rest is flushed at the end of the cell."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        n = self._stream.write(text)
        if "\n" in text or "\r" in text:
            self._stream.flush()
        return n

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


for _name in ("stdout", "stderr"):
    _s = getattr(sys, _name)
    if _s is not None:
        try:
            _s.reconfigure(line_buffering=False, write_through=False)
        except Exception:
            pass
        setattr(sys, _name, _Lines(_s))

warnings.filterwarnings("ignore", message=".*non-interactive.*")
os.environ.setdefault("MPLBACKEND", "Agg")


def _send(obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        n = os.write(_ctl_out, data)
        data = data[n:]


_ns = {"__name__": "__main__", "__builtins__": builtins}
_loop = None


def _call(fn, *args):
    try:
        v = fn(*args)
    except Exception:
        return None
    return v


def _bundle(value):
    """The rich forms of value, as a result event's fields."""
    out = {}
    text = _call(repr, value)
    if text is not None:
        out["text"] = text
    for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"),
                      ("_repr_svg_", "svg"), ("_repr_latex_", "latex"),
                      ("_repr_javascript_", "javascript")):
        fn = getattr(value, attr, None) if not isinstance(value, type) else None
        if callable(fn):
            v = _call(fn)
            if isinstance(v, tuple):
                v = v[0]
            if isinstance(v, str):
                out[key] = v
    for attr, key in (("_repr_png_", "png"), ("_repr_jpeg_", "jpeg")):
        fn = getattr(value, attr, None) if not isinstance(value, type) else None
        if callable(fn):
            v = _call(fn)
            if isinstance(v, tuple):
                v = v[0]
            if isinstance(v, bytes):
                out[key] = base64.b64encode(v).decode()
            elif isinstance(v, str):
                out[key] = v
    fn = getattr(value, "_repr_json_", None) if not isinstance(value, type) else None
    if callable(fn):
        v = _call(fn)
        if v is not None:
            out["json"] = v
    elif isinstance(value, (dict, list)):
        try:
            json.dumps(value)
            out["json"] = value
        except (TypeError, ValueError):
            pass
    if _is_figure(value):
        png = _figure_png(value)
        if png:
            out["png"] = png
    return out


def _is_figure(value):
    mpl = sys.modules.get("matplotlib.figure")
    return mpl is not None and isinstance(value, mpl.Figure)


def _figure_png(fig):
    import io
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", bbox_inches="tight")
    except Exception:
        return None
    return base64.b64encode(buf.getvalue()).decode()


def _flush_figures():
    """Sends each open matplotlib figure as a PNG result and closes it."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = plt.get_fignums()
    except Exception:
        return
    for num in nums:
        fig = plt.figure(num)
        png = _figure_png(fig)
        if png:
            _send({"type": "result", "png": png, "text": repr(fig)})
    try:
        plt.close("all")
    except Exception:
        pass


def _error(e):
    tb = e.__traceback__
    # Leave out the driver's own frames.
    while tb is not None and (tb.tb_frame.f_code.co_filename == _DRIVER or
                              tb.tb_frame.f_code.co_filename == ast.__file__):
        tb = tb.tb_next
    lines = traceback.format_exception(type(e), e, tb)
    _send({"type": "error", "name": type(e).__name__, "value": str(e),
           "traceback": "".join(lines)})


def _run(code, n):
    global _loop
    name = "<cell-%d>" % n
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    for node, mode in ((tree, "exec"), (last, "eval")):
        if node is None:
            continue
        co = compile(node, name, mode, flags=flags, dont_inherit=True)
        value = eval(co, _ns)
        if co.co_flags & 0x80:  # CO_COROUTINE: top-level await
            if _loop is None:
                _loop = asyncio.new_event_loop()
            value = _loop.run_until_complete(value)
        if mode == "eval" and value is not None:
            _ns["_"] = value
            ev = {"type": "result", "is_main_result": True}
            ev.update(_bundle(value))
            _send(ev)


def _mark():
    marked = []
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
        try:
            os.write(fd, _MARK)
            marked.append(True)
        except OSError:
            marked.append(False)
    return marked


def _main():
    n = 0
    _send({"type": "ready", "pid": os.getpid()})
    while True:
        try:
            line = _ctl_in.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            req = json.loads(line)
        except ValueError:
            continue
        n += 1
        saved = {}
        try:
            for k, v in (req.get("env") or {}).items():
                saved[k] = os.environ.get(k)
                os.environ[k] = v
            _run(req.get("code", ""), n)
        except BaseException as e:  # KeyboardInterrupt and SystemExit too
            try:
                _error(e)
            except KeyboardInterrupt:
                _send({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": ""})
        finally:
            try:
                _flush_figures()
            except BaseException:
                pass
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _send({"type": "done", "count": n, "marked": _mark()})


_main()
