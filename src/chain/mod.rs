//! Chains: a global task and the follow-ups its tasks create, followed as one piece of
//! work (DESIGN.md "Chains, sync tasks and controls").
//!
//! A chain is identified by its global task's id. What it holds is its member list beside
//! the queues, `NS:{chain:ID}:tasks`, under a hash tag of its own; an unlisted chain (the
//! global task's of a queue with a done route, on one server) has none, its tasks found
//! from their records ([`run_base`], [`members_of`]). (On a Redis Cluster its
//! keys are in another slot than its tasks' queues): one string, `^` and the global task,
//! `@RUN@` once a run of it made follow-ups, then each follow-up with its parent, every
//! member length-prefixed (`LEN:QUEUE\x1fID`, so ids may hold any byte). A string, not a
//! hash: a new chain is then one `SET NX PX` with its first follow-ups, and more are one
//! `APPEND`, where a hash took a read, a write and an expiry per chain, the most of what a
//! chain cost Redis. Members are added before their tasks are enqueued, and those before
//! their parent is acked, each step idempotent, so a slot that dies anywhere in between
//! leaves nothing a re-run parent does not redo exactly once. The chain's state is not stored: it is read from its members' records
//! (`view`), which every queue script keeps in the same step as each state change, so no
//! end of any task (a lease expiry included) can leave the chain out of date.
//!
//! Neutral ground: the slot adds members, the api and the CLI read chains; it knows
//! queues only through `queue_client`.

mod page;
mod view;

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::config::Config;
use crate::queue_client::{
    ChainWrites, Glance, QueueClient, QueueError, QueueLimits, RedisConn, RefusedClaims, TaskRecord,
};

pub use page::{ChainHead, ChainPage, PageCursor, head, read_page};
pub use view::{ChainState, ChainTask, ChainView, read};

/// Marks the global task at the head of a chain's member list.
const ROOT_MARK: u8 = b'^';
/// Encloses the run that claimed a chain, after its global task (see [`Claim::run`]).
const RUN_MARK: u8 = b'@';
/// The run of a claim made before the task runs (a submit's): no run is written, and the
/// first run's claim writes its own. (A run is digits and dots.)
pub const NO_RUN: &str = "-";
/// Separates a member's queue from its id in the chain's list (a queue name cannot hold it).
const SEP: char = '\u{1f}';
/// Separates a follow-up's id from its parent's: `PARENT~N`, N counting from 1.
pub const DERIVED_SEP: char = '~';

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

/// The key of a chain's member list.
pub fn key(namespace: &str, chain: &str) -> String {
    format!("{namespace}:{{chain:{chain}}}:tasks")
}

/// The id of the `n`-th follow-up (from 1) of `parent`: derived, so that a parent run
/// again makes the same ids and the enqueue finds the children it made before.
pub fn derived_id(parent: &str, n: usize) -> String {
    format!("{parent}{DERIVED_SEP}{n}")
}

/// What the follow-ups of an unlisted chain's global task take their ids from: the
/// chain's name and the run of the global task that made them (`CHAIN@RUN`, so
/// `CHAIN@RUN~1` is the first). A global task of a queue with a done route, on one server,
/// gets an unlisted chain named `QUEUE:ID` at its enqueue (its meta says `u`: see
/// `lua/enqueue.lua`), unless a list holds that name or the ids would be too long: no
/// other task's chain may have that name ([`reserved`]), so no member list is written to
/// claim it, and its tasks are found from their
/// records ([`members_of`]). Naming them from the run keeps a later run of the same id
/// (submitted again once it ended) from ever making an id an earlier run made, at any
/// depth, with no list to tell the runs apart.
pub fn run_base(chain: &str, run: &str) -> String {
    format!("{chain}{}{run}", RUN_MARK as char)
}

/// The task whose unlisted chain the name `name` is (`QUEUE:ID` with QUEUE a queue with a
/// done route: see [`run_base`]) when that is another task than `root`: only task ID of
/// QUEUE may take that name, or `QUEUE:ID@RUN` (as its renames, when its chain is
/// listed: [`started_by`]), so a list claimed under it by another task (one whose id
/// holds a `:`) would hide that chain. `None` when the name is free to claim. On one
/// server (a Redis Cluster keeps every chain listed).
pub fn reserved(targets: &ChainTargets, name: &str, root: &Member) -> Option<Member> {
    let (queue, id) = name.split_once(':')?;
    let done_route = targets
        .routes
        .get(queue)
        .is_some_and(|r| r.iter().any(|r| r.on == crate::config::RouteOn::Done));
    let its_own = root.queue == queue && started_by(queue, &root.id, name);
    (done_route && !its_own).then(|| Member::new(queue, id))
}

