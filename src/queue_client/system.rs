//! External systems at run time: the switch (`gaffer system NAME pause|resume|disable|enable`)
//! and the token bucket that holds a system's `rate` cluster-wide.
//!
//! The switch lives twice: in `NS:{cluster}:systems` (name → state), which listings and
//! the manager read, and in each of the system's queues' `conf` hash (`system` =
//! `STATE:NAME`), which take.lua and enqueue.lua read in the same step that takes or
//! enqueues, on the queue's own hash slot. A system without a switch is in the config's
//! state (`paused = true` or active). Each switch counts the system's generation up
//! (`gen:NAME` in the cluster's hash; a queue keeps its switch's in `system_gen`), so the
//! manager's tick, which copies the switches it read to the queues, never writes an older
//! switch over a newer one (two hash slots: no script can do both at once). While a system
//! is disabled, the tick also cancels what became waiting since its switch (a retry, a
//! lease that ran out, a requeue). The bucket is `NS:{sys:NAME}:bucket`, in its own hash
//! slot: a take (or a settle_take) acquires tokens there first, then takes at most that
//! many, and hands back the ones it did not use.
//!
//! This is the system's half of ARCHITECTURE.md's invariant 31 (the take's is in
//! `lease`). A switch's sweep works in chunks of `SWEEP_CHUNK`: a pause notes the waiting
//! tasks' records once, a disable cancels them, each cancel checking the queue's switch
//! in its own step, so a cancel that comes after an `enable` cancels nothing. The bucket
//! saves up at most the largest batch of the system's queues, so over any second a system
//! starts at most its rate plus that batch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use serde::Serialize;

use super::args::{AdoptHead, BucketHead, OutcountHead, SwitchHead, SystemHead};
use super::scripts::Function;
use super::{Queue, QueueClient, QueueError};
use crate::config::Config;

/// Waiting tasks handled per call while a switch sweeps a queue, so no script runs long.
const SWEEP_CHUNK: usize = 500;

static SYSTEM: LazyLock<Function> = LazyLock::new(|| Function::named("system"));
static BUCKET: LazyLock<Function> = LazyLock::new(|| Function::named("bucket"));
// The cluster's switch of a system and its generation, in one step (lua/switch.lua).
static SWITCH: LazyLock<Function> = LazyLock::new(|| Function::named("switch"));

/// Where an external system stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SystemState {
    /// Its queues take and accept tasks.
    Active,
    /// Its queues take nothing; their tasks wait, with a note saying why.
    Paused,
    /// Its queues' waiting tasks and every new one are cancelled.
    Disabled,
}

impl SystemState {
    /// The state's name, as the switch stores it and listings print it.
    pub fn as_str(self) -> &'static str {
        match self {
            SystemState::Active => "active",
            SystemState::Paused => "paused",
            SystemState::Disabled => "disabled",
        }
    }

    /// The state of a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(SystemState::Active),
            "paused" => Some(SystemState::Paused),
            "disabled" => Some(SystemState::Disabled),
            _ => None,
        }
    }

    /// The state a system's config starts it in.
    pub fn configured(paused: bool) -> Self {
        if paused {
            SystemState::Paused
        } else {
            SystemState::Active
        }
    }
}

/// How far a switch's sweep got: in `queue`, `done` tasks cancelled (a disable) or noted
/// (a pause) so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepProgress {
    /// The queue being swept.
    pub queue: String,
    /// Its tasks handled so far.
    pub done: u64,
}

/// What a switch did.
#[derive(Debug, Clone, Serialize)]
pub struct SystemChange {
    /// The system.
    pub system: String,
    /// Its state now.
    pub state: SystemState,
    /// Its state before.
    pub was: SystemState,
    /// Waiting tasks cancelled (disable).
    pub cancelled: u64,
    /// Waiting tasks whose records got the pause note (pause).
    pub noted: u64,
}

// A switch's count raised past a queue's copy (lua/outcount.lua).
static OUTCOUNT: LazyLock<Function> = LazyLock::new(|| Function::named("outcount"));

