"""The handler libraries (sdk/python/gaffer_exec.py, sdk/perl/lib/Gaffer/Exec.pm) against
gaffer's side of the exec protocol and of the fork protocol, played here with real
processes (README.md, "Handlers"). No Rust needed: `sdk/tests/run`.

Each case runs for both libraries: the same handler (sdk/tests/handlers/handler.*) is
driven by its tasks' payloads."""

import errno
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = Path(__file__).resolve().parent / "handlers"
TIMEOUT = 10.0


def wait_for(check, what, timeout=TIMEOUT):
    """Polls `check` until it returns something true; fails the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Lines:
    """Lines from a pipe or FIFO fd, each read with a deadline."""

    def __init__(self, fd):
        self.fd = fd
        self.buffer = b""

    def _fill(self, deadline, what):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {what}; got {self.buffer!r}")
        if select.select([self.fd], [], [], left)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return True
            self.buffer += chunk
            return bool(chunk)
        return True

    def line(self, what="a line"):
        deadline = time.monotonic() + TIMEOUT
        while b"\n" not in self.buffer:
            if not self._fill(deadline, what):
                raise AssertionError(f"end of file before {what}; got {self.buffer!r}")
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def text_until(self, needle):
        """Everything read until `needle` shows up (the stderr checks)."""
        deadline = time.monotonic() + TIMEOUT
        while needle.encode() not in self.buffer:
            if not self._fill(deadline, repr(needle)):
                raise AssertionError(f"end of file before {needle!r}; got {self.buffer!r}")
        return self.buffer.decode(errors="replace")

    def at_end(self):
        """Whether the writers are gone and nothing unread is left."""
        deadline = time.monotonic() + TIMEOUT
        while self._fill(deadline, "end of file"):
            pass
        return self.buffer == b""


def write(fd, message):
    data = (message if isinstance(message, str) else json.dumps(message)) + "\n"
    os.write(fd, data.encode())


def batch(*tasks):
    """A batch line of (id, payload) pairs, first attempts."""
    return {"batch": [{"id": i, "payload": p, "attempt": 1} for i, p in tasks]}


def proc_status(pid):
    """/proc/<pid>/status as a dict, or None once the process is gone (reaped)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def smaps_kib(pid, field):
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/smaps_rollup")