/// The name a task `id` of `queue` starts its chain under when another task's chain (or
/// an earlier run's of the same task) already has its id: `QUEUE:ID`, and should that be
/// taken too, `QUEUE:ID@RUN`.
pub fn renamed(queue: &str, id: &str, run: Option<&str>) -> String {
    match run {
        None => format!("{queue}:{id}"),
        Some(run) => format!("{queue}:{id}{}{run}", RUN_MARK as char),
    }
}

/// Whether `chain` is one the task `id` of `queue` started: its id, or one of the names
/// [`renamed`] gives it.
pub fn started_by(queue: &str, id: &str, chain: &str) -> bool {
    chain == id
        || chain
            .strip_prefix(queue)
            .and_then(|c| c.strip_prefix(':'))
            .and_then(|c| c.strip_prefix(id))
            .is_some_and(|rest| rest.is_empty() || rest.as_bytes()[0] == RUN_MARK)
}

/// A fresh id for a global task submitted without one: ids a queue generates (`~gN`) are
/// unique within their queue only, and a chain's id must be unique in the namespace.
pub fn new_global_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.write_u32(std::process::id());
    format!("chain-{:016x}", h.finish())
}

/// What the slot needs to know of the queues follow-ups may go to: their limits (payload
/// size, tracking) by name, and how long a chain's member list is kept.
#[derive(Debug, Clone, Default)]
pub struct ChainTargets {
    /// Every queue of the config.
    pub queues: BTreeMap<String, QueueLimits>,
    /// Every queue's `next` routes, in the config's order: where a chain its routes
    /// describe, which has no member list, finds its tasks (see [`members_of`]).
    pub routes: BTreeMap<String, Vec<crate::config::Route>>,
    /// How long a chain's member list lives after its last member was added: twice the
    /// longest `history_ttl`, so it outlives the records it lists.
    pub ttl: Duration,
}

impl ChainTargets {
    /// The targets of a config.
    pub fn from_config(cfg: &Config) -> Self {
        let longest = cfg
            .queues
            .values()
            .map(|q| q.history_ttl)
            .max()
            .unwrap_or(crate::config::DEFAULT_HISTORY_TTL);
        ChainTargets {
            queues: cfg
                .queues
                .values()
                .map(|q| (q.name.clone(), QueueLimits::from(q)))
                .collect(),
            routes: cfg
                .queues
                .values()
                .map(|q| (q.name.clone(), q.next.clone()))
                .collect(),
            ttl: longest * 2,
        }
    }
}

/// Whether a chain's global task is the task given, or another one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootClaim {
    /// The chain is this task's (newly, or it already was).
    Ours,
    /// Another task is the global task of a chain with that id.
    Taken(Member),
    /// The chain is this task's, but an earlier run of it (the task ended and was
    /// submitted again under its id) made the chain's follow-ups: this run's would have
    /// the same ids, so it needs a chain of its own.
    EarlierRun,
    /// The chain is this task's, and its follow-ups were added by a gaffer that did not
    /// tell runs apart: its children keep ids derived from the parent's (as that gaffer
    /// made them), and the claim added none of the members given, which the caller adds
    /// under those ids. The list is this run's from then on (`@=RUN@`): another run's
    /// claim is refused.
    OursBefore,
}

/// Makes `root` the global task of chain `chain`, unless another task already is.
pub async fn claim_root(
    conn: &RedisConn,
    namespace: &str,
    chain: &str,
    root: &Member,
    ttl: Duration,
) -> Result<RootClaim, QueueError> {
    let claim = Claim {
        chain,
        root,
        run: NO_RUN,
        members: &[],
    };
    let mut claims = claim_many(conn, namespace, std::slice::from_ref(&claim), ttl).await?;
    Ok(claims.pop().unwrap_or(RootClaim::Ours))
}

