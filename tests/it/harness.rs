//! Throwaway Redis servers and clusters for tests, killed on drop.

use std::time::{Duration, Instant};

use gaffer::queue_client::{ConnectOptions, PemFile, PemKind, Queue, QueueClient, TlsFiles};
use gaffer::redis_server::{RedisServer, RedisServerOptions, ServerTls};

/// One redis-server in its own temp dir.
pub struct TestRedis {
    pub server: RedisServer,
    _dir: tempfile::TempDir,
    /// The certificates of a TLS-only server ([`TestRedis::with_tls`]).
    certs: Option<TestCerts>,
}

impl TestRedis {
    /// A plain server; TLS-only under `GAFFER_TEST_TLS=1` (see [`tls_mode`]).
    pub fn start() -> Self {
        Self::plain_or_tls(RedisServerOptions::default())
    }

    /// With `appendonly yes` and `appendfsync always`; TLS-only under `GAFFER_TEST_TLS=1`.
    pub fn with_aof() -> Self {
        Self::plain_or_tls(RedisServerOptions {
            appendonly: true,
            ..Default::default()
        })
    }

    pub fn with(opts: RedisServerOptions) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = RedisServer::start(dir.path(), opts).expect("start redis-server");
        TestRedis {
            server,
            _dir: dir,
            certs: None,
        }
    }

    /// A TLS-only server (`rediss://`) with the server certificate of `certs`; its
    /// [`client`](Self::client) and [`raw`](Self::raw) trust their CA.
    pub fn with_tls(opts: RedisServerOptions, certs: TestCerts) -> Self {
        let mut redis = Self::with(RedisServerOptions {
            tls: Some(certs.server_tls()),
            ..opts
        });
        redis.certs = Some(certs);
        redis
    }

    fn plain_or_tls(opts: RedisServerOptions) -> Self {
        if tls_mode() {
            Self::with_tls(opts, TestCerts::generate())
        } else {
            Self::with(opts)
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Connect options for this server: its CA when it serves TLS.
    pub fn options(&self) -> ConnectOptions {
        self.certs
            .as_ref()
            .map_or_else(ConnectOptions::default, TestCerts::trusting_ca)
    }

    pub async fn client(&self) -> QueueClient {
        QueueClient::connect(&self.url(), "test", &self.options())
            .await
            .expect("connect")
    }

    /// A raw connection for inspecting the server (INFO, CONFIG, …).
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        let client = match &self.certs {
            Some(certs) => redis::Client::build_with_tls(self.url(), certs.redis_certificates()),
            None => redis::Client::open(self.url()),
        };
        client
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Total commands the server has processed.
    pub async fn commands_processed(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_commands_processed in INFO")
    }
}

/// A Redis Cluster of three masters (no replicas), each in its own temp dir.
pub struct TestCluster {
    pub nodes: Vec<TestRedis>,
}

impl TestCluster {
    pub fn start() -> Self {
        Self::start_nodes(None, 0)
    }

    /// Three masters, each with one replica (six nodes), up once every node says so;
    /// whether each replica has synced yet is for the test to wait on.
    pub fn start_with_replicas() -> Self {
        Self::start_nodes(None, 1)
    }

    /// A cluster whose nodes serve TLS only, clients and cluster bus alike, with the
    /// server certificate of `certs`.
    pub fn start_tls(certs: &TestCerts) -> Self {
        Self::start_nodes(Some(certs), 0)
    }

    fn start_nodes(tls: Option<&TestCerts>, replicas: usize) -> Self {
        let nodes: Vec<TestRedis> = (0..3 * (1 + replicas))
            .map(|_| {
                TestRedis::with(RedisServerOptions {
                    cluster_node: true,
                    tls: tls.map(TestCerts::server_tls),
                    ..Default::default()
                })
            })
            .collect();
        let mut cmd = std::process::Command::new("redis-cli");
        redis_cli_tls(&mut cmd, tls);
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.server.port()));
        }
        cmd.arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes");
        let out = cmd.output().expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Every node must agree the cluster is up before clients route by slot.
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &nodes {
            loop {
                let mut cli = std::process::Command::new("redis-cli");
                redis_cli_tls(&mut cli, tls);
                let out = cli
                    .args(["-p", &n.server.port().to_string(), "cluster", "info"])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster never reached state ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        TestCluster { nodes }
    }
}

