#!/usr/bin/env python3
"""An example gaffer `exec` handler, and a template for your own.

gaffer starts this program once per slot and keeps it running for the slot's life:

    [queues.example]
    handler = "exec"
    command = ["python3", "examples/exec_handler.py"]

Protocol (README, "Handlers"): one JSON line in per batch, one JSON line out.

    in:  {"batch": [{"id": "...", "payload": <JSON>, "attempt": 1}, ...]}
    out: {"results": [{"id": "...", "status": "ok"},
                      {"id": "...", "status": "retry", "delay_ms": 5000},
                      {"id": "...", "status": "fail", "error": "why"}, ...]}

An "ok" entry may carry "result": <JSON> (kept in the task's record, at most the queue's
max_result) and "next": [{"queue": "...", "payload": <JSON>}, ...], follow-up tasks of the
task's chain, created before the task is acked (docs/API.md, Chains); a follow-up to a
queue the config does not name fails the task.

A queue of kind "long" also sends {"cancel": "ID"} while its task runs: stop the task and
answer it, or get SIGTERM after the queue's cancel_grace (then SIGKILL).

A batch queue's slot that is asked to stop (its queue shrinks, its host drains) while this
process has a batch sends {"stop": true} on stdin: finish the task in hand, then reply at
once for the tasks finished (any subset of the batch); the tasks the reply leaves out go
back to the queue unstarted, no attempt counted. Ignoring it is allowed: the full reply is
used, it only keeps the slot from moving sooner. A stop line that arrives after the reply
(the batch was already answered) needs nothing. This template looks for it between tasks.

When the slot ends in order (stopped, scaled down, recycled), stdin closes between
batches: end at the end of input, after closing what you hold. A process still running 5 s
later gets SIGTERM, then SIGKILL 2 s after that.

A payload that is not JSON arrives as a JSON string. A task left out of the reply is
retried by the queue's policy; an unreadable reply or an exit retries the whole batch and
gaffer starts a new process. stdout belongs to the protocol: log to stderr, which gaffer
copies to the slot's log line by line.

The demo behaviour is driven by the payload so gaffer's tests can use it:
    {"action": "ok"}                        -> ok (also: no action, or a non-object payload)
    {"action": "retry", "delay_ms": N}      -> retry (no delay_ms: the queue's policy)
    {"action": "fail", "error": "..."}      -> fail
    {"action": "skip"}                      -> left out of the reply
    {"action": "sleep", "ms": N}            -> sleeps, then ok
    {"action": "garbage"}                   -> a non-JSON reply for the whole batch
    {"action": "die"}                       -> exits with status 3 without replying
An "ok" or "sleep" payload's "result" and "next", when it has them, go into its ok reply as
they are: {"action": "ok", "next": [{"queue": "q2", "payload": {...}}]} makes a follow-up
(the fault suite's chains are built so).

If GAFFER_EXEC_RECORD names a file, "queue id attempt slot_pid pid time_ms" is appended to
it for every task received, before it runs, so a crash mid-task still leaves a trace of the
attempt: slot_pid is the slot that sent it (this process's parent), pid this process,
time_ms the wall clock in milliseconds. The fault suite (scripts/chaos) reads it.
"""

import json
import os
import select
import sys
import time

QUEUE = os.environ.get("GAFFER_QUEUE", "?")
SLOT = os.environ.get("GAFFER_SLOT", "?")

# Keep the real stdout for replies and send everything else printed to stderr, so a stray
# print() in your code lands in the log instead of corrupting the protocol.
REPLIES = sys.stdout
sys.stdout = sys.stderr


def log(message):
    print(f"[{QUEUE}/{SLOT}] {message}", file=sys.stderr, flush=True)


class GarbageReply(Exception):
    """Test hook: answer the whole batch with a line that is not JSON."""