/// One chain a task starts: its global task claims it, unless another task already has,
/// and then (only then) its follow-ups are added.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The chain's id.
    pub chain: &'a str,
    /// The task that would be its global task.
    pub root: &'a Member,
    /// Which run of the root task claims it (its enqueue time and record number, as its
    /// meta says them), so that the same task submitted again after it ended does not
    /// add to the chain of its earlier run; `""` when its meta does not say. [`NO_RUN`]
    /// for a submit's claim, before the task is enqueued, which the first run's claim
    /// then takes over.
    pub run: &'a str,
    /// The follow-ups to add (follow-up, parent) once the chain is the root's.
    pub members: &'a [(Member, Member)],
}

/// Claims many chains (see [`Claim`]), idempotently; answers in the order of `claims`. On one server
/// they go in one script call: a batch whose every task starts a chain (a queue with a
/// `next` route) would otherwise pay a script call per task, which cost Redis more than
/// the claims' own work. A Redis Cluster puts each chain in a slot of its own, so there
/// each is a call of its own, all in flight together.
pub async fn claim_many(
    conn: &RedisConn,
    namespace: &str,
    claims: &[Claim<'_>],
    ttl: Duration,
) -> Result<Vec<RootClaim>, QueueError> {
    match conn {
        RedisConn::Single(_) => claim_call(conn, namespace, claims, ttl).await,
        RedisConn::Cluster(_) => {
            let each = claims
                .iter()
                .map(|c| claim_call(conn, namespace, std::slice::from_ref(c), ttl));
            let answers = futures::future::try_join_all(each).await?;
            Ok(answers.into_iter().flatten().collect())
        }
    }
}

async fn claim_call(
    conn: &RedisConn,
    namespace: &str,
    claims: &[Claim<'_>],
    ttl: Duration,
) -> Result<Vec<RootClaim>, QueueError> {
    let refused = writes(namespace, claims, &[], ttl).write(conn).await?;
    answers(claims, refused)
}

/// The writes of `claims` and then of `adds` (follow-ups with their parents, by chain),
/// as one call makes them (`lua/claim.lua` in `queue_client`).
pub fn writes(
    namespace: &str,
    claims: &[Claim<'_>],
    adds: &[(&str, &[(Member, Member)])],
    ttl: Duration,
) -> ChainWrites {
    let mut w = ChainWrites::new(ttl);
    for c in claims {
        let mut head = format!("{}{}", ROOT_MARK as char, encode(c.root));
        if c.run != NO_RUN {
            let mark = RUN_MARK as char;
            head = format!("{head}{mark}{}{mark}", c.run);
        }
        w.claim(key(namespace, c.chain), head, encode_pairs(c.members));
    }
    for (chain, members) in adds.iter().filter(|(_, m)| !m.is_empty()) {
        w.add(key(namespace, chain), encode_pairs(members));
    }
    w
}

/// What each of `claims` answered, in their order, from the claims the call refused
/// (the first of its lists are the claims: see [`writes`]).
pub fn answers(claims: &[Claim<'_>], refused: RefusedClaims) -> Result<Vec<RootClaim>, QueueError> {
    let mut answers = vec![RootClaim::Ours; claims.len()];
    for (i, holder) in refused {
        let answer = i.checked_sub(1).and_then(|i| answers.get_mut(i));
        let holder = match &holder[..] {
            b"" => Some(Err(RootClaim::EarlierRun)),
            b"=" => Some(Err(RootClaim::OursBefore)),
            _ => decode(&holder).next().map(Ok),
        };
        let (Some(answer), Some(holder)) = (answer, holder) else {
            return Err(QueueError::Protocol(format!(
                "claiming {} chains answered position {i} with a holder that does not decode",
                claims.len()
            )));
        };
        match holder {
            Err(claim) => *answer = claim,
            Ok(m) if &m != claims[i - 1].root => *answer = RootClaim::Taken(m),
            Ok(_) => {}
        }
    }
    Ok(answers)
}

/// Why tasks could not start chains of their own.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The id is already the chain of another task: a chain's id must be unique in the
    /// namespace, across queues.
    #[error("chain {chain} already exists, as the chain of task {} of queue {}", .holder.id, .holder.queue)]
    Taken {
        /// The chain id asked for.
        chain: String,
        /// Its global task.
        holder: Member,
    },
    /// The id is the name an unlisted chain of another task has, or would have
    /// ([`reserved`]): a chain of that name would hide it.
    #[error(
        "chain {chain} is kept for the chain of task {} of queue {}: submit the global task under another id",
        .holder.id, .holder.queue
    )]
    Reserved {
        /// The chain id asked for.
        chain: String,
        /// The task the name is kept for.
        holder: Member,
    },
    /// The id is the chain of an earlier run of the same task, which has ended: a new
    /// run in a chain of that id would mix its tasks with the earlier run's.
    #[error(
        "chain {chain} already exists, made by an earlier run of task {chain} of queue {queue} that has ended: submit the new run under another id"
    )]
    Ended {
        /// The chain id asked for.
        chain: String,
        /// The global task's queue.
        queue: String,
    },
    /// The task under that id, which the submit would be (a dedup hit), is a task of
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

