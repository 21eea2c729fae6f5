//! `gaffer up`: the whole cluster on one host. A local redis-server child (unless the
//! config or `--redis` names one), then `gaffer manager`, `gaffer master` and `gaffer
//! api` as child processes of the same binary, their logs prefixed on our stderr;
//! optionally a demo load that moves slots between the queues. The api gets an admin key
//! whose token `up` makes once and keeps in the state directory (printed at start, for
//! the demo). Ctrl-C stops the api, drains the master, stops the manager, then Redis, and
//! leaves no process behind.
//!
//! The roles run as separate processes, exactly as in production: the master's zygote
//! must be forked from a single-threaded process, and a crash of one role must not take
//! the others down. Every child is in its own process group, so a terminal's Ctrl-C
//! reaches only this process, which stops the others in order (writers before Redis);
//! each also dies with this process (PDEATHSIG) if it is killed outright.
//!
//! Its children's logs are prefixed and they are restarted with back-off; a deliberate
//! second Ctrl-C (from the `Interrupts` the binary's edge hands it) kills them. It installs
//! no signal handler of its own, races its demo load against Ctrl-C, and writes the state
//! file other commands find its Redis by.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::{Config, Handler};
use crate::queue_client::{ConnectOptions, NewTask, QueueClient, QueueLimits};
use crate::redis_server::{RedisServer, RedisServerOptions};

/// A child that exits this soon after its first start failed to start (a port in use, a
/// wrong password; an unreachable Redis it waits for): `up` stops with its log rather than
/// restarting it forever.
const STARTUP_WINDOW: Duration = Duration::from_secs(5);
/// Restarts after a later crash back off from 1 s, doubling, up to 30 s.
const RESTART_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// How long Redis may take to flush its AOF and exit once everything else has stopped.
const REDIS_STOP: Duration = Duration::from_secs(10);
/// The file in the state directory that tells other commands where `up`'s Redis is.
const STATE_FILE: &str = "up.json";
/// The demo's admin token for the api, kept between runs (mode 0600).
const TOKEN_FILE: &str = "api-token";

/// Everything `gaffer up` needs; built by the CLI.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The config file, handed on to the roles.
    pub config_path: PathBuf,
    /// The validated config.
    pub config: Config,
    /// Redis to use instead of starting one (`--redis` or `[cluster].redis`).
    pub redis: Option<String>,
    /// Password and timeouts for Redis.
    pub connect: ConnectOptions,
    /// Where the local Redis keeps its data and `up` its state file.
    pub state_dir: PathBuf,
    /// Push a built-in, wave-shaped load to every queue.
    pub demo_load: bool,
    /// This binary, to start the roles with.
    pub exe: PathBuf,
    /// Arguments every role gets before its own (e.g. `--log-format json`).
    pub role_args: Vec<String>,
}

/// What a running `up` leaves in its state directory for other commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpState {
    /// The `up` process.
    pub pid: u32,
    /// The Redis it started (or was given).
    pub redis: String,
}

/// The Redis URL of a `gaffer up` running with state directory `dir`, if one runs.
pub fn running_redis(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    let state: UpState = serde_json::from_str(&text).ok()?;
    let alive = kill(Pid::from_raw(i32::try_from(state.pid).ok()?), None).is_ok();
    alive.then_some(state.redis)
}

/// The state directory when none is given: `.gaffer` beside the config file.
pub fn default_state_dir(config_path: &Path) -> PathBuf {
    let parent = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    parent.join(".gaffer")
}

/// One role run as a child process.
struct Role {
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    child: Option<Child>,
    started: Instant,
    starts: u32,
    backoff: Backoff,
    restart_at: Option<Instant>,
}