/// `redis-cli`'s TLS flags with the CA of `certs`, when there are certificates.
fn redis_cli_tls(cmd: &mut std::process::Command, tls: Option<&TestCerts>) {
    if let Some(certs) = tls {
        cmd.arg("--tls").arg("--cacert").arg(certs.path("ca.crt"));
    }
}

/// Whether the queue tests' servers serve TLS only: `GAFFER_TEST_TLS=1` makes
/// [`TestRedis::start`] and [`TestRedis::with_aof`] TLS-only servers and
/// [`shared_cluster_client`] a client of a TLS-only cluster, each with certificates the
/// harness makes (`.ci/run` runs the queue and record tests so).
/// Calls of gaffer's Lua (`FCALL` and `FCALL_RO`, a call that found its function missing
/// included) the server behind `conn` has run since its start.
pub async fn script_calls<C: redis::aio::ConnectionLike + Send>(mut conn: C) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_fcall_ro:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

pub fn tls_mode() -> bool {
    std::env::var("GAFFER_TEST_TLS").is_ok_and(|v| v == "1")
}

/// Polls `cond` until it holds or `limit` passes; the test fails with `what` otherwise.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(5);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// What a slot run in-process by a test starts from: slot number `slot` of `queue` on
/// `redis`, reporting on `report`, outside any master (no fork line).
pub fn slot_spec(
    redis: &TestRedis,
    queue: gaffer::config::QueueConfig,
    slot: u32,
    report: std::os::unix::net::UnixDatagram,
) -> gaffer::slot::SlotSpec {
    slot_spec_at(&redis.url(), queue, slot, report)
}

/// [`slot_spec`] for the Redis (one server or a cluster) at `url`.
pub fn slot_spec_at(
    url: &str,
    queue: gaffer::config::QueueConfig,
    slot: u32,
    report: std::os::unix::net::UnixDatagram,
) -> gaffer::slot::SlotSpec {
    gaffer::slot::SlotSpec {
        queue,
        slot,
        redis_url: url.to_string(),
        namespace: "test".into(),
        connect: ConnectOptions::default(),
        report: Some(report),
        host: "test-host".into(),
        chains: Default::default(),
        fork_line: None,
    }
}

/// A unique queue name per test, so tests sharing a server never see each other's tasks.
pub fn queue(client: &QueueClient, name: &str) -> Queue {
    client.queue(name).unwrap()
}

/// A cluster shared by every cluster test of this process (creating one takes seconds).
/// Started from a thread that never exits, because PDEATHSIG follows the spawning thread.
/// Under `GAFFER_TEST_TLS=1`, the shared TLS-only cluster ([`shared_tls_cluster`]).
pub async fn shared_cluster_client() -> QueueClient {
    if tls_mode() {
        let (url, certs) = shared_tls_cluster();
        return QueueClient::connect(url, "test", &certs.trusting_ca())
            .await
            .expect("connect to the TLS cluster");
    }
    QueueClient::connect(&shared_cluster_url(), "test", &ConnectOptions::default())
        .await
        .expect("connect to cluster")
}

/// A TLS-only cluster shared by the tests of this process that want one (started like
/// [`shared_cluster_url`]'s): the URL of one node and the certificates it serves with.
pub fn shared_tls_cluster() -> &'static (String, TestCerts) {
    static CLUSTER: std::sync::OnceLock<(String, TestCerts)> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let certs = TestCerts::generate();
            let cluster = TestCluster::start_tls(&certs);
            tx.send((cluster.nodes[0].url(), certs)).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("TLS cluster thread")
    })
}

/// The URL of one node of the shared cluster (see [`shared_cluster_client`]).
pub fn shared_cluster_url() -> String {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let cluster = TestCluster::start();
            tx.send(cluster.nodes[0].url()).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("cluster thread")
    })
    .clone()
}

/// Polls `f` until it yields a value or `limit` passes; the test fails with `what` otherwise.
pub async fn poll_some<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Settle ops for a taken batch: task `id` retried at once (reason "again"), every other
/// one acked.
pub fn retry_one_ack_rest(
    tasks: &[gaffer::queue_client::LeasedTask],
    id: &str,
) -> Vec<gaffer::queue_client::SettleOp> {
    use gaffer::queue_client::{Settle, SettleOp};
    tasks
        .iter()
        .map(|t| {
            let action = if t.id == id {
                Settle::Retry {
                    delay: Duration::ZERO,
                    priority: None,
                    reason: "again".into(),
                }
            } else {
                Settle::Ack
            };
            SettleOp::new(t, action)
        })
        .collect()
}

