"""Timing, /proc and Redis chores of scripts/bench-exec. Runs in the bench's venv (redis-py,
celery and rq are there); BENCH_EXEC_DIR is the temp dir, results go to results.json."""

import glob
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.request

D = os.environ["BENCH_EXEC_DIR"]
RESULTS = os.path.join(D, "results.json")
MIB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")
HERE = os.path.dirname(os.path.abspath(__file__))


def redis():
    import redis as r

    return r.Redis(port=int(os.environ["BENCH_REDIS_PORT"]))


# ---------------------------------------------------------------- /proc


def children_map():
    """pid -> parent pid of every process."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                out[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def tree(roots):
    """The roots and every descendant (children, grandchildren, ...)."""
    parents = children_map()
    mine, grew = set(roots), True
    while grew:
        more = {p for p, pp in parents.items() if pp in mine} - mine
        grew = bool(more)
        mine |= more
    return sorted(mine)


def smaps(pid, *names):
    out = dict.fromkeys(names, 0)
    try:
        with open("/proc/%s/smaps_rollup" % pid) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in out:
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        return None
    return out


def tree_pss(roots):
    """Σ PSS of the roots' trees, with each process's command and PSS."""
    procs = []
    for pid in tree(roots):
        m = smaps(pid, "Pss", "Private_Dirty")
        if m is None:
            continue
        try:
            cmd = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")
            name = " ".join(os.path.basename(c.decode(errors="replace")) for c in cmd[:3] if c)
        except OSError:
            name = "?"
        procs.append({"pid": pid, "cmd": name, "pss": m["Pss"], "private_dirty": m["Private_Dirty"]})
    return {"pss": sum(p["pss"] for p in procs), "processes": len(procs), "procs": procs}


def start_boottime_ns(pid):
    with open("/proc/%s/stat" % pid) as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return ticks * 10**9 // TICK


# ---------------------------------------------------------------- counters


def read_counts():
    out = []
    for path in glob.glob(os.path.join(D, "count.*")):
        with open(path, "rb") as f:
            data = f.read(32)
        if len(data) == 32:
            out.append(struct.unpack("<4q", data))
    return out


def clear_counts():
    for path in glob.glob(os.path.join(D, "count.*")):
        os.unlink(path)


def drain(n, timeout):
    """Until the workers' counters say n tasks are done: the rate from the first
    completion (any worker) to the last, from the workers' own clocks."""
    n, deadline = int(n), time.monotonic() + float(timeout)
    while True:
        counts = read_counts()
        got = sum(c[0] for c in counts)
        if got >= n:
            break
        if time.monotonic() > deadline:
            sys.exit("bench-exec: drain timed out at %d of %d" % (got, n))
        time.sleep(0.02)
    first = min(counts, key=lambda c: c[1])
    last = max(c[3] for c in counts)
    secs = (last - first[1]) / 1e9
    return {"tasks": got, "per_s": (got - first[2]) / secs, "seconds": secs,
            "per_worker": sorted(c[0] for c in counts)}


def lines(name):
    try:
        with open(os.path.join(D, name)) as f:
            return [l.split() for l in f if l.strip()]
    except FileNotFoundError:
        return []


def touch_until(k, op, push, timeout=300):
    """Pushes k data-reading tasks (op: lookup or scan) at a time, each round once the
    last one finished, until k distinct processes have run one; then everything pushed
    is done."""
    deadline, pushed, name = time.monotonic() + timeout, 0, "touched." + op
    while True:
        pids = {l[0] for l in lines(name)}
        if len(pids) >= k:
            return {"workers_touched": len(pids), "tasks": pushed}
        push(k)
        pushed += k
        while len(lines(name)) < pushed:
            if time.monotonic() > deadline:
                sys.exit("bench-exec: %d of %d %s tasks ran" % (len(lines(name)), pushed, op))
            time.sleep(0.05)


# ---------------------------------------------------------------- gaffer


def gaffer(*args):
    return subprocess.run([os.environ["BENCH_GAFFER"], "--config", os.environ["BENCH_CFG"], *args],
                          check=True, capture_output=True, text=True).stdout


