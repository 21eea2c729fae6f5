//! Redis over TLS: a TLS-only redis-server the harness starts with certificates it makes
//! with openssl, reached with `rediss://` and `[cluster]`'s CA, certificate and key files.

use std::time::Duration;

use gaffer::queue_client::{
    ConnectOptions, NewTask, PemFile, PemKind, QueueClient, QueueError, RecordState, TlsFiles,
};

use gaffer::redis_server::RedisServerOptions;

use crate::harness::{
    ANY_LOAD, ClientAuth, TestCerts, TestRedis, TlsRedis, eventually, poll_some, shared_tls_cluster,
};

/// Connect options trusting `ca` of `certs`, with the client certificate when asked.
fn options(certs: &TestCerts, ca: &str, client_cert: bool) -> ConnectOptions {
    let pem = |name: &str, kind| PemFile::read(&certs.path(name), kind).unwrap();
    let client = client_cert.then(|| {
        (
            pem("client.crt", PemKind::Certificates),
            pem("client.key", PemKind::PrivateKey),
        )
    });
    ConnectOptions {
        tls: Some(TlsFiles {
            ca: Some(pem(ca, PemKind::Certificates)),
            client,
        }),
        ..ConnectOptions::default()
    }
}

async fn connect(server: &TlsRedis, opts: &ConnectOptions) -> Result<QueueClient, QueueError> {
    QueueClient::connect(&server.url(), "test", opts).await
}

/// What a refused connection said; a connection that worked fails the test.
async fn refusal(server: &TlsRedis, opts: &ConnectOptions) -> QueueError {
    match connect(server, opts).await {
        Ok(_) => panic!("connected to {} though it should be refused", server.url()),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_task_goes_round_over_tls_with_a_private_ca() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "server.crt", ClientAuth::Optional);
    let client = connect(&server, &options(&certs, "ca.crt", false))
        .await
        .expect("connect over TLS with the CA file");
    let q = client.queue("tls").unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    let batch = q.take(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(batch.tasks.len(), 1);
    q.ack(&batch.tasks).await.unwrap();
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 1));
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_not_trusted() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "server.crt", ClientAuth::Optional);
    let err = refusal(&server, &options(&certs, "other-ca.crt", false)).await;
    let text = err.to_string();
    assert!(matches!(err, QueueError::Certificate(_)), "{text}");
    assert!(!err.is_transient(), "retrying cannot fix a CA: {text}");
    assert!(text.contains("certificate is not trusted"), "{text}");
    assert!(text.contains("redis_ca_file"), "{text}");
    assert!(text.contains("other-ca.crt"), "{text}");
}

#[tokio::test]
async fn an_expired_server_certificate_is_reported_expired() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "expired.crt", ClientAuth::Optional);
    let err = refusal(&server, &options(&certs, "ca.crt", false)).await;
    let text = err.to_string();
    assert!(matches!(err, QueueError::Certificate(_)), "{text}");
    assert!(text.contains("certificate has expired"), "{text}");
}

#[tokio::test]
async fn a_server_requiring_client_certificates_takes_ours() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "server.crt", ClientAuth::Required);
    // Without one the server hangs up during or right after the handshake.
    assert!(
        connect(&server, &options(&certs, "ca.crt", false))
            .await
            .is_err()
    );
    let client = connect(&server, &options(&certs, "ca.crt", true))
        .await
        .expect("connect with the client certificate");
    let q = client.queue("mtls").unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    assert_eq!(q.stats().await.unwrap().ready, 1);
}

#[test]
fn a_file_without_pem_of_its_kind_is_refused_naming_it() {
    let certs = TestCerts::generate();
    let err = PemFile::read(&certs.path("ca.crt"), PemKind::PrivateKey)
        .err()
        .expect("a certificate is no private key");
    let text = err.to_string();
    assert!(
        text.contains("ca.crt") && text.contains("no PEM private key"),
        "{text}"
    );
    let missing = certs.path("missing.crt");
    let err = PemFile::read(&missing, PemKind::Certificates)
        .err()
        .unwrap();
    assert!(err.to_string().contains("cannot read") && err.to_string().contains("missing.crt"));
}

/// Runs `gaffer ARGS` with a config whose `[cluster]` is `cluster` plus one queue.
fn gaffer(dir: &std::path::Path, cluster: &str, args: &[&str]) -> std::process::Output {
    let config = dir.join("config.toml");
    let text =
        format!("[cluster]\nnamespace = \"tlscli\"\n{cluster}\n[queues.q]\nhandler = \"noop\"\n");
    std::fs::write(&config, text).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .args(args)
        .env_remove("GAFFER_LOG")
        .output()
        .unwrap()
}

