//! Long-running tasks (`kind = "long"`, docs/OPERATIONS.md "Long tasks") end to end: real
//! `gaffer master` processes with distinct host names, real exec children that log when
//! they start and stop, a real api, the real CLI, real signals.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gaffer::cluster::{self, Keys, SlotMap};
use gaffer::config::{LONG_RENEW_EVERY, QueueKind};
use gaffer::queue_client::{NewTask, Queue, QueueClient, QueueLimits, RecordState, TaskRecord};
use gaffer::redis_server::free_port;
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::{ANY_LOAD, TestRedis, eventually, kid_ids, poll_some};
use crate::host::{gone, http_get, slots};

/// The exec child of the tests' long queues: runs each task until its payload's `run_s`
/// passes (forever without), then answers its `then` (`ok` by default, with the payload's
/// `result` and `next` follow-ups when it has them). A cancel line is
/// logged and, with `"on_cancel": "stop"`, ends the task; otherwise the child goes on
/// until SIGTERM. Every start, cancel and stop goes to `$LONG_LOG` with the host
/// (`$LONG_HOST`), the pid and the time.
const CHILD: &str = r#"
import json, os, select, sys, time
log, host = os.environ["LONG_LOG"], os.environ.get("LONG_HOST", "?")
def note(*words):
    with open(log, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")
def line():
    out = b""
    while True:
        c = os.read(0, 1)
        if not c:
            sys.exit(0)
        if c == b"\n":
            return json.loads(out)
        out += c
while True:
    msg = line()
    if "cancel" in msg:
        note("late-cancel", msg["cancel"], host, os.getpid(), time.time())
        continue
    task = msg["batch"][0]
    tid, p = task["id"], task["payload"]
    note("start", tid, host, os.getpid(), time.time())
    end = time.time() + p.get("run_s", 1e9)
    status = None
    while status is None:
        left = end - time.time()
        if left <= 0:
            status = p.get("then", "ok")
            break
        r, _, _ = select.select([0], [], [], left)
        if r:
            m = line()
            if "cancel" in m:
                note("cancel", m["cancel"], host, os.getpid(), time.time())
                if p.get("on_cancel") == "stop":
                    status = "ok"
    note("stop", tid, host, os.getpid(), time.time())
    reply = {"id": tid, "status": status}
    for k in ("result", "next"):
        if k in p and status == "ok":
            reply[k] = p[k]
    print(json.dumps({"results": [reply]}), flush=True)
"#;

const ADMIN: &str = "long-admin-token";

/// Processes killed on drop, with the host each master serves.
struct Procs(Vec<(String, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One Redis, a config with the long queues under test, and masters (a manager too,
/// where the balancer is under test).
struct Hosts {
    redis: TestRedis,
    dir: tempfile::TempDir,
    config: PathBuf,
    client: QueueClient,
    procs: Procs,
    /// Each master's host and HTTP port.
    http: Vec<(String, u16)>,
}

impl Hosts {
    /// Redis and a config of `queues` (TOML tables; `{child}` stands for the exec
    /// command of [`CHILD`]).
    async fn start(queues: &str) -> Self {
        let redis = TestRedis::start();
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("child.py");
        std::fs::write(&script, CHILD).unwrap();
        let config = dir.path().join("config.toml");
        let queues = queues
            .replace(
                "{child}",
                &format!("[\"python3\", \"{}\"]", script.display()),
            )
            .replace(
                "{wrapped}",
                &format!("[\"sh\", \"-c\", \"python3 {}; true\"]", script.display()),
            )
            .replace(
                "{sleeper}",
                &format!(
                    "[\"sh\", \"-c\", \"(sleep 1000 & echo $! > {}.$$); exec python3 {}\"]",
                    dir.path().join("sleeper").display(),
                    script.display()
                ),
            );
        let text = format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
             [manager]\ntick = \"500ms\"\nheartbeat_timeout = \"3s\"\n\n\
             [master]\ndrain_timeout = \"5s\"\nmemory_reserve = \"64MiB\"\n\n\
             [api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n\n{queues}",
            redis.url(),
            gaffer::api::hash_token(ADMIN)
        );
        std::fs::write(&config, text).unwrap();
        Hosts {
            client: redis.client().await,
            redis,
            dir,
            config,
            procs: Procs(Vec::new()),
            http: Vec::new(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("tasks.log")
    }

    /// The exec children's log, one event per line split in words.
    fn events(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').map(str::to_owned).collect())
            .collect()
    }

    /// The pids of the children that logged `what` for `task`, in order.
    fn pids(&self, what: &str, task: &str) -> Vec<u32> {
        self.events()
            .iter()
            .filter(|e| e[0] == what && e[1] == task)
            .map(|e| e[3].parse().unwrap())
            .collect()
    }

    fn gaffer(&self, args: &[&str], log: &str) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gaffer"));
        cmd.arg("--config")
            .arg(&self.config)
            .args(args)
            .env("GAFFER_LOG", "info")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .env("LONG_LOG", self.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join(log)).unwrap());
        cmd
    }

    /// Starts a master for `host`; returns its pid.
    fn master(&mut self, host: &str) -> u32 {
        self.master_with(host, &[])
    }

    /// Starts a master for `host` with `env` (and so its slots); returns its pid.
    fn master_with(&mut self, host: &str, env: &[(&str, &Path)]) -> u32 {
        let http = free_port().unwrap();
        let child = self
            .gaffer(&["master", "--host", host], &format!("master-{host}.log"))
            .envs(env.iter().copied())
            .env("GAFFER_MASTER_HTTP", format!("127.0.0.1:{http}"))
            .env("LONG_HOST", host)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.procs.0.push((host.to_owned(), child));
        self.http.push((host.to_owned(), http));
        pid
    }

    /// Starts the manager.
    fn manager(&mut self) {
        let child = self
            .gaffer(&["manager"], "manager.log")
            .env(
                "GAFFER_MANAGER_HTTP",
                format!("127.0.0.1:{}", free_port().unwrap()),
            )
            .spawn()
            .unwrap();
        self.procs.0.push(("manager".to_owned(), child));
    }

    fn master_log(&self, host: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("master-{host}.log")))
            .unwrap_or_default()
    }

    /// Writes a slot map (no manager): host → queue → slots.
    async fn publish(&self, version: u64, map: &[(&str, &str, u32)]) {
        let mut hosts: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        for (host, queue, n) in map {
            hosts
                .entry(host.to_string())
                .or_default()
                .insert(queue.to_string(), *n);
        }
        let map = SlotMap {
            epoch: 1,
            version,
            hosts,
        };
        cluster::write_map_unfenced(&mut self.client.connection(), &Keys::new("test"), &map)
            .await
            .unwrap();
    }

    /// Waits until `host`'s master reports `n` slots started.
    async fn slots_up(&self, host: &str, n: usize) {
        let port = self.http.iter().find(|(h, _)| h == host).unwrap().1;
        eventually(
            Duration::from_secs(30),
            &format!("{n} slots up on {host}"),
            || async {
                http_get(port, "/status")
                    .and_then(|b| serde_json::from_str::<Value>(&b).ok())
                    .is_some_and(|s| {
                        slots(&s)
                            .iter()
                            .filter(|s| s["state"] == "idle" || s["state"] == "busy")
                            .count()
                            >= n
                    })
            },
        )
        .await;
    }

    /// The long queue `name` with its config's limits, as the api and the CLI open it.
    fn queue(&self, name: &str) -> Queue {
        let config = gaffer::config::load(&self.config).unwrap();
        let limits = QueueLimits::from(&config.queues[name]);
        assert_eq!(limits.kind, QueueKind::Long);
        self.client.queue_with(name, limits).unwrap()
    }

    /// `gaffer tasks ARGS` with this config: its stdout.
    fn cli(&self, args: &[&str]) -> String {
        crate::harness::gaffer_ok(&self.config, args)
    }
}

async fn enqueue(q: &Queue, id: &str, payload: &str) {
    q.enqueue_many(&[NewTask::new(payload.to_owned()).id(id)])
        .await
        .unwrap();
}

async fn record(q: &Queue, id: &str) -> TaskRecord {
    q.record(id).await.unwrap().expect("the task has a record")
}

/// The states of a record's history, in order.
fn states(r: &TaskRecord) -> Vec<RecordState> {
    r.history
        .iter()
        .flatten()
        .map(|h| h.state)
        .collect::<Vec<_>>()
}

/// Waits until `id` runs (its exec child logged its start, its record says running)
/// and returns the child's pid.
async fn running(h: &Hosts, q: &Queue, id: &str) -> u32 {
    let pid = poll_some(
        Duration::from_secs(30),
        &format!("{id} started"),
        || async { h.pids("start", id).last().copied() },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        &format!("{id} running"),
        || async { record(q, id).await.state == RecordState::Running },
    )
    .await;
    pid
}

/// A DELETE of the api: status and JSON body.
async fn http_delete(port: u16, path: &str, token: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let req = format!(
        "DELETE {path} HTTP/1.0\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("the api answers")
        .unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap())
}

/// An api instance on a free port with this config; stopped with the token.
async fn start_api(h: &Hosts) -> (u16, tokio_util::sync::CancellationToken) {
    let mut config = gaffer::config::load(&h.config).unwrap();
    config.cluster.namespace = "test".into();
    let mut opts = gaffer::api::ApiOptions::new(config, h.redis.url());
    opts.listen = Some("127.0.0.1:0".parse().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
    (rx.await.expect("the api binds").port(), stop)
}

/// How long a cancelled task may take to be gone: a tick for the slot to see it, the
/// queue's cancel_grace, and room for a loaded test machine.
fn cancel_bound(grace: Duration) -> Duration {
    LONG_RENEW_EVERY + grace + Duration::from_secs(5)
}

/// Waits for the exec child `pid` of long task `id` (cancelled, on a queue whose
/// cancel_grace is 1s) to be gone within the cancel bound, then for its record to say
/// cancelled.
async fn child_gone_then_cancelled(q: &Queue, id: &str, pid: u32) {
    eventually(
        cancel_bound(Duration::from_secs(1)),
        &format!("{id}'s child gone"),
        || async { gone(pid) },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        &format!("{id} cancelled"),
        || async { record(q, id).await.state == RecordState::Cancelled },
    )
    .await;
}

const WATCH: &str = r#"
[queues.watch]
kind = "long"
handler = "exec"
command = {child}
lease = "5s"
cancel_grace = "1s"
"#;

#[tokio::test]
async fn exec_long_tasks_run_and_are_cancelled_over_the_api_and_the_cli() {
    let mut h = Hosts::start(WATCH).await;
    h.publish(1, &[("h1", "watch", 2)]).await;
    h.master("h1");
    h.slots_up("h1", 2).await;
    let q = h.queue("watch");
    enqueue(&q, "a", "{}").await;
    enqueue(&q, "b", "{}").await;
    let pid_a = running(&h, &q, "a").await;
    let pid_b = running(&h, &q, "b").await;
    let rec = record(&q, "a").await;
    let run = rec.history.as_ref().unwrap().last().unwrap();
    assert_eq!(run.state, RecordState::Running);
    assert_eq!(run.host.as_deref(), Some("h1"));
    assert!(run.slot.is_some(), "{run:?}");
    // The dashboard's snapshot lists both with where they run.
    let mut config = gaffer::config::load(&h.config).unwrap();
    config.cluster.namespace = "test".into();
    let snap = cluster::snapshot::read(&h.client, &config).await.unwrap();
    let shown: Vec<(String, String)> = snap.queues["watch"]
        .long_running
        .iter()
        .map(|t| (t.id.clone(), t.host.clone()))
        .collect();
    assert_eq!(
        shown,
        [
            ("b".to_owned(), "h1".to_owned()),
            ("a".to_owned(), "h1".to_owned())
        ]
    );
    // Runs past its lease (5s): the renewals keep it, nobody else takes it. Only the
    // absence of a second start can be checked, so the test looks after that time.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(h.pids("start", "a"), [pid_a], "a ran once");
    assert!(!gone(pid_a));
    assert_eq!(record(&q, "a").await.attempt, 1);

    let (port, stop) = start_api(&h).await;
    let (status, body) = http_delete(port, "/v1/queues/watch/tasks/a", ADMIN).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "cancelling", "{body}");
    child_gone_then_cancelled(&q, "a", pid_a).await;
    assert_eq!(
        h.pids("cancel", "a"),
        [pid_a],
        "the child got the cancel line"
    );
    let rec = record(&q, "a").await;
    let s = states(&rec);
    let tail = &s[s.len() - 3..];
    assert_eq!(
        tail,
        [
            RecordState::Running,
            RecordState::Cancelling,
            RecordState::Cancelled
        ],
        "{rec:?}"
    );
    let note = rec.history.as_ref().unwrap().last().unwrap().note.clone();
    assert_eq!(note.as_deref(), Some("cancelled by key ops"));

    let out = h.cli(&["tasks", "cancel", "watch", "b"]);
    assert!(out.contains("cancelling watch task b"), "{out}");
    child_gone_then_cancelled(&q, "b", pid_b).await;
    assert_eq!(q.stats().await.unwrap().cancelled_total, 2);
    // Their slots are free for the next long task.
    enqueue(&q, "c", "{}").await;
    running(&h, &q, "c").await;
    stop.cancel();
}

/// A command that runs its worker as a subprocess (a shell that goes on after it): the
/// cancel's signals reach the worker too, and the task ends cancelled.
#[tokio::test]
async fn a_cancel_stops_a_worker_the_exec_command_started_as_a_subprocess() {
    let (h, q, _) = one_long_queue(
        r#"
[queues.wrapped]
kind = "long"
handler = "exec"
command = {wrapped}
lease = "5s"
cancel_grace = "1s"
"#,
        "wrapped",
        1,
    )
    .await;
    // (it ignores the cancel line: only SIGTERM ends it)
    enqueue(&q, "w", "{}").await;
    let worker = running(&h, &q, "w").await;
    q.cancel_with("w", "cancelled by test").await.unwrap();
    child_gone_then_cancelled(&q, "w", worker).await;
}

/// A slot killed outright (SIGKILL, as the watchdog, a deadline or the OOM killer kill
/// it) leaves nothing its exec command started: the exec child dies with the slot, and
/// the zygote, which adopts what the child left (here a `sleep` the command put in the
/// background, which reads no stdin and so would never notice), ends the rest. The same
/// left by a live slot's command stays while its task runs.
#[tokio::test]
async fn a_slot_killed_outright_leaves_no_process_of_its_exec_command() {
    let (h, q, _) = one_long_queue(
        r#"
[queues.sleeper]
kind = "long"
handler = "exec"
command = {sleeper}
lease = "5s"
"#,
        "sleeper",
        2,
    )
    .await;
    enqueue(&q, "s1", "{}").await;
    enqueue(&q, "s2", "{}").await;
    let workers = [running(&h, &q, "s1").await, running(&h, &q, "s2").await];
    let mut sleepers = Vec::new();
    for w in workers {
        let file = h.dir.path().join(format!("sleeper.{w}"));
        let pid: u32 = poll_some(Duration::from_secs(10), "a sleeper's pid", || async {
            std::fs::read_to_string(&file).ok()?.trim().parse().ok()
        })
        .await;
        assert!(!gone(pid), "the sleeper runs");
        sleepers.push(pid);
    }
    let slot = parent_of(workers[0]).expect("the first worker's slot");
    signal(&[slot], Signal::SIGKILL);
    eventually(
        Duration::from_secs(10),
        "the first worker and sleeper gone",
        || async { gone(workers[0]) && gone(sleepers[0]) },
    )
    .await;
    assert!(
        !gone(workers[1]) && !gone(sleepers[1]),
        "the live slot's task and what its command left run on"
    );
}

/// A long queue's slot of an older zygote, busy when a new one is ready, retires: it
/// keeps its task, its place goes to a slot of the new zygote at once (room allowing),
/// and once its task ended it takes no other, even with tasks waiting. Before, it took
/// the next task as soon as its own ended, and under a backlog never rolled over.
#[tokio::test]
async fn an_old_busy_long_slot_retires_once_a_new_zygote_is_ready() {
    let (h, q, master) = one_long_queue(
        r#"
[queues.watch]
kind = "long"
handler = "exec"
command = {child}
lease = "5s"
"#,
        "watch",
        1,
    )
    .await;
    enqueue(&q, "a", r#"{"on_cancel": "stop"}"#).await;
    let first = running(&h, &q, "a").await;
    let old_slot = parent_of(first).expect("a's slot");
    enqueue(&q, "b", "{}").await;
    enqueue(&q, "c", "{}").await;
    // A queue more in the config: a new zygote, of generation 2.
    let text =
        std::fs::read_to_string(&h.config).unwrap() + "\n[queues.extra]\nhandler = \"noop\"\n";
    std::fs::write(&h.config, text).unwrap();
    signal(&[master], Signal::SIGHUP);
    let port = h.http.iter().find(|(n, _)| n == "h1").unwrap().1;
    eventually(Duration::from_secs(20), "the old slot retiring", || async {
        http_get(port, "/status")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .is_some_and(|s| {
                slots(&s)
                    .iter()
                    .any(|x| x["pid"] == old_slot && x["retiring"] == true && x["state"] == "busy")
            })
    })
    .await;
    // The new zygote's slot takes the next task while the old one keeps its own.
    let second = running(&h, &q, "b").await;
    assert_ne!(parent_of(second), Some(old_slot), "b ran on the old slot");
    assert!(!gone(first), "a runs on: a retiring slot keeps its task");
    q.cancel_with("a", "test").await.unwrap();
    eventually(Duration::from_secs(10), "the old slot gone", || async {
        gone(old_slot)
    })
    .await;
    assert!(h.pids("start", "c").is_empty(), "the retiring slot took c");
    assert_eq!(record(&q, "c").await.state, RecordState::Waiting);
}

#[tokio::test]
async fn a_rust_handler_sees_its_long_task_cancelled_and_the_slot_goes_on() {
    let mut h =
        Hosts::start("[queues.nap]\nkind = \"long\"\nhandler = \"sleep\"\nlease = \"5s\"\n").await;
    h.publish(1, &[("h1", "nap", 1)]).await;
    h.master("h1");
    h.slots_up("h1", 1).await;
    let q = h.queue("nap");
    enqueue(&q, "x", r#"{"ms": 3600000}"#).await;
    eventually(Duration::from_secs(30), "x running", || async {
        record(&q, "x").await.state == RecordState::Running
    })
    .await;
    let info = q.cancel_with("x", "test").await.unwrap().unwrap();
    assert_eq!(info.state.to_string(), "cancelling");
    assert_eq!(record(&q, "x").await.state, RecordState::Cancelling);
    eventually(cancel_bound(Duration::ZERO), "x cancelled", || async {
        record(&q, "x").await.state == RecordState::Cancelled
    })
    .await;
    // The one slot is free again: a task that returns is settled like any.
    enqueue(&q, "y", r#"{"ms": 200}"#).await;
    eventually(Duration::from_secs(10), "y done", || async {
        record(&q, "y").await.state == RecordState::Done
    })
    .await;
}

/// A long task whose handler does not return once asked to stop, here an exec child
/// whose reply pipe stays open after the child was killed (held by a process it started in
/// a session of its own, which its group's SIGKILL misses): its run is ended without it
/// `cancel_grace` + 2 s + 1 s after the cancel, the record says cancelled, and the slot
/// exits for a fresh one. Before, the record stayed `cancelling` for ever.
#[tokio::test]
async fn a_cancel_whose_handler_never_returns_still_ends_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let held = dir.path().join("held.pid");
    // Every slot's child leaves one (a slot starts its child at once), killed once the master
    // is gone (dropped after it), passed or failed: nothing else ever ends them.
    struct Holders(PathBuf);
    impl Drop for Holders {
        fn drop(&mut self) {
            let pids = std::fs::read_to_string(&self.0).unwrap_or_default();
            let pids: Vec<u32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
            signal(&pids, Signal::SIGKILL);
        }
    }
    let _holders = Holders(held.clone());
    let mut h = Hosts::start(&format!(
        "[queues.stuck]\nkind = \"long\"\nhandler = \"exec\"\n\
         command = [\"sh\", \"-c\", \"setsid sh -c 'echo $$ >> {}; exec sleep 3601' & exec sleep 3600\"]\n\
         lease = \"5s\"\ncancel_grace = \"1s\"\n",
        held.display()
    ))
    .await;
    h.publish(1, &[("h1", "stuck", 1)]).await;
    h.master("h1");
    h.slots_up("h1", 1).await;
    let q = h.queue("stuck");
    enqueue(&q, "x", "{}").await;
    eventually(Duration::from_secs(30), "x running", || async {
        record(&q, "x").await.state == RecordState::Running
    })
    .await;
    q.cancel_with("x", "test").await.unwrap();
    eventually(
        cancel_bound(Duration::from_secs(4)),
        "x cancelled",
        || async { record(&q, "x").await.state == RecordState::Cancelled },
    )
    .await;
}

#[tokio::test]
async fn a_long_task_that_returns_is_settled_by_its_outcome() {
    let (h, q, _) = one_long_queue(
        r#"
[queues.watch]
kind = "long"
handler = "exec"
command = {child}
lease = "5s"
max_attempts = 2
retry = { backoff = "fixed", base = "100ms", max = "100ms" }
"#,
        "watch",
        2,
    )
    .await;
    enqueue(&q, "ok", r#"{"run_s": 0.3}"#).await;
    enqueue(&q, "bad", r#"{"run_s": 0.3, "then": "fail"}"#).await;
    eventually(Duration::from_secs(20), "ok done, bad failed", || async {
        record(&q, "ok").await.state == RecordState::Done
            && record(&q, "bad").await.state == RecordState::Failed
    })
    .await;
    assert_eq!(h.pids("start", "ok").len(), 1);
    assert_eq!(h.pids("start", "bad").len(), 2, "retried once by policy");
}

/// Hosts with one long queue (`table`, a TOML table of queue `name`), its master on
/// host h1 with `slots` of its slots up: the hosts, the queue, the master's pid.
async fn one_long_queue(table: &str, name: &str, slots: u32) -> (Hosts, Queue, u32) {
    let mut h = Hosts::start(table).await;
    h.publish(1, &[("h1", name, slots)]).await;
    let master = h.master("h1");
    h.slots_up("h1", slots as usize).await;
    let q = h.queue(name);
    (h, q, master)
}

/// Every process under `pid` (children first found by their parent), `pid` first.
fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) && !out.contains(&child) {
                out.push(child);
            }
        }
        i += 1;
    }
    out
}

/// The parent of `pid`, while it runs.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn signal(pids: &[u32], sig: Signal) {
    for &p in pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), sig);
    }
}

