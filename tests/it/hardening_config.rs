//! A published config told apart by its text, not its version alone (issue 40, item 1),
//! and the api's Redis outages logged once per spell with their real cause (item 14).
//! A real `gaffer api` process, its log read as JSON lines, against a real redis-server
//! that is restarted empty, killed and frozen under it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gaffer::api::hash_token;
use gaffer::cluster::{self, ConfigSeen, Keys};
use gaffer::redis_server::RedisServerOptions;
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::api::request;
use crate::harness::{TestRedis, eventually, gaffer_ok};

const SHOP: &str = "shop-token";
const OPS: &str = "ops-token";

/// A `gaffer api` process with its JSON log in a file, killed on drop.
struct ApiProcess {
    child: std::process::Child,
    dir: tempfile::TempDir,
    config: PathBuf,
    addr: SocketAddr,
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The config of the tests' api: queue `q`, an admin key and `shop` (queue q only), each
/// left out when `keep_shop` is false.
fn config_text(redis: &str, port: u16, keep_shop: bool) -> String {
    let shop = if keep_shop {
        format!(
            "[api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"q\"]\n",
            hash_token(SHOP)
        )
    } else {
        String::new()
    };
    format!(
        "[cluster]\nredis = \"{redis}\"\nnamespace = \"test\"\n\n[queues.q]\nhandler = \"noop\"\n\n\
         [api]\nlisten = \"127.0.0.1:{port}\"\n\n[api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n\n{shop}",
        hash_token(OPS)
    )
}

impl ApiProcess {
    /// Starts `gaffer api` on a free port against `redis`, and waits until it answers.
    async fn start(redis: &TestRedis) -> ApiProcess {
        let dir = tempfile::tempdir().unwrap();
        let port = gaffer::redis_server::free_port().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(&config, config_text(&redis.url(), port, true)).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(&config)
            .args(["--log-format", "json", "api"])
            // Debug lines too: the quiet failures of a spell are counted.
            .env("GAFFER_LOG", "info,gaffer=debug")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("api.log")).unwrap())
            .spawn()
            .unwrap();
        let api = ApiProcess {
            child,
            dir,
            config,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
        };
        eventually(Duration::from_secs(20), "the api answering", || async {
            tokio::net::TcpStream::connect(api.addr).await.is_ok()
        })
        .await;
        api
    }

    /// The status of a GET of `path` with `token`.
    async fn get(&self, path: &str, token: Option<&str>) -> u16 {
        request(self.addr, "GET", path, token, None).await.0
    }

    /// Every line it logged, parsed.
    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("api.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The lines at `level` whose message holds `text`.
    fn said(&self, level: &str, text: &str) -> Vec<Value> {
        self.log()
            .into_iter()
            .filter(|l| l["level"] == level && l["message"].as_str().unwrap().contains(text))
            .collect()
    }

    /// The whole log, for a failed assertion's message.
    fn dump(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("api.log")).unwrap_or_default()
    }

    /// `gaffer config apply` of the config file, as it is now: the version published.
    fn apply(&self) -> u64 {
        let out = gaffer_ok(&self.config, &["config", "apply"]);
        out.strip_prefix("published config version ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no version in {out:?}"))
    }
}

/// A plain redis-server (never TLS: the api process is given a bare URL).
fn plain_redis() -> TestRedis {
    TestRedis::with(RedisServerOptions::default())
}

/// The attack: three applies, Redis restarted empty, `[api.keys.shop]` removed
/// and applied. The version starts again at 1, below the 3 the api had adopted; it used
/// to wait for a version above 3 and let the revoked key in until the fourth apply. The
/// same text applied again afterwards is no change: nothing is adopted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_after_redis_lost_its_data_is_refused_at_the_next_apply() {
    let mut redis = plain_redis();
    let api = ApiProcess::start(&redis).await;
    assert_eq!(api.get("/v1/queues/q/tasks", Some(SHOP)).await, 200);
    let text = std::fs::read_to_string(&api.config).unwrap();
    for extra in ["", "\n# again\n", "\n# and again\n"] {
        std::fs::write(&api.config, format!("{text}{extra}")).unwrap();
        api.apply();
    }
    let adopting = || api.said("INFO", "adopting the published config").len();
    eventually(Duration::from_secs(20), "v3 adopted", || async {
        api.said("INFO", "adopting the published config")
            .iter()
            .any(|l| l["version"] == 3)
    })
    .await;

    redis.server.restart().unwrap();
    let revoked = text.replace(
        &format!(
            "[api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"q\"]\n",
            hash_token(SHOP)
        ),
        "",
    );
    assert_ne!(revoked, text);
    std::fs::write(&api.config, &revoked).unwrap();
    assert_eq!(api.apply(), 1, "an empty Redis counts from 1 again");
    eventually(
        Duration::from_secs(20),
        "the revoked key refused",
        || async { api.get("/v1/queues/q/tasks", Some(SHOP)).await == 401 },
    )
    .await;
    assert_eq!(api.get("/v1/queues/q/tasks", Some(OPS)).await, 200);
    // Loudly: the version went backwards (or, read in between, the config vanished).
    let warned = api.said("WARN", "version did not go up").len()
        + api
            .said("WARN", "the published config is gone from redis")
            .len();
    assert!(warned >= 1, "{}", api.dump());

    // The same text again, as version 2: read, not adopted.
    let adopted = adopting();
    assert_eq!(api.apply(), 2);
    eventually(Duration::from_secs(20), "v2 read", || async {
        api.said("INFO", "published again with its text unchanged")
            .iter()
            .any(|l| l["version"] == 2)
    })
    .await;
    assert_eq!(adopting(), adopted, "{}", api.dump());
    assert_eq!(api.get("/v1/queues/q/tasks", Some(SHOP)).await, 401);
}