def status():
    url = "http://%s/status" % os.environ["BENCH_HTTP"]
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def slots_of(queue):
    return [s for s in status().get("slots", []) if s["queue"] == queue]


def set_map(host_map):
    """Writes the slot map as a manager would; each write bumps the version (kept in a
    file: helper calls are separate processes)."""
    path = os.path.join(D, "map_version")
    v = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(v))
    m = {"epoch": 1, "version": v, "hosts": {os.environ["BENCH_HOST"]: host_map}}
    redis().set("gaffer:{cluster}:map", json.dumps(m))


def wait_slots(queue, n, timeout):
    """Until exactly n slots of queue exist and all have taken (idle or busy)."""
    deadline = time.monotonic() + float(timeout)
    while True:
        try:
            mine = slots_of(queue)
        except OSError:
            mine = None
        if mine is not None and len(mine) == int(n) and all(
                s["state"] in ("idle", "busy") for s in mine):
            return mine
        if time.monotonic() > deadline:
            sys.exit("bench-exec: timed out waiting for %s slots of %s: %s" % (n, queue, mine))
        time.sleep(0.02)


def wait_pending(queue, timeout):
    """Until the queue has nothing ready, leased or delayed."""
    deadline = time.monotonic() + float(timeout)
    while True:
        q = json.loads(gaffer("stats", "--json"))["queues"][queue]
        if q["ready"] + q["leased"] + q["delayed"] == 0:
            return
        if time.monotonic() > deadline:
            sys.exit("bench-exec: queue %s never emptied: %s" % (queue, q))
        time.sleep(0.2)


def startup(queue, samples):
    """Per sample: one task waits in the queue, the map starts one slot, the handler notes
    its first task; then the map stops the slot. Two figures per sample: the master's
    ready_ms (spawn request -> the slot's first take) and the slot process's start (from
    /proc, 10 ms resolution) -> the handler starting its first task."""
    out = []
    set_map({queue: 0})
    wait_slots(queue, 0, 60)
    for _ in range(int(samples)):
        before = len(lines("first"))
        gaffer("push", queue, "--count", "1", "--payload", '{"op": "first"}')
        set_map({queue: 1})
        deadline = time.monotonic() + 120
        while len(lines("first")) <= before:
            if time.monotonic() > deadline:
                sys.exit("bench-exec: the %s slot never ran its first task" % queue)
            time.sleep(0.01)
        slot = wait_slots(queue, 1, 60)[0]
        first_ns = int(lines("first")[-1][1])
        out.append({"ready_ms": slot["ready_ms"],
                    "first_task_ms": (first_ns - start_boottime_ns(slot["pid"])) / 1e6})
        set_map({queue: 0})
        wait_slots(queue, 0, 60)
    return out


# ---------------------------------------------------------------- results