def handle(task):
    """Runs one task; returns its result dict, or None to leave it out of the reply.

    Replace this with your own work. Anything expensive to set up (clients, models) belongs
    at module level or in main(), once per process, not here once per task.
    """
    payload = task["payload"]
    action = payload.get("action", "ok") if isinstance(payload, dict) else "ok"
    if action == "ok":
        return ok(payload)
    if action == "retry":
        result = {"status": "retry"}
        if "delay_ms" in payload:
            result["delay_ms"] = payload["delay_ms"]
        return result
    if action == "fail":
        return {"status": "fail", "error": payload.get("error", "failed")}
    if action == "skip":
        return None
    if action == "sleep":
        time.sleep(payload.get("ms", 0) / 1000)
        return ok(payload)
    if action == "garbage":
        raise GarbageReply()
    if action == "die":
        log(f"task {task['id']}: exiting without a reply, as asked")
        sys.exit(3)
    return {"status": "fail", "error": f"unknown action {action!r}"}


def ok(payload):
    """An ok reply, with the payload's "result" and "next" (follow-ups) when it has them."""
    reply = {"status": "ok"}
    if isinstance(payload, dict):
        for key in ("result", "next"):
            if key in payload:
                reply[key] = payload[key]
    return reply


class Requests:
    """The request lines on stdin, read unbuffered by us, so a stop line that arrives while
    a batch runs can be looked for between tasks without blocking (a buffered reader could
    hold it unseen while select() says nothing is waiting)."""

    def __init__(self):
        self.pending = b""

    def _read(self):
        chunk = os.read(0, 65536)
        self.pending += chunk
        return bool(chunk)

    def next(self):
        """The next request, blocking; None when stdin is closed."""
        while b"\n" not in self.pending:
            if not self._read():
                return None
        line, self.pending = self.pending.split(b"\n", 1)
        # Bytes in: the request is UTF-8 whatever the locale says.
        return json.loads(line)

    def stop_asked(self):
        """Whether {"stop": true} has arrived, without blocking; other lines that came
        meanwhile (a late cancel) are dropped."""
        while True:
            if b"\n" not in self.pending:
                if not select.select([0], [], [], 0)[0] or not self._read():
                    return False
                continue
            line, self.pending = self.pending.split(b"\n", 1)
            if json.loads(line).get("stop"):
                return True


def main():
    record_path = os.environ.get("GAFFER_EXEC_RECORD")
    record = open(record_path, "a", encoding="utf-8") if record_path else None
    log(f"started, pid {os.getpid()}")

    requests = Requests()
    while True:
        request = requests.next()
        if request is None:
            break
        if "stop" in request:
            log("stop after the batch was answered: nothing to stop")
            continue
        if "cancel" in request:
            # Long queues (kind = "long") send {"cancel": "ID"} while the task runs; a
            # handler of such a queue watches stdin during its work, stops the task and
            # answers it. Between tasks there is nothing left to stop.
            log(f"cancel of {request['cancel']} after it ended: nothing to stop")
            continue
        results = []
        try:
            for task in request["batch"]:
                # Between tasks: a stop leaves the tasks not yet started out of the reply.
                if requests.stop_asked():
                    log(f"asked to stop: answering {len(results)} finished tasks")
                    break
                if record:
                    now_ms = int(time.time() * 1000)
                    record.write(
                        f"{QUEUE} {task['id']} {task['attempt']} "
                        f"{os.getppid()} {os.getpid()} {now_ms}\n"
                    )
                    record.flush()
                try:
                    result = handle(task)
                except GarbageReply:
                    raise
                except Exception as error:
                    # A bug or bad input in one task fails that task, not the whole batch.
                    log(f"task {task['id']} failed: {error!r}")
                    result = {"status": "fail", "error": repr(error)}
                if result is not None:
                    results.append({"id": task["id"], **result})
        except GarbageReply:
            REPLIES.write("this is not JSON\n")
            REPLIES.flush()
            continue
        # gaffer waits for this line: always flush it.
        REPLIES.write(json.dumps({"results": results}) + "\n")
        REPLIES.flush()
    log("stdin closed, exiting")


if __name__ == "__main__":
    main()
