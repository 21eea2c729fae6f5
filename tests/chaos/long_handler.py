#!/usr/bin/env python3
"""The exec handler of the fault suite's long-tasks profile (tests/chaos/longtasks.rs).

Runs each long task until it is cancelled, writing to $GAFFER_EXEC_RECORD:

    start ID HOST SLOT PID T     when the task reaches it
    beat ID PID T                every BEAT seconds while it runs
    cancel ID PID T              when the cancel line arrives
    stop ID PID T                when it winds down and answers

T is the wall clock in seconds. A run killed (SIGKILL from its slot, or its slot dying)
writes no stop line: its last beat bounds when it last did any work, which is what the
oracle's overlap check needs (a frozen process does none). A payload with
"on_cancel": "ignore" makes it go on after the cancel line until SIGTERM (the queue's
cancel_grace path), which it does not catch.
"""

import json
import os
import select
import sys
import time

BEAT = 0.2
RECORD = os.environ["GAFFER_EXEC_RECORD"]
HOST = os.environ.get("GAFFER_CHAOS_HOST", "?")
SLOT = os.environ.get("GAFFER_SLOT", "?")
OUT = sys.stdout
sys.stdout = sys.stderr


def note(*words):
    # One write per line with O_APPEND: lines of concurrent children never interleave.
    line = (" ".join(str(w) for w in words) + "\n").encode()
    fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_line():
    out = b""
    while True:
        c = os.read(0, 1)
        if not c:
            sys.exit(0)
        if c == b"\n":
            return json.loads(out)
        out += c


def run(task):
    tid, payload = task["id"], task["payload"]
    ignore = isinstance(payload, dict) and payload.get("on_cancel") == "ignore"
    note("start", tid, HOST, SLOT, os.getpid(), f"{time.time():.3f}")
    while True:
        note("beat", tid, os.getpid(), f"{time.time():.3f}")
        ready, _, _ = select.select([0], [], [], BEAT)
        if not ready:
            continue
        msg = read_line()
        if "cancel" in msg:
            note("cancel", msg["cancel"], os.getpid(), f"{time.time():.3f}")
            if not ignore:
                break
    note("stop", tid, os.getpid(), f"{time.time():.3f}")
    OUT.write(json.dumps({"results": [{"id": tid, "status": "ok"}]}) + "\n")
    OUT.flush()


while True:
    msg = read_line()
    if "batch" in msg:
        run(msg["batch"][0])
