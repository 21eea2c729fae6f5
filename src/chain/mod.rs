//! Chains: a global task and the follow-ups its tasks create, followed as one piece of
//! work.
//!
//! **Identity.** A chain's id is minted when its global task is enqueued, from that task's
//! queue and record number: `~cQUEUE.SEQ` ([`chain_id`]). It is unique in the namespace (a
//! queue's counter never goes back; after `gaffer drop` it starts over, and a reader leaves
//! out what an older chain of the same id left: a task made before the global task), URL-safe, the same on one server and on a Redis
//! Cluster, and of a form no client id may take (`check_id` refuses `~c…`). The global
//! task keeps the id its client gave it; the same id submitted again once it ended is a
//! new task with a new number, so a new chain. A task in no chain whose handler adds
//! follow-ups becomes the global task of the chain its number names, then and there.
//!
//! **Members.** A follow-up's id derives from its parent's ([`derived_id`]: `PARENT~N`,
//! where the global task's follow-ups take the chain's id as their parent's), so a parent
//! run again (its slot died after the follow-ups were made) makes the same ids, and the
//! enqueue's dedup finds them. Each queue lists the members it holds of a chain (in a roster
//! it shares with the chains of neighbouring numbers: lua/lib/chains.lua),
//! written in the same script as their enqueue; a reader asks every configured queue's
//! list and finds the global task by its number in its queue's listing index. Nothing is
//! claimed, renamed or written apart from the enqueue, so no step can leave a member
//! unlisted. The chain's state is not stored: it is read from its members' records
//! (`view`), which every queue script keeps in the same step as each state change.
//!
//! Neutral ground: the slot makes follow-ups, the api and the CLI read chains; it knows
//! queues only through `queue_client`.

mod page;
mod view;

use std::collections::{BTreeMap, HashMap};

use crate::config::Config;
use crate::queue_client::{Glance, QueueClient, QueueError, QueueLimits, TaskRecord};

pub use crate::queue_client::{CHAIN_ID_PREFIX, chain_id, chain_origin};
pub use page::{ChainHead, ChainPage, PageCursor, head, read_page};
pub use view::{ChainState, ChainTask, ChainView, read};

/// Separates a member's queue from its id in a page cursor (a queue name cannot hold it).
const SEP: char = '\u{1f}';
/// Separates a follow-up's id from its parent's: `PARENT~N`, N counting from 1.
pub const DERIVED_SEP: char = '~';
/// Marks the global task among a chain list's entries, for a chain an older layout named
/// (not `~c…`), whose global task cannot be found by its number: `gaffer migrate` writes
/// it so.
pub const GLOBAL_MARK: char = '^';

/// One task of a chain: its queue and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Member {
    /// The task's queue.
    pub queue: String,
    /// The task's id.
    pub id: String,
}

impl Member {
    /// A member.
    pub fn new(queue: impl Into<String>, id: impl Into<String>) -> Self {
        Member {
            queue: queue.into(),
            id: id.into(),
        }
    }

    fn field(&self) -> String {
        format!("{}{SEP}{}", self.queue, self.id)
    }

    fn parse(field: &str) -> Option<Member> {
        let (queue, id) = field.split_once(SEP)?;
        Some(Member::new(queue, id))
    }
}

/// The id of the `n`-th follow-up (from 1) of a task whose children derive from `base`
/// (its own id, or for a chain's global task the chain's id): derived, so that a parent
/// run again makes the same ids and the enqueue finds the children it made before.
pub fn derived_id(base: &str, n: usize) -> String {
    format!("{base}{DERIVED_SEP}{n}")
}

/// Whether a task in chain `chain` that names `submitted_by` as its submitter is a
/// follow-up in it: a follow-up's record shows `chain:CHAIN`, a global task's its own.
fn follow_up_in(chain: &str, submitted_by: Option<&str>) -> bool {
    submitted_by.and_then(|by| by.strip_prefix("chain:")) == Some(chain)
}

/// The chain a record's task is the global task of, if it is one.
pub fn started_chain(rec: &TaskRecord) -> Option<&str> {
    let chain = rec.chain.as_deref()?;
    (!follow_up_in(chain, rec.submitted_by.as_deref())).then_some(chain)
}

