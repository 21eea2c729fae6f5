//! The `gaffer` binary as operators and scripts use it: exit codes, output, the
//! `stats --json` contract, against a real redis-server.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gaffer::queue_client::{Queue, QueueClient, Worker};
use serde_json::Value;

use crate::harness::{TestRedis, eventually};

const CONFIG: &str = r#"
[cluster]
namespace = "clitest"

[queues.emails]
handler = "noop"
max_attempts = 3

[queues.reports]
handler = "sleep"
priority = 5
"#;

/// A Redis and a config file `gaffer` runs the CLI against (also `retired.rs`'s).
pub(crate) struct Env {
    pub(crate) redis: TestRedis,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self::with_config(CONFIG)
    }

    pub(crate) fn with_config(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        Env {
            redis: TestRedis::start(),
            dir,
        }
    }

    pub(crate) fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    /// `gaffer ARGS` with this config and Redis, stdin not a terminal.
    pub(crate) fn gaffer(&self, args: &[&str]) -> Output {
        self.gaffer_stdin(args, None)
    }

    fn gaffer_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(self.config())
            .arg("--redis")
            .arg(self.redis.url())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    async fn client(&self) -> QueueClient {
        QueueClient::connect(&self.redis.url(), "clitest", &Default::default())
            .await
            .unwrap()
    }
}

/// A finished command's stdout as text.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A finished command's stderr as text.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails the test, showing stderr, unless the command said `text` on stderr.
fn assert_said(o: &Output, text: &str) {
    assert!(stderr(o).contains(text), "{}", stderr(o));
}

