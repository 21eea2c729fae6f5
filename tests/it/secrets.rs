//! Secrets stay secret: a Redis password (from `redis_password_file`) and an api token are
//! known, every role runs with debug logs, and every output an operator or another role
//! can see is searched for them: logs, `/status`, `/metrics`, `stats` (text and JSON),
//! `tasks show`, the api's answers (the web console's login too), the dashboard's screens
//! and what `config apply` publishes.
//!
//! Also covered: help texts (`--help` hides `GAFFER_REDIS`'s value), a unix socket URL's
//! `pass=` in an error, and an exec handler's environment (it is started without
//! `GAFFER_REDIS`). The code side is `queue_client::redacted` for URLs, `ConnectOptions`'
//! `Debug`, and `config apply`'s masking of a password in `[cluster].redis`
//! (ARCHITECTURE.md, invariant 10).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gaffer::queue_client::{ConnectOptions, QueueClient};
use gaffer::redis_server::RedisServerOptions;
use gaffer::tui::{Action, State, View, update};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::harness::{ANY_LOAD, TestRedis, eventually, poll_some};

const PASSWORD: &str = "pw-d7e1c0ffee-secret";
const TOKEN: &str = "tok-9b2f5eed-secret";

/// A Redis that wants [`PASSWORD`] for its default user.
fn redis() -> TestRedis {
    TestRedis::with(RedisServerOptions {
        extra: vec![("requirepass".into(), PASSWORD.into())],
        auth: Some(("default".into(), PASSWORD.into())),
        ..Default::default()
    })
}

fn port_of(url: &str) -> u16 {
    let rest = url.rsplit_once(':').unwrap().1;
    rest.split('/').next().unwrap().parse().unwrap()
}

/// Every place a secret could show, gathered as text.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn add(&mut self, what: &str, text: impl Into<String>) {
        self.0.push((what.to_string(), text.into()));
    }

    fn add_output(&mut self, what: &str, o: &std::process::Output) {
        assert!(
            o.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.add(
            &format!("{what} stdout"),
            String::from_utf8_lossy(&o.stdout),
        );
        self.add(
            &format!("{what} stderr"),
            String::from_utf8_lossy(&o.stderr),
        );
    }

    /// Fails naming every output that holds a secret.
    fn assert_clean(&self) {
        let leaks: Vec<&str> = self
            .0
            .iter()
            .filter(|(_, text)| text.contains(PASSWORD) || text.contains(TOKEN))
            .map(|(what, _)| what.as_str())
            .collect();
        assert!(leaks.is_empty(), "secrets shown in: {leaks:?}");
        // The search looked at something: the logs are not empty.
        assert!(
            self.0
                .iter()
                .any(|(w, t)| w.ends_with("log") && t.len() > 200)
        );
    }
}

fn gaffer(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("GAFFER_LOG", "debug")
        .output()
        .unwrap()
}

/// A daemon with debug logs into `dir/NAME.log`; killed on drop.
struct Daemon {
    child: Child,
    log: std::path::PathBuf,
}

