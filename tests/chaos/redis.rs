//! The Redis of a run: one server, or a Redis Cluster of three masters without replicas,
//! every node with AOF (`appendfsync always`) in its own directory, so that a node killed
//! and restarted comes back with everything it acknowledged. The Redis faults hit one
//! node, picked by the seed on a cluster.
//!
//! The failover profile's two (`failover.rs`): `sentinel`, a primary and one replica
//! (`replicaof`), each with AOF, watched by three Sentinels (`redis-server SENTINEL.conf
//! --sentinel`, each with its own port and writable config file) that fail the group
//! `gaffer` over; and `cluster-replicas`, a Redis Cluster of three masters each with one
//! replica. In both, the primary serving the run's first queue is killed and a replica
//! takes its place; the killed node is restarted as configured (a Sentinel group's node
//! without `replicaof`, as a primary of its own, which Sentinel turns into a replica; a
//! cluster node with its `nodes.conf`, which the cluster turns into one).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gaffer::redis_server::{RedisServer, RedisServerOptions, SentinelOf};
use nix::sys::signal::Signal;

use crate::rng::Rng;

/// How Redis is deployed under the roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// One redis-server.
    Single,
    /// A Redis Cluster of three masters, no replicas (a node's faults are not failed
    /// over: it is killed and restarted, or frozen and woken, as the single server is).
    Cluster,
    /// A primary and a replica under three Sentinels (the failover profile).
    Sentinel,
    /// A Redis Cluster of three masters with a replica each (the failover profile).
    ClusterReplicas,
}

impl Topology {
    /// The name `--redis` takes.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
            Topology::Sentinel => "sentinel",
            Topology::ClusterReplicas => "cluster-replicas",
        }
    }

    /// Whether a replica takes a killed primary's place (the failover profile's
    /// topologies, and only those).
    pub fn fails_over(self) -> bool {
        matches!(self, Topology::Sentinel | Topology::ClusterReplicas)
    }

    /// Whether it is a Redis Cluster.
    fn clustered(self) -> bool {
        matches!(self, Topology::Cluster | Topology::ClusterReplicas)
    }

    /// The topology `--redis NAME` names.
    pub fn named(name: &str) -> Option<Topology> {
        match name {
            "single" => Some(Topology::Single),
            "cluster" => Some(Topology::Cluster),
            "sentinel" => Some(Topology::Sentinel),
            "cluster-replicas" => Some(Topology::ClusterReplicas),
            _ => None,
        }
    }
}

/// Masters of the cluster topologies: the fewest a Redis Cluster takes.
const CLUSTER_NODES: usize = 3;
/// The Sentinel topology's group name (in the roles' `redis+sentinel://` URL too).
pub const SENTINEL_GROUP: &str = "gaffer";
/// Sentinels of the Sentinel topology, and how many must agree that the primary is down.
const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// Sentinel's `down-after-milliseconds`: how long a primary may not answer before a
/// Sentinel holds it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// Sentinel's `failover-timeout`: how long a failover may take before it is given up
/// (and twice that before the same group can be failed over again).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);
/// `cluster-node-timeout` of the cluster with replicas: how long a master may not answer
/// before the others hold it failed.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long any wait for Redis to settle may take (a cluster forming, a replica in sync).
const SETTLE: Duration = Duration::from_secs(60);

/// The running Redis: its nodes (one for a single server), and a Sentinel group's
/// Sentinels.
pub struct Redis {
    /// Single server, cluster, Sentinel group or cluster with replicas.
    pub topology: Topology,
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// The hash tags of the run (its queues', the roles' `cluster`) each node serves at
    /// the start.
    holds: Vec<Vec<String>>,
    /// The run's hash tags, the first being the one whose primary a failover kills.
    tags: Vec<String>,
    /// Each tag's hash slot (a cluster's).
    slots: Vec<u64>,
    /// The node whose URL the roles are given (a cluster's: never one the failover
    /// profile kills, so a role can always connect).
    seed: usize,
}