// A queue's copy of a switch adopted by the cluster, where the cluster's count is behind
// it (lua/adopt.lua).
static ADOPT: LazyLock<Function> = LazyLock::new(|| Function::named("adopt"));

/// The run-time switches as one reading: each system's state and generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switches {
    /// The state of each system that has a switch (others are in their config's state).
    pub states: BTreeMap<String, SystemState>,
    /// The generation of each switch: how many times its system was switched.
    pub gens: BTreeMap<String, u64>,
}

impl Switches {
    /// The generation of `system`'s switch as read (0: none).
    fn generation(&self, system: &str) -> u64 {
        self.gens.get(system).copied().unwrap_or(0)
    }
}

/// Tokens a take got from its system's bucket.
pub(super) enum Granted {
    /// Take at most this many.
    Tasks(usize),
    /// None now: the next token comes in this long.
    None(Duration),
}

/// Errors of the switch.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    /// The config has no `[systems.NAME]`.
    #[error("unknown system `{0}`: no [systems.{0}] table in the config")]
    Unknown(String),
    /// Redis failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// The key of a system's token bucket, in its own hash slot.
pub fn bucket_key(namespace: &str, system: &str) -> String {
    format!("{namespace}:{{sys:{system}}}:bucket")
}

/// The cluster's hash of run-time system switches.
pub fn switches_key(namespace: &str) -> String {
    format!("{namespace}:{{cluster}}:systems")
}

/// The config with each system's run-time switch applied (a paused or disabled system
/// counts as `paused`, so the balancer gives its queues no slots); `None` when no switch
/// differs from the config, so a caller clones nothing in the usual case.
pub fn with_switches(cfg: &Config, switches: &BTreeMap<String, SystemState>) -> Option<Config> {
    let differs = |name: &str, paused: bool| {
        switches
            .get(name)
            .is_some_and(|s| (*s != SystemState::Active) != paused)
    };
    if !cfg.systems.values().any(|s| differs(&s.name, s.paused)) {
        return None;
    }
    let mut out = cfg.clone();
    for s in out.systems.values_mut() {
        if let Some(state) = switches.get(&s.name) {
            s.paused = *state != SystemState::Active;
        }
    }
    Some(out)
}

/// Every system of the config with the state it is in: its switch, else the config's.
pub fn states(
    cfg: &Config,
    switches: &BTreeMap<String, SystemState>,
) -> BTreeMap<String, SystemState> {
    cfg.systems
        .values()
        .map(|s| {
            let state = switches
                .get(&s.name)
                .copied()
                .unwrap_or(SystemState::configured(s.paused));
            (s.name.clone(), state)
        })
        .collect()
}

impl QueueClient {
    /// The run-time switches that are set (systems without one are in their config's state).
    pub async fn system_switches(&self) -> Result<BTreeMap<String, SystemState>, QueueError> {
        Ok(self.read_switches().await?.states)
    }

    /// The run-time switches with their generations, in one read.
    pub async fn read_switches(&self) -> Result<Switches, QueueError> {
        let mut conn = self.connection();
        let raw: BTreeMap<String, String> = conn.hgetall(switches_key(self.namespace())).await?;
        let mut out = Switches::default();
        for (k, v) in raw {
            if let Some(system) = k.strip_prefix("gen:") {
                out.gens.insert(system.to_string(), v.parse().unwrap_or(0));
            } else if let Some(state) = SystemState::parse(&v) {
                out.states.insert(k, state);
            }
        }
        Ok(out)
    }

    /// Tokens granted by a system's bucket so far (net of those handed back): the tasks
    /// its queues started under its rate; 0 for a system without a rate.
    pub async fn system_granted(&self, system: &str) -> Result<u64, QueueError> {
        let mut conn = self.connection();
        let v: Option<i64> = conn
            .hget(bucket_key(self.namespace(), system), "granted")
            .await?;
        Ok(v.unwrap_or(0).max(0) as u64)
    }