/// Runs the cluster until `shutdown` is cancelled (the edge cancels it on Ctrl-C or
/// SIGTERM); returns once every child is gone. A deliberate press in `interrupts` while
/// the roles stop kills them instead of waiting.
///
/// Must run on a current-thread runtime on a thread that outlives it: the children's
/// PDEATHSIG follows the thread that started them.
pub async fn run(
    opts: UpOptions,
    shutdown: CancellationToken,
    interrupts: Interrupts,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("creating the state directory {}", opts.state_dir.display()))?;
    let _lock = lock_state_dir(&opts.state_dir)?;

    let mut redis_server = None;
    let redis_url = match &opts.redis {
        Some(url) => url.clone(),
        None => {
            let dir = opts.state_dir.join("redis");
            // Blocking, on the runtime's one thread: nothing else runs yet, and the server's
            // PDEATHSIG is tied to this thread, which lives as long as `up`.
            let server = RedisServer::start(
                &dir,
                RedisServerOptions {
                    appendonly: true,
                    ..RedisServerOptions::default()
                },
            )
            .context("starting a local redis-server")?;
            let url = server.url();
            eprintln!(
                "gaffer up: redis-server at {url} (data in {})",
                dir.display()
            );
            redis_server = Some(server);
            url
        }
    };
    let state_file = opts.state_dir.join(STATE_FILE);
    let state = UpState {
        pid: std::process::id(),
        redis: redis_url.clone(),
    };
    // (mode 0600: the URL may hold a password)
    write_private(&state_file, serde_json::to_string(&state)?.as_bytes())
        .with_context(|| format!("writing {}", state_file.display()))?;

    let result = supervise(&opts, &redis_url, shutdown, interrupts).await;

    if let Some(mut server) = redis_server {
        eprintln!("gaffer up: stopping redis-server");
        server.stop(REDIS_STOP);
    }
    let _ = std::fs::remove_file(&state_file);
    eprintln!("gaffer up: stopped");
    result
}

/// The demo's admin token: the one kept in the state directory, or a new one written
/// there (readable by its owner only), so a restarted `up` keeps the same token.
fn demo_token(state_dir: &Path) -> anyhow::Result<String> {
    let path = state_dir.join(TOKEN_FILE);
    if let Ok(t) = std::fs::read_to_string(&path)
        && !t.trim().is_empty()
    {
        return Ok(t.trim().to_string());
    }
    let token = crate::api::new_token().context("making an api token")?;
    write_private(&path, token.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(token)
}

/// Writes a file only its owner may read (a file written before with a wider mode is
/// narrowed too).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    std::io::Write::write_all(&mut file, bytes)
}

/// Where the api child listens: `GAFFER_API_LISTEN` when set (as the child reads it),
/// else the config's.
fn api_listen(opts: &UpOptions) -> String {
    std::env::var("GAFFER_API_LISTEN").unwrap_or_else(|_| opts.config.api.listen.to_string())
}

/// One `up` per state directory: a second would start a second Redis on the same files.
fn lock_state_dir(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = dir.join("up.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        anyhow::anyhow!(
            "another `gaffer up` is running with state directory {} (stop it, or give --state-dir)",
            dir.display()
        )
    })
}

/// What `up` reads as Ctrl-C presses once it stops its roles: a deliberate one kills the
/// role it waits for. The first press (or SIGTERM) reaches `up` as its shutdown token; the
/// edge installs the handler behind both, and hands a stream that sees every press, the
/// first among them, which falls within the half second a press must wait to count.
pub struct Interrupts(Option<tokio::signal::unix::Signal>);

impl Interrupts {
    /// Presses of a SIGINT stream the edge installed.
    pub fn from_signal(signal: tokio::signal::unix::Signal) -> Self {
        Interrupts(Some(signal))
    }

    /// No presses ever: roles are stopped gracefully, killed only after their limits (an
    /// in-process caller with only a token).
    pub fn none() -> Self {
        Interrupts(None)
    }