/// What readers and the slot need to know of the queues a chain's tasks may be in: their
/// limits (payload size, tracking) by name.
#[derive(Debug, Clone, Default)]
pub struct ChainTargets {
    /// Every queue of the config.
    pub queues: BTreeMap<String, QueueLimits>,
}

impl ChainTargets {
    /// The targets of a config.
    pub fn from_config(cfg: &Config) -> Self {
        ChainTargets {
            queues: cfg
                .queues
                .values()
                .map(|q| (q.name.clone(), QueueLimits::from(q)))
                .collect(),
        }
    }
}

/// Why tasks could not become the global tasks of chains.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The task under that id, which the submit would be (a dedup hit), is a follow-up in
    /// another chain: it cannot be the global task of a chain of its own.
    #[error(
        "task {id} of queue {queue} is already a task of chain {chain}: submit the global task of a new chain under another id"
    )]
    InChain {
        /// The id asked for.
        id: String,
        /// The queue.
        queue: String,
        /// The chain its task is in.
        chain: String,
    },
    /// Redis refused or could not be reached.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// Marks each of `tasks` as the global task of a chain of its own, before they are
/// enqueued on `on` (the enqueue mints each chain's id): an id whose task the enqueue's
/// dedup would find, and which is a follow-up in some chain, refuses them all before
/// anything is written. One read for all the tasks.
pub async fn start_global(
    on: &crate::queue_client::Queue,
    mut tasks: Vec<&mut crate::queue_client::NewTask>,
) -> Result<(), ChainError> {
    for t in tasks.iter_mut() {
        t.chain = Some(crate::queue_client::TaskChain::Global);
    }
    let ids: Vec<&str> = tasks.iter().filter_map(|t| t.id.as_deref()).collect();
    for (id, glance) in ids.iter().zip(on.glance_many(&ids).await?) {
        let Glance::Recorded {
            state,
            chain: Some(chain),
            submitted_by,
            ..
        } = glance
        else {
            continue;
        };
        if follow_up_in(&chain, submitted_by.as_deref()) && !makes_a_new_run(on, Some(state)) {
            return Err(ChainError::InChain {
                id: id.to_string(),
                queue: on.name().to_string(),
                chain,
            });
        }
    }
    Ok(())
}

/// Whether a task submitted under an id whose record is `record` would be a new task
/// rather than a dedup hit on the one there: its record is gone, or it has ended and the
/// queue's dedup (`active`) lets an ended task's id be used again.
fn makes_a_new_run(
    queue: &crate::queue_client::Queue,
    record: Option<crate::queue_client::RecordState>,
) -> bool {
    let active = queue.limits().dedup == crate::config::Dedup::Active;
    match record {
        None => true,
        Some(state) => active && state.is_end(),
    }
}

/// A chain's members: its global task, and each follow-up with its parent, in the order
/// of their ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    /// Its global task.
    pub root: Member,
    /// Each follow-up once with its parent.
    pub follow: Vec<(Member, Member)>,
}

/// A chain's members, read from every configured queue's list of it (all at once) and its
/// global task's queue's listing index. `None` when the chain is unknown: no task has the
/// number its id names (its record is gone, or never started it), or for a chain an
/// older layout named, no list marks its global task.
pub async fn members_of(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
) -> Result<Option<Members>, QueueError> {
    let reads = targets
        .queues
        .iter()
        .filter(|(_, l)| l.track)
        .map(|(name, limits)| {
            let queue = client.queue_with(name, limits.clone());
            async move {
                let ids = queue?.chain_members(chain).await?;
                Ok::<_, QueueError>((name.clone(), ids))
            }
        });
    let sets = futures::future::try_join_all(reads).await?;
    let root = match global_by_number(client, targets, chain).await? {
        Some(root) => Some(root),
        None => sets.iter().find_map(|(queue, ids)| {
            ids.iter()
                .find_map(|id| id.strip_prefix(GLOBAL_MARK))
                .map(|id| Member::new(queue, id))
        }),
    };
    Ok(root.map(|root| arranged(chain, root, sets)))
}

/// The global task of chain `chain` found by the number its id names: the task of that
/// number in its queue, while its record lives. `None` for an id of another form.
async fn global_by_number(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
) -> Result<Option<Member>, QueueError> {
    let Some((queue, seq)) = chain_origin(chain) else {
        return Ok(None);
    };
    let Some(limits) = targets.queues.get(queue) else {
        return Ok(None);
    };
    let id = client
        .queue_with(queue, limits.clone())?
        .id_numbered(seq)
        .await?;
    Ok(id.map(|id| Member::new(queue, id)))
}