    /// Switches a system: the cluster's switch, then each of its queues' (so takes and
    /// enqueues obey at once), then the sweep the new state asks for: a pause notes the
    /// waiting tasks' records, a disable cancels them (through the cancel path, in
    /// chunks) with the note "system NAME is disabled".
    pub async fn set_system(
        &self,
        cfg: &Config,
        system: &str,
        state: SystemState,
    ) -> Result<SystemChange, SystemError> {
        self.set_system_reporting(cfg, system, state, &mut |_| {})
            .await
    }

    /// [`set_system`](Self::set_system), telling `progress` after each chunk of its sweep
    /// how far it got (a sweep of a large backlog takes a while).
    pub async fn set_system_reporting(
        &self,
        cfg: &Config,
        system: &str,
        state: SystemState,
        progress: &mut (dyn FnMut(&SweepProgress) + Send),
    ) -> Result<SystemChange, SystemError> {
        let sys = cfg
            .systems
            .get(system)
            .ok_or_else(|| SystemError::Unknown(system.to_string()))?;
        let mut conn = self.connection();
        let (was, mut generation): (String, u64) = SWITCH
            .prepare_invoke()
            .confirming(self.durability())
            .key(switches_key(self.namespace()))
            .head(&SwitchHead {
                system: system.to_string(),
                state: state.as_str(),
            })
            .invoke_async(&mut conn)
            .await?;
        let was = SystemState::parse(&was).unwrap_or(SystemState::configured(sys.paused));
        let mut change = SystemChange {
            system: system.to_string(),
            state,
            was,
            cancelled: 0,
            noted: 0,
        };
        // Every queue's copy first, then the sweeps: a sweep of a large backlog takes a
        // while, and the queues after it would go on taking under the old state meanwhile.
        let mut queues = Vec::new();
        for q in cfg
            .queues
            .values()
            .filter(|q| q.system.as_deref() == Some(system))
        {
            let queue = self.queue_with(&q.name, super::QueueLimits::from(q))?;
            if !queue.switch_system(system, state, generation).await? {
                generation = self.outcount(&queue, system, state, generation).await?;
            }
            queues.push(queue);
        }
        for queue in queues {
            let mut report = |done: u64| {
                progress(&SweepProgress {
                    queue: queue.name().to_string(),
                    done,
                })
            };
            match state {
                SystemState::Disabled => {
                    change.cancelled += queue.cancel_waiting(system, &mut report).await?
                }
                SystemState::Paused if was != SystemState::Paused => {
                    change.noted += queue.note_waiting(system, &mut report).await?
                }
                _ => {}
            }
        }
        Ok(change)
    }
}

impl QueueClient {
    /// A switch (of generation `generation`) that `queue`'s copy refused, holding a newer
    /// one: when the cluster's count is behind that copy (its hash was lost, or a failover
    /// lost writes), the count jumps past it and the switch is written again, to the
    /// cluster and the queue; when the count is not behind, another switch came later and
    /// stays. Returns the generation the switch has now.
    async fn outcount(
        &self,
        queue: &Queue,
        system: &str,
        state: SystemState,
        generation: u64,
    ) -> Result<u64, QueueError> {
        let mut conn = self.connection();
        let theirs: Option<u64> = conn.hget(queue.keys.conf(), "system_gen").await?;
        let reply: Vec<redis::Value> = OUTCOUNT
            .prepare_invoke()
            .confirming(self.durability())
            .key(switches_key(self.namespace()))
            .head(&OutcountHead {
                system: system.to_string(),
                state: state.as_str(),
                theirs: theirs.unwrap_or(0),
                ours: generation,
            })
            .invoke_async(&mut conn)
            .await?;
        let raised = match reply.as_slice() {
            [kind] if super::reply::string(kind)? == "kept" => return Ok(generation),
            [kind, raised] if super::reply::string(kind)? == "raised" => {
                super::reply::int(raised)? as u64
            }
            other => {
                return Err(QueueError::Protocol(format!("outcount returned {other:?}")));
            }
        };
        queue.switch_system(system, state, raised).await?;
        Ok(raised)
    }