/// The reader every role adopts through: a text other than the one read is news at any
/// version, the same text at another version is not, and a config published by the
/// previous build (no stamp, or a stamp an older apply left behind) is compared by its
/// text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_configs_are_told_apart_by_their_text_not_their_version() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let mut conn = client.connection();
    let keys = Keys::new("test");
    let text = |queue: &str| format!("[queues.{queue}]\nhandler = \"noop\"\n");
    let mut seen = ConfigSeen::default();
    let reader = conn.clone();
    let read = async |seen: &mut ConfigSeen| {
        let read = cluster::changed_config(&mut reader.clone(), &keys, seen, &[])
            .await
            .unwrap();
        *seen = read.seen;
        read.changed.map(|p| (p.version, p.source))
    };
    assert_eq!(read(&mut seen).await, None, "nothing published");

    cluster::publish_config(&mut conn, &keys, &text("a"))
        .await
        .unwrap();
    cluster::publish_config(&mut conn, &keys, &text("b"))
        .await
        .unwrap();
    assert_eq!(read(&mut seen).await, Some((2, text("b"))));
    assert_eq!(read(&mut seen).await, None, "read once");
    cluster::publish_config(&mut conn, &keys, &text("b"))
        .await
        .unwrap();
    assert_eq!(read(&mut seen).await, None, "the same text, version 3");
    assert_eq!(seen.version, 3);

    // Redis lost its data: a differing text at a lower version is adopted, the same text
    // is not.
    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    assert_eq!(read(&mut seen).await, None, "nothing published any more");
    cluster::publish_config(&mut conn, &keys, &text("b"))
        .await
        .unwrap();
    assert_eq!(read(&mut seen).await, None, "the same text at version 1");
    cluster::publish_config(&mut conn, &keys, &text("c"))
        .await
        .unwrap();
    assert_eq!(read(&mut seen).await, Some((2, text("c"))), "below 3");
    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    cluster::publish_config(&mut conn, &keys, &text("d"))
        .await
        .unwrap();
    cluster::publish_config(&mut conn, &keys, &text("e"))
        .await
        .unwrap();
    assert_eq!(
        read(&mut seen).await,
        Some((2, text("e"))),
        "another text at the version seen"
    );

    // Redis went back to an older apply (a failover to a replica that lagged): its text
    // differs but it was published before the one read, so it is not adopted, and the
    // reader says so; an apply made after that is adopted whatever its version.
    let hash = async |conn: &mut gaffer::queue_client::RedisConn| -> Vec<(String, String)> {
        redis::cmd("HGETALL")
            .arg(keys.config())
            .query_async(conn)
            .await
            .unwrap()
    };
    let older = hash(&mut conn).await;
    cluster::publish_config(&mut conn, &keys, &text("f"))
        .await
        .unwrap();
    assert_eq!(read(&mut seen).await, Some((3, text("f"))));
    let mut restore = redis::cmd("HSET");
    restore.arg(keys.config());
    for (k, v) in &older {
        restore.arg(k).arg(v);
    }
    let _: i64 = restore.query_async(&mut conn).await.unwrap();
    let went_back = cluster::changed_config(&mut conn.clone(), &keys, &seen, &[])
        .await
        .unwrap();
    assert!(
        went_back.behind && went_back.changed.is_none(),
        "{went_back:?}"
    );
    assert_eq!(
        went_back.seen, seen,
        "the config in force stays the one seen"
    );
    cluster::publish_config(&mut conn, &keys, &text("g"))
        .await
        .unwrap();
    assert_eq!(
        read(&mut seen).await,
        Some((3, text("g"))),
        "applied after it"
    );

    // An apply of the previous build: HINCRBY version and HSET source, no stamp; the
    // stamp of the apply before stays, naming another version.
    let old_apply = async |conn: &mut gaffer::queue_client::RedisConn, source: &str| {
        let _: u64 = redis::Script::new(
            "local v = redis.call('HINCRBY', KEYS[1], 'version', 1) \
             redis.call('HSET', KEYS[1], 'source', ARGV[1]) return v",
        )
        .key(keys.config())
        .arg(source)
        .invoke_async(conn)
        .await
        .unwrap();
    };
    old_apply(&mut conn, &text("f")).await;
    assert_eq!(read(&mut seen).await, Some((4, text("f"))));
    assert_eq!(read(&mut seen).await, None, "the stale stamp is no news");
    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    old_apply(&mut conn, &text("g")).await;
    assert_eq!(read(&mut seen).await, Some((1, text("g"))), "no stamp");
    assert_eq!(read(&mut seen).await, None, "compared by its text");
    old_apply(&mut conn, &text("g")).await;
    assert_eq!(read(&mut seen).await, None, "the same text again");
}

