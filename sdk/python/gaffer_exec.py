"""gaffer_exec: write a gaffer `exec` handler once; the queue's config picks how it starts.

    import gaffer_exec

    REFERENCE = load_reference_data()     # module level: loaded once, shared by forked slots

    def handle(tasks):
        # tasks: [{"id": "...", "payload": <JSON value>, "attempt": 1}, ...]
        return [{"id": t["id"], "status": "ok"} for t in tasks]

    gaffer_exec.serve(handle)

Each result entry is {"id", "status": "ok"} (optionally "result" and "next"),
{"id", "status": "retry"} (optionally "delay_ms" and "priority") or {"id", "status": "fail", "error"};
a task left out of the list is retried by gaffer. README.md ("Handlers") has the protocol.

With `start = "spawn"` (GAFFER_START unset or "spawn") serve() speaks the exec protocol on
stdin/stdout. With `start = "fork"` this process is the queue's *language zygote*: it has
already imported the handler's module (its code and data), then serve() forks one child
per slot on gaffer's request, and each child speaks the exec protocol over the slot's
FIFOs. The children share the zygote's memory copy-on-write.

serve() never returns: it exits 0 at the end of input. A forked child leaves with
os._exit(), so atexit hooks (which belong to the zygote) do not run in it.
"""

import collections
import gc
import json
import os
import select
import signal
import sys
import sysconfig
import threading
import time
import traceback

__all__ = ["serve", "should_stop", "cancelled"]
__version__ = "1"

# The fd that protocol replies are written to; see _claim_stdout().
_replies_fd = 1


class _Stdin:
    """Request lines from fd 0, read unbuffered, so that a stop or cancel line that arrives
    while a batch runs can be looked for without blocking: a buffered reader could hold it
    unseen while select() says nothing is waiting."""

    def __init__(self):
        self.buffer = bytearray()
        self.lines = collections.deque()
        self.closed = False

    def _read(self):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            self.closed = True
            return
        # Only the new chunk can hold a newline: a multi-megabyte batch is scanned once.
        start = len(self.buffer)
        self.buffer += chunk
        end = self.buffer.find(b"\n", start)
        while end >= 0:
            self.lines.append(bytes(self.buffer[:end]))
            del self.buffer[: end + 1]
            end = self.buffer.find(b"\n")

    def next_line(self):
        """The next line, blocking; None at the end of input."""
        while not self.lines and not self.closed:
            self._read()
        return self.lines.popleft() if self.lines else None

    def poll(self):
        """Reads what is waiting, without blocking."""
        while not self.closed and select.select([0], [], [], 0)[0]:
            self._read()


class _Batch:
    """What the handler may ask about the batch it is running."""

    def __init__(self, stdin):
        self.stdin = stdin
        self.ids = set()
        self.stop = False
        self.cancels = set()

    def look(self):
        """Takes stop and cancel lines that arrived; any other line stays for the loop."""
        self.stdin.poll()
        keep = collections.deque()
        for line in self.stdin.lines:
            request = _parse(line)
            if isinstance(request, dict) and request.get("stop"):
                self.stop = True
            elif isinstance(request, dict) and isinstance(request.get("cancel"), str):
                self.cancels.add(request["cancel"])
            else:
                keep.append(line)
        self.stdin.lines = keep


_batch = None


def should_stop():
    """Whether gaffer asked this slot to stop during the current batch ({"stop": true}).

    Look between tasks: on True, return the results of the tasks finished so far; the
    others go back to the queue unstarted, with no attempt counted. Never blocks."""
    if _batch is None:
        return False
    _batch.look()
    return _batch.stop


def cancelled(task_id=None):
    """Whether gaffer cancelled `task_id` (any task of the batch when None) while it runs.

    For `kind = "long"` queues, and for a batch queue's task past its `timeout` (the line
    then says {"timeout": true}; gaffer retries the task unless it answers "ok"): look now
    and then during the work, and answer the task (e.g. "fail") when True; a handler that
    does not is sent SIGTERM after cancel_grace."""
    if _batch is None:
        return False
    _batch.look()
    if task_id is None:
        return bool(_batch.cancels & _batch.ids)
    return task_id in _batch.cancels


