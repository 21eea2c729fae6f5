"""What scripts/bench-exec's tasks write down, the same way in gaffer's exec handler,
Celery's tasks and RQ's jobs, so the three are timed alike (plain Python, no client
library). Everything goes under $BENCH_EXEC_DIR.

- done(n): n tasks finished. Each worker keeps four int64 in a file of its own, mapped
  shared (count, first_ns, count at first, last_ns; CLOCK_MONOTONIC, system-wide), so the
  bench reads the drain's first and last completion from the workers' own clocks and a
  task costs a few hundred nanoseconds more, not a Redis round trip. The file is read and
  written through the mapping each time, so RQ's work horses (a fork per job) keep
  counting in their worker's file: BENCH_COUNT_KEY names it (one per worker process, which
  runs one job at a time); without it, the pid does.
- touched(op): this process ran a task that read the reference data, `op` being lookup or
  scan (one line in the file touched.OP: its pid). It then holds the worker 0.2 s, as a
  task waiting on I/O would, so that k such tasks pushed together spread over k idle
  workers (Celery's pool hands a quick task to whichever child is free first, often the
  same one).
- first(): the first task this process ran, as "pid CLOCK_BOOTTIME-ns" (compared with
  the slot's start time from /proc, which counts from boot).
"""

import mmap
import os
import struct
import time

DIR = os.environ["BENCH_EXEC_DIR"]
_FMT = struct.Struct("<4q")
_map = None
_first_done = False


def _counter():
    global _map
    if _map is None:
        key = os.environ.get("BENCH_COUNT_KEY") or str(os.getpid())
        path = os.path.join(DIR, "count." + key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(fd).st_size < _FMT.size:
            os.ftruncate(fd, _FMT.size)
        _map = mmap.mmap(fd, _FMT.size)
        os.close(fd)
    return _map


def done(n=1):
    m = _counter()
    now = time.monotonic_ns()
    count, first, at_first, _ = _FMT.unpack_from(m)
    if count == 0:
        first, at_first = now, n
    _FMT.pack_into(m, 0, count + n, first, at_first, now)


def _append(name, line):
    fd = os.open(os.path.join(DIR, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def touched(op):
    _append("touched." + op, "%d\n" % os.getpid())
    time.sleep(0.2)


def first():
    global _first_done
    if not _first_done:
        _first_done = True
        _append("first", "%d %d\n" % (os.getpid(), time.clock_gettime_ns(time.CLOCK_BOOTTIME)))
