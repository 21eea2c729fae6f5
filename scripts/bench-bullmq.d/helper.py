"""Timing, /proc and Redis chores of scripts/bench-bullmq (Python stdlib only)."""
import json
import os
import socket
import statistics
import sys
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20
POLL = 0.002  # the gaffer drain's counter read, as `gaffer bench --e2e` does it
FOOTPRINT_EVERY = 50  # polls between two footprint samples (about 0.1 s)
DRAIN_LIMIT = 900


class Redis:
    """Just enough RESP to poll a counter every 2 ms without forking redis-cli."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", int(port)))
        self.f = self.s.makefile("rb")
        self.own = {}  # this poller's calls by command, left out of the calls per task

    def cmd(self, *args):
        name = str(args[0]).lower()
        self.own[name] = self.own.get(name, 0) + 1
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self.reply()

    def reply(self):
        line = self.f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        return rest.decode()

    def cpu(self):
        """Redis's own CPU so far, user + sys, seconds."""
        info = dict(l.split(":", 1) for l in self.cmd("INFO", "cpu").splitlines() if ":" in l)
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def calls(self, n):
        """Commands Redis ran per task since CONFIG RESETSTAT (those inside scripts
        included), this poller's own and the measurement's INFO/CONFIG left out: the
        total, the script calls among them and the four most frequent."""
        got = {}
        for line in self.cmd("INFO", "commandstats").splitlines():
            if line.startswith("cmdstat_"):
                name, _, rest = line[len("cmdstat_"):].partition(":")
                got[name] = int(rest.split("calls=")[1].split(",")[0]) - self.own.get(name, 0)
        got = {k: v for k, v in got.items() if v > 0 and k not in ("info", "config")}
        top = sorted(got.items(), key=lambda kv: -kv[1])[:4]
        scripts = sum(got.get(k, 0) for k in ("evalsha", "eval", "evalsha_ro", "fcall", "fcall_ro"))
        return {"calls_per_task": sum(got.values()) / n, "scripts_per_task": scripts / n,
                "top_calls_per_task": {k: round(v / n, 3) for k, v in top}}


def kib_fields(path, *names):
    out = dict.fromkeys(names, 0)
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in out:
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def rss(pid):
    return kib_fields("/proc/%s/status" % pid, "VmRSS")["VmRSS"]


def private(pid):
    f = kib_fields("/proc/%s/smaps_rollup" % pid, "Private_Dirty", "Private_Clean")
    return f["Private_Dirty"] + f["Private_Clean"]


def top_private(pid, k=4):
    """The k mappings (by name) of a pid holding the most private memory, KiB."""
    by_name, cur = {}, None
    try:
        with open("/proc/%s/smaps" % pid) as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    cur = " ".join(head[5:]) or "[anon]"
                elif head[0] in ("Private_Dirty:", "Private_Clean:"):
                    by_name[cur] = by_name.get(cur, 0) + int(head[1])
    except OSError:
        return {}
    return dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:k])


def tree_cpu(roots):
    """CPU seconds (user + sys) of the roots and every descendant (zygote, slots)."""
    stat = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
            stat[int(pid)] = (int(f[1]), int(f[11]) + int(f[12]))
        except (OSError, IndexError):
            pass
    mine, grew = set(roots), True
    while grew:
        more = {p for p, (pp, _) in stat.items() if pp in mine} - mine
        grew = bool(more)
        mine |= more
    return sum(stat[p][1] for p in mine if p in stat) / TICK


def slot_pids(http, queue):
    with urllib.request.urlopen("http://%s/status" % http, timeout=5) as r:
        st = json.load(r)
    return [s["pid"] for s in st.get("slots", []) if s["queue"] == queue and s.get("pid")]


def gaffer_drain(port, stats_key, n, base, http, queue, manager, master):
    """Polls the queue's acked counter until it moved by n from base (read while the
    queue was still paused): the rate runs from the first ack seen to the last. CPU per
    task (Redis's, and manager + master + zygote + slots') runs from a snapshot taken
    right after the first ack, counted from the acks read after that snapshot, to one
    after the last ack. The daemons' footprint is sampled every ~0.1 s of the drain and
    once after it."""
    n, base, r = int(n), int(base), Redis(port)
    acked = lambda: int(r.cmd("HGET", stats_key, "acked") or 0) - base
    roots = [int(manager), int(master)]
    t_first = a_first = cpu_from = None
    slots, foot = [], {"master_rss": 0, "manager_rss": 0, "slot_private": 0}
    deadline, polls = time.monotonic() + DRAIN_LIMIT, 0

    def sample():
        # /status lists a new slot only once the master has its report: ask until it does
        if not slots:
            slots.extend(slot_pids(http, queue))
        foot["master_rss"] = max(foot["master_rss"], rss(master))
        foot["manager_rss"] = max(foot["manager_rss"], rss(manager))
        for p in slots:
            foot["slot_private"] = max(foot["slot_private"], private(p))

    while True:
        a, now = acked(), time.monotonic()
        if a > 0 and t_first is None:
            t_first, a_first = now, a
            c, g = r.cpu(), tree_cpu(roots)
            cpu_from = (c, g, acked())
        if a >= n:
            break
        if now > deadline:
            sys.exit("gaffer's drain timed out at %d of %d acked" % (a, n))
        polls += 1
        if t_first is not None and polls % FOOTPRINT_EVERY == 0:
            sample()
        time.sleep(POLL)
    c, g, a_cpu = cpu_from
    counted = max(1, n - a_cpu)
    redis_us = (r.cpu() - c) / counted * 1e6
    gaffer_us = (tree_cpu(roots) - g) / counted * 1e6
    sample()
    # right after the drain, every slot idle again: what bench-host measured
    after = {"master_rss_after": rss(master), "manager_rss_after": rss(manager),
             "slot_private_after": max((private(p) for p in slots), default=0),
             "slot_top_private_kib": top_private(slots[0]) if slots else {}}
    print(json.dumps({"per_s": (a - a_first) / (now - t_first), "redis_us": redis_us,
                      "client_us": gaffer_us, "cpu_tasks": counted, "slots": len(slots),
                      **foot, **after, **r.calls(n)}))