class Handler:
    """Which library the cases run against; the handler programs are alike."""

    lang = None

    def command(self):
        if self.lang == "python":
            return ["python3", str(HANDLERS / "handler.py")]
        return ["perl", str(HANDLERS / "handler.pl")]

    def library(self):
        if self.lang == "python":
            return ROOT / "sdk/python/gaffer_exec.py"
        return ROOT / "sdk/perl/lib/Gaffer/Exec.pm"

    def start(self, start="spawn", bare=False, **extra):
        """Starts the handler as gaffer does; `bare`: without the libraries on the paths."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GAFFER_") and k not in ("PYTHONPATH", "PERL5LIB")}
        if not bare:
            env.update(PYTHONPATH=str(ROOT / "sdk/python"), PERL5LIB=str(ROOT / "sdk/perl/lib"))
        env["GAFFER_QUEUE"] = "q"
        if start is not None:
            env["GAFFER_START"] = start
        env.update(extra)
        proc = subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, bufsize=0)
        self.addCleanup(self._end, proc)
        return proc, Lines(proc.stdout.fileno()), Lines(proc.stderr.fileno())

    @staticmethod
    def _end(proc):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()


class SpawnCases(Handler):
    """GAFFER_START unset or "spawn": the library serves the exec protocol itself."""

    def setUp(self):
        self.proc, self.out, self.err = self.start()
        self.stdin = self.proc.stdin.fileno()

    def test_results_as_returned_and_a_left_out_task_omitted(self):
        write(self.stdin, batch(
            ("a", {}), ("b", {"action": "retry", "delay_ms": 1500}),
            ("c", {"action": "fail", "error": "bad"}), ("d", {"action": "skip"})))
        self.assertEqual(self.out.line(), {"results": [
            {"id": "a", "status": "ok"}, {"id": "b", "status": "retry", "delay_ms": 1500},
            {"id": "c", "status": "fail", "error": "bad"}]})

    def test_without_gaffer_start_it_serves_as_spawned(self):
        proc, out, _ = self.start(start=None)
        write(proc.stdin.fileno(), batch(("a", {"action": "info"})))
        reply = out.line()
        self.assertEqual(reply["results"][0]["result"]["pid"], proc.pid)

    def test_an_unknown_start_is_refused(self):
        proc, _, err = self.start(start="bogus")
        self.assertIn("GAFFER_START", err.text_until("neither"))
        self.assertNotEqual(proc.wait(timeout=TIMEOUT), 0)

    def test_a_stop_line_ends_the_batch_after_the_task_in_hand(self):
        write(self.stdin, batch(("a", {"action": "wait_stop"}), ("b", {})))
        # Once the task runs: a stop before it would rightly leave the whole batch out.
        self.err.text_until("waiting a")
        write(self.stdin, {"stop": True})
        self.assertEqual(self.out.line(), {"results": [
            {"id": "a", "status": "ok", "result": {"saw_stop": True}}]})
        # A stop that comes after the reply belongs to no batch: the next one runs whole.
        write(self.stdin, {"stop": True})
        write(self.stdin, batch(("c", {}), ("d", {})))
        self.assertEqual(self.out.line(), {"results": [
            {"id": "c", "status": "ok"}, {"id": "d", "status": "ok"}]})

    def test_a_cancel_line_is_seen_by_the_running_task(self):
        write(self.stdin, batch(("a", {"action": "wait_cancel"})))
        write(self.stdin, {"cancel": "a"})
        self.assertEqual(self.out.line(), {"results": [
            {"id": "a", "status": "fail", "error": "cancelled"}]})

    def test_end_of_input_exits_0(self):
        write(self.stdin, batch(("a", {})))
        self.out.line()
        self.proc.stdin.close()
        self.assertEqual(self.proc.wait(timeout=TIMEOUT), 0)

    def test_an_exception_fails_the_whole_batch_and_the_process_keeps_serving(self):
        write(self.stdin, batch(("a", {"action": "raise", "message": "boom"}), ("b", {})))
        reply = self.out.line()
        self.assertEqual([(r["id"], r["status"]) for r in reply["results"]],
                         [("a", "fail"), ("b", "fail")])
        self.assertTrue(all("boom" in r["error"] for r in reply["results"]), reply)
        self.err.text_until("boom")
        if self.lang == "python":
            self.assertIn("Traceback", self.err.text_until("ValueError"))
        write(self.stdin, batch(("c", {})))
        self.assertEqual(self.out.line(), {"results": [{"id": "c", "status": "ok"}]})
        self.assertIsNone(self.proc.poll())

    def test_results_that_cannot_be_encoded_fail_the_batch(self):
        write(self.stdin, batch(("a", {"action": "unencodable"}), ("b", {})))
        reply = self.out.line()
        self.assertEqual([(r["id"], r["status"]) for r in reply["results"]],
                         [("a", "fail"), ("b", "fail")])
        write(self.stdin, batch(("c", {})))
        self.assertEqual(self.out.line(), {"results": [{"id": "c", "status": "ok"}]})

    def test_print_and_subprocesses_write_to_stderr_not_to_the_protocol(self):
        write(self.stdin, batch(("a", {"action": "print", "message": "hello"})))
        self.assertEqual(self.out.line(), {"results": [{"id": "a", "status": "ok"}]})
        self.assertIn("hello\n", self.err.text_until("hello-shell"))
        self.proc.stdin.close()
        self.assertTrue(self.out.at_end(), "stdout carried more than the reply")


class Child:
    """A forked child as its slot sees it: the pid and its FIFOs' ends."""

    def __init__(self, out, err):
        self.pid, self.stdin, self.out, self.err = None, None, Lines(out), Lines(err)

    def close(self):
        for fd in (self.stdin, self.out.fd, self.err.fd):
            if fd is not None:
                os.close(fd)
        self.stdin = self.out.fd = self.err.fd = None

    def close_stdin(self):
        os.close(self.stdin)
        self.stdin = None

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _open_writer(path):
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ENXIO:  # the child has not opened its end yet
            return None
        raise