#[tokio::test]
async fn a_host_frozen_past_its_lease_stops_its_tasks_at_once_when_woken() {
    let mut h = Hosts::start(WATCH).await;
    h.publish(1, &[("h1", "watch", 2)]).await;
    let m1 = h.master("h1");
    h.slots_up("h1", 2).await;
    let q = h.queue("watch");
    enqueue(&q, "a", "{}").await;
    enqueue(&q, "b", "{}").await;
    let old = [running(&h, &q, "a").await, running(&h, &q, "b").await];
    h.publish(2, &[("h1", "watch", 2), ("h2", "watch", 2)])
        .await;
    h.master("h2");
    h.slots_up("h2", 2).await;

    // The whole host freezes: master, zygote, slots, exec children.
    let frozen = tree(m1);
    assert!(
        frozen.len() >= 6,
        "master, zygote, 2 slots, 2 children: {frozen:?}"
    );
    signal(&frozen, Signal::SIGSTOP);
    for id in ["a", "b"] {
        poll_some(Duration::from_secs(30), &format!("{id} on h2"), || async {
            h.events()
                .iter()
                .any(|e| e[0] == "start" && e[1] == id && e[2] == "h2")
                .then_some(())
        })
        .await;
    }
    // The kernel kept the slots' deadlines while they were frozen: each slot was killed
    // before its lease could pass, and its exec child with it, before the host woke.
    for pid in old {
        assert!(
            gone(pid),
            "h1's child {pid} still there while h2 runs its task"
        );
    }
    let stale_before = q.stats().await.unwrap().stale_total;
    signal(&frozen, Signal::SIGCONT);
    for pid in old {
        eventually(
            Duration::from_secs(5),
            "h1's children stopped at once",
            || async { gone(pid) },
        )
        .await;
    }
    // Nothing was settled by the woken slots: both tasks still run on h2, and no record
    // names h1 after h2 took over.
    tokio::time::sleep(LONG_RENEW_EVERY * 2).await;
    assert_eq!(q.stats().await.unwrap().stale_total, stale_before);
    for id in ["a", "b"] {
        let rec = record(&q, id).await;
        assert_eq!(rec.state, RecordState::Running, "{rec:?}");
        let hist = rec.history.unwrap();
        let last = hist.last().unwrap();
        assert_eq!(last.host.as_deref(), Some("h2"), "{hist:?}");
    }
    // Both frozen slots were killed by their kernel deadline (SIGKILL), which the woken
    // master logs as it reaps them.
    let log = h.master_log("h1");
    let killed = log
        .lines()
        .filter(|l| l.contains("slot exited") && l.contains("signal=Some(9)"))
        .count();
    assert_eq!(killed, 2, "{log}");
}