/// Fails every task of a batch with the reason `why(id)`, asserting each settle applied.
pub async fn fail_all(
    q: &gaffer::queue_client::Queue,
    tasks: &[gaffer::queue_client::LeasedTask],
    why: impl Fn(&str) -> String,
) {
    use gaffer::queue_client::{Settle, SettleOp, SettleResult};
    let ops: Vec<_> = tasks
        .iter()
        .map(|t| SettleOp::new(t, Settle::Fail { reason: why(&t.id) }))
        .collect();
    let results = q.settle(&ops).await.unwrap();
    assert!(
        results.iter().all(|r| *r == SettleResult::Done),
        "{results:?}"
    );
}

/// Runs each case (an `async fn(QueueClient, &str)`) against a fresh single server and
/// against the shared cluster: the queue's contract holds on both.
macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod single {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let redis = crate::harness::TestRedis::start();
                    super::$case(redis.client().await, stringify!($case)).await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let client = crate::harness::shared_cluster_client().await;
                    super::$case(client, concat!("cluster_", stringify!($case))).await;
                }
            )*
        }
    };
}
pub(crate) use on_both;

/// Masters in tests take slots whatever the machine's load: under a parallel test run the
/// load average of a 2-core machine passes the default ceiling (4 per CPU), and a master
/// then takes no slots at all, which no test means to check.
pub const ANY_LOAD: (&str, &str) = ("GAFFER_MAX_LOAD_PER_CPU", "1000");

