//! The leader's firing of schedules, the config's and the stored ones alike, each tick.
//!
//! A schedule fires once per due moment across managers (ARCHITECTURE.md, invariant 20):
//! each fire is claimed in a fenced script that records it as the schedule's last and
//! marks it pending until its task is enqueued; a new leader resumes from the last claim
//! (catching up at most a day) and first enqueues a pending fire. The task id is derived
//! from the schedule's name and the fire time (`schedule:NAME:MS`), so a fire enqueued
//! twice dedups while its task waits or runs, and a tracked task that already ran is found
//! by its record and not enqueued again. An untracked queue's pending fire whose task
//! already ran leaves no trace and runs again.
//!
//! The claim also refuses a paused schedule's fire and a deleted stored schedule's, in
//! the same step: a pause or a delete that Redis has answered stops every later claim. A
//! paused schedule's due moments are skipped (its last claim moves past them), not kept
//! for its resume; so are those of a schedule whose queue the config no longer has.
//!
//! First sight: a config schedule fires from the moment a leader first sees it (its claim
//! starts at that tick); a stored one from its creation (`created_ms`), so one made while
//! no manager led is caught up. A stored schedule whose name the config also defines does
//! not fire: the config's wins, and the leader warns once.

use std::collections::BTreeSet;

use super::lease::FireClaim;
use super::{Manager, telemetry};
use crate::cluster;
use crate::queue_client::{NewTask, QueueLimits};
use crate::schedule::store::{self, CATCH_UP_MS, Stored};
use crate::schedule::{Origin, Schedule};

/// Fire moments one schedule enqueues per tick, at most: a day of a one-second schedule
/// is caught up over many ticks rather than in one long one.
const FIRES_PER_TICK: usize = 1000;

/// What the firing remembers between ticks: what it has warned about, so a warning that
/// holds every tick is logged once (until the config changes).
#[derive(Debug, Default)]
pub(super) struct Firing {
    /// Names of stored schedules shadowed by a config schedule, warned about.
    shadowed: BTreeSet<String>,
    /// Names of schedules whose queue is gone, warned about.
    queue_gone: BTreeSet<String>,
    /// Names of stored definitions that could not be read, warned about.
    unreadable: BTreeSet<String>,
}

impl Firing {
    /// Forgets what was warned about: a new config may change all of it.
    pub(super) fn config_changed(&mut self) {
        *self = Firing::default();
    }
}

/// Why a due moment was not enqueued (a metric label: bounded).
#[derive(Debug, Clone, Copy)]
enum Skipped {
    Paused,
    QueueGone,
}

impl Manager {
    /// Fires every schedule due since its last claim: the config's, then the stored ones
    /// (read with the paused names and the claims in one round trip).
    pub(super) async fn fire_schedules(&mut self) -> anyhow::Result<()> {
        let now_ms = cluster::now_ms() as i64;
        let stored = store::read(&mut self.conn, &self.keys).await?;
        self.warn_unreadable(&stored);
        // (a copy: the config is read while the lease and connection are used)
        let config = self.opts.config.schedules.clone();
        let configured: BTreeSet<&str> = config.iter().map(|s| s.name.as_str()).collect();
        for s in &config {
            self.fire_schedule(s, &stored, now_ms).await?;
        }
        for s in &stored.schedules {
            if configured.contains(s.name.as_str()) {
                if self.firing.shadowed.insert(s.name.clone()) {
                    tracing::warn!(schedule = %s.name, owner = %s.owner(),
                        "a stored schedule has the name of a config schedule: the config's fires, the stored one does not (delete it, or rename the config's)");
                }
                continue;
            }
            self.fire_schedule(s, &stored, now_ms).await?;
        }
        Ok(())
    }

    /// Says once per name which stored definitions cannot be read.
    fn warn_unreadable(&mut self, stored: &Stored) {
        for (name, why) in &stored.unreadable {
            if self.firing.unreadable.insert(name.clone()) {
                tracing::warn!(schedule = %name, error = %why,
                    "a stored schedule cannot be read; it does not fire");
            }
        }
    }