    /// The next press, or never.
    async fn next(&mut self) {
        match &mut self.0 {
            Some(signal) => {
                if signal.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// The three roles `up` runs.
struct Roles {
    manager: Role,
    master: Role,
    api: Role,
}

/// Starts the roles, the demo load if asked, runs them until `shutdown` or a role that
/// must not be restarted, then stops them in order.
async fn supervise(
    opts: &UpOptions,
    redis_url: &str,
    shutdown: CancellationToken,
    interrupts: Interrupts,
) -> anyhow::Result<()> {
    let mut roles = start_roles(opts, redis_url)?;
    let demo = start_demo(opts, redis_url).await?;
    let failure = run_roles(opts, redis_url, &mut roles, demo, shutdown).await?;
    stop_roles(opts, roles, interrupts).await;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Starts manager, master and api (the api with the demo's admin key), and says where
/// they are.
fn start_roles(opts: &UpOptions, redis_url: &str) -> anyhow::Result<Roles> {
    let token = demo_token(&opts.state_dir)?;
    let mut api = Role::new("api", vec!["api".into()]);
    api.env
        .push(("GAFFER_API_ADMIN_SHA256", crate::api::hash_token(&token)));
    let mut roles = Roles {
        manager: Role::new("manager", vec!["manager".into()]),
        master: Role::new("master", vec!["master".into()]),
        api,
    };
    for role in [&mut roles.manager, &mut roles.master, &mut roles.api] {
        role.start(opts, redis_url)?;
    }
    eprintln!(
        "gaffer up: manager on http://{} , master on http://{} ; watch with `gaffer top`, \
         stop with Ctrl-C",
        opts.config.manager.http, opts.config.master.http
    );
    eprintln!(
        "gaffer up: task service on http://{} ; admin token for this demo: {token} (kept in {})",
        api_listen(opts),
        opts.state_dir.join(TOKEN_FILE).display()
    );
    if opts.config.api.console.is_some() {
        eprintln!(
            "gaffer up: web console on http://{}/ui/ ; log in with the token",
            api_listen(opts)
        );
    }
    Ok(roles)
}

/// The demo load, when `--demo-load` asks for it.
async fn start_demo(opts: &UpOptions, redis_url: &str) -> anyhow::Result<Option<DemoLoad>> {
    if !opts.demo_load {
        return Ok(None);
    }
    let client = QueueClient::connect(redis_url, &opts.config.cluster.namespace, &opts.connect)
        .await
        .context("connecting the demo load")?;
    eprintln!("gaffer up: demo load on, a wave per queue, 2 minutes a period");
    Ok(Some(DemoLoad::new(client, &opts.config)))
}

/// Runs the roles, restarting them with back-off, and the demo load, until `shutdown`
/// (`None`) or a role that failed at start-up (`Some`, the error `up` ends with).
async fn run_roles(
    opts: &UpOptions,
    redis_url: &str,
    roles: &mut Roles,
    mut demo: Option<DemoLoad>,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<anyhow::Error>> {
    let mut demo_tick = tokio::time::interval(Duration::from_secs(1));
    demo_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let Roles {
        manager,
        master,
        api,
    } = roles;
    loop {
        let restart_at = [manager.restart_at, master.restart_at, api.restart_at]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            status = wait(&mut manager.child) => {
                if let Some(e) = manager.exited(status) { return Ok(Some(e)) }
            }
            status = wait(&mut master.child) => {
                if let Some(e) = master.exited(status) { return Ok(Some(e)) }
            }
            status = wait(&mut api.child) => {
                if let Some(e) = api.exited(status) { return Ok(Some(e)) }
            }
            () = sleep_until(restart_at) => {
                for role in [&mut *manager, &mut *master, &mut *api] {
                    if role.restart_at.is_some_and(|at| at <= Instant::now()) {
                        role.start(opts, redis_url)?;
                    }
                }
            }
            _ = demo_tick.tick(), if demo.is_some() => {
                if let Some(d) = demo.as_mut() {
                    // A tick waits on Redis (an outage: seconds per call); Ctrl-C must not
                    // wait for it. Dropping it half done only pushes less demo load.
                    tokio::select! {
                        () = d.tick() => {}
                        () = shutdown.cancelled() => return Ok(None),
                    }
                }
            }
        }
    }
}

/// Stops the roles in order: the api stops taking requests first; the master drains
/// next, and the manager keeps deciding until then, so nothing is placed on a host that
/// is leaving without the map saying so.
async fn stop_roles(opts: &UpOptions, roles: Roles, mut interrupts: Interrupts) {
    let drain = opts.config.master.drain_timeout;
    eprintln!(
        "gaffer up: stopping: the master drains its slots (up to drain_timeout {}), \
         Ctrl-C again to kill",
        humantime::format_duration(drain)
    );
    let Roles {
        mut manager,
        mut master,
        mut api,
    } = roles;
    let mut stopper = Stopper {
        interrupts: &mut interrupts,
        killing: false,
    };
    stopper.stop(&mut api, Duration::from_secs(15)).await;
    stopper
        .stop(&mut master, drain + Duration::from_secs(15))
        .await;
    stopper.stop(&mut manager, Duration::from_secs(15)).await;
}

/// Stops roles one after another.
struct Stopper<'a> {
    interrupts: &'a mut Interrupts,
    /// A deliberate Ctrl-C came: every role from then on is killed, not asked.
    killing: bool,
}

impl Stopper<'_> {
    /// Sends `role` SIGTERM and waits for it to exit; SIGKILL after `limit`, or on a
    /// second Ctrl-C (which also kills every role stopped after it). Says every few
    /// seconds what it waits for.
    async fn stop(&mut self, role: &mut Role, limit: Duration) {
        role.signal(if self.killing {
            Signal::SIGKILL
        } else {
            Signal::SIGTERM
        });
        let deadline = Instant::now() + limit;
        // One Ctrl-C can arrive twice (a terminal and a wrapper such as `timeout` both
        // signalling); only a deliberate second press, a moment later, kills.
        let deliberate = Instant::now() + Duration::from_millis(500);
        let mut progress = tokio::time::interval_at(
            Instant::now() + Duration::from_secs(5),
            Duration::from_secs(5),
        );
        // Killed at the deadline once: a passed deadline stays ready, and without this the
        // loop would spin sending SIGKILL (and saying so) until the exit is seen.
        let mut killed = false;
        while role.child.is_some() {
            tokio::select! {
                status = wait(&mut role.child) => {
                    role.child = None;
                    eprintln!("gaffer up: {} stopped ({})", role.name, describe(status));
                }
                () = self.interrupts.next() => {
                    if Instant::now() >= deliberate {
                        self.killing = true;
                        eprintln!("gaffer up: killing the {}", role.name);
                        role.signal(Signal::SIGKILL);
                    }
                }
                () = tokio::time::sleep_until(deadline), if !killed => {
                    killed = true;
                    eprintln!("gaffer up: the {} did not stop within {:?}, killing it", role.name, limit);
                    role.signal(Signal::SIGKILL);
                }
                _ = progress.tick() => {
                    eprintln!("gaffer up: waiting for the {} to stop", role.name);
                }
            }
        }
    }
}

impl Role {
    fn new(name: &'static str, args: Vec<String>) -> Self {
        Role {
            name,
            args,
            env: Vec::new(),
            child: None,
            started: Instant::now(),
            starts: 0,
            backoff: RESTART_BACKOFF,
            restart_at: None,
        }
    }

    fn start(&mut self, opts: &UpOptions, redis_url: &str) -> anyhow::Result<()> {
        let mut cmd = Command::new(&opts.exe);
        cmd.arg("--config")
            .arg(&opts.config_path)
            .args(&opts.role_args)
            .args(&self.args)
            .env("GAFFER_REDIS", redis_url)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the {}", self.name))?;
        if let Some(stderr) = child.stderr.take() {
            let name = self.name;
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("{name:>7} | {line}");
                }
            });
        }
        self.child = Some(child);
        self.started = Instant::now();
        self.starts += 1;
        self.restart_at = None;
        Ok(())
    }

    /// Handles an exit while running; returns an error when `up` must stop.
    fn exited(&mut self, status: std::io::Result<ExitStatus>) -> Option<anyhow::Error> {
        self.child = None;
        let what = describe(status);
        if self.starts == 1 && self.started.elapsed() < STARTUP_WINDOW {
            return Some(anyhow::anyhow!(
                "the {} failed at start-up ({what}); its log is above",
                self.name
            ));
        }
        let pause = self.backoff.next();
        eprintln!(
            "gaffer up: the {} exited ({what}); restarting in {pause:?}",
            self.name
        );
        self.restart_at = Some(Instant::now() + pause);
        None
    }

    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = kill(Pid::from_raw(pid as i32), sig);
        }
    }
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("wait failed: {e}"),
    }
}