/// The members of a chain from its lists (per queue, the ids listed): each follow-up with
/// its parent, the task whose id its own derives from, or the global task where that is
/// the chain's id or not among the members (its record gone, or an older layout's name).
fn arranged(chain: &str, root: Member, sets: Vec<(String, Vec<String>)>) -> Members {
    let mut follow: Vec<Member> = sets
        .into_iter()
        .flat_map(|(queue, ids)| ids.into_iter().map(move |id| Member::new(&queue, id)))
        .filter(|m| !m.id.starts_with(GLOBAL_MARK) && *m != root)
        .collect();
    follow.sort_by(|a, b| natural(&a.id).cmp(&natural(&b.id)).then(a.cmp(b)));
    follow.dedup();
    let by_id: HashMap<&str, &Member> = follow.iter().map(|m| (m.id.as_str(), m)).collect();
    let parent_of = |m: &Member| {
        m.id.rsplit_once(DERIVED_SEP)
            .filter(|(p, _)| *p != chain)
            .and_then(|(p, _)| by_id.get(p).copied())
            .unwrap_or(&root)
            .clone()
    };
    let follow = follow.iter().map(|m| (m.clone(), parent_of(m))).collect();
    Members { root, follow }
}

/// A derived id's sort key: its parts, numbers compared as numbers (`a~2` before `a~10`).
fn natural(id: &str) -> Vec<(u64, String)> {
    id.split(DERIVED_SEP)
        .map(|p| match p.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (0, p.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_fields_round_trip_and_ids_with_the_separator_stay_whole() {
        let m = Member::new("parse", "a\u{1f}b");
        assert_eq!(Member::parse(&m.field()), Some(m));
        assert_eq!(Member::parse("no separator"), None);
    }

    #[test]
    fn derived_ids_sort_by_their_numbers() {
        let mut ids = vec!["g~10", "g~2", "g~1~3", "g~1"];
        ids.sort_by_key(|a| natural(a));
        assert_eq!(ids, ["g~1", "g~1~3", "g~2", "g~10"]);
        assert_eq!(derived_id("g~1", 3), "g~1~3");
    }

    #[test]
    fn chain_ids_name_their_global_tasks_number_and_nothing_else_parses() {
        assert_eq!(chain_id("fetch.v2", 17), "~cfetch.v2.17");
        assert_eq!(chain_origin("~cfetch.v2.17"), Some(("fetch.v2", 17)));
        for other in [
            "fetch:a",
            "~gfetch.1",
            "~cfetch.",
            "~c.5",
            "~cfetch.+5",
            "~cq/x.1",
        ] {
            assert_eq!(chain_origin(other), None, "{other}");
        }
    }

    #[test]
    fn members_hang_under_the_task_their_id_derives_from() {
        let c = "~cq.7";
        let sets = vec![
            ("q".to_string(), vec![]),
            (
                "r".to_string(),
                vec![format!("{c}~1"), format!("{c}~2~1"), format!("{c}~10")],
            ),
            ("s".to_string(), vec![format!("{c}~2"), format!("{c}~1~1")]),
        ];
        let m = arranged(c, Member::new("q", "order-1"), sets);
        let shown: Vec<(String, String)> = m
            .follow
            .iter()
            .map(|(k, p)| (format!("{}/{}", k.queue, k.id), p.id.clone()))
            .collect();
        assert_eq!(
            shown,
            [
                ("r/~cq.7~1".to_string(), "order-1".to_string()),
                ("s/~cq.7~1~1".into(), "~cq.7~1".into()),
                ("s/~cq.7~2".into(), "order-1".into()),
                ("r/~cq.7~2~1".into(), "~cq.7~2".into()),
                ("r/~cq.7~10".into(), "order-1".into()),
            ]
        );
        // A chain an older layout named marks its global task; a follow-up whose parent is
        // not listed hangs under it.
        let old = arranged(
            "a",
            Member::new("q", "a"),
            vec![("q".into(), vec!["^a".into(), "a@5.1~1".into()])],
        );
        assert_eq!(
            old.follow,
            [(Member::new("q", "a@5.1~1"), Member::new("q", "a"))]
        );
    }
}
