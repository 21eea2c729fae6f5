//! The `gaffer` binary as operators and scripts use it: exit codes, output, the
//! `stats --json` contract, against a real redis-server.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gaffer::queue_client::QueueClient;
use serde_json::Value;

use crate::harness::TestRedis;

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

struct Env {
    redis: TestRedis,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
        Env {
            redis: TestRedis::start(),
            dir,
        }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    fn gaffer(&self, args: &[&str]) -> Output {
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

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
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
    assert!(
        stderr(&o).contains("stdin:2: not a JSON payload"),
        "{}",
        stderr(&o)
    );
    let o = env.gaffer(&["push", "nosuch", "--count", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not in the config (known: emails, reports)"),
        "{}",
        stderr(&o)
    );
    let o = env.gaffer(&["push", "emails"]);
    assert_eq!(o.status.code(), Some(2));
    let big = env.dir.path().join("big.jsonl");
    std::fs::write(&big, format!("{{}}\n\"{}\"\n", "x".repeat(2 * 1024 * 1024))).unwrap();
    let o = env.gaffer(&["push", "emails", "--file", big.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("exceeds the limit of 1048576 bytes"),
        "{}",
        stderr(&o)
    );
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
    let o = env.gaffer(&["tasks", "requeue", "emails", first]);
    assert_eq!(stdout(&o).trim(), "requeued 1 dead letters of emails");
    let o = env.gaffer(&["tasks", "purge", "emails"]);
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
    assert!(!err.contains("hunter2"), "password leaked: {err}");
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
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(
            &mut redis::Client::open(env.redis.url())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
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