/// Makes each of `tasks` the global task of a chain of its own, before they are enqueued
/// on `queue`: a task without an id gets a fresh one ([`new_global_id`]); an id that is
/// already some other task's chain (its list says so) refuses them all before anything
/// is written; then each chain's global task is claimed, but in a queue with a done route
/// on one server, whose chains are unlisted ([`run_base`]): named `QUEUE:ID`, which no
/// other task's chain may be, their tasks found without a list.
pub async fn start_global(
    client: &crate::queue_client::QueueClient,
    on: &crate::queue_client::Queue,
    mut tasks: Vec<&mut crate::queue_client::NewTask>,
    targets: &ChainTargets,
) -> Result<(), ChainError> {
    let conn = client.connection();
    let ns = client.namespace();
    let queue = on.name();
    let ids: Vec<String> = tasks
        .iter_mut()
        .map(|t| {
            t.chain = Some(crate::queue_client::TaskChain::Global);
            t.id.get_or_insert_with(new_global_id).clone()
        })
        .collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    // What each id holds and each chain's list, read for all the tasks at once: read a
    // task at a time, a bulk of 10,000 chains made some 60,000 round trips in turn.
    let found = on.glance_many(&id_refs).await?;
    // (its enqueue makes its chain unlisted, `QUEUE:ID`, unless that name has a list:
    // then it claims the chain of its id as its follow-ups are made, renaming it when
    // taken; see `Queue::root_arg`)
    let single = matches!(conn, RedisConn::Single(_));
    let unlisted = single && on.limits().starts_chains;
    let lists = match unlisted {
        true => Vec::new(),
        false => stored_many(&conn, ns, &id_refs).await?,
    };
    let mut claims = Vec::new();
    for (i, (id, glance)) in ids.iter().zip(&found).enumerate() {
        let (state, chain) = match glance {
            Glance::Recorded { state, chain, .. } => (Some(*state), chain.as_deref()),
            Glance::Held(_) | Glance::Unknown => (None, None),
        };
        let new_run = makes_a_new_run(on, state);
        // Where the enqueue's dedup finds the task there, the submit is that task: one in
        // another chain (a follow-up under this id) cannot be a chain's global task.
        if let Some(chain) = chain
            .filter(|_| !new_run)
            .filter(|c| !started_by(queue, id, c))
        {
            return Err(ChainError::InChain {
                id: id.clone(),
                queue: queue.to_string(),
                chain: chain.to_string(),
            });
        }
        if unlisted {
            continue;
        }
        if let Some(holder) = single
            .then(|| reserved(targets, id, &Member::new(queue, id)))
            .flatten()
        {
            return Err(ChainError::Reserved {
                chain: id.clone(),
                holder,
            });
        }
        match &lists[i] {
            Some(s) if s.root != Member::new(queue, id) => {
                return Err(ChainError::Taken {
                    chain: id.clone(),
                    holder: s.root.clone(),
                });
            }
            // A run of this task made follow-ups in the chain: while the enqueue's dedup
            // finds that run, this submit is it; where it would make a new run, that
            // run would need a chain of its own, and a submit that asked for this one
            // (and may wait on it) is refused instead.
            Some(s) if s.run.is_some() && new_run => {
                return Err(ChainError::Ended {
                    chain: id.clone(),
                    queue: queue.to_string(),
                });
            }
            _ => {}
        }
        claims.push(id.as_str());
    }
    claim_roots(&conn, ns, queue, &claims, targets.ttl).await
}

