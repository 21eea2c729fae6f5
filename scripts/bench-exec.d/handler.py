#!/usr/bin/env python3
"""scripts/bench-exec's gaffer exec handler: `handler.py ROLE DIR`.

ROLE mem: imports refdata (200 MiB), notes its first task, and per task reads the data as
the payload says ({"op": "lookup"}: 1,000 records by key; {"op": "scan"}: all of them);
noop: answers every task ok and counts them. DIR is the bench's temp dir (benchtask.py
writes there).

With the repository's Python library on the path (sdk/python/gaffer_exec.py, which
scripts/bench-exec puts on PYTHONPATH when it exists) the handler is
`gaffer_exec.serve(handle)`, so the queue's `start` decides spawn or fork; without it, a
minimal loop of the exec protocol (README, Handlers) that can only be spawned.
"""

import json
import os
import sys

ROLE = sys.argv[1]
os.environ["BENCH_EXEC_DIR"] = sys.argv[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchtask  # noqa: E402

if ROLE == "mem":
    import refdata  # noqa: E402


def handle(tasks):
    if ROLE == "mem":
        benchtask.first()
        for t in tasks:
            op = t["payload"].get("op") if isinstance(t["payload"], dict) else None
            if op in ("lookup", "scan"):
                getattr(refdata, op)()
                benchtask.touched(op)
    results = [{"id": t["id"], "status": "ok"} for t in tasks]
    if ROLE == "noop":
        benchtask.done(len(tasks))
    return results


def serve(handle):
    """The exec protocol, batches only (stop and cancel lines are ignored, as allowed)."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        batch = json.loads(line).get("batch")
        if batch is not None:
            out.write(json.dumps({"results": handle(batch)}).encode() + b"\n")
            out.flush()


try:
    import gaffer_exec
except ImportError:
    gaffer_exec = None

if gaffer_exec is not None:
    gaffer_exec.serve(handle)
else:
    if os.environ.get("GAFFER_START", "spawn") != "spawn":
        sys.exit("handler.py: start = %r needs gaffer_exec (sdk/python)" % os.environ["GAFFER_START"])
    serve(handle)
