//! What the web console reads beside the task endpoints: the cluster at a glance
//! (`GET /v1/cluster`), one queue with its config (`GET /v1/queues/{queue}`), a task
//! found by id across the queues a key may use (`GET /v1/tasks/{id}`), and a task's
//! payload (`GET /v1/queues/{queue}/tasks/{id}/payload`), which its record does not hold.
//!
//! The cluster and a queue are answered from one read of Redis as `gaffer stats` makes it
//! (`cluster::snapshot`), scoped to what the key may see, so a limited key's page costs
//! only its own queues, and nothing is read per queue beyond what the snapshot reads. A
//! search looks once in each queue the key may use, all the looks sent together.

use hyper::StatusCode;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::routes::{Answer, Api};
use crate::cluster;
use crate::cluster::snapshot::{self, Scope, Snapshot};
use crate::config::ApiKey;
use crate::queue_client::{Glance, MAX_ID_LEN, Queue, QueueError};

/// Keys of a queue's table a limited key is not shown: how and as whom its handler runs
/// (an exec command line, a custom handler's settings, the account), which may hold what
/// only the operators should read.
const HIDDEN_FROM_LIMITED: [&str; 3] = ["command", "options", "user"];

/// Fields of a host a limited key is shown: its state and its queues' slots, not its
/// memory, load, capacity or Redis node.
const HOST_FIELDS_FOR_LIMITED: [&str; 3] = ["alive", "state", "draining"];

/// A payload as JSON: it is JSON text when it came through the api or `gaffer push`;
/// anything else the library enqueued shows as text.
pub(super) fn payload_json(payload: &[u8]) -> Value {
    serde_json::from_slice(payload)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(payload).into_owned()))
}

/// Refuses a task id no task can have (by length), before anything is read.
pub(super) fn check_task_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(ApiError::bad_request(format!(
            "task id must be 1 to {MAX_ID_LEN} bytes, got {}",
            id.len()
        )));
    }
    Ok(())
}

impl Api {
    /// `GET /v1/cluster`: the `gaffer stats --json` document. Whole for an admin key; for
    /// any other key its queues, the systems they belong to (naming only them), each
    /// host's state and the slots of its queues there, and whether a manager leads.
    pub(super) async fn cluster(&self, key: &ApiKey) -> Answer {
        let snap = self.snapshot(key).await?;
        let mut doc = snapshot::stats_json(&snap);
        if !key.admin {
            limit_for(&mut doc, key);
        }
        Ok((StatusCode::OK, doc))
    }

    /// A snapshot of what `key` may see.
    async fn snapshot(&self, key: &ApiKey) -> Result<Snapshot, ApiError> {
        let allows = |q: &str| key.allows(q);
        let scope = if key.admin {
            Scope::All
        } else {
            Scope::Only(&allows)
        };
        Ok(snapshot::read_scoped(&self.client, &self.config, scope).await?)
    }

    /// `GET /v1/queues/{queue}`: the queue's figures as `GET /v1/queues` gives them, where
    /// it runs, its long tasks running, and its table of the published config.
    pub(super) async fn queue_detail(&self, queue: &Queue, key: &ApiKey) -> Answer {
        let name = queue.name();
        let only = |q: &str| q == name;
        let snap = snapshot::read_scoped(&self.client, &self.config, Scope::Only(&only)).await?;
        let mut doc = snapshot::stats_json(&snap);
        let mut out = doc["queues"][name].take();
        if !out.is_object() {
            return Err(ApiError::not_found(format!("unknown queue {name}")));
        }
        out["name"] = json!(name);
        out["system"] = json!(self.config.queues.get(name).and_then(|q| q.system.clone()));
        out["hosts"] = Value::Object(hosts_of(&doc, name));
        out["long_running"] = json!(snap.queues.get(name).map(|q| &q.long_running));
        let shown = self.config_table(name, key.admin).await?;
        out["config_version"] = json!(shown.version);
        out["config_origin"] = json!(shown.origin);
        out["config"] = shown.table.unwrap_or(Value::Null);
        Ok((StatusCode::OK, out))
    }

    /// The queue's table in the config the leading manager runs, as JSON, with where that
    /// config came from: the manager's record of it ([`cluster::Keys::config_in_force`]),
    /// else (a manager from before that record) the published config. A limited key's copy
    /// leaves out [`HIDDEN_FROM_LIMITED`]. No table when neither is there, or the text does
    /// not parse or does not name the queue.
    async fn config_table(&self, queue: &str, admin: bool) -> Result<ConfigShown, ApiError> {
        let keys = cluster::Keys::new(&self.config.cluster.namespace);
        let mut conn = self.client.connection();
        // (`version` is '' for a file)
        let (source, origin, version): (Option<String>, Option<String>, Option<String>) =
            redis::cmd("HMGET")
                .arg(keys.config_in_force())
                .arg(&["source", "origin", "version"])
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
        let (source, origin, version) = match source {
            Some(source) => (Some(source), origin, version.and_then(|v| v.parse().ok())),
            None => {
                let (version, source): (Option<u64>, Option<String>) = redis::cmd("HMGET")
                    .arg(keys.config())
                    .arg(&["version", "source"])
                    .query_async(&mut conn)
                    .await
                    .map_err(QueueError::from)?;
                let origin = source.as_ref().map(|_| "published".to_owned());
                (source, origin, version)
            }
        };
        let table = source.and_then(|s| queue_table(&s, queue, admin));
        Ok(ConfigShown {
            origin,
            version,
            table,
        })
    }