impl Daemon {
    fn start(config: &Path, dir: &Path, name: &str, args: &[&str], env: (&str, String)) -> Self {
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(config)
            .args(args)
            .env("GAFFER_LOG", "debug")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .env(env.0, env.1)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    /// SIGTERM, wait, and the whole log.
    fn stop(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` on a daemon's HTTP endpoint: the body, once it answers 200.
async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> String {
    poll_some(
        Duration::from_secs(30),
        &format!("GET {path}"),
        || async move {
            tokio::net::TcpStream::connect(addr).await.ok()?;
            let (st, raw) = crate::api::request(addr, "GET", path, token, None).await;
            (st == 200).then(|| String::from_utf8_lossy(&raw).into_owned())
        },
    )
    .await
}

fn free_addr() -> std::net::SocketAddr {
    let port = gaffer::redis_server::free_port().unwrap();
    format!("127.0.0.1:{port}").parse().unwrap()
}

/// Every screen of the dashboard, drawn from a real read, as text.
async fn dashboard(client: &QueueClient, config: &gaffer::config::Config) -> String {
    let snapshot = gaffer::cluster::snapshot::read(client, config)
        .await
        .unwrap();
    let mut state = State::new(Duration::from_secs(1));
    update(
        &mut state,
        Action::Snapshot {
            snapshot: Box::new(snapshot),
            config: "config.toml".into(),
        },
    );
    update(
        &mut state,
        Action::Tick {
            now_ms: gaffer::cluster::now_ms(),
        },
    );
    state.queue = Some("work".into());
    state.host = Some("h1".into());
    let mut text = String::new();
    for view in [
        View::Queues,
        View::SlotMap,
        View::QueueDetail,
        View::HostDetail,
    ] {
        state.view = view;
        let mut t = Terminal::new(TestBackend::new(160, 50)).unwrap();
        t.draw(|f| f.render_widget(&state, f.area())).unwrap();
        let buf = t.backend().buffer();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                text.push_str(buf[(x, y)].symbol());
            }
            text.push('\n');
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_shows_the_redis_password_or_an_api_token() {
    let redis = redis();
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("redis-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = {:?}\nnamespace = \"sec\"\nredis_password_file = {:?}\n\n\
             [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"5s\"\n\n\
             [queues.work]\nhandler = \"noop\"\nmin_slots = 1\n\n\
             [api.keys.shop]\ntoken_sha256 = {:?}\nqueues = [\"work\"]\n",
            redis.url(),
            password_file.display().to_string(),
            gaffer::api::hash_token(TOKEN),
        ),
    )
    .unwrap();
    let client = QueueClient::connect(
        &redis.url(),
        "sec",
        &ConnectOptions {
            password: Some(PASSWORD.into()),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let (manager_http, master_http, api_http) = (free_addr(), free_addr(), free_addr());
    let manager = Daemon::start(
        &config,
        dir.path(),
        "manager",
        &["manager"],
        ("GAFFER_MANAGER_HTTP", manager_http.to_string()),
    );
    let master = Daemon::start(
        &config,
        dir.path(),
        "master",
        &["master", "--host", "h1"],
        ("GAFFER_MASTER_HTTP", master_http.to_string()),
    );
    let api = Daemon::start(
        &config,
        dir.path(),
        "api",
        &["api"],
        ("GAFFER_API_LISTEN", api_http.to_string()),
    );
    let mut seen = Seen::default();

    // The api: a submit, a refused token (which holds the real one), the record, the queues.
    let body = br#"{"payload": {"n": 1}, "id": "s1"}"#;
    get(api_http, "/healthz", None).await;
    let (st, answer) = crate::api::request(
        api_http,
        "POST",
        "/v1/queues/work/tasks",
        Some(TOKEN),
        Some(body),
    )
    .await;
    assert_eq!(st, 202, "{}", String::from_utf8_lossy(&answer));
    seen.add("api submit", String::from_utf8_lossy(&answer));
    let wrong = format!("{TOKEN}-wrong");
    let (st, answer) = crate::api::request(api_http, "GET", "/v1/queues", Some(&wrong), None).await;
    assert_eq!(st, 401);
    seen.add("api refusal", String::from_utf8_lossy(&answer));
    let q = client.queue("work").unwrap();
    eventually(
        Duration::from_secs(60),
        "the slot acks the task",
        || async { q.stats().await.is_ok_and(|s| s.acked_total == 1) },
    )
    .await;
    seen.add(
        "api record",
        get(api_http, "/v1/queues/work/tasks/s1", Some(TOKEN)).await,
    );
    seen.add("api queues", get(api_http, "/v1/queues", Some(TOKEN)).await);
    // The web console's login form, with the token and with a wrong one (the log says
    // who logged in and who failed, never with what).
    for token in [TOKEN.to_string(), wrong.clone()] {
        let form = format!("token={token}");
        let (st, answer) =
            crate::api::request(api_http, "POST", "/ui/login", None, Some(form.as_bytes())).await;
        assert_eq!(st, 303);
        seen.add("console login", String::from_utf8_lossy(&answer));
    }
    for (who, addr) in [("manager", manager_http), ("master", master_http)] {
        seen.add(&format!("{who} /status"), get(addr, "/status", None).await);
        seen.add(
            &format!("{who} /metrics"),
            get(addr, "/metrics", None).await,
        );
    }

    // The operator's commands.
    seen.add_output("stats --json", &gaffer(&config, &["stats", "--json"]));
    seen.add_output("stats", &gaffer(&config, &["stats"]));
    seen.add_output(
        "tasks show",
        &gaffer(&config, &["tasks", "show", "work", "s1"]),
    );
    seen.add_output("config apply", &gaffer(&config, &["config", "apply"]));
    let cfg = gaffer::config::load(&config).unwrap();
    let screens = dashboard(&client, &cfg).await;
    assert!(
        screens.contains("work") && screens.contains("h1"),
        "{screens}"
    );
    seen.add("dashboard", screens);
    seen.add("published config", published_source(&client).await);
    assert!(
        seen.0.last().unwrap().1.contains("redis_password_file"),
        "the published text keeps the file's path"
    );

    // A published config is adopted (and logged) by the running roles before they stop.
    eventually(
        Duration::from_secs(10),
        "the master adopts the config",
        || async {
            std::fs::read_to_string(dir.path().join("master.log"))
                .is_ok_and(|l| l.contains("published config"))
        },
    )
    .await;
    seen.add("manager log", manager.stop());
    seen.add("master log", master.stop());
    seen.add("api log", api.stop());
    seen.assert_clean();
}

/// What `config apply` left in Redis for every role to read.
async fn published_source(client: &QueueClient) -> String {
    let mut conn = client.connection();
    let source: Option<String> = redis::cmd("HGET")
        .arg("sec:{cluster}:config")
        .arg("source")
        .query_async(&mut conn)
        .await
        .unwrap();
    source.expect("a published config")
}

#[tokio::test]
async fn config_apply_masks_a_password_written_in_the_url() {
    let redis = redis();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let url = format!(
        "redis://default:{PASSWORD}@127.0.0.1:{}/0",
        port_of(&redis.url())
    );
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = {url:?}\nnamespace = \"sec\"\n\n[queues.work]\nhandler = \"noop\"\n"
        ),
    )
    .unwrap();
    let o = gaffer(&config, &["config", "apply"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.contains(PASSWORD), "{out}");
    let client = QueueClient::connect(&url, "sec", &ConnectOptions::default())
        .await
        .unwrap();
    let source = published_source(&client).await;
    assert!(!source.contains(PASSWORD), "{source}");
    assert!(
        source.contains("redis://default:***@127.0.0.1:"),
        "{source}"
    );
}

/// A password in the Redis URL gaffer is given through its environment, or in a unix
/// socket's URL (whose query carries it), shows in no help text or error, and no exec
/// handler inherits it (nor the slot's report socket to its master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_environment_or_a_socket_url_is_not_shown_or_handed_down() {
    let redis = redis();
    let dir = tempfile::tempdir().unwrap();
    let port = port_of(&redis.url());
    let url = format!("redis://default:{PASSWORD}@127.0.0.1:{port}/0");
    let handler = dir.path().join("env.py");
    std::fs::write(
        &handler,
        "import json, os, sys\n\
         for line in sys.stdin:\n\
         \x20   batch = json.loads(line)['batch']\n\
         \x20   env = {k: os.environ.get(k) for k in ('GAFFER_REDIS', 'GAFFER_QUEUE')}\n\
         \x20   fds = []\n\
         \x20   for f in os.listdir('/proc/self/fd'):\n\
         \x20       try: fds.append(os.readlink('/proc/self/fd/' + f))\n\
         \x20       except OSError: pass\n\
         \x20   env['sockets'] = sum(1 for f in fds if f.startswith('socket:'))\n\
         \x20   print(json.dumps({'results': [{'id': t['id'], 'status': 'ok', 'result': env} for t in batch]}), flush=True)\n",
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nnamespace = \"env\"\n\n\
             [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"5s\"\nhttp = \"127.0.0.1:0\"\n\n\
             [master]\nhttp = \"127.0.0.1:0\"\n\n\
             [queues.work]\nhandler = \"exec\"\ncommand = [\"python3\", {:?}]\nmin_slots = 1\n",
            handler.display().to_string()
        ),
    )
    .unwrap();
    let mut seen = Seen::default();

    // Help, with the URL in the environment.
    for args in [&["-h"][..], &["stats", "--help"], &["push", "-h"]] {
        let o = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .args(args)
            .env("GAFFER_REDIS", &url)
            .output()
            .unwrap();
        seen.add_output(&format!("{args:?}"), &o);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("GAFFER_REDIS"),
            "{args:?}: the variable is still named"
        );
    }
    // An error naming a unix socket's URL.
    let socket = format!(
        "redis+unix://{}/none.sock?user=gaffer&pass={PASSWORD}",
        dir.path().display()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .args(["--redis", &socket, "stats"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.contains("pass=***"), "{err}");
    seen.add("socket error", err);

    // A handler run by a master given the URL in its environment.
    let manager = Daemon::start(
        &config,
        dir.path(),
        "manager",
        &["manager"],
        ("GAFFER_REDIS", url.clone()),
    );
    let master = Daemon::start(
        &config,
        dir.path(),
        "master",
        &["master", "--host", "h1"],
        ("GAFFER_REDIS", url.clone()),
    );
    let client = QueueClient::connect(&url, "env", &ConnectOptions::default())
        .await
        .unwrap();
    let q = client.queue("work").unwrap();
    q.enqueue(gaffer::queue_client::NewTask::new("{}").id("e1"))
        .await
        .unwrap();
    let result = poll_some(Duration::from_secs(60), "the task's result", || async {
        q.record("e1").await.ok().flatten().and_then(|r| r.result)
    })
    .await;
    assert_eq!(
        result,
        serde_json::json!({"GAFFER_REDIS": null, "GAFFER_QUEUE": "work", "sockets": 0})
    );
    seen.add("manager log", manager.stop());
    seen.add("master log", master.stop());
    seen.assert_clean();
}