def put(key, value):
    res = json.load(open(RESULTS)) if os.path.exists(RESULTS) else {}
    res[key] = value
    json.dump(res, open(RESULTS, "w"), indent=1)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ports":  # free TCP ports on loopback, all held until all are known
        socks = [socket.socket() for _ in range(int(args[0]))]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        print(" ".join(str(s.getsockname()[1]) for s in socks))
    elif cmd == "put":  # key, JSON
        put(args[0], json.loads(args[1]))
    elif cmd == "up":  # the master's /status answers
        deadline = time.monotonic() + float(args[0])
        while True:
            try:
                status()
                return
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("bench-exec: the master's /status never answered")
                time.sleep(0.05)
    elif cmd == "set-map":
        set_map(json.loads(args[0]))
    elif cmd == "wait-slots":
        wait_slots(*args)
    elif cmd == "wait-children":  # until pid has n children
        pid, n, timeout = int(args[0]), int(args[1]), float(args[2])
        deadline = time.monotonic() + timeout
        while sum(1 for pp in children_map().values() if pp == pid) < n:
            if time.monotonic() > deadline:
                sys.exit("bench-exec: %d never had %d children" % (pid, n))
            time.sleep(0.1)
    elif cmd == "tree":  # the pids of a process's tree, but itself
        print(" ".join(str(p) for p in tree([int(args[0])]) if p != int(args[0])))
    elif cmd == "tree-pss":  # key, root pids: Σ PSS of their trees into results
        put(args[0], tree_pss([int(p) for p in args[1:]]))
    elif cmd == "one-process":  # key: one plain process importing refdata, after a scan
        code = ("import sys, time; sys.path.insert(0, %r); t = time.monotonic(); "
                "import refdata; t = time.monotonic() - t; refdata.scan(); "
                "pss = [l for l in open('/proc/self/smaps_rollup') if l.startswith('Pss:')]; "
                "print(int(pss[0].split()[1]) * 1024, t)") % HERE
        pss, secs = subprocess.run([sys.executable, "-c", code], check=True,
                                   capture_output=True, text=True).stdout.split()
        put(args[0], {"pss": int(pss), "import_s": float(secs)})
    elif cmd == "touch-gaffer":  # key, op, queue, k
        op, queue, k = args[1], args[2], int(args[3])
        payload = json.dumps({"op": op})
        put(args[0], touch_until(k, op, lambda n: gaffer("push", queue, "--count", str(n),
                                                         "--payload", payload)))
        wait_pending(queue, 120)
    elif cmd == "touch-celery":  # key, op, k
        sys.path.insert(0, HERE)
        from celery_app import app

        op, k = args[1], int(args[2])
        put(args[0], touch_until(k, op, lambda n: [app.send_task(op, queue="mem")
                                                   for _ in range(n)]))
    elif cmd == "wait-pending":  # queue, timeout: nothing ready, leased or delayed
        wait_pending(args[0], float(args[1]))
    elif cmd == "clear-touched":
        for name in ("touched.lookup", "touched.scan", "first"):
            if os.path.exists(os.path.join(D, name)):
                os.unlink(os.path.join(D, name))
    elif cmd == "enqueue-celery":  # n: the no-op task, one message each, one connection
        sys.path.insert(0, HERE)
        from celery_app import app

        n, t = int(args[0]), time.monotonic()
        with app.producer_or_acquire() as producer:
            for _ in range(n):
                app.send_task("noop", producer=producer)
        print(json.dumps({"enqueue_per_s": n / (time.monotonic() - t)}))
    elif cmd == "enqueue-rq":  # n: rq's bulk path (enqueue_many, one pipeline a 1,000)
        from rq import Queue

        q, n, t = Queue("bench", connection=redis()), int(args[0]), time.monotonic()
        for i in range(0, n, 1000):
            q.enqueue_many([Queue.prepare_data("rq_tasks.noop", result_ttl=0)
                            for _ in range(min(1000, n - i))])
        print(json.dumps({"enqueue_per_s": n / (time.monotonic() - t)}))
    elif cmd == "clear-counts":
        clear_counts()
    elif cmd == "drain":  # n, timeout, then JSON of extra fields to merge
        out = drain(args[0], args[1])
        out.update(json.loads(args[2]) if len(args) > 2 else {})
        print(json.dumps(out))
    elif cmd == "startup":  # key, queue, samples
        put(args[0], startup(args[1], args[2]))
    elif cmd == "report":
        report(json.load(open(RESULTS)), args[0] == "json")
    else:
        sys.exit("bench-exec helper: unknown command " + cmd)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