/// A child's exit, or never when there is none.
async fn wait(child: &mut Option<Child>) -> std::io::Result<ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A wave of tasks per queue, each wave a phase behind the last, so demand (and with it
/// the slots) moves from queue to queue over a period.
struct DemoLoad {
    client: QueueClient,
    queues: Vec<DemoQueue>,
    started: Instant,
    pushed: u64,
    last_report: Instant,
}

struct DemoQueue {
    name: String,
    limits: QueueLimits,
    /// Tasks per second at the wave's crest.
    peak: f64,
    /// Where in the period its crest is, 0..1.
    phase: f64,
    /// The payload of every task.
    payload: serde_json::Value,
    /// Fractional tasks carried to the next second.
    carry: f64,
}

/// One period of every queue's wave.
const DEMO_PERIOD: f64 = 120.0;
/// A queue with this much waiting gets no more: a paused or starved queue must not grow
/// without bound while the demo runs.
const DEMO_BACKLOG_CAP: u64 = 2_000;

impl DemoLoad {
    fn new(client: QueueClient, cfg: &Config) -> Self {
        let n = cfg.queues.len().max(1) as f64;
        let queues = cfg
            .queues
            .values()
            .enumerate()
            .map(|(i, q)| {
                // Slow tasks at a rate that asks for a few slots at the crest; fast ones
                // at a steady trickle that shows throughput.
                let (peak, payload) = match q.handler.name() {
                    Handler::SLEEP => (30.0, serde_json::json!({"ms": 100})),
                    Handler::EXEC => (30.0, serde_json::json!({"action": "sleep", "ms": 100})),
                    Handler::MEMHOG => (2.0, serde_json::json!({"demo": true})),
                    Handler::PRELOAD_DEMO => (6.0, serde_json::json!({"demo": true})),
                    _ => (20.0, serde_json::json!({"demo": true})),
                };
                DemoQueue {
                    name: q.name.clone(),
                    limits: QueueLimits::from(q),
                    peak,
                    phase: i as f64 / n,
                    payload,
                    carry: 0.0,
                }
            })
            .collect();
        DemoLoad {
            client,
            queues,
            started: Instant::now(),
            pushed: 0,
            last_report: Instant::now(),
        }
    }

    async fn tick(&mut self) {
        let t = self.started.elapsed().as_secs_f64() / DEMO_PERIOD;
        let mut rates = BTreeMap::new();
        for q in &mut self.queues {
            // 0 at the trough, `peak` at the crest.
            let wave = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * (t - q.phase)).cos();
            let want = q.peak * wave + q.carry;
            let n = want.floor();
            q.carry = want - n;
            rates.insert(q.name.as_str(), n as u64);
            if n < 1.0 {
                continue;
            }
            let Ok(queue) = self.client.queue_with(&q.name, q.limits.clone()) else {
                continue;
            };
            match queue.stats().await {
                Ok(s) if s.ready >= DEMO_BACKLOG_CAP => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(queue = %q.name, error = %e, "demo load: stats failed");
                    continue;
                }
            }
            let body = serde_json::to_vec(&q.payload).unwrap_or_default();
            let tasks: Vec<NewTask> = (0..n as usize)
                .map(|_| NewTask::new(body.clone()))
                .collect();
            match queue.enqueue_many(&tasks).await {
                Ok(done) => self.pushed += done.len() as u64,
                Err(e) => tracing::warn!(queue = %q.name, error = %e, "demo load: enqueue failed"),
            }
        }
        if self.last_report.elapsed() >= Duration::from_secs(30) {
            self.last_report = Instant::now();
            let now: Vec<String> = rates.iter().map(|(q, r)| format!("{q}={r}/s")).collect();
            eprintln!(
                "gaffer up: demo load pushed {} tasks so far; now {}",
                self.pushed,
                now.join(" ")
            );
        }
    }
}