/// Seconds since the epoch, the clock the exec children log with.
fn wall() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Each task's runs as (host, pid, start, end) from the children's log; a run without a
/// stop ends at `ended(host)` (its host was killed then) or is still going.
fn runs(
    h: &Hosts,
    ended: impl Fn(&str) -> Option<f64>,
) -> BTreeMap<String, Vec<(String, u32, f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(String, u32, f64, f64)>> = BTreeMap::new();
    let events = h.events();
    for e in events.iter().filter(|e| e[0] == "start") {
        let (id, host, pid) = (&e[1], &e[2], &e[3]);
        let start: f64 = e[4].parse().unwrap();
        let stop = events
            .iter()
            .find(|s| s[0] == "stop" && &s[1] == id && &s[3] == pid)
            .map(|s| s[4].parse().unwrap());
        let end = stop.or_else(|| ended(host)).unwrap_or(f64::INFINITY);
        out.entry(id.clone())
            .or_default()
            .push((host.clone(), pid.parse().unwrap(), start, end));
    }
    out
}

#[tokio::test]
async fn long_tasks_spread_over_hosts_and_a_killed_hosts_tasks_run_again_elsewhere_once() {
    let mut h = Hosts::start(WATCH).await;
    h.manager();
    let m1 = h.master("h1");
    h.master("h2");
    h.master("h3");
    // Every host reports before any task arrives: slots are placed where they are when
    // demand appears, and a host that joins later is given none of the running tasks.
    eventually(Duration::from_secs(30), "three hosts report", || async {
        cluster::read_hosts(&mut h.client.connection(), &Keys::new("test"))
            .await
            .is_ok_and(|hosts| hosts.len() == 3)
    })
    .await;
    let q = h.queue("watch");
    let ids: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    for id in &ids {
        enqueue(&q, id, "{}").await;
    }
    for id in &ids {
        running(&h, &q, id).await;
    }
    // Spread 4/4/4 (± 1).
    let first = runs(&h, |_| None);
    let mut per_host: BTreeMap<String, u32> = BTreeMap::new();
    for r in first.values() {
        assert_eq!(r.len(), 1, "{first:?}");
        *per_host.entry(r[0].0.clone()).or_default() += 1;
    }
    assert_eq!(per_host.len(), 3, "{per_host:?}");
    assert!(
        per_host.values().all(|n| (3..=5).contains(n)),
        "{per_host:?}"
    );

    // kill -9 of h1's master: its slots and their children die with it.
    let on_h1: Vec<(String, u32)> = first
        .iter()
        .filter(|(_, r)| r[0].0 == "h1")
        .map(|(id, r)| (id.clone(), r[0].1))
        .collect();
    signal(&[m1], Signal::SIGKILL);
    let killed = wall();
    let killed_at = std::time::Instant::now();
    for (_, pid) in &on_h1 {
        eventually(
            Duration::from_secs(5),
            "h1's children die with it",
            || async { gone(*pid) },
        )
        .await;
    }
    let all_gone = wall();
    // They run again on h2 and h3, within the lease (5 s), two ticks and a slot start
    // (generous on a loaded test machine: the bound is correctness, not speed).
    for (id, _) in &on_h1 {
        poll_some(Duration::from_secs(30), &format!("{id} again"), || async {
            h.events()
                .iter()
                .any(|e| e[0] == "start" && e[1] == *id && e[2] != "h1")
                .then_some(())
        })
        .await;
    }
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(5) + LONG_RENEW_EVERY * 2 + Duration::from_secs(15),
        "{took:?}"
    );
    eprintln!("h1's {} tasks ran again after {took:?}", on_h1.len());
    // No task ever ran on two hosts at once: h1's runs ended when its processes were gone.
    let all = runs(&h, |host| (host == "h1").then_some(all_gone));
    for (id, r) in &all {
        for (i, a) in r.iter().enumerate() {
            for b in &r[i + 1..] {
                assert!(
                    a.3 <= b.2 || b.3 <= a.2,
                    "{id} ran twice at once: {a:?} and {b:?} (h1 killed at {killed})"
                );
            }
        }
        let expected = if on_h1.iter().any(|(t, _)| t == id) {
            2
        } else {
            1
        };
        assert_eq!(r.len(), expected, "{id}: {r:?}");
    }
    for id in &ids {
        assert_eq!(record(&q, id).await.state, RecordState::Running);
    }
}