#[test]
fn the_cli_reads_the_tls_files_of_the_config() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "server.crt", ClientAuth::Required);
    let dir = tempfile::tempdir().unwrap();
    let cluster = format!(
        "redis = {:?}\nredis_ca_file = {:?}\nredis_cert_file = {:?}\nredis_key_file = {:?}",
        server.url(),
        certs.path("ca.crt").display().to_string(),
        certs.path("client.crt").display().to_string(),
        certs.path("client.key").display().to_string(),
    );
    let o = gaffer(dir.path(), &cluster, &["stats", "--json"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(!stderr.contains("verification is off"), "{stderr}");
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(stats.is_object(), "{stats}");

    let missing = certs.path("nowhere.pem").display().to_string();
    let cluster = format!("redis = {:?}\nredis_ca_file = {missing:?}", server.url());
    let o = gaffer(dir.path(), &cluster, &["stats", "--json"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("[cluster].redis_ca_file") && stderr.contains(&missing),
        "{stderr}"
    );
}

#[test]
fn insecure_warns_at_start_naming_the_risk() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "server.crt", ClientAuth::Optional);
    let dir = tempfile::tempdir().unwrap();
    // No CA file: only #insecure lets the private CA's certificate through.
    let cluster = format!("redis = \"{}#insecure\"", server.url());
    let o = gaffer(dir.path(), &cluster, &["stats", "--json"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("tls certificate verification is off"),
        "{stderr}"
    );
    assert!(stderr.contains("risk="), "{stderr}");
}

// (daemons, killed on drop)
use crate::harness::Killed as Daemons;

impl Daemons {
    /// A manager and a master (host h1) of `config`, their logs manager.log and
    /// master.log in `dir`.
    pub(crate) fn manager_and_master(config: &std::path::Path, dir: &std::path::Path) -> Self {
        let daemon = |args: &[&str], log: &str, http_env: &str| {
            let http = gaffer::redis_server::free_port().unwrap();
            std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
                .arg("--config")
                .arg(config)
                .args(args)
                .env("GAFFER_LOG", "info")
                .env(ANY_LOAD.0, ANY_LOAD.1)
                .env(http_env, format!("127.0.0.1:{http}"))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(dir.join(log)).unwrap())
                .spawn()
                .unwrap()
        };
        Daemons(vec![
            daemon(&["manager"], "manager.log", "GAFFER_MANAGER_HTTP"),
            daemon(
                &["master", "--host", "h1"],
                "master.log",
                "GAFFER_MASTER_HTTP",
            ),
        ])
    }
}