def fork_child(zygote_stdin, control, request_id, slot, fifos):
    """Asks a language zygote for a child as gaffer does, with the FIFOs in the private
    directory `fifos`: stdout and stderr opened first, then the child's stdin once the
    child has opened its end."""
    fifos = Path(fifos)
    for name in ("in", "out", "err"):
        os.mkfifo(fifos / name, 0o600)
    child = Child(os.open(fifos / "out", os.O_RDONLY | os.O_NONBLOCK),
                  os.open(fifos / "err", os.O_RDONLY | os.O_NONBLOCK))
    write(zygote_stdin, {"fork": {
        "id": request_id, "stdin": str(fifos / "in"), "stdout": str(fifos / "out"),
        "stderr": str(fifos / "err"), "env": {"GAFFER_SLOT": str(slot)}}})
    reply = control.line("the forked line")
    if set(reply) != {"forked"} or reply["forked"]["id"] != request_id:
        child.close()
        raise AssertionError(f"expected the child of request {request_id}, got {reply}")
    child.pid = reply["forked"]["pid"]
    try:
        child.stdin = wait_for(lambda: _open_writer(fifos / "in"), "the child's stdin open")
    except AssertionError:
        child.kill()
        child.close()
        raise
    flags = fcntl.fcntl(child.stdin, fcntl.F_GETFL)
    fcntl.fcntl(child.stdin, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return child


class ForkCases(Handler):
    """GAFFER_START=fork: the library is a language zygote; this plays gaffer's zygote.
    The zygote preloads 50 MiB, so that its children can be seen sharing it."""

    def setUp(self):
        self.zygote, self.control, self.log = self.start(
            start="fork", GAFFER_TEST_PRELOAD_MIB="50")
        self.ready = self.control.line("the ready line")
        self.next_id = 1

    def fork(self, slot):
        """Asks for a child as a slot does."""
        fifos = tempfile.mkdtemp(prefix="gaffer-sdk-")
        self.addCleanup(shutil.rmtree, fifos)
        request_id, self.next_id = self.next_id, self.next_id + 1
        child = fork_child(self.zygote.stdin.fileno(), self.control, request_id, slot, fifos)
        self.addCleanup(child.close)
        self.addCleanup(child.kill)
        return child

    def info(self, child):
        write(child.stdin, batch(("i", {"action": "info"})))
        return child.out.line("the info reply")["results"][0]["result"]

    def test_the_ready_line_names_the_pid_and_the_handler_files(self):
        ready = self.ready["ready"]
        self.assertEqual(ready["pid"], self.zygote.pid)
        files = ready["files"]
        self.assertTrue(all(os.path.isabs(f) for f in files), files)
        real = {os.path.realpath(f) for f in files}
        self.assertIn(os.path.realpath(self.command()[1]), real)
        self.assertIn(os.path.realpath(self.library()), real)
        if self.lang == "python":
            self.assertFalse([f for f in files if f.endswith("json/__init__.py")], files)

    def test_a_child_serves_in_its_own_group_with_the_slot_env(self):
        child = self.fork(slot=3)
        info = self.info(child)
        self.assertEqual(info["pid"], child.pid)
        self.assertNotEqual(child.pid, self.zygote.pid)
        self.assertEqual(info["pgid"], child.pid)
        self.assertEqual(info["ppid"], self.zygote.pid)
        self.assertEqual((info["slot"], info["queue"], info["start"]), ("3", "q", "fork"))
        if self.lang == "python":
            self.assertGreater(info["frozen"], 0, "gc.freeze() not in effect in the child")
        write(child.stdin, batch(("a", {}), ("b", {"action": "fail", "error": "x"})))
        self.assertEqual(child.out.line(), {"results": [
            {"id": "a", "status": "ok"}, {"id": "b", "status": "fail", "error": "x"}]})

    def test_a_child_prints_to_its_own_stderr(self):
        child = self.fork(slot=1)
        write(child.stdin, batch(("a", {"action": "print", "message": "from-child"})))
        self.assertEqual(child.out.line(), {"results": [{"id": "a", "status": "ok"}]})
        self.assertIn("from-child\n", child.err.text_until("from-child-shell"))

    def test_an_ended_child_leaves_no_zombie(self):
        child = self.fork(slot=1)
        pid = child.pid
        self.info(child)
        child.close_stdin()
        states = []

        def reaped():
            status = proc_status(pid)
            states.append(status and status["State"])
            return status is None

        try:
            wait_for(reaped, f"child {pid} to be reaped")
        except AssertionError:
            self.fail(f"child {pid} still listed, last state {states[-1]!r}")
        self.assertTrue(child.out.at_end())

    def test_end_of_input_ends_the_zygote_and_its_children_keep_serving(self):
        child = self.fork(slot=1)
        self.zygote.stdin.close()
        self.assertEqual(self.zygote.wait(timeout=TIMEOUT), 0)
        # No child holds the zygote's reply pipe: gaffer sees the zygote's end at once.
        self.assertTrue(self.control.at_end())
        write(child.stdin, batch(("a", {})))
        self.assertEqual(child.out.line(), {"results": [{"id": "a", "status": "ok"}]})

    def test_children_share_the_preloaded_memory(self):
        mib = 1024
        self.assertGreaterEqual(smaps_kib(self.zygote.pid, "Rss"), 50 * mib)
        for slot in (1, 2):
            child = self.fork(slot)
            self.assertEqual(self.info(child)["preload"], 50 << 20)
            private = smaps_kib(child.pid, "Private_Dirty")
            self.assertLess(private, 20 * mib, f"child {slot}: {private} KiB Private_Dirty")
            self.assertGreaterEqual(smaps_kib(child.pid, "Shared_Dirty"), 50 * mib)

    def test_unreadable_requests_are_answered_by_id_or_ignored(self):
        write(self.zygote.stdin.fileno(), "not json")
        write(self.zygote.stdin.fileno(), {"fork": {"id": 90}})
        reply = self.control.line()
        self.assertEqual(reply["failed"]["id"], 90, reply)
        self.assertIn("stdin", reply["failed"]["error"])
        self.log.text_until("unreadable")
        child = self.fork(slot=2)
        self.assertEqual(self.info(child)["pid"], child.pid)


class ExampleCases(Handler):
    """examples/python_handler.py and examples/perl_handler.pl run in both start modes and
    quote alike (each finds its library in the checkout without PYTHONPATH/PERL5LIB)."""

    QUOTES = batch(
        ("a", {"sku": "SKU-000042", "quantity": 3, "currency": "USD"}),
        ("b", {"sku": "nope"}))

    def command(self):
        if self.lang == "python":
            return ["python3", str(ROOT / "examples/python_handler.py")]
        return ["perl", str(ROOT / "examples/perl_handler.pl")]

    def check_quotes(self, reply):
        results = {r["id"]: r for r in reply["results"]}
        self.assertEqual(results["a"], {"id": "a", "status": "ok", "result": {
            "sku": "SKU-000042", "quantity": 3, "currency": "USD", "total": "1059.42"}})
        self.assertEqual(results["b"]["status"], "fail")
        self.assertIn("nope", results["b"]["error"])

    def test_spawned(self):
        proc, out, _ = self.start(bare=True)
        write(proc.stdin.fileno(), self.QUOTES)
        self.check_quotes(out.line())

    def test_forked(self):
        zygote, control, _ = self.start(start="fork", bare=True)
        self.assertEqual(control.line("the ready line")["ready"]["pid"], zygote.pid)
        fifos = tempfile.mkdtemp(prefix="gaffer-sdk-")
        self.addCleanup(shutil.rmtree, fifos)
        child = fork_child(zygote.stdin.fileno(), control, 1, 1, fifos)
        self.addCleanup(child.close)
        self.addCleanup(child.kill)
        write(child.stdin, self.QUOTES)
        self.check_quotes(child.out.line())


def cases(base, name):
    """One TestCase per library for a case mixin."""
    for lang in ("python", "perl"):
        cls = type(f"{name}_{lang}", (base, unittest.TestCase), {"lang": lang})
        globals()[cls.__name__] = cls


cases(SpawnCases, "Spawn")
cases(ForkCases, "Fork")
cases(ExampleCases, "Example")

if __name__ == "__main__":
    unittest.main()