/// The long queue `name` on a fresh Redis, without masters: the scripts alone.
async fn bare_long_queue(redis: &TestRedis, name: &str) -> Queue {
    let limits = QueueLimits {
        kind: QueueKind::Long,
        ..QueueLimits::default()
    };
    redis.client().await.queue_with(name, limits).unwrap()
}

#[tokio::test]
async fn a_cancelled_long_task_whose_slot_died_ends_cancelled_when_its_lease_runs_out() {
    let redis = TestRedis::start();
    let q = bare_long_queue(&redis, "watch").await;
    enqueue(&q, "x", "{}").await;
    let taken = q.take(1, Duration::from_millis(300)).await.unwrap();
    assert_eq!(taken.tasks.len(), 1);
    let info = q
        .cancel_with("x", "cancelled by test")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state.to_string(), "cancelling");
    // A second cancel changes nothing more.
    q.cancel_with("x", "again").await.unwrap();
    let rec = record(&q, "x").await;
    assert_eq!(rec.state, RecordState::Cancelling);
    assert_eq!(
        states(&rec)
            .iter()
            .filter(|s| **s == RecordState::Cancelling)
            .count(),
        1
    );
    // The slot never renews (it died): once the lease ran out, the next take ends the
    // task cancelled instead of handing it out again.
    poll_some(Duration::from_secs(10), "the lease runs out", || async {
        let b = q.take(1, Duration::from_secs(5)).await.unwrap();
        assert!(b.tasks.is_empty(), "a cancelled task was handed out again");
        (record(&q, "x").await.state == RecordState::Cancelled).then_some(())
    })
    .await;
    let rec = record(&q, "x").await;
    assert_eq!(
        rec.history.unwrap().last().unwrap().note.as_deref(),
        Some("cancelled by test")
    );
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.cancelled_total, stats.leased, stats.ready),
        (1, 0, 0)
    );
}