#[tokio::test]
async fn a_manager_a_master_and_the_api_run_tasks_over_tls() {
    let certs = TestCerts::generate();
    let server = TlsRedis::start(&certs, "server.crt", ClientAuth::Required);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let text = format!(
        "[cluster]\nredis = {:?}\nnamespace = \"test\"\nredis_ca_file = {:?}\n\
         redis_cert_file = {:?}\nredis_key_file = {:?}\n\n\
         [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"2s\"\n\n\
         [queues.q]\nhandler = \"noop\"\nmin_slots = 2\n\n\
         [api.keys.shop]\ntoken_sha256 = {:?}\nqueues = [\"q\"]\n",
        server.url(),
        certs.path("ca.crt").display().to_string(),
        certs.path("client.crt").display().to_string(),
        certs.path("client.key").display().to_string(),
        gaffer::api::hash_token(TOKEN),
    );
    std::fs::write(&config, text).unwrap();
    let _daemons = Daemons::manager_and_master(&config, dir.path());
    // The slots connect with the files their master read: the zygote hands them over.
    let client = connect(&server, &options(&certs, "ca.crt", true))
        .await
        .unwrap();
    let q = client.queue("q").unwrap();
    let tasks: Vec<NewTask> = (0..20)
        .map(|i| NewTask::new(format!("{{\"n\":{i}}}")))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    let log = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    eventually(
        Duration::from_secs(60),
        "slots ack every task over TLS",
        || {
            let q = q.clone();
            async move { q.stats().await.is_ok_and(|s| s.acked_total == 20) }
        },
    )
    .await;
    assert!(
        !log("master.log").contains("ERROR"),
        "{}",
        log("master.log")
    );

    // The api, connected with the same files, submits a task the slots then run.
    let cfg = gaffer::config::load(&config).unwrap();
    let mut api = gaffer::api::ApiOptions::new(cfg, server.url());
    api.connect = options(&certs, "ca.crt", true);
    api.listen = Some("127.0.0.1:0".parse().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(gaffer::api::run(api, stop.clone(), Some(tx)));
    let addr = rx.await.expect("the api binds over TLS");
    let (status, body) = crate::api::request(
        addr,
        "POST",
        "/v1/queues/q/tasks",
        Some(TOKEN),
        Some(br#"{"payload":{}}"#),
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
    eventually(Duration::from_secs(60), "slots ack the api's task", || {
        let q = q.clone();
        async move { q.stats().await.is_ok_and(|s| s.acked_total == 21) }
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// The api token of the end-to-end test.
const TOKEN: &str = "tls-test-token-0123456789abcdef";

/// A TLS-only Redis Cluster (clients, bus and replication over TLS) takes a queue's whole
/// round: enqueue, take, ack, and the record the ack wrote, through the cluster client
/// with the CA file.
#[tokio::test]
async fn a_task_goes_round_over_a_tls_cluster() {
    let (url, certs) = shared_tls_cluster();
    let client = QueueClient::connect(url, "tlscluster", &options(certs, "ca.crt", false))
        .await
        .expect("connect to the TLS cluster with the CA file");
    // The nodes serve TLS only: a plain connection gets nowhere.
    let plain = url.replacen("rediss://", "redis://", 1);
    assert!(
        QueueClient::connect(&plain, "tlscluster", &ConnectOptions::default())
            .await
            .is_err(),
        "{plain} answered in plain text"
    );
    // One queue on each node: their hash slots (3784, 7789, 11790) fall in the three
    // ranges `redis-cli --cluster create` gives three masters.
    for name in ["round_d", "round_a", "round_b"] {
        let q = client.queue(name).unwrap();
        q.enqueue(NewTask::new("{\"n\":1}").id("t1")).await.unwrap();
        let batch = q.take(10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(batch.tasks.len(), 1, "{name}");
        q.ack(&batch.tasks).await.unwrap();
        let s = q.stats().await.unwrap();
        assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 1), "{name}");
        let rec = q.record("t1").await.unwrap().expect("the record");
        assert_eq!(rec.state, RecordState::Done, "{name}");
    }
}

/// A TLS cluster whose certificates another CA signed is refused as untrusted, naming
/// the CA file, as a single server is.
#[tokio::test]
async fn a_tls_cluster_signed_by_another_ca_is_not_trusted() {
    let (url, certs) = shared_tls_cluster();
    let err = match QueueClient::connect(url, "tlscluster", &options(certs, "other-ca.crt", false))
        .await
    {
        Ok(_) => panic!("connected to {url} with a CA that signed nothing of it"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(matches!(err, QueueError::Certificate(_)), "{text}");
    assert!(!err.is_transient(), "retrying cannot fix a CA: {text}");
    assert!(text.contains("certificate is not trusted"), "{text}");
    assert!(text.contains("other-ca.crt"), "{text}");
}

/// A manager and a master with its slots against the TLS-only cluster, with only the
/// config's CA file: the slots ack every task.
#[tokio::test]
async fn a_manager_and_a_master_run_tasks_over_a_tls_cluster() {
    let (url, certs) = shared_tls_cluster();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let text = format!(
        "[cluster]\nredis = {url:?}\nnamespace = \"tlse2e\"\nredis_ca_file = {:?}\n\n\
         [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"2s\"\n\n\
         [queues.q]\nhandler = \"noop\"\nmin_slots = 2\n",
        certs.path("ca.crt").display().to_string(),
    );
    std::fs::write(&config, text).unwrap();
    let _daemons = Daemons::manager_and_master(&config, dir.path());
    let client = QueueClient::connect(url, "tlse2e", &options(certs, "ca.crt", false))
        .await
        .unwrap();
    let q = client.queue("q").unwrap();
    let tasks: Vec<NewTask> = (0..20)
        .map(|i| NewTask::new(format!("{{\"n\":{i}}}")))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    let log = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    eventually(
        Duration::from_secs(60),
        "slots ack every task over the TLS cluster",
        || {
            let q = q.clone();
            async move { q.stats().await.is_ok_and(|s| s.acked_total == 20) }
        },
    )
    .await;
    for name in ["manager.log", "master.log"] {
        assert!(!log(name).contains("ERROR"), "{name}: {}", log(name));
    }
}

/// The harness's TLS-only server, which `GAFFER_TEST_TLS=1` gives the queue tests: it
/// answers `rediss://` only, and after a kill and restart (the durability test's) it
/// serves TLS again with what its AOF kept.
#[tokio::test]
async fn the_harness_tls_server_refuses_plain_text_and_restarts_over_tls() {
    let mut redis = TestRedis::with_tls(
        RedisServerOptions {
            appendonly: true,
            ..Default::default()
        },
        TestCerts::generate(),
    );
    assert!(redis.url().starts_with("rediss://"), "{}", redis.url());
    let plain = redis.url().replacen("rediss://", "redis://", 1);
    assert!(
        QueueClient::connect(&plain, "test", &ConnectOptions::default())
            .await
            .is_err(),
        "{plain} answered in plain text"
    );
    let q = redis.client().await.queue("kept").unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    redis.server.kill();
    redis.server.restart().unwrap();
    let s = poll_some(Duration::from_secs(20), "stats after the restart", || {
        let q = q.clone();
        async move { q.stats().await.ok() }
    })
    .await;
    assert_eq!(s.ready, 1);
}