/// Claims to make in one call: a call of a few thousand stays near a millisecond.
const CLAIMS_PER_CALL: usize = 1000;

/// Makes each task `id` of `queue` the global task of the chain of its id, in calls of
/// [`CLAIMS_PER_CALL`] (on a Redis Cluster, a call per chain, all in flight together: see
/// [`claim_many`]). A chain another task took since the checks refuses the submit; the
/// claims made before it stay, as a claim made for a task that is then not enqueued
/// does (the same task submitted again finds the chain its own).
async fn claim_roots(
    conn: &RedisConn,
    ns: &str,
    queue: &str,
    ids: &[&str],
    ttl: Duration,
) -> Result<(), ChainError> {
    let roots: Vec<Member> = ids.iter().map(|id| Member::new(queue, *id)).collect();
    let claims: Vec<Claim<'_>> = ids
        .iter()
        .zip(&roots)
        .map(|(id, root)| Claim {
            chain: id,
            root,
            run: NO_RUN,
            members: &[],
        })
        .collect();
    for part in claims.chunks(CLAIMS_PER_CALL) {
        let answers = claim_many(conn, ns, part, ttl).await?;
        for (claim, answer) in part.iter().zip(answers) {
            if let RootClaim::Taken(holder) = answer {
                return Err(ChainError::Taken {
                    chain: claim.chain.to_string(),
                    holder,
                });
            }
        }
    }
    Ok(())
}

/// Adds follow-ups (each with its parent) to chains they are in, idempotently (a member
/// added twice, by a parent run again, is listed twice; readers keep the first): one
/// call on one server; on a Redis Cluster, where each chain has a slot of its own, one
/// per chain, all in flight together.
pub async fn add_many(
    conn: &RedisConn,
    namespace: &str,
    adds: &[(&str, &[(Member, Member)])],
    ttl: Duration,
) -> Result<(), QueueError> {
    match conn {
        RedisConn::Single(_) => writes(namespace, &[], adds, ttl)
            .write(conn)
            .await
            .map(|_| ()),
        RedisConn::Cluster(_) => {
            let each = adds.iter().map(|a| {
                let w = writes(namespace, &[], std::slice::from_ref(a), ttl);
                async move { w.write(conn).await }
            });
            futures::future::try_join_all(each).await.map(|_| ())
        }
    }
}

/// Whether a task submitted under an id whose record is `record` would be a new run
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

/// A chain's members as stored: its global task, and each follow-up with its parent, in
/// the order of their ids. `None` when the chain is unknown (or its list expired).
pub async fn members(
    conn: &RedisConn,
    namespace: &str,
    chain: &str,
) -> Result<Option<Members>, QueueError> {
    Ok(stored_or_loose(conn, namespace, chain).await?.0.map(sorted))
}

/// A chain's members: its list's, when it has one that names its global task; else, for
/// an unlisted chain (see [`run_base`]), read from its tasks' records (`unlisted`): its
/// global task (task ID of queue QUEUE, whose record names the chain), then its
/// follow-ups. `None` when the chain is unknown.
pub async fn members_of(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
) -> Result<Option<Members>, QueueError> {
    let conn = client.connection();
    let (listed, loose) = stored_or_loose(&conn, client.namespace(), chain).await?;
    if let Some(m) = listed {
        return Ok(Some(sorted(m)));
    }
    let Some((root, rec)) = unlisted_root(client, targets, chain).await? else {
        return Ok(None);
    };
    let follow = unlisted(client, targets, chain, &root, &rec, loose).await?;
    Ok(Some(sorted(Members {
        root,
        run: None,
        follow,
    })))
}

