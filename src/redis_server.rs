//! A local `redis-server` child process: the test harness, the demo and `gaffer up`
//! all need one, and all need the same things from it: a free port, its own directory,
//! optional AOF, readiness before use, and death with its parent.
//!
//! It takes a free port and its own directory, writes AOF when asked, checks readiness
//! before use, runs in its own process group and dies with its parent. For the TLS tests it
//! serves TLS only, its readiness read from its log.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Why a local redis-server could not be started or controlled.
#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    /// The binary is not installed; the message says how to install it.
    #[error(
        "redis-server not found on PATH: install it (Debian/Ubuntu: `apt-get install redis-server`)"
    )]
    NotInstalled,
    /// Spawning or signalling the process failed.
    #[error("redis-server on port {port}: {source}")]
    Io {
        /// Port the server was meant to listen on.
        port: u16,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The process started but never answered PING; its log tail is included.
    #[error("redis-server on port {port} did not become ready within {waited:?}; log tail:\n{log}")]
    NotReady {
        /// Port the server was meant to listen on.
        port: u16,
        /// How long we waited.
        waited: Duration,
        /// The end of its log file.
        log: String,
    },
}

/// How to start a local redis-server.
#[derive(Debug, Clone, Default)]
pub struct RedisServerOptions {
    /// Persist every write with `appendonly yes` and `appendfsync always`.
    pub appendonly: bool,
    /// Start as a Redis Cluster node (`cluster-enabled yes`); slots are assigned by the caller.
    pub cluster_node: bool,
    /// Fixed port; a free one is picked when absent.
    pub port: Option<u16>,
    /// Extra `--key value` settings passed verbatim.
    pub extra: Vec<(String, String)>,
    /// The user and password readiness checks log in with: a server whose ACL disables
    /// the default user answers a bare PING with NOAUTH.
    pub auth: Option<(String, String)>,
    /// Serve TLS only with these files (tests of `rediss://`); readiness is then read
    /// from the log, since a bare PING cannot reach a TLS port.
    pub tls: Option<ServerTls>,
    /// Run as a Sentinel watching this primary instead of as a data server.
    pub sentinel: Option<SentinelOf>,
}

/// What a Sentinel (`redis-server CONF --sentinel`) watches and how fast it acts. Its
/// config file is written once, in its directory: Sentinel rewrites it with what it
/// learns (the current primary, the other sentinels), and a restart reads that back.
#[derive(Debug, Clone)]
pub struct SentinelOf {
    /// The name clients ask for (`redis+sentinel://…/NAME`).
    pub name: String,
    /// The primary's port on 127.0.0.1.
    pub primary_port: u16,
    /// Sentinels that must agree the primary is down before a failover.
    pub quorum: u32,
    /// How long the primary may not answer before a sentinel calls it down.
    pub down_after: Duration,
    /// Sentinel's `failover-timeout`: the pace of a failover and of a retry of one.
    pub failover_timeout: Duration,
}

/// The PEM files of a TLS-only server: `port 0` and `tls-port` on its port (a cluster
/// node's bus and replication over TLS too), a client certificate optional.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// Its certificate.
    pub cert: PathBuf,
    /// The certificate's private key.
    pub key: PathBuf,
    /// The CA that signs the certificates it accepts (a cluster's nodes present theirs).
    pub ca: PathBuf,
}

/// A running redis-server child. Killed (SIGKILL) and reaped on drop; it also dies with
/// its parent through PDEATHSIG, so a crashed test leaves no server behind. PDEATHSIG
/// follows the *thread* that spawned it: start it from a thread that lives as long as
/// the server is needed.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    opts: RedisServerOptions,
}