fn stats_json(env: &Env) -> Value {
    let o = env.gaffer(&["stats", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn config_check_exit_codes() {
    let env = Env::new();
    let ok = env.gaffer(&["config", "check"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert!(stdout(&ok).starts_with("ok: 2 queues"), "{}", stdout(&ok));

    let bad = env.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[queues.x]\nhandler = \"noop\"\nmin_slots = 9\nmax_slots = 2\nlease = 5\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&bad)
        .args(["config", "check"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("bad.toml:5:9: queues.x.lease"), "{err}");
    assert!(
        err.contains("queues.x.min_slots"),
        "both errors at once: {err}"
    );
    // Every line is `file:line:col: key: message`, the first too (problem matchers).
    for line in err.lines() {
        assert!(line.starts_with(&format!("{}:", bad.display())), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_variants_and_stats_json_contract() {
    let env = Env::new();
    let push_m1 = [
        "push",
        "emails",
        "--payload",
        r#"{"to":"a@b"}"#,
        "--id",
        "m1",
    ];
    let o = env.gaffer(&push_m1);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "enqueued: emails task m1");
    let o = env.gaffer(&push_m1);
    assert_eq!(stdout(&o).trim(), "already pending: emails task m1");
    let o = env.gaffer(&["push", "emails", "--count", "250"]);
    assert!(stdout(&o).contains("enqueued 250 tasks"), "{}", stdout(&o));
    let o = env.gaffer_stdin(
        &["push", "reports", "--file", "-"],
        Some("{\"ms\":1}\n\n{\"ms\":2}\n"),
    );
    assert!(
        stdout(&o).contains("enqueued 2 tasks to reports"),
        "{}",
        stdout(&o)
    );
    let o = env.gaffer(&[
        "push",
        "reports",
        "--payload",
        "{}",
        "--delay",
        "1h",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["created"], 1);

    let s = stats_json(&env);
    let emails = &s["queues"]["emails"];
    for key in [
        "ready",
        "delayed",
        "leased",
        "dead",
        "slots",
        "enqueued_total",
        "acked_total",
        "retried_total",
        "dead_total",
        "stale_total",
        "expired_total",
        "load",
    ] {
        assert!(
            emails.get(key).is_some(),
            "stats --json lacks queues.emails.{key}"
        );
    }
    assert_eq!(emails["ready"], 251);
    assert_eq!(s["queues"]["reports"]["ready"], 2);
    assert_eq!(s["queues"]["reports"]["delayed"], 1);
    assert!(s["hosts"].is_object());
    assert!(s["manager"].get("epoch").is_some() && s["manager"].get("map_version").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_enqueues_nothing() {
    let env = Env::new();
    let o = env.gaffer_stdin(
        &["push", "emails", "--file", "-"],
        Some("{\"ok\":1}\nnot json\n"),
    );
    assert_eq!(o.status.code(), Some(2));
    assert_said(&o, "stdin:2: not a JSON payload");
    let o = env.gaffer(&["push", "nosuch", "--count", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert_said(&o, "not in the config (known: emails, reports)");
    let o = env.gaffer(&["push", "emails"]);
    assert_eq!(o.status.code(), Some(2));
    let big = env.dir.path().join("big.jsonl");
    std::fs::write(&big, format!("{{}}\n\"{}\"\n", "x".repeat(2 * 1024 * 1024))).unwrap();
    let o = env.gaffer(&["push", "emails", "--file", big.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert_said(&o, "exceeds the limit of 1048576 bytes");
    assert_eq!(stats_json(&env)["queues"]["emails"]["enqueued_total"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_listed_requeued_purged_and_cancel() {
    let env = Env::new();
    env.gaffer(&["push", "emails", "--count", "3"]);
    let client = env.client().await;
    let q = client.queue("emails").unwrap();
    let b = q.take(3, Duration::from_secs(60)).await.unwrap();
    crate::harness::fail_all(&q, &b.tasks, |id| format!("smtp refused {id}")).await;

    let o = env.gaffer(&["tasks", "dead", "emails", "--json"]);
    let rows: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[0]["error"],
        format!("smtp refused {}", rows[0]["id"].as_str().unwrap())
    );
    assert_eq!(rows[0]["payload"]["n"], 0, "payload shown as JSON");

    let first = rows[0]["id"].as_str().unwrap();
    let o = env.gaffer(&["tasks", "requeue", "emails", first, "nope"]);
    assert_eq!(stdout(&o).trim(), "requeued 1 dead letters of emails");
    assert_eq!(o.status.code(), Some(1));
    assert_said(&o, "1 of the 2 ids named are not dead letters of emails");
    // All of them, with no terminal to ask: refused unless --yes, nothing deleted.
    let o = env.gaffer(&["tasks", "purge", "emails"]);
    assert_eq!(o.status.code(), Some(2));
    assert_said(&o, "purging every dead letter of emails needs --yes");
    assert_eq!(stats_json(&env)["queues"]["emails"]["dead"], 2);
    let o = env.gaffer(&["tasks", "purge", "emails", "--yes"]);
    assert_eq!(
        stdout(&o).trim(),
        "purged 2 dead letters of emails",
        "{}",
        stderr(&o)
    );
    let s = stats_json(&env);
    assert_eq!(
        (
            s["queues"]["emails"]["ready"].as_u64(),
            s["queues"]["emails"]["dead"].as_u64()
        ),
        (Some(1), Some(0))
    );

    let o = env.gaffer(&["tasks", "cancel", "emails", first]);
    assert_eq!(
        stdout(&o).trim(),
        format!("cancelled emails task {first} (was ready)")
    );
    let o = env.gaffer(&["tasks", "cancel", "emails", first]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn unreachable_redis_is_a_runtime_failure() {
    let env = Env::new();
    let port = gaffer::redis_server::free_port().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(env.config())
        .arg("--redis")
        .arg(format!("redis://gaffer:hunter2@127.0.0.1:{port}/0"))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("cannot connect to redis"), "{err}");
    assert!(
        err.contains(&format!(
            "redis at redis://gaffer:***@127.0.0.1:{port}/0 (from --redis or GAFFER_REDIS)"
        )),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "password leaked: {err}");
}

/// A Redis URL that cannot be right (here a stale `GAFFER_REDIS` without its scheme) is
/// bad usage, exit 2, and the error says which URL and where it came from.
#[test]
fn a_bad_redis_url_is_bad_usage_naming_the_url_and_its_source() {
    let env = Env::new();
    let o = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(env.config())
        .env("GAFFER_REDIS", "localhost:6379")
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("redis at localhost:6379 (from --redis or GAFFER_REDIS): bad redis url"),
        "{err}"
    );
}

/// TLS files in the config with a plain URL given apart from it (`--redis` here): refused
/// as bad usage, rather than connecting in plain text with the files unused.
#[test]
fn tls_files_with_a_plain_url_from_the_command_line_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[cluster]\nredis_ca_file = \"/nonexistent/ca.pem\"\n\n[queues.a]\nhandler = \"noop\"\n",
    )
    .unwrap();
    let port = gaffer::redis_server::free_port().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .arg("--redis")
        .arg(format!("redis://127.0.0.1:{port}/0"))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("[cluster].redis_ca_file is set")
            && err.contains(
                "is not rediss:// (or rediss+sentinel://): refusing to connect without TLS"
            ),
        "{err}"
    );
}

#[test]
fn bench_reports_gaffer_beside_the_bare_loop() {
    let env = Env::new();
    let o = env.gaffer(&[
        "bench",
        "--tasks",
        "2000",
        "--samples",
        "20",
        "--rounds",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["enqueue"]["gaffer_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["enqueue"]["bare_per_s"].as_f64().unwrap() > 0.0);
    let rows = v["take_ack"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "batch 1, 10, 100 × 1 and 2 takers");
    assert_eq!(v["wakeup"]["samples"], 20);
    assert!(stderr(&o).contains("bench: "), "progress lines on stderr");
    // The bench cleans up after itself.
    let keys = all_keys(&env);
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// Every key of the server.
fn all_keys(env: &Env) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*")
        .query(
            &mut redis::Client::open(env.redis.url())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap()
}

/// Ctrl-C during a bench deletes what the bench made before it exits: its queue lives in
/// the configured namespace, often a production one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_bench_leaves_nothing_behind() {
    let env = Env::new();
    let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(env.config())
        .args(["--redis", &env.redis.url()])
        .args(["bench", "--tasks", "200000", "--rounds", "50"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupted once its queue holds tasks.
    eventually(Duration::from_secs(30), "the bench's tasks", || async {
        all_keys(&env).iter().any(|k| k.contains("bench."))
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_said(&o, "interrupted: the bench's queues and keys were deleted");
    let keys = all_keys(&env);
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// `--log-format json`: each log line is one JSON object with the level, the message and
/// the event's fields at the top level, for log shippers.
#[test]
fn log_format_json_writes_one_object_per_line() {
    use std::io::BufRead;
    let env = Env::new();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(env.dir.path().join("config.toml"))
        .args(["--redis", &env.redis.url(), "--log-format", "json"])
        .args(["manager", "--http", "127.0.0.1:0"])
        .env("GAFFER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Reading blocks until the manager logs; its first lines come at start-up.
    let lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut found = None;
    for line in lines.take(20) {
        let line = line.unwrap();
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}; before: {seen:?}"));
        if v["message"] == "manager starting" {
            found = Some(v);
            break;
        }
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    let v = found.unwrap_or_else(|| panic!("no start-up line among {seen:?}"));
    assert_eq!(v["level"], "INFO", "{v}");
    assert!(v["id"].as_str().is_some_and(|id| id.contains(':')), "{v}");
    assert!(v["timestamp"].is_string(), "{v}");
}

/// Pushes one task with this id through the CLI (so its record says `cli`).
fn push_id(env: &Env, queue: &str, id: &str) {
    let o = env.gaffer(&["push", queue, "--payload", r#"{"to":"a@b"}"#, "--id", id]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A slot's view of a queue: takes are recorded as on host h1, slot 3.
async fn slot_queue(env: &Env, queue: &str) -> Queue {
    env.client()
        .await
        .queue(queue)
        .unwrap()
        .with_worker(Worker {
            host: "h1".into(),
            slot: 3,
        })
}

/// The lines of a table after its header (the line starting with `header`).
fn rows_after<'a>(out: &'a str, header: &str) -> Vec<&'a str> {
    out.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(1)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_show_prints_the_record_with_its_history() {
    let env = Env::new();
    push_id(&env, "emails", "m1");
    let q = slot_queue(&env, "emails").await;
    let b = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    q.ack(&b.tasks).await.unwrap();

    let o = env.gaffer(&["tasks", "show", "emails", "m1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let record = q.record("m1").await.unwrap().expect("a record");
    assert_eq!(
        stdout(&o).trim_end(),
        serde_json::to_string_pretty(&record).unwrap(),
        "--json prints the API's record"
    );
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["submitted_by"].as_str()),
        (Some("done"), Some("cli"))
    );
    let states: Vec<&str> = v["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["waiting", "running", "done"]);

    let o = env.gaffer(&["tasks", "show", "emails", "m1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for (field, value) in [("id", "m1"), ("state", "done"), ("submitted_by", "cli")] {
        let line = format!("{field:<13} {value}");
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    let rows = rows_after(&out, "at ");
    assert_eq!(rows.len(), 3, "one row per history entry:\n{out}");
    assert!(rows[0].contains("waiting"), "{out}");
    assert!(
        rows[1].contains("running") && rows[1].contains("h1/3"),
        "{out}"
    );
    assert!(rows[2].contains("done"), "{out}");

    let o = env.gaffer(&["tasks", "show", "emails", "nosuch"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(r#"no task "nosuch" in queue emails"#),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_show_of_an_untracked_queue_shows_what_the_queue_holds() {
    let env = Env::with_config(
        "[cluster]\nnamespace = \"clitest\"\n\n[queues.bulk]\nhandler = \"noop\"\ntrack = false\n",
    );
    push_id(&env, "bulk", "b1");
    let o = env.gaffer(&["tasks", "show", "bulk", "b1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["state"], "ready");
    assert_eq!(v["payload"]["to"], "a@b");
    assert!(v.get("history").is_none(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_list_filters_by_state_and_pages_by_cursor() {
    let env = Env::new();
    for id in ["a1", "a2", "a3", "a4", "a5"] {
        push_id(&env, "emails", id);
    }
    let q = slot_queue(&env, "emails").await;
    let b = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(b.tasks[0].id, "a1");
    q.ack(&b.tasks).await.unwrap();

    let page = |args: &[&str]| -> Value {
        let mut all = vec!["tasks", "list", "emails", "--json"];
        all.extend_from_slice(args);
        let o = env.gaffer(&all);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let ids = |v: &Value| -> Vec<String> {
        v["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect()
    };
    let first = page(&["--state", "waiting", "--limit", "3"]);
    assert_eq!(ids(&first), ["a5", "a4", "a3"], "newest first");
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let second = page(&["--state", "waiting", "--limit", "3", "--cursor", &cursor]);
    assert_eq!(ids(&second), ["a2"]);
    assert!(second["next_cursor"].is_null(), "{second}");
    assert_eq!(ids(&page(&["--state", "done"])), ["a1"]);

    // The table ends with the cursor to pass for the next page.
    let o = env.gaffer(&[
        "tasks", "list", "emails", "--state", "waiting", "--limit", "3",
    ]);
    let out = stdout(&o);
    let rows = rows_after(&out, "id ");
    assert_eq!(rows.len(), 4, "three rows and the cursor line:\n{out}");
    assert!(
        rows[0].starts_with("a5 ") && rows[0].contains("waiting"),
        "{out}"
    );
    assert_eq!(
        rows[0].split_whitespace().nth(5),
        Some("cli"),
        "submitted_by column:\n{out}"
    );
    let cursor = rows[3]
        .strip_prefix("more: pass --cursor ")
        .and_then(|r| r.strip_suffix(" for the next page"))
        .unwrap_or_else(|| panic!("no cursor line:\n{out}"));
    let o = env.gaffer(&[
        "tasks", "list", "emails", "--state", "waiting", "--cursor", cursor,
    ]);
    let out = stdout(&o);
    let rows = rows_after(&out, "id ");
    assert_eq!(rows.len(), 1, "the last page has no cursor line:\n{out}");
    assert!(rows[0].starts_with("a2 "), "{out}");
}

#[test]
fn tasks_list_refuses_an_unknown_state() {
    let env = Env::new();
    let o = env.gaffer(&["tasks", "list", "emails", "--state", "sleeping"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("sleeping"), "{err}");
    assert!(
        err.contains("waiting, running, done, failed, cancelled, frozen, cancelling"),
        "names the states: {err}"
    );
    let o = env.gaffer(&["tasks", "list", "emails", "--limit", "1001"]);
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_freeze_thaw_and_cancel_note_the_cli() {
    let env = Env::new();
    push_id(&env, "emails", "f1");
    let o = env.gaffer(&["tasks", "freeze", "emails", "f1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "frozen emails task f1");
    let s = stats_json(&env);
    assert_eq!(
        (
            s["queues"]["emails"]["frozen"].as_u64(),
            s["queues"]["emails"]["ready"].as_u64()
        ),
        (Some(1), Some(0))
    );
    let q = slot_queue(&env, "emails").await;
    let b = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert!(b.tasks.is_empty(), "a frozen task is not taken");

    let o = env.gaffer(&["tasks", "thaw", "emails", "f1"]);
    assert_eq!(stdout(&o).trim(), "thawed emails task f1", "{}", stderr(&o));
    assert_eq!(stats_json(&env)["queues"]["emails"]["frozen"], 0);
    let notes: Vec<Value> = q
        .record("f1")
        .await
        .unwrap()
        .unwrap()
        .history
        .unwrap()
        .iter()
        .map(|e| serde_json::json!([e.state.as_str(), e.note]))
        .collect();
    assert_eq!(
        notes[1..],
        [
            serde_json::json!(["frozen", "frozen by cli"]),
            serde_json::json!(["waiting", "thawed by cli"])
        ]
    );

    let b = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    let o = env.gaffer(&["tasks", "freeze", "emails", "f1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("it is running"), "{}", stderr(&o));
    let o = env.gaffer(&["tasks", "freeze", "emails", "nosuch"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(r#"no task "nosuch""#), "{}", stderr(&o));

    let o = env.gaffer(&["tasks", "cancel", "emails", "f1"]);
    assert_eq!(stdout(&o).trim(), "cancelled emails task f1 (was leased)");
    let r = q.record("f1").await.unwrap().unwrap();
    let last = r.history.unwrap().pop().unwrap();
    assert_eq!(
        (last.state.as_str(), last.note.as_deref()),
        ("cancelled", Some("cancelled by cli"))
    );
    let o = env.gaffer(&["tasks", "thaw", "emails", "f1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("it is cancelled"), "{}", stderr(&o));
}

/// Ctrl-C during a push of many chunks stops it between chunks and says how far it got,
/// which is what Redis holds.
#[tokio::test]
async fn ctrl_c_stops_a_long_push_between_chunks_and_says_how_far_it_got() {
    let env = Env::new();
    let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(env.config())
        .arg("--redis")
        .arg(env.redis.url())
        .args(["push", "emails", "--count", "1000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = env.client().await;
    let q = client.queue("emails").unwrap();
    eventually(Duration::from_secs(60), "the push under way", || async {
        q.stats().await.is_ok_and(|s| s.enqueued_total > 0)
    })
    .await;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    let enqueued = q.stats().await.unwrap().enqueued_total;
    assert!(enqueued < 1_000_000, "the push ran to its end: {err}");
    assert!(
        err.contains(&format!(
            "interrupted: {enqueued} of 1000000 tasks sent to emails ({enqueued} enqueued"
        )),
        "{err}"
    );
}

#[test]
fn intake_switches_shows_and_resets() {
    let env = Env::new();
    let intake = |args: &[&str]| -> String {
        let mut all = vec!["intake", "emails"];
        all.extend_from_slice(args);
        let o = env.gaffer(&all);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o).trim().to_string()
    };
    assert_eq!(intake(&[]), "emails: intake open (the config's value)");
    assert_eq!(
        intake(&["closed"]),
        "emails: intake closed (run-time switch; the config says open)"
    );
    assert_eq!(
        intake(&[]),
        "emails: intake closed (run-time switch; the config says open)"
    );

    let o = env.gaffer(&["push", "emails", "--payload", "{}"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert_said(&o, "the intake of queue emails is closed");
    assert_eq!(stats_json(&env)["queues"]["emails"]["enqueued_total"], 0);

    let json: Value = serde_json::from_str(&intake(&["--json"])).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"queue": "emails", "intake": "closed", "configured": "open", "switched": true})
    );
    // A switch to the config's own value is still a switch (a config change won't move it).
    assert_eq!(
        intake(&["open"]),
        "emails: intake open (run-time switch; the config says open)"
    );
    assert_eq!(
        intake(&["--reset"]),
        "emails: intake open (no run-time switch: the config's value)"
    );
    let json: Value = serde_json::from_str(&intake(&["--json"])).unwrap();
    assert_eq!(json["switched"], false, "{json}");
    let o = env.gaffer(&["push", "emails", "--payload", "{}"]);
    assert!(o.status.success(), "{}", stderr(&o));

    let o = env.gaffer(&["intake", "nosuch"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not in the config"), "{}", stderr(&o));
}

#[test]
fn api_hash_token_hashes_stdin_and_refuses_nothing() {
    let env = Env::new();
    let o = env.gaffer_stdin(&["api", "hash-token"], Some("test\n"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim(),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    );
    let o = env.gaffer_stdin(&["api", "hash-token"], Some("\n"));
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).is_empty());
    assert!(stderr(&o).contains("no token"), "{}", stderr(&o));
}

/// A bulk push that Redis refuses partway (here at its `maxmemory`) says how far it got,
/// as an interrupted one does: a rerun without ids would enqueue what was sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_refused_partway_says_how_far_it_got() {
    let env = Env::new();
    let mut raw = env.redis.raw().await;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut raw)
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    // Room for the first chunk of 10,000 tasks (about 5.5 MB), not for six.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + (8 << 20))
        .query_async(&mut raw)
        .await
        .unwrap();
    let o = env.gaffer(&["push", "emails", "--count", "60000"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("OOM"), "{err}");
    let (sent, rest) = err
        .split_once(" of 60000 tasks sent to emails before (")
        .unwrap_or_else(|| panic!("no progress in {err:?}"));
    let sent: u64 = sent.rsplit(' ').next().unwrap().parse().unwrap();
    let created: u64 = rest.split(' ').next().unwrap().parse().unwrap();
    assert!(sent >= 10_000 && sent.is_multiple_of(10_000), "{err}");
    assert_eq!(created, sent, "{err}");
    assert!(err.contains("the other"), "{err}");
    // What Redis holds: the chunks reported, and at most the chunk in flight besides.
    let enqueued = stats_json(&env)["queues"]["emails"]["enqueued_total"]
        .as_u64()
        .unwrap();
    assert!(
        (sent..=sent + 10_000).contains(&enqueued),
        "{enqueued} of {err}"
    );
}

/// Text `stats` shows each queue's load column, and says STALE, in the words the docs
/// and the dashboard use, when no manager holds the lease.
#[test]
fn text_stats_show_load_and_a_stale_manager() {
    let env = Env::new();
    let o = env.gaffer(&["stats"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out.lines().next().unwrap();
    assert!(header.trim_end().ends_with("wanted   load"), "{out}");
    let emails = out.lines().find(|l| l.starts_with("emails ")).unwrap();
    assert!(emails.trim_end().ends_with('-'), "no decision yet: {out}");
    assert!(out.contains("STALE: no manager holds the lease"), "{out}");
}

/// A drain mark for a host no master reports as (a host drained before it starts, or a
/// misspelt name) is kept, said at once, and shown by `stats` until it is dropped.
#[test]
fn a_drain_mark_for_an_unknown_host_is_said_and_shown_until_dropped() {
    let env = Env::new();
    let o = env.gaffer(&["drain", "web7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "no master has registered as \"web7\" (yet); marking it anyway (known hosts: none;"
        ),
        "{}",
        stderr(&o)
    );
    let o = env.gaffer(&["stats"]);
    assert!(
        stdout(&o).contains("marked for draining, but no master reports as: web7"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        stats_json(&env)["drain_marked_unknown_hosts"],
        serde_json::json!(["web7"])
    );
    env.gaffer(&["drain", "web7", "--cancel"]);
    assert_eq!(
        stats_json(&env)["drain_marked_unknown_hosts"],
        serde_json::json!([])
    );
}
