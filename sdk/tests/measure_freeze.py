#!/usr/bin/env python3
"""What gc.freeze() in a language zygote saves (docs/BENCHMARKS.md, issue 41). Measured,
not asserted.

A handler module preloads ~200 MiB of Python objects: a list of dicts, either "flat"
(strings and a float: CPython leaves such dicts untracked by the collector) or "nested"
(each also holds a list, so every record is a tracked container). A gaffer_exec zygote
forks 4 children, as gaffer would for 4 slots; each child runs one batch, then a full
collection (gc.collect()), and the children's Private_Dirty and PSS are summed from
/proc/<pid>/smaps_rollup. Each run is made with gaffer_exec as
shipped (gc.freeze() before the ready line) and with gc.freeze() made a no-op, for two
batches: "lookup" reads 1,000 records (a typical reference-data handler), "scan" reads
every record (which un-shares through reference counts whatever the collector does).
Spawned processes (4 separate imports) are the reference.

    python3 sdk/tests/measure_freeze.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from test_protocol import ROOT, Lines, batch, fork_child, smaps_kib, write

CHILDREN = 4
# Records per shape for ~200 MiB of objects.
SHAPES = {"flat": 600_000, "nested": 480_000}

HANDLER = '''
import gc, os, random
import gaffer_exec

if os.environ.get("MEASURE_NO_FREEZE"):
    gc.freeze = lambda: None

CITIES = [f"city-{n}" for n in range(50)]
RECORDS = int(os.environ["MEASURE_RECORDS"])
if os.environ["MEASURE_SHAPE"] == "flat":
    DATA = [{"id": i, "name": f"customer-{i:08d}", "city": CITIES[i % 50], "score": i * 0.5}
            for i in range(RECORDS)]
else:
    DATA = [{"id": i, "name": f"customer-{i:08d}", "city": CITIES[i % 50],
             "tags": [CITIES[i % 50], i * 0.5]} for i in range(RECORDS)]


def handle(tasks):
    results = []
    for task in tasks:
        if task["payload"] == "scan":
            seen = sum(len(record["name"]) for record in DATA)
        else:
            picks = random.Random(os.getpid()).sample(range(len(DATA)), 1000)
            seen = sum(len(DATA[i]["name"]) for i in picks)
        gc.collect()
        results.append({"id": task["id"], "status": "ok", "result": seen})
    return results


gaffer_exec.serve(handle)
'''


def start(handler, start, shape, freeze):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "sdk/python"), GAFFER_START=start,
               GAFFER_QUEUE="measure", MEASURE_SHAPE=shape, MEASURE_RECORDS=str(SHAPES[shape]))
    if not freeze:
        env["MEASURE_NO_FREEZE"] = "1"
    return subprocess.Popen([sys.executable, str(handler)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, bufsize=0)


def run_batch(stdin, out, work):
    write(stdin, batch(("t", work)))
    reply = out.line("the batch's reply")
    assert reply["results"][0]["status"] == "ok", reply


def forked(handler, shape, freeze, work):
    """(Σ Private_Dirty, Σ PSS) of the children in MiB, and the zygote's PSS."""
    zygote = start(handler, "fork", shape, freeze)
    control = Lines(zygote.stdout.fileno())
    control.line("the ready line")
    children, dirs = [], []
    try:
        for slot in range(CHILDREN):
            dirs.append(tempfile.mkdtemp(prefix="gaffer-measure-"))
            children.append(fork_child(zygote.stdin.fileno(), control, slot + 1, slot, dirs[-1]))
        for child in children:
            run_batch(child.stdin, child.out, work)
        private = sum(smaps_kib(c.pid, "Private_Dirty") for c in children) / 1024
        pss = sum(smaps_kib(c.pid, "Pss") for c in children) / 1024
        return private, pss, smaps_kib(zygote.pid, "Pss") / 1024
    finally:
        for child in children:
            child.kill()
            child.close()
        zygote.kill()
        zygote.wait()
        for d in dirs:
            shutil.rmtree(d)


def spawned(handler, shape, work):
    """Σ PSS in MiB of CHILDREN spawned processes, each with its own import."""
    procs = [start(handler, "spawn", shape, True) for _ in range(CHILDREN)]
    try:
        for proc in procs:
            run_batch(proc.stdin.fileno(), Lines(proc.stdout.fileno()), work)
        return sum(smaps_kib(p.pid, "Pss") for p in procs) / 1024
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        handler = Path(tmp) / "preloaded_handler.py"
        handler.write_text(HANDLER)
        print(f"{CHILDREN} children, Python {sys.version.split()[0]}, MiB")
        print("| data | batch | freeze | zygote PSS | Σ children Private_Dirty | Σ children PSS "
              "| Σ PSS |")
        print("|---|---|---|---:|---:|---:|---:|")
        for shape in SHAPES:
            for work in ("lookup", "scan"):
                for freeze in (True, False):
                    private, pss, zygote = forked(handler, shape, freeze, work)
                    print(f"| {shape} | {work} | {'yes' if freeze else 'no'} | {zygote:.0f} | "
                          f"{private:.0f} | {pss:.0f} | {pss + zygote:.0f} |")
            total = spawned(handler, shape, "lookup")
            print(f"| {shape} | lookup | spawned, 4 imports | | | | {total:.0f} |")


if __name__ == "__main__":
    main()