def _parse(line):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _log(message):
    print(f"gaffer_exec[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _encode(message):
    return (json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _send(data):
    view = memoryview(data)
    while view:
        view = view[os.write(_replies_fd, view) :]


def _write(message):
    _send(_encode(message))


def _claim_stdout():
    """Keeps fd 1 for replies in a private copy and points fd 1 (and print()) at stderr, so
    a stray print(), a C library or a subprocess logs instead of corrupting the protocol."""
    global _replies_fd
    sys.stdout.flush()
    _replies_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def _answer(handle, tasks):
    """The reply line to one batch. An exception (results that cannot be encoded too)
    fails every task of the batch with its text, as the task that raised it is unknown,
    and keeps the process serving."""
    try:
        results = handle(tasks)
        if results is None:
            raise TypeError("handle() returned None instead of a list of results")
        return _encode({"results": list(results)})
    except Exception as error:
        traceback.print_exc()
        text = f"{type(error).__name__}: {error}"
        return _encode({"results": [
            {"id": t["id"], "status": "fail", "error": text} for t in tasks]})


def _exec_loop(handle):
    """The exec protocol: one batch line in, one results line out, until end of input."""
    global _batch
    stdin = _Stdin()
    while (line := stdin.next_line()) is not None:
        request = _parse(line)
        if not isinstance(request, dict) or not isinstance(request.get("batch"), list):
            # A stop or cancel for a batch already answered needs nothing.
            if not (isinstance(request, dict) and ("stop" in request or "cancel" in request)):
                _log(f"unreadable request ignored: {line[:200]!r}")
            continue
        tasks = request["batch"]
        _batch = _Batch(stdin)
        _batch.ids = {t.get("id") for t in tasks if isinstance(t, dict)}
        _batch.ids = {i for i in _batch.ids if isinstance(i, str)}
        reply = _answer(handle, tasks)
        _batch = None
        _send(reply)


def _source_files():
    """The files whose change must replace the zygote: every loaded module's file outside
    the standard library (the handler, its imports, installed packages)."""
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib")}
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not os.path.isfile(path):
            continue
        real = os.path.realpath(path)
        parts = set(real.split(os.sep))
        if real.startswith(tuple(stdlib)) and not parts & {"site-packages", "dist-packages"}:
            continue
        files.add(os.path.abspath(path))
    return sorted(files)


def _fork_request(line):
    """(id, spec, error) of a fork request line; error is None when it is usable."""
    request = _parse(line)
    spec = request.get("fork") if isinstance(request, dict) else None
    if not isinstance(spec, dict):
        return None, None, "not a fork request"
    for key in ("stdin", "stdout", "stderr"):
        if not isinstance(spec.get(key), str):
            return spec.get("id"), None, f"fork request without a {key} path"
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return spec.get("id"), None, "fork request env is not an object of strings"
    return spec.get("id"), spec, None


# How long a forked child whose slot is gone waits for its own loop to end before it ends
# its process group: an orderly end of input is read and obeyed well within it.
_ORPHAN_GRACE = 1.0


def _watch_slot():
    """Ends this process's group once its slot is gone: the slot's end of stdin closing
    makes it hang up. A spawned child dies with its slot (gaffer sets its parent-death
    signal); a forked one's parent is the zygote, so a slot killed outright, or a whole
    host's gaffer gone, would leave it running its task while the task's lease passes to
    another slot. At an orderly end of input the exec loop exits first."""
    poller = select.poll()
    poller.register(0, select.POLLHUP)
    while True:
        for _, events in poller.poll():
            if events & (select.POLLHUP | select.POLLERR):
                time.sleep(_ORPHAN_GRACE)
                os.killpg(0, signal.SIGKILL)


def _flush_all():
    """What os._exit would drop: the standard streams and logging's handlers."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _child(handle, spec):
    """A forked slot's process: its own process group, the slot's FIFOs as fds 1, 2, 0
    (stdout and stderr first: gaffer must never read an end of file before the writers
    exist), the slot's environment, then the exec loop. Never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        opened = [
            os.open(spec["stdout"], os.O_WRONLY),
            os.open(spec["stderr"], os.O_WRONLY),
            os.open(spec["stdin"], os.O_RDONLY),  # blocks until gaffer opens its end
        ]
        for fd, target in zip(opened, (1, 2, 0)):
            os.dup2(fd, target)
            os.close(fd)
        # The zygote's reply pipe: gaffer must see it close when the zygote dies.
        os.close(_replies_fd)
        os.environ.update(spec.get("env", {}))
        _claim_stdout()
        threading.Thread(target=_watch_slot, name="gaffer-slot-watch", daemon=True).start()
        _exec_loop(handle)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_all()
        os._exit(code)


def _zygote(handle):
    """The language zygote: announce readiness, then fork a child per request."""
    # The kernel reaps children of a process that ignores SIGCHLD: no zombies, no waits.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    files = _source_files()
    # Moves every object allocated so far out of the collector's reach: a collection in a
    # child would otherwise write to each preloaded container's header and un-share its page.
    gc.freeze()
    _write({"ready": {"pid": os.getpid(), "files": files}})
    stdin = _Stdin()
    while (line := stdin.next_line()) is not None:
        request_id, spec, error = _fork_request(line)
        if error is None:
            sys.stderr.flush()  # or the child would write the zygote's pending log again
            try:
                pid = os.fork()
            except OSError as fork_error:
                error = f"fork: {fork_error}"
            else:
                if pid == 0:
                    _child(handle, spec)
                _write({"forked": {"id": request_id, "pid": pid}})
                continue
        if request_id is None:
            _log(f"unreadable request ignored ({error}): {line[:200]!r}")
        else:
            _write({"failed": {"id": request_id, "error": error}})


def serve(handle):
    """Serves batches with `handle(tasks) -> results` until the end of input, then exits 0.

    GAFFER_START=fork makes this process the queue's language zygote; unset or "spawn",
    it serves the exec protocol itself. Call it last, after the module's preloading."""
    start = os.environ.get("GAFFER_START", "spawn")
    if start not in ("spawn", "fork"):
        sys.exit(f"gaffer_exec: GAFFER_START={start!r} is neither 'spawn' nor 'fork'")
    _claim_stdout()
    try:
        if start == "fork":
            _zygote(handle)
        else:
            _exec_loop(handle)
    except BrokenPipeError:
        _log("gaffer closed the replies' pipe: exiting")
        sys.exit(1)
    sys.exit(0)