def summarise(r):
    """The results file as the report's JSON: figures, ratios, what was not measured."""
    out = {k: r.get(k) for k in ("date", "machine", "versions", "gaffer", "handler",
                                 "load1_at_start", "slots", "mib")}
    missing = r.get("fork_missing")
    if "one_process" in r:
        one = r["one_process"]["pss"]
        mem = {"one_process_bytes": one, "one_process_import_s": r["one_process"]["import_s"]}
        for op in ("lookup", "scan"):
            celery = r["celery_%s_pss" % op]["pss"]
            for side in ("celery", "gaffer_spawn", "gaffer_fork"):
                got = r.get("%s_%s_pss" % (side, op))
                if got is None:
                    mem.setdefault(side, {})[op] = {"not_measured": missing}
                    continue
                mem.setdefault(side, {})[op] = {
                    "pss_bytes": got["pss"], "processes": got["processes"],
                    "to_one_process": got["pss"] / one, "to_celery": got["pss"] / celery,
                    "touch": r.get("%s_%s_touch" % (side, op)),
                    "largest": sorted(got["procs"], key=lambda p: -p["pss"])[:3]}
        out["memory"] = mem
    if "celery_throughput" in r:
        celery = r["celery_throughput"]["per_s"]
        tp = {}
        for side in ("gaffer", "celery", "rq_fork", "rq_simple"):
            got = r.get(side + "_throughput")
            if got is not None:
                tp[side] = dict(got, to_celery=got["per_s"] / celery)
        out["throughput"] = tp
    if "startup_spawn" in r:
        st = {}
        for mode in ("spawn", "fork"):
            got = r.get("startup_" + mode)
            if got is None:
                st[mode] = {"not_measured": missing}
                continue
            ready = [x["ready_ms"] for x in got]
            first = [x["first_task_ms"] for x in got]
            st[mode] = {"samples": len(got), "ready_ms_p50": statistics.median(ready),
                        "ready_ms_p90": pct(ready, 90), "first_task_ms_p50": statistics.median(first),
                        "first_task_ms_p90": pct(first, 90), "raw": got}
        out["startup"] = st
    return out


def report(r, as_json):
    out = summarise(r)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    mib = lambda b: "%.1f MiB" % (b / MIB)
    nm = lambda x: "not measured: %s" % x["not_measured"]
    rows = []
    if "memory" in out:
        m, n = out["memory"], out["slots"]
        rows.append(("one plain process, data imported and read", mib(m["one_process_bytes"]),
                     "import %.1f s" % m["one_process_import_s"]))
        for op, what in (("lookup", "after lookups"), ("scan", "after full reads")):
            for side, label in (("celery", "Celery prefork -c %d" % n),
                                ("gaffer_spawn", "gaffer exec, %d slots, spawn" % n),
                                ("gaffer_fork", "gaffer exec, %d slots, fork" % n)):
                x = m[side][op]
                label = "Σ PSS %s, %s" % (what, label)
                if "not_measured" in x:
                    rows.append((label, "-", nm(x)))
                else:
                    rows.append((label, mib(x["pss_bytes"]),
                                 "%.2f x one process, %.2f x Celery (%d processes)" % (
                                     x["to_one_process"], x["to_celery"], x["processes"])))
    if "throughput" in out:
        for side, label in (("gaffer", "gaffer exec, 2 slots, batch 100"),
                            ("celery", "Celery prefork -c 2"),
                            ("rq_fork", "RQ, 2 workers (a fork per job)"),
                            ("rq_simple", "RQ, 2 SimpleWorkers")):
            x = out["throughput"].get(side)
            if x:
                rows.append(("no-op tasks/s, " + label, "%.0f/s" % x["per_s"],
                             "%.2f x Celery (%d tasks in %.1f s)" % (
                                 x["to_celery"], x["tasks"], x["seconds"])))
    if "startup" in out:
        for mode in ("spawn", "fork"):
            x = out["startup"][mode]
            label = "slot start, start = %s" % mode
            if "not_measured" in x:
                rows.append((label, "-", nm(x)))
                continue
            rows.append((label + ": ready_ms p50 / p90", "%.1f / %.1f ms" % (
                x["ready_ms_p50"], x["ready_ms_p90"]), "%d starts" % x["samples"]))
            rows.append((label + ": to the first task p50 / p90", "%.0f / %.0f ms" % (
                x["first_task_ms_p50"], x["first_task_ms_p90"]), "10 ms resolution"))
    w = max(len(a) for a, _, _ in rows)
    print("%-*s  %16s  %s" % (w, "measurement", "value", ""))
    for a, b, c in rows:
        print("%-*s  %16s  %s" % (w, a, b, c))
    print()
    print("%s; %s; load1 at start %s; %s; handler: %s; %s" % (
        out["date"], out["machine"], out["load1_at_start"], out["gaffer"], out["handler"],
        ", ".join("%s %s" % kv for kv in (out["versions"] or {}).items())))


if __name__ == "__main__":
    main()