impl RedisServer {
    /// Starts a server whose data and log live in `dir` (created if missing) and waits
    /// until it answers PING.
    pub fn start(dir: &Path, opts: RedisServerOptions) -> Result<Self, RedisServerError> {
        let port = match opts.port {
            Some(p) => p,
            None => free_port().map_err(|source| RedisServerError::Io { port: 0, source })?,
        };
        std::fs::create_dir_all(dir).map_err(|source| RedisServerError::Io { port, source })?;
        let mut server = RedisServer {
            child: None,
            port,
            dir: dir.to_path_buf(),
            opts,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), RedisServerError> {
        let port = self.port;
        let mut cmd = Command::new("redis-server");
        if let Some(of) = &self.opts.sentinel {
            let conf = self.write_sentinel_conf(of)?;
            cmd.arg(conf).arg("--sentinel");
        }
        cmd.arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg("redis.log")
            .arg("--daemonize")
            .arg("no");
        if self.opts.sentinel.is_none() {
            cmd.args(["--save", ""]);
        }
        if self.opts.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        }
        if self.opts.cluster_node {
            cmd.args(["--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg("nodes.conf")
                .args(["--cluster-node-timeout", "2000"]);
        }
        if let Some(tls) = &self.opts.tls {
            tls_args(&mut cmd, port, tls, self.opts.cluster_node);
        }
        for (k, v) in &self.opts.extra {
            cmd.arg(format!("--{k}")).arg(v);
        }
        let log_start = std::fs::metadata(self.dir.join("redis.log")).map_or(0, |m| m.len());
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C at the terminal reaches the parent alone, which
            // stops the server last, after everything that writes to it.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                RedisServerError::NotInstalled
            } else {
                RedisServerError::Io { port, source }
            }
        })?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(20), log_start)
    }

    /// The Sentinel's config file, written on its first start only (see [`SentinelOf`]).
    fn write_sentinel_conf(&self, of: &SentinelOf) -> Result<PathBuf, RedisServerError> {
        let path = self.dir.join("sentinel.conf");
        if !path.exists() {
            let name = &of.name;
            let text = format!(
                "sentinel monitor {name} 127.0.0.1 {} {}\n\
                 sentinel down-after-milliseconds {name} {}\n\
                 sentinel failover-timeout {name} {}\n\
                 sentinel parallel-syncs {name} 1\n",
                of.primary_port,
                of.quorum,
                of.down_after.as_millis(),
                of.failover_timeout.as_millis(),
            );
            std::fs::write(&path, text).map_err(|source| RedisServerError::Io {
                port: self.port,
                source,
            })?;
        }
        Ok(path)
    }

    /// Waits until it answers PING, or (TLS) until its log, past `log_start` (where this
    /// start's lines begin), says it is ready.
    fn wait_ready(&mut self, limit: Duration, log_start: u64) -> Result<(), RedisServerError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        while start.elapsed() < limit {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                break; // exited early: report with its log
            }
            let ready = match self.opts.tls {
                Some(_) => self.log_says_ready(log_start),
                None => ping(self.port, self.opts.auth.as_ref()),
            };
            if ready {
                return Ok(());
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
        Err(RedisServerError::NotReady {
            port: self.port,
            waited: start.elapsed(),
            log: self.log_tail(20),
        })
    }

    /// The options the next [`restart`](Self::restart) uses: a test changes them to
    /// start the server as its operator would after a change (a replica's `replicaof`
    /// dropped once it was promoted, say).
    pub fn options_mut(&mut self) -> &mut RedisServerOptions {
        &mut self.opts
    }

    /// The port it listens on (loopback).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0` (`rediss://` when it serves TLS).
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// Whether the log, from byte `from` on, has the line Redis writes once it serves.
    fn log_says_ready(&self, from: u64) -> bool {
        let text = std::fs::read(self.dir.join("redis.log")).unwrap_or_default();
        let start = (from as usize).min(text.len());
        String::from_utf8_lossy(&text[start..]).contains("Ready to accept connections")
    }

    /// Its data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends a signal (SIGSTOP, SIGCONT, …) to the server.
    pub fn signal(&self, sig: Signal) -> Result<(), RedisServerError> {
        let pid = self.pid().ok_or(RedisServerError::Io {
            port: self.port,
            source: std::io::Error::other("not running"),
        })?;
        kill(Pid::from_raw(pid as i32), sig).map_err(|e| RedisServerError::Io {
            port: self.port,
            source: e.into(),
        })
    }

    /// SIGTERM (Redis then flushes its AOF and exits), SIGKILL if it is still running
    /// after `grace`; reaped either way.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL and reap: the abrupt death that persistence tests need.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory (after `kill`), so AOF is replayed.
    pub fn restart(&mut self) -> Result<(), RedisServerError> {
        self.kill();
        self.spawn()
    }

    /// The last `lines` lines of its log file, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The arguments of a TLS-only server on `port` (see [`ServerTls`]).
fn tls_args(cmd: &mut Command, port: u16, tls: &ServerTls, cluster_node: bool) {
    cmd.args(["--port", "0"])
        .arg("--tls-port")
        .arg(port.to_string())
        .arg("--tls-cert-file")
        .arg(&tls.cert)
        .arg("--tls-key-file")
        .arg(&tls.key)
        .arg("--tls-ca-cert-file")
        .arg(&tls.ca)
        .args(["--tls-auth-clients", "optional"]);
    if cluster_node {
        cmd.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
    }
}

/// A port that was free a moment ago. Redis Cluster also needs port + 10000 for its bus,
/// so ports are kept below 55000.
pub fn free_port() -> std::io::Result<u16> {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if port < 55000 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::other("no free port below 55000"))
}

/// True when a server on `port` answers PING with PONG (not LOADING or an error), after
/// logging in as `auth` when given.
fn ping(port: u16, auth: Option<&(String, String)>) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut request = Vec::new();
    let mut replies = 1;
    if let Some((user, password)) = auth {
        request.extend(resp(&["AUTH", user, password]));
        replies += 1;
    }
    request.extend(resp(&["PING"]));
    if s.write_all(&request).is_err() {
        return false;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.windows(2).filter(|w| w == b"\r\n").count() < replies {
        match s.read(&mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    let text = String::from_utf8_lossy(&got);
    text.lines().all(|l| l.starts_with('+')) && text.lines().last() == Some("+PONG")
}

/// A command in RESP, so a password with spaces or quotes goes through as it is.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend(a.as_bytes());
        out.extend(b"\r\n");
    }
    out
}