/// A slot that hands a long task back (its host drains) after its cancel was asked ends
/// it cancelled: handed back, it would start again elsewhere before its cancel was seen.
#[tokio::test]
async fn a_long_task_handed_back_after_its_cancel_was_asked_ends_cancelled() {
    let redis = TestRedis::start();
    let q = bare_long_queue(&redis, "watch").await;
    enqueue(&q, "x", "{}").await;
    enqueue(&q, "y", "{}").await;
    let taken = q.take(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(taken.tasks.len(), 2);
    q.cancel_with("x", "cancelled by test").await.unwrap();
    let results = q.release(&taken.tasks).await.unwrap();
    assert_eq!(results.len(), 2);
    let rec = record(&q, "x").await;
    assert_eq!(rec.state, RecordState::Cancelled);
    assert_eq!(
        rec.history.unwrap().last().unwrap().note.as_deref(),
        Some("cancelled by test")
    );
    // The other goes back to wait, and only it is handed out next.
    assert_eq!(record(&q, "y").await.state, RecordState::Waiting);
    let next = q.take(2, Duration::from_secs(30)).await.unwrap();
    let ids: Vec<&str> = next.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["y"]);
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.cancelled_total, stats.leased), (1, 1));
}

#[tokio::test]
async fn renewal_reports_a_cancel_and_a_lost_lease_and_a_returned_task_ends_cancelled() {
    use gaffer::queue_client::{LongSettled, Renewal, Settle, SettleOp};
    let redis = TestRedis::start();
    let q = bare_long_queue(&redis, "watch").await;
    enqueue(&q, "x", "{}").await;
    let t = q
        .take(1, Duration::from_secs(5))
        .await
        .unwrap()
        .tasks
        .remove(0);
    let lease = Duration::from_secs(5);
    assert_eq!(q.renew_long(&t, lease).await.unwrap(), Renewal::Renewed);
    q.cancel_with("x", "cancelled by test").await.unwrap();
    assert_eq!(
        q.renew_long(&t, lease).await.unwrap(),
        Renewal::CancelAsked {
            note: "cancelled by test".into()
        }
    );
    // The handler returned done meanwhile: the cancel wins.
    let op = SettleOp::new(&t, Settle::Ack);
    assert_eq!(
        q.settle_long(&t, &op).await.unwrap(),
        LongSettled::Cancelled
    );
    assert_eq!(record(&q, "x").await.state, RecordState::Cancelled);
    assert_eq!(q.renew_long(&t, lease).await.unwrap(), Renewal::Lost);

    // Without a cancel, a returned task is settled as any: done.
    enqueue(&q, "y", "{}").await;
    let t = q
        .take(1, Duration::from_secs(5))
        .await
        .unwrap()
        .tasks
        .remove(0);
    let op = SettleOp::new(&t, Settle::Ack);
    assert!(matches!(
        q.settle_long(&t, &op).await.unwrap(),
        LongSettled::Settled(_)
    ));
    assert_eq!(record(&q, "y").await.state, RecordState::Done);
    assert!(!q.end_cancelled(&t).await.unwrap(), "no lease left to end");
}