    /// Brings every queue's copy of its system's switch in line with `switches` and the
    /// config: a queue that joined a switched system gets the switch, one that left a
    /// system (or whose system has no switch) loses it; a queue whose switch is newer than
    /// the reading (an operator switched meanwhile) keeps it. The manager calls this every
    /// tick, so a config change cannot leave a queue held by a system it left. Returns
    /// the queues it changed.
    pub async fn reconcile_system_switches(
        &self,
        cfg: &Config,
        switches: &Switches,
    ) -> Result<BTreeSet<String>, QueueError> {
        let mut changed = BTreeSet::new();
        for q in cfg.queues.values() {
            let system = q.system.as_deref().unwrap_or_default();
            let want = q.system.as_ref().and_then(|name| {
                let state = switches.states.get(name)?;
                Some(format!("{}:{name}", state.as_str()))
            });
            let queue = self.queue_with(&q.name, super::QueueLimits::from(q))?;
            let mut conn = self.connection();
            let have: Option<String> = conn.hget(queue.keys.conf(), "system").await?;
            if have == want {
                continue;
            }
            let generation = switches.generation(system);
            let done = match &want {
                Some(value) => queue.set_switch(value, generation).await?,
                None => queue.clear_switch(system, generation).await?,
            };
            if done {
                changed.insert(q.name.clone());
            } else {
                self.adopt_newer_copy(&queue, system).await?;
            }
        }
        Ok(changed)
    }

    /// A queue's copy of `system`'s switch that the reading could not replace, being
    /// newer: adopted by the cluster when its count is behind the copy (it lost that
    /// switch), so what `gaffer system` shows and what the balancer decides on heal
    /// within a tick to what the queues do. Where an operator switched meanwhile, the
    /// count is not behind and nothing changes.
    async fn adopt_newer_copy(&self, queue: &Queue, system: &str) -> Result<(), QueueError> {
        let mut conn = self.connection();
        let (copy, generation): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(queue.keys.conf())
            .arg("system")
            .arg("system_gen")
            .query_async(&mut conn)
            .await?;
        let Some((state, name)) = copy.as_deref().and_then(|c| c.split_once(':')) else {
            return Ok(());
        };
        if name != system || SystemState::parse(state).is_none() {
            return Ok(());
        }
        let adopted: i64 = ADOPT
            .prepare_invoke()
            .confirming(self.durability())
            .key(switches_key(self.namespace()))
            .head(&AdoptHead {
                system: system.to_string(),
                state: state.to_string(),
                theirs: generation.unwrap_or(0),
            })
            .invoke_async(&mut conn)
            .await?;
        if adopted == 1 {
            tracing::warn!(system, state, generation, queue = %queue.name(),
                "the cluster had lost a system's switch that its queues keep; adopted it");
        }
        Ok(())
    }

    /// Cancels what waits on the queues of systems `switches` says are disabled: tasks
    /// that became waiting after the switch's own sweep (a retry of a task that was
    /// running, a lease of a killed slot that ran out, a requeued dead letter, a queue
    /// that joined the system). Each cancel checks the queue's switch in the same step,
    /// so a reading older than an `enable` cancels nothing; a queue in `reconciled` (its
    /// copy of the switch written from this very reading, which an older gaffer's
    /// `enable`, counting no generation, may have overtaken) waits for the next reading.
    /// At most one chunk per queue: a tick stays short however much waits. Returns how
    /// many it cancelled.
    pub async fn sweep_disabled(
        &self,
        cfg: &Config,
        switches: &Switches,
        reconciled: &BTreeSet<String>,
    ) -> Result<u64, QueueError> {
        let mut cancelled = 0;
        for q in cfg.queues.values() {
            let Some(system) = q.system.as_deref() else {
                continue;
            };
            if switches.states.get(system) != Some(&SystemState::Disabled)
                || reconciled.contains(&q.name)
            {
                continue;
            }
            let queue = self.queue_with(&q.name, super::QueueLimits::from(q))?;
            // Leases that ran out come back first (no slot takes from a disabled queue).
            queue.reclaim().await?;
            cancelled += queue.cancel_waiting_chunk(system).await?;
        }
        Ok(cancelled)
    }
}

