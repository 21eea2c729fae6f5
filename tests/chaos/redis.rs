//! The Redis of a run: one server, or a Redis Cluster of three masters without replicas,
//! every node with AOF (`appendfsync always`) in its own directory, so that a node killed
//! and restarted comes back with everything it acknowledged. The Redis faults hit one
//! node, picked by the seed on a cluster.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gaffer::redis_server::{RedisServer, RedisServerOptions};
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
}

impl Topology {
    /// The name `--redis` takes.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
        }
    }

    /// The topology `--redis NAME` names.
    pub fn named(name: &str) -> Option<Topology> {
        match name {
            "single" => Some(Topology::Single),
            "cluster" => Some(Topology::Cluster),
            _ => None,
        }
    }
}

/// Masters of the cluster topology: the fewest a Redis Cluster takes.
const CLUSTER_NODES: usize = 3;

/// The running Redis: its nodes (one for a single server).
pub struct Redis {
    /// Single server or cluster.
    pub topology: Topology,
    nodes: Vec<RedisServer>,
    /// The hash tags of the run (its queues', the roles' `cluster`) each node serves.
    holds: Vec<Vec<String>>,
}

impl Redis {
    /// Starts the servers under `dir` (`dir/redis`, or `dir/redis-N` for node N), and for
    /// a cluster assigns the slots, waits until every node says the cluster is up and
    /// notes which node serves each of `tags` (hash tags: a fault's target names what it
    /// hits).
    pub fn start(dir: &Path, topology: Topology, tags: &[&str]) -> Result<Redis, String> {
        let opts = RedisServerOptions {
            appendonly: true,
            cluster_node: topology == Topology::Cluster,
            ..RedisServerOptions::default()
        };
        let nodes = match topology {
            Topology::Single => vec![RedisServer::start(&dir.join("redis"), opts)],
            Topology::Cluster => (1..=CLUSTER_NODES)
                .map(|i| RedisServer::start(&dir.join(format!("redis-{i}")), opts.clone()))
                .collect(),
        };
        let nodes = nodes
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut redis = Redis {
            topology,
            nodes,
            holds: Vec::new(),
        };
        if topology == Topology::Cluster {
            redis.create_cluster()?;
            redis.holds = (0..redis.nodes.len())
                .map(|i| redis.served(i, tags))
                .collect::<Result<_, _>>()?;
        }
        Ok(redis)
    }

    /// Which of `tags` node `i` serves: the hash slot of each (`CLUSTER KEYSLOT`) in the
    /// ranges its own line of `CLUSTER NODES` lists.
    fn served(&self, i: usize, tags: &[&str]) -> Result<Vec<String>, String> {
        let nodes = self.cli(i, &["cluster", "nodes"])?;
        let mine = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .ok_or_else(|| format!("{}: no line of its own in CLUSTER NODES", self.name(i)))?;
        let ranges: Vec<(u64, u64)> = mine
            .split_whitespace()
            .skip(8)
            .filter_map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        let mut out = Vec::new();
        for tag in tags {
            let slot: u64 = self
                .cli(i, &["cluster", "keyslot", &format!("{{{tag}}}")])?
                .trim()
                .parse()
                .map_err(|e| format!("CLUSTER KEYSLOT {{{tag}}}: {e}"))?;
            if ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)) {
                out.push(tag.to_string());
            }
        }
        Ok(out)
    }

    /// `redis-cli` against node `i`: its output.
    fn cli(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.nodes[i].port().to_string()])
            .args(args)
            .output()
            .map_err(|e| format!("redis-cli {}: {e}", args.join(" ")))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `redis-cli --cluster create` over the nodes, then every node polled until it says
    /// `cluster_state:ok` (a client routes by slot only once they agree).
    fn create_cluster(&self) -> Result<(), String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["--cluster", "create"]);
        for n in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = cmd
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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
        Ok(())
    }

    /// Whether node `i` says the cluster is up (`CLUSTER INFO`).
    fn cluster_ok(&self, i: usize) -> bool {
        self.cli(i, &["cluster", "info"])
            .is_ok_and(|o| o.contains("cluster_state:ok"))
    }

    /// The URL the roles are given: the single server's, or the first node's (a client
    /// finds the others from it).
    pub fn url(&self) -> String {
        self.nodes[0].url()
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

    /// How a fault's target names node `i`: with what it serves, on a cluster.
    pub fn name(&self, i: usize) -> String {
        match self.topology {
            Topology::Single => "redis-server".into(),
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
                format!(
                    "redis node {} (port {}{holds})",
                    i + 1,
                    self.nodes[i].port()
                )
            }
        }
    }

    /// Node `i`'s pid while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    /// Every running node's pid, with its name.
    pub fn pids(&self) -> Vec<(u32, String)> {
        (0..self.nodes.len())
            .filter_map(|i| self.pid(i).map(|p| (p, self.name(i))))
            .collect()
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
    /// cluster node reads its `nodes.conf`, so it rejoins with its slots).
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        self.nodes[i]
            .restart()
            .map_err(|e| format!("restarting {}: {e}", self.name(i)))
    }

    /// Stops every node (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        for n in &mut self.nodes {
            n.stop(grace);
        }
    }
}