/// A renewal that reaches Redis after the lease ran out (it waited out a stall of Redis,
/// its slot has stopped the task by then) does not bring the lease back: the task is free
/// for the next take at once, not held for one more lease.
#[tokio::test]
async fn a_renewal_past_the_leases_expiry_is_refused() {
    use gaffer::queue_client::Renewal;
    let redis = TestRedis::start();
    let q = bare_long_queue(&redis, "watch").await;
    enqueue(&q, "x", "{}").await;
    let t = q
        .take(1, Duration::from_millis(200))
        .await
        .unwrap()
        .tasks
        .remove(0);
    // Until Redis's clock is past the lease (nothing reclaims it meanwhile: no take). A
    // take of a first attempt leases it as a batch (`leased:b`).
    let conn = redis.client().await.connection();
    eventually(Duration::from_secs(10), "the lease past its expiry", || {
        let mut conn = conn.clone();
        async move {
            let mut expiries = Vec::new();
            for key in ["test:{watch}:leased", "test:{watch}:leased:b"] {
                let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                expiries.extend(first.into_iter().map(|(_, e)| e));
            }
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            let now = (secs * 1000 + micros / 1000) as f64;
            expiries.len() == 1 && expiries[0] < now
        }
    })
    .await;
    assert_eq!(
        q.renew_long(&t, Duration::from_secs(60)).await.unwrap(),
        Renewal::Lost
    );
    let again = q.take(1, Duration::from_secs(5)).await.unwrap().tasks;
    assert_eq!(again.len(), 1, "the task is free for the next take");
    assert_eq!(again[0].id, "x");
}