impl Queue {
    /// The config's state of the queue's system, as take.lua's argument.
    pub(super) fn configured_system_state(&self) -> &'static str {
        match &self.limits.system {
            Some(s) if s.paused => "paused",
            _ => "",
        }
    }

    /// Tokens for a take of up to `n`: all `n` when the queue's system has no rate.
    pub(super) async fn acquire_tokens(&self, n: usize) -> Result<Granted, QueueError> {
        let Some((key, rate, burst)) = self.bucket() else {
            return Ok(Granted::Tasks(n));
        };
        // The burst is the system's largest batch, the same for all its queues: over any
        // second, a system starts at most its rate plus one batch, and a queue of small
        // batches does not throw away the tokens saved up for one of large batches.
        let (got, wait): (i64, i64) = self.bucket_call(&key, rate, burst.max(n), n as i64).await?;
        if got > 0 {
            Ok(Granted::Tasks(got as usize))
        } else {
            Ok(Granted::None(Duration::from_millis(wait.max(1) as u64)))
        }
    }

    /// Hands back the tokens of a take that got fewer tasks than it had tokens for. Best
    /// effort, so it returns nothing: the take's tasks are leased already, and a refund
    /// that fails (Redis, or on a Redis Cluster the bucket's node, gone for a moment) only
    /// leaves the bucket short for a second, where failing the take would leave its tasks
    /// to expire with an attempt counted, unrun.
    pub(super) async fn refund_tokens(&self, granted: usize, taken: usize) {
        let Some((key, rate, burst)) = self.bucket() else {
            return;
        };
        if taken < granted {
            let back = (granted - taken) as i64;
            let refund: Result<(i64, i64), QueueError> = self
                .bucket_call(&key, rate, burst.max(granted), -back)
                .await;
            if let Err(e) = refund {
                tracing::warn!(queue = %self.name(), tokens = back, error = %e,
                    "could not hand unused rate tokens back; the system starts fewer tasks for a moment");
            }
        }
    }

    /// The queue's system's bucket, its rate and its burst, when the system has a rate.
    fn bucket(&self) -> Option<(String, f64, usize)> {
        let sys = self.limits.system.as_ref()?;
        let rate = sys.rate?;
        let ns = self.keys.namespace();
        Some((bucket_key(ns, &sys.name), rate, sys.burst))
    }

    async fn bucket_call(
        &self,
        key: &str,
        rate: f64,
        burst: usize,
        want: i64,
    ) -> Result<(i64, i64), QueueError> {
        let mut conn = self.conn.clone();
        BUCKET
            .prepare_invoke()
            .key(key)
            .head(&BucketHead {
                rate,
                burst: burst.max(1),
                want,
            })
            .invoke_async(&mut conn)
            .await
    }

    /// Sets the queue's copy of its system's switch, of generation `generation`.
    async fn switch_system(
        &self,
        system: &str,
        state: SystemState,
        generation: u64,
    ) -> Result<bool, QueueError> {
        self.set_switch(&format!("{}:{system}", state.as_str()), generation)
            .await
    }

    /// Sets the queue's switch to `value` (`STATE:NAME`) of generation `generation`,
    /// unless it holds a newer one of that system; back to active wakes its takers.
    /// Returns whether it was set.
    async fn set_switch(&self, value: &str, generation: u64) -> Result<bool, QueueError> {
        let mut inv = self.invocation(&SYSTEM);
        inv.head(&SystemHead {
            switch: value.to_string(),
            generation,
            ..SystemHead::op("set")
        });
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async::<i64>(&mut conn).await? == 1)
    }

    /// Removes the queue's switch, unless it is one of `system` newer than generation
    /// `generation`. Returns whether it was removed.
    async fn clear_switch(&self, system: &str, generation: u64) -> Result<bool, QueueError> {
        let mut inv = self.invocation(&SYSTEM);
        inv.head(&SystemHead {
            switch: system.to_string(),
            generation,
            ..SystemHead::op("clear")
        });
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async::<i64>(&mut conn).await? == 1)
    }

    /// Cancels every waiting task, from the head, in chunks; returns how many. `report`
    /// hears the count so far after each chunk.
    async fn cancel_waiting(
        &self,
        system: &str,
        report: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, QueueError> {
        let mut total = 0;
        loop {
            let n = self.cancel_waiting_chunk(system).await?;
            // A chunk that cancelled nothing (none left, or the system enabled meanwhile)
            // ends the sweep rather than looping on it.
            if n == 0 {
                return Ok(total);
            }
            total += n;
            report(total);
        }
    }

    /// Cancels the first chunk of waiting tasks while `system` is disabled; returns how
    /// many.
    async fn cancel_waiting_chunk(&self, system: &str) -> Result<u64, QueueError> {
        let note = format!("system {system} is disabled");
        let ids = self.waiting_ids(SWEEP_CHUNK).await?;
        let cancels = ids
            .iter()
            .map(|id| self.cancel_while_disabled(id, system, &note));
        let done = futures::future::try_join_all(cancels).await?;
        Ok(done.iter().filter(|d| d.is_some()).count() as u64)
    }

    /// The first `limit` waiting tasks' ids (ready by priority, then delayed).
    async fn waiting_ids(&self, limit: usize) -> Result<Vec<String>, QueueError> {
        let mut inv = self.invocation(&SYSTEM);
        inv.head(&SystemHead {
            limit,
            ..SystemHead::op("waiting")
        });
        let mut conn = self.conn.clone();
        inv.invoke_async(&mut conn).await
    }

    /// Adds "held: system NAME is paused" to every waiting task's record, in chunks.
    async fn note_waiting(
        &self,
        system: &str,
        report: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, QueueError> {
        let note = format!("held: system {system} is paused");
        let mut offset = 0u64;
        loop {
            let mut inv = self.invocation(&SYSTEM);
            inv.head(&SystemHead {
                offset,
                limit: SWEEP_CHUNK,
                note: note.clone(),
                ..SystemHead::op("note")
            });
            let mut conn = self.conn.clone();
            let n: u64 = inv.invoke_async(&mut conn).await?;
            offset += n;
            report(offset);
            if n < SWEEP_CHUNK as u64 {
                return Ok(offset);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{SystemState, states, with_switches};

    const CONFIG: &str = "[systems.partner]\n\n[systems.mailer]\npaused = true\n\n\
        [queues.calls]\nhandler = \"noop\"\nsystem = \"partner\"\n";

    #[test]
    fn a_switch_counts_as_paused_for_the_balancer_and_wins_over_the_config() {
        let cfg = crate::config::parse(CONFIG, "t.toml").unwrap();
        assert!(
            with_switches(&cfg, &BTreeMap::new()).is_none(),
            "no switch, no copy"
        );
        let same = BTreeMap::from([("mailer".to_string(), SystemState::Paused)]);
        assert!(
            with_switches(&cfg, &same).is_none(),
            "a switch equal to the config"
        );
        let switches = BTreeMap::from([
            ("partner".to_string(), SystemState::Disabled),
            ("mailer".to_string(), SystemState::Active),
        ]);
        let switched = with_switches(&cfg, &switches).unwrap();
        assert!(switched.systems["partner"].paused);
        assert!(!switched.systems["mailer"].paused);
        let now = states(&cfg, &BTreeMap::new());
        assert_eq!(now["mailer"], SystemState::Paused, "the config's state");
        assert_eq!(now["partner"], SystemState::Active);
        assert_eq!(states(&cfg, &switches)["partner"], SystemState::Disabled);
    }
}