    /// One schedule: its pending fire, then its fires due since its last claim.
    async fn fire_schedule(
        &mut self,
        s: &Schedule,
        stored: &Stored,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        telemetry::schedule_known(&s.queue);
        let field = s.claim_key();
        let claim = FireClaim {
            field: &field,
            name: &s.name,
            stored: matches!(s.origin, Origin::Api { .. }),
        };
        let state = stored.claim(&field);
        if let Some(ms) = state.pending {
            self.enqueue_fire(s, &field, ms, true).await?;
        }
        let last = match (state.last, s.start_ms()) {
            (Some(last), start) => last.max(start.unwrap_or(i64::MIN)),
            (None, Some(start)) => start,
            (None, None) => {
                // First sight: from now on, kept as if it had fired now. A look back of a
                // fixed second instead missed every fire that fell between two ticks
                // until one happened to land in it.
                self.leadership
                    .skip_fires(&mut self.conn, &claim, now_ms)
                    .await?;
                return Ok(());
            }
        };
        let from = last.max(now_ms - CATCH_UP_MS);
        let tz = self.opts.config.manager.timezone;
        let due = s.due(from, now_ms, tz, FIRES_PER_TICK);
        let Some(&latest) = due.last() else {
            return Ok(());
        };
        if let Some(why) = self.skipped(s, stored) {
            if self
                .leadership
                .skip_fires(&mut self.conn, &claim, latest)
                .await?
            {
                telemetry::fires_skipped(why.label(), due.len());
            }
            return Ok(());
        }
        for ms in due {
            if !self
                .leadership
                .claim_fire(&mut self.conn, &claim, ms)
                .await?
            {
                break;
            }
            self.enqueue_fire(s, &field, ms, false).await?;
        }
        Ok(())
    }

    /// Why `s`'s due moments are skipped rather than fired, if they are.
    fn skipped(&mut self, s: &Schedule, stored: &Stored) -> Option<Skipped> {
        if stored.is_paused(s) {
            return Some(Skipped::Paused);
        }
        if !self.opts.config.queues.contains_key(&s.queue) {
            if self.firing.queue_gone.insert(s.name.clone()) {
                tracing::warn!(schedule = %s.name, queue = %s.queue,
                    "a schedule's queue is not in the config: its fires are skipped until it is");
            }
            return Some(Skipped::QueueGone);
        }
        None
    }

    /// Enqueues `s`'s task for the fire at `ms`, claimed under `key`, then says it is no
    /// longer pending. `again`: a fire claimed by an earlier tick that may have enqueued
    /// it: a tracked queue's record says whether it did (its dedup covers only tasks still
    /// waiting or running), under the id of this release or, for an unnamed cron entry,
    /// the one the releases before names gave it; an untracked queue's task that already
    /// ran leaves no trace, and runs again. A fire whose queue is gone is dropped.
    async fn enqueue_fire(
        &mut self,
        s: &Schedule,
        key: &str,
        ms: i64,
        again: bool,
    ) -> anyhow::Result<()> {
        let Some(limits) = self.opts.config.queues.get(&s.queue).map(QueueLimits::from) else {
            tracing::warn!(schedule = %s.name, queue = %s.queue, fire_ms = ms,
                "a schedule's fire is dropped: its queue is not in the config");
            telemetry::fires_skipped(Skipped::QueueGone.label(), 1);
            self.leadership.fired(&mut self.conn, key, ms).await?;
            return Ok(());
        };
        let track = limits.track;
        let queue = self.client.queue_with(&s.queue, limits)?;
        let id = s.task_id(ms);
        let mut done_before = false;
        if again && track {
            for earlier in std::iter::once(id.clone()).chain(s.legacy_task_id(ms)) {
                done_before = done_before || queue.record(&earlier).await?.is_some();
            }
        }
        if !done_before {
            let task = NewTask::new(s.payload.clone().into_bytes())
                .id(id.clone())
                .submitted_by(s.submitted_by());
            match queue.enqueue(task).await {
                Ok(_) => telemetry::ScheduleFired {
                    schedule: &s.name,
                    queue: &s.queue,
                    fire_ms: ms,
                    id: &id,
                }
                .emit(),
                // Redis gone: the fire stays pending, for the next tick.
                Err(e) if e.is_transient() => return Err(e.into()),
                // Refused (a closed intake): this fire is dropped, said, and the other
                // schedules still fire.
                Err(e) => {
                    tracing::warn!(schedule = %s.name, queue = %s.queue, fire_ms = ms,
                        error = %e, "a schedule's fire was refused by its queue; skipped");
                    telemetry::fires_skipped("refused", 1);
                }
            }
        }
        self.leadership.fired(&mut self.conn, key, ms).await?;
        Ok(())
    }
}

impl Skipped {
    fn label(self) -> &'static str {
        match self {
            Skipped::Paused => "paused",
            Skipped::QueueGone => "queue_gone",
        }
    }
}