def wait_slots(http, queue, n, timeout):
    """Until the master runs exactly n slots of the queue: a pause reaches the slots only
    through the manager's next map, so tasks pushed before that would be taken."""
    deadline = time.monotonic() + float(timeout)
    while True:
        try:
            have = len(slot_pids(http, queue))
        except OSError:
            have = None
        if have == int(n):
            return
        if time.monotonic() > deadline:
            sys.exit("the master runs %s slots of %s, not %s" % (have, queue, n))
        time.sleep(0.05)


def bullmq_drained(port, n, timeout):
    """Until BullMQ's queue `bench` has nothing waiting, prioritized or active; then the
    commands per job since the drain's CONFIG RESETSTAT."""
    r, deadline = Redis(port), time.monotonic() + float(timeout)
    while True:
        left = (r.cmd("LLEN", "bull:bench:wait") + r.cmd("LLEN", "bull:bench:active")
                + r.cmd("ZCARD", "bull:bench:prioritized"))
        if left == 0:
            print(json.dumps(r.calls(int(n))))
            return
        if time.monotonic() > deadline:
            sys.exit("BullMQ's drain timed out with %d jobs left" % left)
        time.sleep(0.02)


def bullmq_round(n, cpu0, cpu1, reports, calls):
    """The workers' own reports → rate from the first completion (any worker) to the last."""
    n = int(n)
    calls = json.load(open(calls))
    ws = [json.loads(l) for l in open(reports) if l.strip()]
    got = sum(w["completed"] for w in ws)
    if got != n:
        sys.exit("BullMQ completed %d jobs, not %d" % (got, n))
    first = min(w["first_ms"] for w in ws if w["completed"])
    last = max(w["last_ms"] for w in ws if w["completed"])
    print(json.dumps({"per_s": (n - 1) / ((last - first) / 1000),
                      "redis_us": (float(cpu1) - float(cpu0)) / n * 1e6,
                      "client_us": sum(w["cpu_us"] for w in ws) / n,
                      "per_worker": [w["completed"] for w in ws], **calls}))


def summary(path):
    rounds = [json.loads(l) for l in open(path) if l.strip()]
    print()
    print("round  BullMQ jobs/s  gaffer tasks/s  ratio  | Redis us/task B g | client CPU us/task B g")
    for i, x in enumerate(rounds, 1):
        b, g = x["bullmq"], x["gaffer"]
        print("%5d  %13.0f  %14.0f  %5.2f  | %7.2f %6.2f | %8.2f %6.2f" % (
            i, b["per_s"], g["per_s"], g["per_s"] / b["per_s"], b["redis_us"], g["redis_us"],
            b["client_us"], g["client_us"]))
    med = lambda side, k: statistics.median(x[side][k] for x in rounds)
    ratios = [x["gaffer"]["per_s"] / x["bullmq"]["per_s"] for x in rounds]
    print("%6s  %13.0f  %14.0f  %5.2f  | %7.2f %6.2f | %8.2f %6.2f   (ratio: median of the rounds')" % (
        "median", med("bullmq", "per_s"), med("gaffer", "per_s"), statistics.median(ratios),
        med("bullmq", "redis_us"), med("gaffer", "redis_us"),
        med("bullmq", "client_us"), med("gaffer", "client_us")))
    for side in ("bullmq", "gaffer"):
        x = rounds[-1][side]
        print("%s, last round: %.3f script calls and %.2f Redis commands in all per task (%s)" % (
            side, x["scripts_per_task"], x["calls_per_task"],
            ", ".join("%s %.3f" % kv for kv in x["top_calls_per_task"].items())))
    mib = lambda b: "%.1f MiB" % (b / MIB)
    foot = lambda k: max(x["gaffer"][k] for x in rounds)
    print("footprint, max over the gaffer drains: master RSS %s (target < 30 MiB), manager RSS %s, "
          "no-op slot private %s (target < 8 MiB)" % (
              mib(foot("master_rss")), mib(foot("manager_rss")), mib(foot("slot_private"))))
    last = rounds[-1]["gaffer"]
    print("footprint right after the last drain: master RSS %s, manager RSS %s, no-op slot "
          "private %s; the slot's largest private mappings: %s" % (
              mib(last["master_rss_after"]), mib(last["manager_rss_after"]),
              mib(last["slot_private_after"]),
              ", ".join("%s %d KiB" % kv for kv in last["slot_top_private_kib"].items())))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ports":  # free TCP ports on loopback, all held until all are known
        socks = [socket.socket() for _ in range(int(args[0]))]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        print(" ".join(str(s.getsockname()[1]) for s in socks))
    elif cmd == "redis-cpu":
        print(Redis(args[0]).cpu())
    elif cmd == "gaffer-drain":
        gaffer_drain(*args)
    elif cmd == "wait-slots":
        wait_slots(*args)
    elif cmd == "bullmq-drained":
        bullmq_drained(*args)
    elif cmd == "bullmq-round":
        bullmq_round(*args)
    elif cmd == "summary":
        summary(args[0])
    else:
        sys.exit("bench-bullmq helper: unknown command " + cmd)


main()