/// Redis killed under a running api, then frozen: the subscription's listener names the
/// refusal for what it is (not the ACL), the requests' failures make one warning however
/// many there are, and each spell's end is one info line with its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_logs_a_redis_outage_once_per_spell_with_its_cause() {
    let mut redis = plain_redis();
    let api = ApiProcess::start(&redis).await;
    assert_eq!(api.get("/healthz", None).await, 200);

    redis.server.kill();
    for _ in 0..5 {
        assert_eq!(api.get("/v1/queues/q/tasks", Some(OPS)).await, 503);
        assert_eq!(api.get("/healthz", None).await, 503);
    }
    // The subscription is tried again (after 100 ms, 200 ms, …): quietly.
    eventually(Duration::from_secs(20), "the listener retried", || async {
        api.said("DEBUG", "cannot subscribe to task ends").len() >= 2
    })
    .await;
    let listener = api.said("WARN", "cannot subscribe to task ends");
    assert_eq!(listener.len(), 1, "{}", api.dump());
    // (its first try may meet the connection as it breaks; the retries meet the refusal)
    assert!(
        ["refused", "dropped"].contains(&listener[0]["cause"].as_str().unwrap()),
        "{}",
        api.dump()
    );
    assert!(
        api.said("DEBUG", "cannot subscribe to task ends")
            .iter()
            .any(|l| l["cause"] == "refused"),
        "{}",
        api.dump()
    );
    assert!(
        !listener[0]["message"].as_str().unwrap().contains("ACL"),
        "{}",
        api.dump()
    );
    // Ten failed requests (each logged before its answer): one warning, nine quiet lines.
    let requests = api.said("WARN", "redis unreachable, further failures");
    assert_eq!(requests.len(), 1, "{}", api.dump());
    let quiet = api.said("DEBUG", "could not reach redis");
    assert!(quiet.len() >= 9, "{}", api.dump());
    // The first call may meet the connection as it breaks, the later ones the refusal.
    assert!(
        ["refused", "dropped"].contains(&requests[0]["cause"].as_str().unwrap()),
        "{}",
        api.dump()
    );
    assert!(
        quiet.iter().any(|l| l["cause"] == "refused"),
        "{}",
        api.dump()
    );

    redis.server.restart().unwrap();
    eventually(Duration::from_secs(20), "both recoveries said", || async {
        !api.said("INFO", "subscribed to task ends again").is_empty()
            && !api.said("INFO", "redis answers again").is_empty()
    })
    .await;
    for line in [
        &api.said("INFO", "subscribed to task ends again")[0],
        &api.said("INFO", "redis answers again")[0],
    ] {
        assert!(line["after"].is_string(), "{line}");
    }

    // Frozen: no refusal, no word from the listener; the health check's 2 s give up.
    redis.server.signal(Signal::SIGSTOP).unwrap();
    let frozen = api.get("/healthz", None).await;
    redis.server.signal(Signal::SIGCONT).unwrap();
    assert_eq!(frozen, 503);
    let requests = api.said("WARN", "redis unreachable, further failures");
    assert_eq!(requests.len(), 2, "{}", api.dump());
    assert_eq!(requests[1]["cause"], "timed_out", "{}", api.dump());
    // The freeze's spell ends with the first answer after it (a spell after it, if a
    // loaded machine makes one, is not this test's business).
    let ended_after_freeze = || {
        let log = api.log();
        let freeze = log
            .iter()
            .position(|l| l["level"] == "WARN" && l["cause"] == "timed_out");
        freeze.is_some_and(|at| {
            log[at..]
                .iter()
                .any(|l| l["level"] == "INFO" && l["message"] == "redis answers again")
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !ended_after_freeze() {
        assert!(
            std::time::Instant::now() < deadline,
            "the freeze's end was not said: {}",
            api.dump()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