/// What an unlisted chain's global task `root` (of record `rec`) made, with each one's
/// parent: its
/// route follow-ups `QUEUE:G@RUN~N` (the N-th of its queue's done routes, or of its
/// failed routes: whichever record is there and names the chain, whatever the global
/// task's state, so that a task running again, or cancelled, shows what it made), then
/// what `loose` (the list of added members) holds below this run's tasks: a handler's
/// follow-ups of the global task (named from the run too) and every follow-up further
/// down. An earlier run's tasks, in the same list, are not this run's.
async fn unlisted(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
    root: &Member,
    rec: &TaskRecord,
    loose: Vec<(Member, Member)>,
) -> Result<Vec<(Member, Member)>, QueueError> {
    let mut follow = Vec::new();
    let Some(run) = record_run(client, targets, root, rec).await? else {
        return Ok(follow);
    };
    let base = run_base(chain, &run);
    let mut seen = std::collections::BTreeSet::new();
    let routes = targets.routes.get(&root.queue).cloned().unwrap_or_default();
    let on = |on| routes.iter().filter(move |r| r.on == on);
    let kids: Vec<Member> = [crate::config::RouteOn::Done, crate::config::RouteOn::Failed]
        .into_iter()
        .flat_map(|o| {
            on(o)
                .enumerate()
                .map(|(n, r)| Member::new(&r.queue, derived_id(&base, n + 1)))
        })
        .collect();
    let reads = kids
        .iter()
        .map(|m| view::record_of(client, &targets.queues, m));
    for (kid, r) in kids.iter().zip(futures::future::try_join_all(reads).await?) {
        if r.is_some_and(|r| r.chain.as_deref() == Some(chain)) && seen.insert(kid.clone()) {
            follow.push((kid.clone(), root.clone()));
        }
    }
    let own_kid = |kid: &Member| {
        kid.id
            .strip_prefix(base.as_str())
            .is_some_and(|rest| rest.starts_with(DERIVED_SEP))
    };
    let mut rest = loose;
    loop {
        let before = rest.len();
        rest.retain(|(kid, parent)| {
            let ours = if parent == root {
                own_kid(kid)
            } else {
                seen.contains(parent)
            };
            if ours && seen.insert(kid.clone()) {
                follow.push((kid.clone(), parent.clone()));
            }
            !ours
        });
        if rest.len() == before {
            break;
        }
    }
    Ok(follow)
}

/// The run of a global task as its follow-ups' ids name it (its enqueue time and record
/// number, as its meta says them: [`Claim::run`]), from its record and its queue's
/// listing index; `None` when either is gone.
async fn record_run(
    client: &QueueClient,
    targets: &ChainTargets,
    root: &Member,
    rec: &TaskRecord,
) -> Result<Option<String>, QueueError> {
    let Some(limits) = targets.queues.get(&root.queue) else {
        return Ok(None);
    };
    let Ok(at) = chrono::DateTime::parse_from_rfc3339(&rec.created_at) else {
        return Ok(None);
    };
    let queue = client.queue_with(&root.queue, limits.clone())?;
    Ok(queue
        .record_seq(&root.id)
        .await?
        .map(|seq| format!("{}.{seq}", at.timestamp_millis())))
}

/// The global task of unlisted chain `chain` (`QUEUE:ID`, [`run_base`]) with its record:
/// task `ID` of queue `QUEUE`, a queue with routes, whose record names the chain. `None`
/// when there is no such task.
async fn unlisted_root(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
) -> Result<Option<(Member, TaskRecord)>, QueueError> {
    let Some((queue, id)) = chain.split_once(':') else {
        return Ok(None);
    };
    if targets.routes.get(queue).is_none_or(|r| r.is_empty()) {
        return Ok(None);
    }
    let root = Member::new(queue, id);
    let rec = view::record_of(client, &targets.queues, &root).await?;
    Ok(rec
        .filter(|r| r.chain.as_deref() == Some(chain))
        .map(|r| (root, r)))
}

/// Members with follow-ups in the order of their ids.
fn sorted(mut m: Members) -> Members {
    m.follow
        .sort_by(|a, b| natural(&a.0.id).cmp(&natural(&b.0.id)).then(a.0.cmp(&b.0)));
    m
}

/// A chain's member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    /// Its global task.
    pub root: Member,
    /// Which run of the global task made its follow-ups (see [`Claim::run`]), if one did
    /// and said so; `=RUN` for a list a gaffer before runs made, which run RUN took over.
    pub run: Option<String>,
    /// Each follow-up once with its parent (the first time it was added).
    pub follow: Vec<(Member, Member)>,
}

impl Members {
    /// When the run that made the follow-ups was enqueued (ms since the epoch), if known:
    /// a record of the global task created at another time is another run's.
    pub fn run_enqueued_ms(&self) -> Option<i64> {
        let run = self.run.as_deref()?;
        run.split('.').next()?.parse().ok()
    }