impl Redis {
    /// Starts the servers under `dir` (`dir/redis`, or `dir/redis-N` for node N, and
    /// `dir/sentinel-N` for Sentinel N): for a cluster assigns the slots (and the
    /// replicas), for a Sentinel group starts the replica and the Sentinels; waits until
    /// every node and Sentinel agrees, and notes which node serves each of `tags` (hash
    /// tags: a fault's target names what it hits).
    pub fn start(dir: &Path, topology: Topology, tags: &[&str]) -> Result<Redis, String> {
        let mut opts = RedisServerOptions {
            appendonly: true,
            cluster_node: topology.clustered(),
            ..RedisServerOptions::default()
        };
        if topology == Topology::ClusterReplicas {
            opts.extra
                .push(("cluster-node-timeout".into(), ms(NODE_TIMEOUT)));
        }
        let count = match topology {
            Topology::Single => 1,
            Topology::Cluster => CLUSTER_NODES,
            Topology::Sentinel => 2,
            Topology::ClusterReplicas => 2 * CLUSTER_NODES,
        };
        let mut nodes = Vec::with_capacity(count);
        for i in 1..=count {
            let here = match topology {
                Topology::Single => dir.join("redis"),
                _ => dir.join(format!("redis-{i}")),
            };
            let mut o = opts.clone();
            if topology == Topology::Sentinel && i > 1 {
                let primary: &RedisServer = &nodes[0];
                o.extra
                    .push(("replicaof".into(), format!("127.0.0.1 {}", primary.port())));
            }
            nodes.push(RedisServer::start(&here, o).map_err(|e| e.to_string())?);
        }
        let mut redis = Redis {
            topology,
            nodes,
            sentinels: Vec::new(),
            holds: Vec::new(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            slots: Vec::new(),
            seed: 0,
        };
        match topology {
            Topology::Single => {}
            Topology::Cluster | Topology::ClusterReplicas => {
                redis.create_cluster()?;
                redis.slots = tags
                    .iter()
                    .map(|t| redis.keyslot(t))
                    .collect::<Result<_, _>>()?;
                redis.holds = (0..redis.nodes.len())
                    .map(|i| redis.served(i, tags))
                    .collect::<Result<_, _>>()?;
                if topology == Topology::ClusterReplicas {
                    redis.seed = redis.pick_seed()?;
                }
            }
            Topology::Sentinel => {
                redis.wait_until("the replica in sync with the primary", |r| {
                    r.replica_of(1, 0)
                })?;
                redis.start_sentinels(dir)?;
            }
        }
        Ok(redis)
    }

    /// Polls `ok` until it holds, for at most [`SETTLE`].
    fn wait_until(&self, what: &str, ok: impl Fn(&Redis) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + SETTLE;
        while !ok(self) {
            if Instant::now() > deadline {
                return Err(format!("not within {SETTLE:?}: {what}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Starts the three Sentinels of the group (each in `dir/sentinel-N` with its own
    /// config file, which it rewrites) and waits until each knows the replica and the
    /// two others.
    fn start_sentinels(&mut self, dir: &Path) -> Result<(), String> {
        let of = SentinelOf {
            name: SENTINEL_GROUP.into(),
            primary_port: self.nodes[0].port(),
            quorum: QUORUM as u32,
            down_after: DOWN_AFTER,
            failover_timeout: FAILOVER_TIMEOUT,
        };
        let g = SENTINEL_GROUP;
        for i in 1..=SENTINELS {
            let opts = RedisServerOptions {
                sentinel: Some(of.clone()),
                ..RedisServerOptions::default()
            };
            let s = RedisServer::start(&dir.join(format!("sentinel-{i}")), opts)
                .map_err(|e| e.to_string())?;
            self.sentinels.push(s);
        }
        self.wait_until("every Sentinel knowing the replica and the others", |r| {
            (0..r.sentinels.len()).all(|s| {
                let m = pairs(&r.sentinel_cli(s, &["sentinel", "master", g]));
                m.get("num-slaves").map(String::as_str) == Some("1")
                    && m.get("num-other-sentinels").map(String::as_str)
                        == Some(&(SENTINELS - 1).to_string()[..])
                    && m.get("flags").map(String::as_str) == Some("master")
            })
        })
    }

    /// The hash slot of `{tag}` (`CLUSTER KEYSLOT`).
    fn keyslot(&self, tag: &str) -> Result<u64, String> {
        self.cli(0, &["cluster", "keyslot", &format!("{{{tag}}}")])?
            .trim()
            .parse()
            .map_err(|e| format!("CLUSTER KEYSLOT {{{tag}}}: {e}"))
    }

    /// Which of `tags` node `i` serves: the hash slot of each in the ranges its own line
    /// of `CLUSTER NODES` lists.
    fn served(&self, i: usize, tags: &[&str]) -> Result<Vec<String>, String> {
        let nodes = self.cli(i, &["cluster", "nodes"])?;
        let mine = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .ok_or_else(|| format!("{}: no line of its own in CLUSTER NODES", self.name(i)))?;
        let ranges = slot_ranges(mine);
        Ok(tags
            .iter()
            .zip(&self.slots)
            .filter(|(_, slot)| ranges.iter().any(|&(a, b)| (a..=b).contains(*slot)))
            .map(|(t, _)| t.to_string())
            .collect())
    }

    /// The seed of the cluster with replicas: a master outside the shard of the first
    /// tag, whose primary the failover profile kills.
    fn pick_seed(&self) -> Result<usize, String> {
        let target = self.primary().ok_or("no primary serves the first queue")?;
        let shard = [Some(target), self.replica_for(target)];
        (0..self.nodes.len())
            .find(|&i| !shard.contains(&Some(i)) && !self.holds[i].is_empty())
            .or_else(|| (0..self.nodes.len()).find(|&i| !shard.contains(&Some(i))))
            .ok_or_else(|| "no node outside the first queue's shard".to_string())
    }

    /// `redis-cli` against node `i`: its output.
    fn cli(&self, i: usize, args: &[&str]) -> Result<String, String> {
        cli(self.nodes[i].port(), args)
    }

    /// `redis-cli` against Sentinel `s`: its output (empty when it does not answer).
    fn sentinel_cli(&self, s: usize, args: &[&str]) -> String {
        cli(self.sentinels[s].port(), args).unwrap_or_default()
    }

    /// `redis-cli --cluster create` over the nodes (with a replica for each master on the
    /// cluster with replicas), then every node polled until it says `cluster_state:ok`
    /// (a client routes by slot only once they agree) and, with replicas, until every
    /// replica is in sync and every node sees the whole cluster.
    fn create_cluster(&self) -> Result<(), String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["--cluster", "create"]);
        for n in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        let replicas = if self.topology == Topology::ClusterReplicas {
            "1"
        } else {
            "0"
        };
        let out = cmd
            .args(["--cluster-replicas", replicas, "--cluster-yes"])
            .output()
            .map_err(|e| format!("running redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..self.nodes.len() {
            while !self.cluster_ok(i) {
                if Instant::now() > deadline {
                    return Err(format!("{} never said cluster_state:ok", self.name(i)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if self.topology == Topology::ClusterReplicas {
            self.wait_until("every replica in sync, seen by every node", |r| {
                (0..r.nodes.len()).all(|i| r.sees_whole_cluster(i))
                    && (0..r.nodes.len())
                        .filter_map(|i| r.master_of_replica(i).map(|m| (i, m)))
                        .filter(|&(i, m)| r.replica_of(i, m))
                        .count()
                        == CLUSTER_NODES
            })?;
        }
        Ok(())
    }

    /// Whether node `i`'s `CLUSTER NODES` shows every node, masters and replicas, none
    /// failed or still joining.
    fn sees_whole_cluster(&self, i: usize) -> bool {
        let Ok(text) = self.cli(i, &["cluster", "nodes"]) else {
            return false;
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        let masters = lines
            .iter()
            .filter(|l| flags(l).contains(&"master"))
            .count();
        lines.len() == self.nodes.len()
            && masters == CLUSTER_NODES
            && lines.iter().all(|l| {
                let f = flags(l);
                !f.iter()
                    .any(|x| matches!(*x, "fail" | "fail?" | "handshake" | "noaddr"))
                    && l.split_whitespace().nth(7) == Some("connected")
            })
    }

    /// Whether node `i` says the cluster is up (`CLUSTER INFO`).
    fn cluster_ok(&self, i: usize) -> bool {
        self.cli(i, &["cluster", "info"])
            .is_ok_and(|o| o.contains("cluster_state:ok"))
    }

    /// The node on `port`.
    fn node_on(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The primary node replica `i` follows, by its `INFO replication`.
    fn master_of_replica(&self, i: usize) -> Option<usize> {
        let info = pairs_colon(&self.cli(i, &["info", "replication"]).ok()?);
        if info.get("role").map(String::as_str) != Some("slave") {
            return None;
        }
        self.node_on(info.get("master_port")?.parse().ok()?)
    }

    /// Whether node `i` is a replica of node `primary` with its link up (in sync).
    pub fn replica_of(&self, i: usize, primary: usize) -> bool {
        let Ok(text) = self.cli(i, &["info", "replication"]) else {
            return false;
        };
        let info = pairs_colon(&text);
        info.get("role").map(String::as_str) == Some("slave")
            && info.get("master_port").and_then(|p| p.parse().ok())
                == Some(self.nodes[primary].port())
            && info.get("master_link_status").map(String::as_str) == Some("up")
    }

    /// The replica of primary `i` (the first node that says it follows it).
    fn replica_for(&self, i: usize) -> Option<usize> {
        (0..self.nodes.len()).find(|&r| r != i && self.master_of_replica(r) == Some(i))
    }

    /// The primary serving the run's first tag, as the roles would find it: the first
    /// Sentinel that answers `SENTINEL get-master-addr-by-name`, or the seed's `CLUSTER
    /// NODES` (the master whose ranges hold the tag's slot). None on a topology without
    /// failover, or when nobody answers.
    pub fn primary(&self) -> Option<usize> {
        match self.topology {
            Topology::Single | Topology::Cluster => None,
            Topology::Sentinel => (0..self.sentinels.len()).find_map(|s| {
                let out =
                    self.sentinel_cli(s, &["sentinel", "get-master-addr-by-name", SENTINEL_GROUP]);
                self.node_on(out.lines().nth(1)?.trim().parse().ok()?)
            }),
            Topology::ClusterReplicas => {
                let text = self.cli(self.seed, &["cluster", "nodes"]).ok()?;
                let slot = *self.slots.first()?;
                text.lines()
                    .filter(|l| flags(l).contains(&"master"))
                    .find(|l| slot_ranges(l).iter().any(|&(a, b)| (a..=b).contains(&slot)))
                    .and_then(|l| self.node_on(node_port(l)?))
            }
        }
    }

    /// The tags primary `i` serves now: all of them in a Sentinel group, its slots' on
    /// a cluster (as the seed sees them).
    pub fn serving(&self, i: usize) -> Vec<String> {
        match self.topology {
            Topology::Sentinel | Topology::Single => self.tags.clone(),
            Topology::Cluster | Topology::ClusterReplicas => {
                let Ok(text) = self.cli(self.seed, &["cluster", "nodes"]) else {
                    return Vec::new();
                };
                let port = self.nodes[i].port();
                let Some(line) = text.lines().find(|l| node_port(l) == Some(port)) else {
                    return Vec::new();
                };
                let ranges = slot_ranges(line);
                self.tags
                    .iter()
                    .zip(&self.slots)
                    .filter(|(_, s)| ranges.iter().any(|&(a, b)| (a..=b).contains(*s)))
                    .map(|(t, _)| t.clone())
                    .collect()
            }
        }
    }

    /// Whether node `i`, restarted after a failover, is a replica of the primary `now`
    /// in sync, and seen as such where the next failover is decided: by every Sentinel
    /// (listed as a replica whose link is up, and `now` the primary they all name), or by
    /// the seed's view of the cluster (a replica, not failed).
    pub fn rejoined(&self, i: usize, now: usize) -> bool {
        if !self.replica_of(i, now) {
            return false;
        }
        let port = self.nodes[i].port().to_string();
        match self.topology {
            Topology::Sentinel => (0..self.sentinels.len()).all(|s| {
                let named =
                    self.sentinel_cli(s, &["sentinel", "get-master-addr-by-name", SENTINEL_GROUP]);
                let replicas = self.sentinel_cli(s, &["sentinel", "replicas", SENTINEL_GROUP]);
                named.lines().nth(1).map(str::trim) == Some(&self.nodes[now].port().to_string()[..])
                    && records(&replicas).iter().any(|r| {
                        r.get("port") == Some(&port)
                            && r.get("flags").map(String::as_str) == Some("slave")
                            && r.get("master-link-status").map(String::as_str) == Some("ok")
                    })
            }),
            Topology::ClusterReplicas => {
                self.cli(self.seed, &["cluster", "nodes"])
                    .is_ok_and(|text| {
                        text.lines().any(|l| {
                            node_port(l).map(|p| p.to_string()) == Some(port.clone())
                                && flags(l).contains(&"slave")
                                && !flags(l).iter().any(|f| f.starts_with("fail"))
                        })
                    })
            }
            Topology::Single | Topology::Cluster => true,
        }
    }

    /// The failovers Redis itself logged, as the Unix ms of each log line, in order:
    /// Sentinel's `+switch-master` (the end of a failover, logged by every Sentinel: the
    /// earliest of them), or a cluster node's `Failover election won` (a replica that
    /// made itself the master). The failover profile holds their count against its kills,
    /// and reads from them when Redis declared each failover.
    pub fn failovers_logged(&self) -> Vec<u64> {
        let logged = |dir: &Path, what: &str| -> Vec<u64> {
            std::fs::read_to_string(dir.join("redis.log"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(what))
                .filter_map(log_time)
                .collect()
        };
        let mut out: Vec<u64> = match self.topology {
            Topology::Sentinel => {
                // One line per failover in each Sentinel's log: the earliest of each.
                let each: Vec<Vec<u64>> = self
                    .sentinels
                    .iter()
                    .map(|s| logged(s.dir(), "+switch-master"))
                    .collect();
                let n = each.iter().map(Vec::len).max().unwrap_or(0);
                (0..n)
                    .filter_map(|k| each.iter().filter_map(|e| e.get(k)).min().copied())
                    .collect()
            }
            _ => self
                .nodes
                .iter()
                .flat_map(|n| logged(n.dir(), "Failover election won"))
                .collect(),
        };
        out.sort_unstable();
        out
    }

    /// The URL the roles are given: the single server's, the seed node's (a client finds
    /// the others from it), or the Sentinels' (`redis+sentinel://`, which names the
    /// group).
    pub fn url(&self) -> String {
        match self.topology {
            Topology::Sentinel => {
                let hosts: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("127.0.0.1:{}", s.port()))
                    .collect();
                format!("redis+sentinel://{}/{SENTINEL_GROUP}/0", hosts.join(","))
            }
            _ => self.nodes[self.seed].url(),
        }
    }

    /// The node a Redis fault hits: the seed picks one of a cluster's (and draws nothing
    /// for a single server, so its schedules stay as they were before clusters).
    pub fn pick(&self, rng: &mut Rng) -> usize {
        if self.nodes.len() > 1 {
            rng.range(0, self.nodes.len() as u64) as usize
        } else {
            0
        }
    }

    /// How a fault's target names node `i`: with what it serves (at the start), on a
    /// cluster.
    pub fn name(&self, i: usize) -> String {
        let port = self.nodes[i].port();
        match self.topology {
            Topology::Single => "redis-server".into(),
            Topology::Sentinel | Topology::ClusterReplicas => {
                format!("redis node {} (port {port})", i + 1)
            }
            Topology::Cluster => {
                let holds = self.holds.get(i).map_or(String::new(), |h| {
                    format!(
                        ", serving {}",
                        if h.is_empty() {
                            "none of the run's keys".into()
                        } else {
                            h.join(" ")
                        }
                    )
                });
                format!("redis node {} (port {port}{holds})", i + 1)
            }
        }
    }

    /// Node `i`'s pid while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    /// Every running node's and Sentinel's pid, with its name.
    pub fn pids(&self) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = (0..self.nodes.len())
            .filter_map(|i| self.pid(i).map(|p| (p, self.name(i))))
            .collect();
        for (i, s) in self.sentinels.iter().enumerate() {
            if let Some(p) = s.pid() {
                out.push((p, format!("sentinel {} (port {})", i + 1, s.port())));
            }
        }
        out
    }

    /// Sends `sig` to node `i`.
    pub fn signal(&self, i: usize, sig: Signal) -> Result<(), String> {
        self.nodes[i].signal(sig).map_err(|e| e.to_string())
    }

    /// kill -9 node `i`, reaped.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again on its port and directory: it replays its AOF (and a
    /// cluster node reads its `nodes.conf`, so it rejoins with its slots, or as the
    /// replica of whoever took them). A Sentinel group's node comes back as configured
    /// after a failover: without `replicaof` (a primary, if it was one, until Sentinel
    /// turns it into a replica).
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.topology == Topology::Sentinel {
            self.nodes[i]
                .options_mut()
                .extra
                .retain(|(k, _)| k != "replicaof");
        }
        self.nodes[i]
            .restart()
            .map_err(|e| format!("restarting {}: {e}", self.name(i)))
    }

    /// Stops the Sentinels first (so that none fails the group over as it goes), then
    /// every node (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        for n in self.sentinels.iter_mut().chain(&mut self.nodes) {
            n.stop(grace);
        }
    }
}

/// `redis-cli -p PORT ARGS…`: its output.
fn cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("redis-cli {}: {e}", args.join(" ")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// When a line of a Redis or Sentinel log was written (Unix ms): `PID:ROLE DD Mon YYYY
/// HH:MM:SS.mmm …`, in this machine's local time.
fn log_time(line: &str) -> Option<u64> {
    use chrono::TimeZone;
    let words: Vec<&str> = line.split_whitespace().skip(1).take(4).collect();
    let t =
        chrono::NaiveDateTime::parse_from_str(&words.join(" "), "%d %b %Y %H:%M:%S%.3f").ok()?;
    let local = chrono::Local.from_local_datetime(&t).single()?;
    u64::try_from(local.timestamp_millis()).ok()
}

/// A duration in whole milliseconds, as Redis's settings take it.
fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

/// The flags of a `CLUSTER NODES` line (`myself,master`, `slave,fail`, …).
fn flags(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .nth(2)
        .map_or_else(Vec::new, |f| f.split(',').collect())
}

/// The port of a `CLUSTER NODES` line's node (`127.0.0.1:PORT@BUS`).
fn node_port(line: &str) -> Option<u16> {
    let addr = line.split_whitespace().nth(1)?;
    let (_, rest) = addr.rsplit_once(':')?;
    rest.split(['@', ',']).next()?.parse().ok()
}

/// The slot ranges a `CLUSTER NODES` line lists (a replica's: none).
fn slot_ranges(line: &str) -> Vec<(u64, u64)> {
    line.split_whitespace()
        .skip(8)
        .filter_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// `key:value` lines (`INFO`) as a map.
fn pairs_colon(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A flat reply of field and value lines (redis-cli's raw output of `SENTINEL master`)
/// as a map.
fn pairs(text: &str) -> std::collections::HashMap<String, String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_string(), c[1].to_string()))
        .collect()
}

/// Records of field and value lines, each starting with `name` (redis-cli's raw output of
/// `SENTINEL replicas`).
fn records(text: &str) -> Vec<std::collections::HashMap<String, String>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<std::collections::HashMap<String, String>> = Vec::new();
    for c in lines.chunks(2).filter(|c| c.len() == 2) {
        if c[0] == "name" {
            out.push(Default::default());
        }
        if let Some(r) = out.last_mut() {
            r.insert(c[0].to_string(), c[1].to_string());
        }
    }
    out
}
