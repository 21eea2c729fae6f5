//! `gaffer up` end to end, as a newcomer runs it: the repo's own config.toml with the demo
//! load, a local redis-server, manager and master as real processes. Within 30 s every demo
//! queue has slots and tasks are acked; the Grafana dashboards use only metrics a real
//! scrape of that manager and master shows; Ctrl-C leaves no process behind.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::redis_server::free_port;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::{ANY_LOAD, poll_some};
use crate::host::{gone, http_get};

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `gaffer up --demo-load` in the repo, with its own state directory and HTTP ports; its
/// host is `up-test`.
pub(crate) struct Up {
    pub child: Child,
    pub state: tempfile::TempDir,
    pub manager_http: u16,
    pub master_http: u16,
    pub api_http: u16,
}

impl Up {
    pub fn start() -> Self {
        let state = tempfile::tempdir().unwrap();
        let (manager_http, master_http) = (free_port().unwrap(), free_port().unwrap());
        let api_http = free_port().unwrap();
        let log = std::fs::File::create(state.path().join("up.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .current_dir(repo())
            .args(["--config", "config.toml", "up", "--demo-load"])
            .env("GAFFER_STATE_DIR", state.path())
            .env("GAFFER_MANAGER_HTTP", format!("127.0.0.1:{manager_http}"))
            .env("GAFFER_MASTER_HTTP", format!("127.0.0.1:{master_http}"))
            .env("GAFFER_API_LISTEN", format!("127.0.0.1:{api_http}"))
            .env("GAFFER_HOST", "up-test")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .env_remove("GAFFER_REDIS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group, like a shell job: the SIGINT below reaches it alone.
            .process_group(0)
            .spawn()
            .unwrap();
        Up {
            child,
            state,
            manager_http,
            master_http,
            api_http,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("up.log")).unwrap_or_default()
    }

    /// `gaffer stats --json` run the way an operator would in a second terminal: same
    /// config, no Redis named; it finds `up`'s Redis through the state directory.
    pub fn stats(&self) -> Option<serde_json::Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .current_dir(repo())
            .args(["--config", "config.toml", "stats", "--json"])
            .env("GAFFER_STATE_DIR", self.state.path())
            .env_remove("GAFFER_REDIS")
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every process descended from `root`, read from /proc.
fn descendants(root: u32) -> BTreeSet<u32> {
    let mut parent = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent.insert(pid, ppid);
        }
    }
    let mut out = BTreeSet::new();
    let mut grew = true;
    while grew {
        grew = false;
        for (&pid, &ppid) in &parent {
            if (ppid == root || out.contains(&ppid)) && out.insert(pid) {
                grew = true;
            }
        }
    }
    out
}

/// Metric names a Prometheus text scrape shows (samples and TYPE lines).
fn scraped_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.strip_prefix("# TYPE ").unwrap_or(l);
            if l.starts_with('#') {
                return None;
            }
            let end = l.find(['{', ' ']).unwrap_or(l.len());
            Some(l[..end].to_string())
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// Every `gaffer_*` name in `text`.
fn gaffer_names(text: &str, out: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(i) = rest.find("gaffer_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        out.insert(name);
    }
}

/// Every `gaffer_*` name in the PromQL of a dashboard: panel targets and variable queries.
fn dashboard_metrics(path: &Path) -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if let (true, Some(s)) = (k == "expr" || k == "definition", v.as_str()) {
                        gaffer_names(s, out);
                    } else {
                        walk(v, out);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = BTreeSet::new();
    walk(&json, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn up_runs_the_demo_and_ctrl_c_leaves_nothing_behind() {
    let up = Up::start();
    let started = Instant::now();

    // Every queue of the demo config has slots, and tasks are being acked.
    let cfg = gaffer::config::load(&repo().join("config.toml")).unwrap();
    let first: serde_json::Value = poll_some(
        Duration::from_secs(30),
        "slots on every demo queue",
        || async {
            let s = up.stats()?;
            let all = cfg
                .queues
                .keys()
                .all(|q| s["queues"][q]["slots"].as_u64() >= Some(1));
            let acked: u64 = cfg
                .queues
                .keys()
                .filter_map(|q| s["queues"][q]["acked_total"].as_u64())
                .sum();
            (all && acked > 0).then_some(s)
        },
    )
    .await;
    eprintln!("every demo queue had slots after {:?}", started.elapsed());
    let acked = |s: &serde_json::Value| -> u64 {
        cfg.queues
            .keys()
            .filter_map(|q| s["queues"][q]["acked_total"].as_u64())
            .sum()
    };
    let before = acked(&first);
    poll_some(Duration::from_secs(20), "more tasks acked", || async {
        up.stats().filter(|s| acked(s) > before)
    })
    .await;
    assert_eq!(first["hosts"]["up-test"]["state"], "alive", "{first}");

    // The task service answers with the demo's admin token, and a sync submit comes back
    // with the task done by a real slot.
    let token = std::fs::read_to_string(up.state.path().join("api-token")).unwrap();
    // Its token and its state (the Redis URL, which may hold a password) are its owner's
    // to read only.
    for file in ["api-token", "up.json"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(up.state.path().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    assert!(
        up.log()
            .contains(&format!("admin token for this demo: {token}")),
        "{}",
        up.log()
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", up.api_http).parse().unwrap();
    let (status, body) = crate::api::request(
        addr,
        "POST",
        "/v1/queues/thumbnails/tasks",
        Some(&token),
        Some(br#"{"payload": {"ms": 1}, "id": "via-api", "wait": "30s"}"#),
    )
    .await;
    let rec: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, rec["state"].clone()),
        (200, serde_json::json!("done")),
        "{rec}"
    );
    assert_eq!(rec["submitted_by"], "up-admin");
    assert_eq!(rec["history"][1]["host"], "up-test");
    assert!(first["manager"]["leader"].is_string(), "{first}");

    // The dashboards use only metrics that exist: the union of a real scrape of the
    // manager and the master, taken once every series has had time to appear.
    let scrape = |port: u16| http_get(port, "/metrics").unwrap_or_default();
    let names: BTreeSet<String> = poll_some(
        Duration::from_secs(20),
        "batch histograms scraped",
        || async {
            let names: BTreeSet<String> = scraped_names(&scrape(up.manager_http))
                .into_iter()
                .chain(scraped_names(&scrape(up.master_http)))
                .collect();
            (names.contains("gaffer_batch_seconds_sum")
                && names.contains("gaffer_task_start_delay_seconds_bucket")
                && names.contains("gaffer_queue_oldest_due_age_seconds"))
            .then_some(names)
        },
    )
    .await;
    // So do the alert rules: every name in them, expressions and texts alike.
    let mut in_rules = BTreeSet::new();
    let rules = std::fs::read_to_string(repo().join("dashboards/alerts.yml")).unwrap();
    gaffer_names(&rules, &mut in_rules);
    for needed in [
        "gaffer_queue_oldest_due_age_seconds",
        "gaffer_queue_priority",
        "gaffer_redis_up",
    ] {
        assert!(in_rules.contains(needed), "alerts.yml lost {needed}");
    }
    let missing: Vec<&String> = in_rules.iter().filter(|m| !names.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "alerts.yml uses metrics no daemon exports: {missing:?}\nscraped: {names:?}"
    );
    let mut checked = 0;
    for entry in std::fs::read_dir(repo().join("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let used = dashboard_metrics(&path);
        assert!(!used.is_empty(), "{} uses no gaffer metric", path.display());
        let missing: Vec<&String> = used.iter().filter(|m| !names.contains(*m)).collect();
        assert!(
            missing.is_empty(),
            "{} uses metrics no daemon exports: {missing:?}\nscraped: {names:?}",
            path.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "expected the three dashboards, found {checked}"
    );

    // Ctrl-C: everything `up` started stops, Redis last, and nothing is left.
    let tree = descendants(up.child.id());
    assert!(
        tree.len() >= 4,
        "expected redis, manager, master, api, zygote and slots under up, found {tree:?}"
    );
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).unwrap();
    let mut up = up;
    let status = poll_some(
        Duration::from_secs(60),
        "gaffer up to exit after Ctrl-C",
        || {
            let r = up.child.try_wait().unwrap();
            async move { r }
        },
    )
    .await;
    let log = up.log();
    assert!(
        status.success(),
        "gaffer up exited with {status}; log:\n{log}"
    );
    let left: Vec<u32> = tree.iter().copied().filter(|&p| !gone(p)).collect();
    assert!(left.is_empty(), "left behind: {left:?}; log:\n{log}");
    assert!(log.contains("stopping redis-server"), "{log}");
    assert!(
        !up.state.path().join("up.json").exists(),
        "the state file names a Redis that is gone"
    );
}

#[test]
fn up_refuses_a_second_instance_on_the_same_state_dir() {
    let state = tempfile::tempdir().unwrap();
    let lock = std::fs::File::create(state.path().join("up.lock")).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .current_dir(repo())
        .args(["--config", "config.toml", "up"])
        .env("GAFFER_STATE_DIR", state.path())
        .env_remove("GAFFER_REDIS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another `gaffer up` is running"), "{err}");
    assert!(
        !state.path().join("redis").exists(),
        "started a Redis before finding the lock"
    );
}

#[test]
fn without_redis_server_up_says_how_to_install_it() {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .current_dir(repo())
        .args(["--config", "config.toml", "up"])
        .env("GAFFER_STATE_DIR", state.path())
        .env("PATH", "/nonexistent")
        .env_remove("GAFFER_REDIS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("redis-server not found") && err.contains("apt-get install redis-server"),
        "{err}"
    );
}

#[test]
fn other_commands_say_no_up_is_running() {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .current_dir(repo())
        .args(["--config", "config.toml", "stats"])
        .env("GAFFER_STATE_DIR", state.path())
        .env_remove("GAFFER_REDIS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no `gaffer up` runs"), "{err}");
}