#[tokio::test]
async fn a_draining_master_hands_its_long_tasks_back_unfinished() {
    let mut h = Hosts::start(WATCH).await;
    h.publish(1, &[("h1", "watch", 1)]).await;
    let m1 = h.master("h1");
    h.slots_up("h1", 1).await;
    let q = h.queue("watch");
    enqueue(&q, "a", r#"{"on_cancel": "stop"}"#).await;
    let pid = running(&h, &q, "a").await;
    signal(&[m1], Signal::SIGTERM);
    // The child is told to stop (and does), the task waits again for a slot elsewhere,
    // no attempt counted, nothing settled.
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while record(&q, "a").await.state != RecordState::Waiting {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{:?}\n{}\n{:?}",
        record(&q, "a").await,
        h.master_log("h1"),
        h.events()
    );
    assert_eq!(h.pids("cancel", "a"), [pid]);
    assert_eq!(h.pids("stop", "a"), [pid]);
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (
            stats.ready,
            stats.leased,
            stats.acked_total,
            stats.cancelled_total
        ),
        (1, 0, 0, 0)
    );
    let rec = record(&q, "a").await;
    assert_eq!(rec.attempt, 0, "no attempt counted");
    // The run it had stays in its history, and why it waits again.
    assert_eq!(
        states(&rec),
        [
            RecordState::Waiting,
            RecordState::Running,
            RecordState::Waiting
        ]
    );
    let history = rec.history.unwrap();
    assert_eq!(
        (history[1].attempt, history[1].host.as_deref()),
        (1, Some("h1"))
    );
    assert_eq!(
        (history[2].attempt, history[2].host.as_deref()),
        (0, Some("h1"))
    );
    assert_eq!(
        history[2].note.as_deref(),
        Some(gaffer::slot::HANDED_BACK_NOTE)
    );
    // Taken again, it runs at the same attempt.
    let again = q.take(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(again.tasks[0].attempt, 1);
}

/// A long queue whose done route goes to a batch queue.
const WATCH_THEN_AFTER: &str = r#"
[queues.watch]
kind = "long"
handler = "exec"
command = {child}
lease = "5s"
cancel_grace = "1s"
next = [{ queue = "after", on = "done" }]

[queues.after]
handler = "noop"
max_slots = 1
"#;

#[tokio::test]
async fn a_long_task_that_returns_makes_its_follow_ups_and_a_cancelled_one_none() {
    let (h, q, _) = one_long_queue(WATCH_THEN_AFTER, "watch", 2).await;
    let after = h.client.queue("after").unwrap();
    // Returns done with a result and a follow-up of its own: the route's child gets the
    // result, the handler's its own payload, both before the parent is settled.
    enqueue(
        &q,
        "w",
        r#"{"run_s": 1.5, "result": {"seen": 3}, "next": [{"queue": "after", "payload": {"from": "handler"}}]}"#,
    )
    .await;
    // Runs until cancelled, then answers ok: cancelled, no follow-up.
    enqueue(&q, "c", r#"{"on_cancel": "stop"}"#).await;
    running(&h, &q, "c").await;
    eventually(Duration::from_secs(20), "w done", || async {
        record(&q, "w").await.state == RecordState::Done
    })
    .await;
    let kids = kid_ids(&h.client, &q, &record(&q, "w").await, 2).await;
    let payload = |id: String| {
        let after = after.clone();
        async move {
            let info = after
                .find(&id)
                .await
                .unwrap()
                .expect("the follow-up exists");
            serde_json::from_slice::<Value>(&info.payload).unwrap()
        }
    };
    assert_eq!(
        payload(kids[0].clone()).await,
        serde_json::json!({"seen": 3})
    );
    assert_eq!(
        payload(kids[1].clone()).await,
        serde_json::json!({"from": "handler"})
    );
    let child = after.record(&kids[0]).await.unwrap().unwrap();
    let chain = record(&q, "w").await.chain.expect("w names its chain");
    assert!(chain.starts_with("~cwatch."), "{chain}");
    assert_eq!(
        child.submitted_by,
        Some(format!("chain:{chain}")),
        "{child:?}"
    );
    assert_eq!(child.chain.as_deref(), Some(chain.as_str()), "{child:?}");

    q.cancel_with("c", "test").await.unwrap();
    eventually(
        cancel_bound(Duration::from_secs(1)),
        "c cancelled",
        || async { record(&q, "c").await.state == RecordState::Cancelled },
    )
    .await;
    assert_eq!(h.pids("stop", "c").len(), 1, "c answered its cancel");
    let c_kids = kid_ids(&h.client, &q, &record(&q, "c").await, 1).await;
    assert!(after.find(&c_kids[0]).await.unwrap().is_none());
    assert_eq!(
        after.stats().await.unwrap().enqueued_total,
        2,
        "w's two follow-ups only"
    );
}

/// A long task cancelled after its follow-ups were made (in the window before its settle,
/// held open by a test hook) ends cancelled, and so do they, with a note naming it.
#[tokio::test]
async fn a_long_task_cancelled_after_its_follow_ups_were_made_cancels_them() {
    let mut h = Hosts::start(WATCH_THEN_AFTER).await;
    let pause = h.dir.path().join("pause");
    h.publish(1, &[("h1", "watch", 1)]).await;
    h.master_with("h1", &[("GAFFER_TEST_PAUSE_AFTER_FOLLOW_UPS", &pause)]);
    h.slots_up("h1", 1).await;
    let q = h.queue("watch");
    let after = h.client.queue("after").unwrap();
    enqueue(&q, "w", r#"{"run_s": 0.2, "result": {"seen": 1}}"#).await;
    crate::harness::held_after_follow_ups(&pause).await;
    let kid = kid_ids(&h.client, &q, &record(&q, "w").await, 1)
        .await
        .remove(0);
    assert!(
        after.find(&kid).await.unwrap().is_some(),
        "the follow-up is made"
    );
    q.cancel_with("w", "test").await.unwrap();
    std::fs::write(h.dir.path().join("pause.go"), "").unwrap();
    eventually(Duration::from_secs(20), "w cancelled", || async {
        record(&q, "w").await.state == RecordState::Cancelled
    })
    .await;
    let child = poll_some(Duration::from_secs(20), "w's child cancelled", || async {
        after
            .record(&kid)
            .await
            .unwrap()
            .filter(|r| r.state == RecordState::Cancelled)
    })
    .await;
    let note = child.history.unwrap().last().unwrap().note.clone();
    assert!(
        note.as_deref()
            .unwrap_or("")
            .contains("task w of queue watch"),
        "{note:?}"
    );
    assert!(
        after.find(&kid).await.unwrap().is_none(),
        "no longer waiting"
    );
}

/// The parent of `pid`, from `/proc`.
fn parent(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_slot_frozen_alone_is_killed_with_its_child_before_its_lease_can_pass() {
    let mut h = Hosts::start(WATCH).await;
    h.publish(1, &[("h1", "watch", 2)]).await;
    h.master("h1");
    h.slots_up("h1", 2).await;
    let q = h.queue("watch");
    enqueue(&q, "a", "{}").await;
    let child = running(&h, &q, "a").await;
    let slot = parent(child);
    // Only the slot freezes: its exec child runs on, and the other slot is idle, ready
    // to take the task once its lease runs out.
    signal(&[slot], Signal::SIGSTOP);
    poll_some(
        Duration::from_secs(30),
        "a killed, then started again",
        || async {
            let again = h.pids("start", "a").len() > 1;
            assert!(
                !again || gone(child),
                "a started again while its first child still ran"
            );
            (gone(child) && again).then_some(())
        },
    )
    .await;
    assert!(gone(slot), "the frozen slot was killed");
    let rec = record(&q, "a").await;
    assert_eq!(rec.state, RecordState::Running, "{rec:?}");
    assert_eq!(rec.attempt, 2, "{rec:?}");
}

/// A one-minute work window two hours from now (every day), so the queue's window is shut
/// for the whole test: "HH:MM-HH:MM" in UTC, the tests' manager time zone.
fn a_shut_window() -> String {
    use chrono::Timelike;
    let start = chrono::Utc::now() + chrono::Duration::hours(2);
    // (never one that wraps midnight)
    let start = if start.hour() == 23 && start.minute() == 59 {
        start + chrono::Duration::hours(1)
    } else {
        start
    };
    let end = start + chrono::Duration::minutes(1);
    format!("{}-{}", start.format("%H:%M"), end.format("%H:%M"))
}

#[tokio::test]
async fn outside_its_window_a_hand_back_queue_hands_its_task_back_and_a_finish_one_runs_on() {
    let window = a_shut_window();
    let mut h = Hosts::start(&format!(
        "[queues.back]\nkind = \"long\"\nhandler = \"sleep\"\nlease = \"5s\"\n\
         work_periods = [\"{window}\"]\nwork_periods_long = \"hand_back\"\n\
         [queues.on]\nkind = \"long\"\nhandler = \"sleep\"\nlease = \"5s\"\n\
         work_periods = [\"{window}\"]\n"
    ))
    .await;
    // (no manager: the map is published by hand, so slots start outside the window, as
    // they would for tasks begun inside it when the window shuts)
    h.publish(1, &[("h1", "on", 1), ("h1", "back", 1)]).await;
    h.master("h1");
    h.slots_up("h1", 2).await;
    let (back, on) = (h.queue("back"), h.queue("on"));
    enqueue(&on, "stays", r#"{"ms": 3600000}"#).await;
    enqueue(&back, "goes", r#"{"ms": 3600000}"#).await;
    eventually(Duration::from_secs(20), "both running", || async {
        record(&on, "stays").await.state == RecordState::Running
            && record(&back, "goes").await.state == RecordState::Running
    })
    .await;
    // The window is shut: the manager would map no slot. A busy long slot taken off the
    // map finishes its task, unless its queue hands its tasks back at the window's end.
    h.publish(2, &[]).await;
    eventually(Duration::from_secs(30), "goes handed back", || async {
        let r = record(&back, "goes").await;
        r.state == RecordState::Waiting
            && r.history.iter().flatten().any(|e| {
                e.attempt == 0 && e.note.as_deref() == Some(gaffer::slot::HANDED_BACK_NOTE)
            })
    })
    .await;
    // The finish queue's task, in the same shut window, still runs.
    let r = record(&on, "stays").await;
    assert_eq!(
        (r.state, states(&r)),
        (
            RecordState::Running,
            vec![RecordState::Waiting, RecordState::Running]
        )
    );
}