    /// `GET /v1/queues/{queue}/tasks/{id}/payload`: the task's payload while the queue
    /// holds it (waiting, running, frozen or dead), for whoever may see its record; `kept`
    /// false once it ended otherwise. On a queue without records, for admin keys only.
    pub(super) async fn payload(&self, queue: &Queue, key: &ApiKey, id: &str) -> Answer {
        let unknown = || ApiError::not_found(format!("no task {id} in queue {}", queue.name()));
        let held = if queue.limits().track {
            let rec = self.own_record(queue, key, id).await?;
            // (the task whose record was checked: not one another key submitted under
            // its id since)
            let owner = rec.submitted_by.as_deref().unwrap_or_default();
            queue.find_owned(id, owner).await?
        } else if key.admin {
            Some(queue.find(id).await?.ok_or_else(unknown)?)
        } else {
            return Err(unknown());
        };
        let payload = held.as_ref().map(|t| payload_json(&t.payload));
        Ok((
            StatusCode::OK,
            json!({"id": id, "queue": queue.name(), "kept": held.is_some(), "payload": payload}),
        ))
    }

    /// `GET /v1/tasks/{id}`: the queues holding a task under `id` that the key may see,
    /// with its state there: one look per queue the key may use, all sent together
    /// (counted as a listing against `[api].max_listings_per_key`).
    pub(super) async fn search(&self, key: &ApiKey, id: &str) -> Answer {
        check_task_id(id)?;
        let _listing = self
            .listings
            .start(&key.name, self.config.api.max_listings_per_key)?;
        // (a queue without records names no submitter: only an admin key sees its tasks)
        let mut queues: Vec<&Queue> = self
            .queues
            .values()
            .filter(|q| key.allows(q.name()) && (key.admin || q.limits().track))
            .collect();
        queues.sort_by(|a, b| a.name().cmp(b.name()));
        let looks = queues.iter().map(|q| async move {
            let glance = q.glance_many(&[id]).await?.pop();
            Ok::<_, ApiError>((*q, glance.unwrap_or(Glance::Unknown)))
        });
        let mut found = Vec::new();
        for (queue, glance) in futures::future::try_join_all(looks).await? {
            let state = match glance {
                Glance::Recorded {
                    state,
                    ref submitted_by,
                    ..
                } if key.admin || submitted_by.as_deref() == Some(key.name.as_str()) => state,
                Glance::Recorded { state, .. } => match queue.record(id).await? {
                    Some(rec) if self.owns(key, &rec).await? => state,
                    _ => continue,
                },
                Glance::Held(state) if key.admin => state,
                _ => continue,
            };
            found.push(json!({"queue": queue.name(), "state": state}));
        }
        Ok((StatusCode::OK, json!({"id": id, "found": found})))
    }
}

/// What `GET /v1/queues/{q}` shows of the config in force.
struct ConfigShown {
    /// `published` or `file`; None when no config is shown.
    origin: Option<String>,
    /// The published version; None for a file.
    version: Option<u64>,
    /// The queue's table.
    table: Option<Value>,
}

/// `queue`'s table in the config text `source`, as JSON; a limited key's copy leaves out
/// [`HIDDEN_FROM_LIMITED`].
fn queue_table(source: &str, queue: &str, admin: bool) -> Option<Value> {
    let toml::Value::Table(mut queues) = toml::from_str::<toml::Table>(source)
        .ok()?
        .remove("queues")?
    else {
        return None;
    };
    let mut table = serde_json::to_value(queues.remove(queue)?).ok()?;
    if let (false, Some(fields)) = (admin, table.as_object_mut()) {
        fields.retain(|k, _| !HIDDEN_FROM_LIMITED.contains(&k.as_str()));
    }
    Some(table)
}

/// Where `queue` runs: per host, the slots its master reports and those the map gives it,
/// for the hosts where either is not zero.
fn hosts_of(doc: &Value, queue: &str) -> Map<String, Value> {
    let Some(hosts) = doc["hosts"].as_object() else {
        return Map::new();
    };
    hosts
        .iter()
        .filter_map(|(host, h)| {
            let slots = h["queues"][queue].as_u64().unwrap_or(0);
            let mapped = h["mapped"][queue].as_u64().unwrap_or(0);
            (slots + mapped > 0).then(|| {
                (
                    host.clone(),
                    json!({"slots": slots, "mapped": mapped, "state": h["state"]}),
                )
            })
        })
        .collect()
}

/// Cuts a stats document down to what a limited key sees (its queues are all the
/// snapshot read): each host that runs or is mapped one of them, with its state and
/// those queues' figures only; whether a manager leads; no retired queue and no host
/// marked for draining.
fn limit_for(doc: &mut Value, key: &ApiKey) {
    let own = |qs: &Value| -> Value {
        let kept: Map<String, Value> = qs
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(q, _)| key.allows(q))
            .map(|(q, v)| (q.clone(), v.clone()))
            .collect();
        Value::Object(kept)
    };
    let hosts: Map<String, Value> = doc["hosts"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, h)| {
            let (queues, mapped) = (own(&h["queues"]), own(&h["mapped"]));
            let any = |v: &Value| v.as_object().is_some_and(|m| !m.is_empty());
            if !any(&queues) && !any(&mapped) {
                return None;
            }
            let mut out: Map<String, Value> = HOST_FIELDS_FOR_LIMITED
                .iter()
                .map(|f| (f.to_string(), h[*f].clone()))
                .collect();
            out.insert("queue_pss_bytes".into(), own(&h["queue_pss_bytes"]));
            out.insert("queues".into(), queues);
            out.insert("mapped".into(), mapped);
            Some((name.clone(), Value::Object(out)))
        })
        .collect();
    doc["hosts"] = Value::Object(hosts);
    doc["manager"] = json!({"stale": doc["manager"]["stale"]});
    doc["retired"] = json!({});
    doc["drain_marked_unknown_hosts"] = json!([]);
}