    /// Whether `record`, of this list's global task's id, is of the run that made chain
    /// `chain` (the id may since hold a later run, with a chain of its own).
    pub fn made_by(&self, chain: &str, record: &crate::queue_client::TaskRecord) -> bool {
        view::is_the_run(record, chain, self.run_enqueued_ms())
    }
}

/// A chain's member list read and decoded: `^`, its global task, `@RUN@` once a run of
/// it claimed the chain (RUN_MARK), then each follow-up with its parent. `None` without a
/// global task.
/// Also, for a list without a global task (follow-ups added to a chain that has no list
/// of its own, or whose list expired), the pairs it holds.
async fn stored_or_loose(
    conn: &RedisConn,
    namespace: &str,
    chain: &str,
) -> Result<(Option<Members>, Vec<(Member, Member)>), QueueError> {
    let mut conn = conn.clone();
    let raw: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key(namespace, chain))
        .query_async(&mut conn)
        .await?;
    Ok(parse_stored(raw))
}

/// Lists read for many chains at once, the member lists of [`stored_or_loose`]: on one
/// server in MGETs of [`CLAIMS_PER_CALL`] keys; on a Redis Cluster, where each chain has
/// a slot of its own, a GET each, many in flight together.
async fn stored_many(
    conn: &RedisConn,
    namespace: &str,
    chains: &[&str],
) -> Result<Vec<Option<Members>>, QueueError> {
    use futures::{StreamExt, TryStreamExt};
    let raws: Vec<Option<Vec<u8>>> = match conn {
        RedisConn::Single(_) => {
            let mut raws = Vec::with_capacity(chains.len());
            for part in chains.chunks(CLAIMS_PER_CALL) {
                let mut mget = redis::cmd("MGET");
                for chain in part {
                    mget.arg(key(namespace, chain));
                }
                let got: Vec<Option<Vec<u8>>> = mget.query_async(&mut conn.clone()).await?;
                raws.extend(got);
            }
            raws
        }
        RedisConn::Cluster(_) => {
            // (the futures made first, owning their keys: a stream that maps borrowed ids
            // in a closure is not `Send` for every lifetime, which the api needs)
            let each: Vec<_> = chains
                .iter()
                .map(|chain| {
                    let mut conn = conn.clone();
                    let get = redis::cmd("GET").arg(key(namespace, chain)).clone();
                    async move { get.query_async::<Option<Vec<u8>>>(&mut conn).await }
                })
                .collect();
            futures::stream::iter(each)
                .buffered(64)
                .try_collect()
                .await?
        }
    };
    Ok(raws.into_iter().map(|raw| parse_stored(raw).0).collect())
}

/// A member list as stored (see [`stored_or_loose`]), decoded.
fn parse_stored(raw: Option<Vec<u8>>) -> (Option<Members>, Vec<(Member, Member)>) {
    let Some(raw) = raw else {
        return (None, Vec::new());
    };
    let Some(rest) = raw.strip_prefix(&[ROOT_MARK]) else {
        return (None, pairs(decode(&raw)));
    };
    let Some((root, used)) = decode_one(rest) else {
        return (None, Vec::new());
    };
    let (run, rest) = split_run(&rest[used..]);
    let follow = pairs(decode(rest));
    (Some(Members { root, run, follow }), Vec::new())
}

/// Decoded members as (follow-up, parent) pairs, each follow-up once (its first).
fn pairs(mut all: impl Iterator<Item = Member>) -> Vec<(Member, Member)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut follow = Vec::new();
    while let (Some(child), Some(parent)) = (all.next(), all.next()) {
        if seen.insert(child.clone()) {
            follow.push((child, parent));
        }
    }
    follow
}

/// The run written after a list's global task (`@RUN@`), if any, and what follows it. A
/// member's length prefix is digits, so the mark cannot be read as one.
fn split_run(raw: &[u8]) -> (Option<String>, &[u8]) {
    let Some(after) = raw.strip_prefix(&[RUN_MARK]) else {
        return (None, raw);
    };
    match after.iter().position(|&b| b == RUN_MARK) {
        Some(end) => (
            Some(String::from_utf8_lossy(&after[..end]).into_owned()),
            &after[end + 1..],
        ),
        None => (None, raw),
    }
}