/// Certificates for TLS tests, made with the `openssl` CLI in a temp dir: a CA, a server
/// certificate for 127.0.0.1/localhost signed by it, the same signed with validity in the
/// past, a client certificate signed by it, and a second CA that signed nothing used here.
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let certs = TestCerts { dir };
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=gaffer test ca",
        ]);
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "other-ca.key",
            "-out",
            "other-ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=gaffer other ca",
        ]);
        certs.write("server.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
        certs.write("client.ext", "extendedKeyUsage=clientAuth\n");
        // `openssl ca` rather than `x509 -req`: only it sets a start date in the past, which
        // an expired certificate needs (notAfter before notBefore would be malformed).
        certs.write(
            "ca.cnf",
            "[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nnew_certs_dir = .\n\
             serial = serial\ndefault_md = sha256\npolicy = any\n[any]\ncommonName = supplied\n",
        );
        certs.write("index.txt", "");
        certs.write("serial", "01\n");
        for (name, cn) in [("server", "localhost"), ("client", "gaffer client")] {
            certs.openssl(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ]);
        }
        certs.sign("server", "server.crt", &["-days", "1"]);
        certs.sign("client", "client.crt", &["-days", "1"]);
        certs.sign(
            "server",
            "expired.crt",
            &[
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
            ],
        );
        certs
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// What a TLS-only server of the harness serves with: server.crt, its key, the CA.
    pub fn server_tls(&self) -> ServerTls {
        ServerTls {
            cert: self.path("server.crt"),
            key: self.path("server.key"),
            ca: self.path("ca.crt"),
        }
    }

    /// Connect options that trust the CA (ca.crt), without a client certificate.
    pub fn trusting_ca(&self) -> ConnectOptions {
        let ca = PemFile::read(&self.path("ca.crt"), PemKind::Certificates).expect("read ca.crt");
        ConnectOptions {
            tls: Some(TlsFiles {
                ca: Some(ca),
                client: None,
            }),
            ..ConnectOptions::default()
        }
    }

    /// The CA as the redis crate takes it, for raw connections.
    pub fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(self.path("ca.crt")).expect("read ca.crt")),
        }
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).expect("write cert helper file");
    }

    fn sign(&self, csr: &str, out: &str, validity: &[&str]) {
        let ext = if csr == "client" {
            "client.ext"
        } else {
            "server.ext"
        };
        let mut args = vec![
            "ca", "-batch", "-notext", "-config", "ca.cnf", "-cert", "ca.crt", "-keyfile",
            "ca.key", "-extfile", ext, "-out", out,
        ];
        let input = format!("{csr}.csr");
        args.extend(["-in", input.as_str()]);
        args.extend(validity);
        // The CA's database refuses a second certificate for the same subject.
        self.write("index.txt", "");
        self.openssl(&args);
    }

    fn openssl(&self, args: &[&str]) {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A TLS-only redis-server (`--port 0`), with a server certificate of [`TestCerts`] and
/// their CA for client certificates. Killed on drop.
pub struct TlsRedis {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// Whether a [`TlsRedis`] demands a client certificate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    Optional,
    Required,
}

impl TlsRedis {
    /// Serves with `cert` (a file of `certs`, keyed by server.key).
    pub fn start(certs: &TestCerts, cert: &str, auth: ClientAuth) -> Self {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let port = gaffer::redis_server::free_port().expect("free port");
        let auth_clients = match auth {
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "yes",
        };
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--daemonize",
            "no",
        ])
        .arg("--tls-port")
        .arg(port.to_string())
        .arg("--tls-cert-file")
        .arg(certs.path(cert))
        .arg("--tls-key-file")
        .arg(certs.path("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(certs.path("ca.crt"))
        .args(["--tls-auth-clients", auth_clients])
        .arg("--dir")
        .arg(dir.path())
        .args(["--logfile", "redis.log"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().expect("start redis-server");
        let server = TlsRedis { child, port, dir };
        server.wait_ready();
        server
    }

    /// Waits for the log's ready line: a plain PING cannot reach a TLS-only port.
    fn wait_ready(&self) {
        let log = self.dir.path().join("redis.log");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Ready to accept connections") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "TLS redis-server not ready:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `rediss://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The user a test's [`AclRedis`] gives every right, to set the scene and to read the ACL
/// log; the role under test never uses it.
const ACL_ADMIN: (&str, &str) = ("gaffer-test-admin", "admin-pw-0123456789");

/// The ACL line of `role` (`user gaffer-ROLE …`) as docs/SECURITY.md gives it, so the
/// tests check the very line operators copy.
pub fn acl_line(role: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/SECURITY.md");
    let text = std::fs::read_to_string(&path).expect("read docs/SECURITY.md");
    let prefix = format!("user gaffer-{role} ");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("docs/SECURITY.md gives no ACL line for {role}"))
        .to_string()
}

/// A redis-server whose ACL file disables the default user and holds one role's user as
/// docs/SECURITY.md gives it (its `>PASSWORD` replaced), plus [`ACL_ADMIN`] for the test.
pub struct AclRedis {
    pub redis: TestRedis,
    /// The role's user name (`gaffer-ROLE`).
    pub user: String,
    /// The role's password.
    pub password: String,
    password_file: std::path::PathBuf,
    _files: tempfile::TempDir,
}

impl AclRedis {
    pub fn start(role: &str) -> Self {
        Self::start_with(role, |line| line)
    }

    /// Like [`start`](Self::start), with the role's line as `edit` makes it: an older or
    /// narrower ACL than the documented one.
    pub fn start_with(role: &str, edit: impl FnOnce(String) -> String) -> Self {
        let files = tempfile::tempdir().expect("temp dir");
        let user = format!("gaffer-{role}");
        let password = format!("{role}-pw-s3cret-0123456789");
        let line = edit(acl_line(role));
        assert!(line.contains(" >PASSWORD "), "{line}");
        let acl = format!(
            "user default off\nuser {} on >{} ~* &* +@all\n{}\n",
            ACL_ADMIN.0,
            ACL_ADMIN.1,
            line.replace(" >PASSWORD ", &format!(" >{password} ")),
        );
        let acl_file = files.path().join("users.acl");
        std::fs::write(&acl_file, acl).expect("write the acl file");
        let password_file = files.path().join("redis-password");
        std::fs::write(&password_file, format!("{password}\n")).expect("write the password");
        let redis = TestRedis::with(RedisServerOptions {
            extra: vec![("aclfile".into(), acl_file.display().to_string())],
            auth: Some((ACL_ADMIN.0.into(), ACL_ADMIN.1.into())),
            ..Default::default()
        });
        AclRedis {
            redis,
            user,
            password,
            password_file,
            _files: files,
        }
    }

    /// The role's URL: its user name, no password (that comes from [`Self::password_file`]).
    pub fn url(&self) -> String {
        format!(
            "redis://{}@127.0.0.1:{}/0",
            self.user,
            self.redis.server.port()
        )
    }

    /// A file holding the role's password, for `[cluster].redis_password_file`.
    pub fn password_file(&self) -> &std::path::Path {
        &self.password_file
    }

    /// Connect options with the role's password.
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions {
            password: Some(self.password.clone()),
            ..ConnectOptions::default()
        }
    }

    fn admin_url(&self) -> String {
        format!(
            "redis://{}:{}@127.0.0.1:{}/0",
            ACL_ADMIN.0,
            ACL_ADMIN.1,
            self.redis.server.port()
        )
    }

    /// A queue client of the test's admin user, namespace `gaffer`, to set the scene.
    pub async fn admin_client(&self) -> QueueClient {
        QueueClient::connect(&self.admin_url(), "gaffer", &ConnectOptions::default())
            .await
            .expect("connect as the test's admin")
    }

    /// A raw connection of the test's admin user, to look at keys as they are stored.
    pub async fn admin_raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.admin_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect as the test's admin")
    }

    /// What Redis refused so far, one line per `ACL LOG` entry in the words of its
    /// `NOPERM` error.
    pub async fn refusals(&self) -> Vec<String> {
        let mut conn = redis::Client::open(self.admin_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect as the test's admin");
        let entries: Vec<Vec<redis::Value>> = redis::cmd("ACL")
            .arg("LOG")
            .query_async(&mut conn)
            .await
            .expect("ACL LOG");
        entries.iter().map(|e| refusal_text(e)).collect()
    }

    /// Forgets the refusals so far (`ACL LOG RESET`), once a test has checked them.
    pub async fn forget_refusals(&self) {
        let mut conn = redis::Client::open(self.admin_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect as the test's admin");
        let () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query_async(&mut conn)
            .await
            .expect("ACL LOG RESET");
    }

    /// Fails the test with Redis's NOPERM words if anything was refused.
    pub async fn assert_nothing_refused(&self) {
        let refused = self.refusals().await;
        assert!(refused.is_empty(), "{}", refused.join("\n"));
    }

    /// Polls `cond` like [`eventually`], failing at once with the NOPERM words of any
    /// refusal: a daemon that retries a refused command would otherwise only time out.
    pub async fn eventually<F, Fut>(&self, limit: Duration, what: &str, mut cond: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(5);
        loop {
            self.assert_nothing_refused().await;
            if cond().await {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

/// One `ACL LOG` entry as Redis words the refusal to the client.
fn refusal_text(entry: &[redis::Value]) -> String {
    let mut fields = std::collections::HashMap::new();
    for pair in entry.chunks(2) {
        if let [k, v] = pair {
            let s = |v: &redis::Value| match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Value::SimpleString(s) => s.clone(),
                redis::Value::Int(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            fields.insert(s(k), s(v));
        }
    }
    let get = |k: &str| fields.get(k).cloned().unwrap_or_default();
    let what = match get("reason").as_str() {
        "command" => format!("to run the '{}' command", get("object")),
        "key" => format!("to access the '{}' key", get("object")),
        "channel" => format!("to access the '{}' channel", get("object")),
        other => format!("({other}) {}", get("object")),
    };
    format!(
        "NOPERM User {} has no permissions {what} (context {}, {} times)",
        get("username"),
        get("context"),
        get("count")
    )
}

/// `gaffer --config CONFIG ARGS`: its stdout, failing the test (with stderr) on a non-zero
/// exit.
pub fn gaffer_ok(config: &std::path::Path, args: &[&str]) -> String {
    gaffer_ok_with_stderr(config, args).0
}

/// [`gaffer_ok`], with what the command said on stderr (progress, warnings) too.
pub fn gaffer_ok_with_stderr(config: &std::path::Path, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits for the slot a test hook holds after its follow-ups
/// (`GAFFER_TEST_PAUSE_AFTER_FOLLOW_UPS` or `…_HOLD_…`, whose file `path` it writes its pid
/// to); returns that pid as written.
pub(crate) async fn held_after_follow_ups(path: &std::path::Path) -> String {
    poll_some(
        Duration::from_secs(30),
        "the slot held after its follow-ups",
        || async { std::fs::read_to_string(path).ok().filter(|p| !p.is_empty()) },
    )
    .await
}

/// The ids the global task of record `rec` gives its first `n` follow-ups: `CHAIN~N`,
/// from the chain's id its record names.
pub async fn kid_ids(
    _client: &gaffer::queue_client::QueueClient,
    _q: &gaffer::queue_client::Queue,
    rec: &gaffer::queue_client::TaskRecord,
    n: usize,
) -> Vec<String> {
    let chain = rec
        .chain
        .clone()
        .expect("a route queue's task names its chain");
    (1..=n).map(|i| format!("{chain}~{i}")).collect()
}

/// Child processes killed and reaped when dropped, so a test that fails leaves none behind.
pub struct Killed(pub Vec<std::process::Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