/// A member as the list stores it: `LEN:FIELD`.
fn encode(m: &Member) -> String {
    let field = m.field();
    format!("{}:{field}", field.len())
}

/// Follow-ups with their parents, as the list stores them.
fn encode_pairs(pairs: &[(Member, Member)]) -> String {
    pairs
        .iter()
        .map(|(child, parent)| encode(child) + &encode(parent))
        .collect()
}

/// The members of a stored list, in order, up to the first that does not decode.
fn decode(mut raw: &[u8]) -> impl Iterator<Item = Member> + '_ {
    std::iter::from_fn(move || {
        let (m, used) = decode_one(raw)?;
        raw = &raw[used..];
        Some(m)
    })
}

/// The member at the start of `raw`, and how many bytes it took.
fn decode_one(raw: &[u8]) -> Option<(Member, usize)> {
    let colon = raw.iter().position(|&b| b == b':')?;
    let len: usize = std::str::from_utf8(&raw[..colon]).ok()?.parse().ok()?;
    let field = raw.get(colon + 1..colon + 1 + len)?;
    Some((
        Member::parse(std::str::from_utf8(field).ok()?)?,
        colon + 1 + len,
    ))
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
    fn member_lists_decode_what_they_encode_whatever_the_ids_hold() {
        let root = Member::new("fetch", "a:1^");
        let pairs = vec![
            (Member::new("parse", "x\u{1f}9:z"), root.clone()),
            (Member::new("store", "é~2"), Member::new("parse", "x")),
        ];
        let raw = format!("{}{}", encode(&root), encode_pairs(&pairs));
        let all: Vec<Member> = decode(raw.as_bytes()).collect();
        assert_eq!(all.len(), 5);
        assert_eq!(all[0], root);
        assert_eq!((all[1].clone(), all[2].clone()), pairs[0]);
        assert_eq!((all[3].clone(), all[4].clone()), pairs[1]);
        // A cut list decodes up to its last whole member.
        assert_eq!(decode(&raw.as_bytes()[..raw.len() - 2]).count(), 4);
    }

    #[test]
    fn the_run_that_claimed_a_list_is_read_apart_from_its_members() {
        let root = Member::new("fetch", "a@1");
        let pair = (Member::new("parse", "a@1~1"), root.clone());
        let members = encode_pairs(std::slice::from_ref(&pair));
        let with_run = format!("{}@1700.42@{members}", encode(&root));
        let (got, used) = decode_one(with_run.as_bytes()).unwrap();
        assert_eq!(got, root);
        let (run, rest) = split_run(&with_run.as_bytes()[used..]);
        assert_eq!(run.as_deref(), Some("1700.42"));
        assert_eq!(decode(rest).collect::<Vec<_>>(), [pair.0.clone(), pair.1]);
        // A list claimed without a run (a submit's, or older) has its members right after.
        let without = format!("{}{members}", encode(&root));
        let (run, rest) = split_run(&without.as_bytes()[used..]);
        assert_eq!((run, rest), (None, members.as_bytes()));
    }

    #[test]
    fn a_task_knows_the_chains_it_started_by_their_names() {
        assert_eq!(renamed("q", "a", None), "q:a");
        assert_eq!(renamed("q", "a", Some("5.1")), "q:a@5.1");
        for chain in ["a", "q:a", "q:a@5.1", "q:a@"] {
            assert!(started_by("q", "a", chain), "{chain}");
        }
        for chain in ["b", "q:ab", "r:a", "q:a~1", "q:"] {
            assert!(!started_by("q", "a", chain), "{chain}");
        }
    }

    #[test]
    fn derived_ids_sort_by_their_numbers() {
        let mut ids = vec!["g~10", "g~2", "g~1~3", "g~1"];
        ids.sort_by_key(|a| natural(a));
        assert_eq!(ids, ["g~1", "g~1~3", "g~2", "g~10"]);
        assert_eq!(derived_id("g~1", 3), "g~1~3");
    }

    #[test]
    fn fresh_global_ids_differ() {
        let a = new_global_id();
        let b = new_global_id();
        assert_ne!(a, b);
        assert!(a.starts_with("chain-"));
    }
}
