//! A chain read a page at a time, for the api: who may see a chain is decided from its
//! global task alone ([`head`]), and one answer reads at most a page of its tasks'
//! records ([`read_page`]), so no request costs Redis work in proportion to a chain it
//! may not see, or to a whole large chain.

use serde_json::{Value, json};

use super::view::{self, ChainState, ChainTask, Summary};
use super::{ChainTargets, Member, Members, chain_origin, members_of, natural};
use crate::queue_client::{QueueClient, QueueError, TaskRecord};

/// A chain's global task and its record (`None` when the record is gone): what decides
/// who may see the chain.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainHead {
    /// The global task.
    pub root: Member,
    /// Its record.
    pub record: Option<TaskRecord>,
}

/// The global task of chain `chain` with its record, in two reads for an id [`chain_id`]
/// minted (the id its number names, then its record, which must name the chain); a
/// chain an older layout named reads its lists (see [`members_of`]). `None` exactly when
/// [`super::read`] finds no such chain.
///
/// [`chain_id`]: super::chain_id
pub async fn head(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
) -> Result<Option<ChainHead>, QueueError> {
    let root = match chain_origin(chain) {
        Some(_) => super::global_by_number(client, targets, chain).await?,
        None => members_of(client, targets, chain).await?.map(|m| m.root),
    };
    let Some(root) = root else {
        return Ok(None);
    };
    let record = view::record_of(client, &targets.queues, &root)
        .await?
        .filter(|r| r.chain.as_deref() == Some(chain));
    if record.is_none() && chain_origin(chain).is_some() {
        // (the task of that number never started the chain)
        return Ok(None);
    }
    Ok(Some(ChainHead { root, record }))
}

/// Where a walk of a chain's pages stands: the last task shown, and what the tasks shown
/// so far say of the chain's state (so the last page can say the whole chain's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    after: Member,
    seen: Summary,
}

impl PageCursor {
    /// As the api hands it out: opaque, URL-safe (hex of its parts).
    pub fn encode(&self) -> String {
        let failed = self.seen.failed.as_ref().map(Member::field);
        let flags: String = [self.seen.cancelled, self.seen.all_done, self.seen.started]
            .map(|b| if b { '1' } else { '0' })
            .iter()
            .collect();
        format!(
            "k{flags}.{}.{}",
            hex(self.after.field().as_bytes()),
            failed.map(|f| hex(f.as_bytes())).unwrap_or_default()
        )
    }

    /// A cursor [`PageCursor::encode`] made; `None` for any other text.
    pub fn decode(text: &str) -> Option<PageCursor> {
        let rest = text.strip_prefix('k')?;
        let mut parts = rest.split('.');
        let (flags, after, failed) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || flags.len() != 3 {
            return None;
        }
        let flag = |i: usize| match flags.as_bytes()[i] {
            b'0' => Some(false),
            b'1' => Some(true),
            _ => None,
        };
        let member = |h: &str| Member::parse(&String::from_utf8(unhex(h)?).ok()?);
        let failed = match failed {
            "" => None,
            h => Some(member(h)?),
        };
        Some(PageCursor {
            after: member(after)?,
            seen: Summary {
                failed,
                cancelled: flag(0)?,
                all_done: flag(1)?,
                started: flag(2)?,
            },
        })
    }
}

/// One page of a chain: its tasks in the chain's order (the global task first, then the
/// follow-ups in the order of their ids), and, on the last page, the chain's state.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainPage {
    /// The chain's id.
    pub id: String,
    /// This page's tasks.
    pub tasks: Vec<ChainTask>,
    /// The chain's state over every page of the walk: on the last page only.
    pub state: Option<ChainState>,
    /// The first task that failed for good, with its error: on the last page only.
    pub failed: Option<(Member, Option<String>)>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<PageCursor>,
}

impl ChainPage {
    /// The api's document: `{"id", "state", "failed", "tasks", "next_cursor"}`, the
    /// tasks as [`super::ChainView::to_json`] shows them.
    pub fn to_json(&self) -> Value {
        let tasks: Vec<Value> = self.tasks.iter().map(view::task_json).collect();
        let failed = self
            .failed
            .as_ref()
            .map(|(m, error)| json!({"queue": m.queue, "id": m.id, "error": error}));
        json!({"id": self.id, "state": self.state, "failed": failed, "tasks": tasks,
               "next_cursor": self.next.as_ref().map(PageCursor::encode)})
    }
}

/// Reads the page of chain `chain` that starts after `cursor` (from the global task
/// without one), of at most `limit` tasks: the member list, and the records of this
/// page's tasks only. `None` when no such chain is known. A task added to the chain
/// before the cursor after an earlier page was read is not shown by this walk; the
/// chain's state on the last page still never reads done while such a task has not
/// ended (its parent, on an earlier page, had not ended when that page was read: a
/// follow-up is listed before its parent ends, and sorts after it).
pub async fn read_page(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
    limit: usize,
    cursor: Option<&PageCursor>,
) -> Result<Option<ChainPage>, QueueError> {
    let Some(mut list) = members_of(client, targets, chain).await? else {
        return Ok(None);
    };
    let limit = limit.max(1);
    // (as `view::read`: the list read again after the records, and the page read again
    // while it grew, a bounded number of times)
    let mut reads_left = view::MAX_READS;
    let (order, start, records, settled) = loop {
        let order = ordered(&list);
        let start = match cursor {
            None => 0,
            Some(c) => {
                let after = sort_key(&c.after, &list.root);
                order.partition_point(|(m, _)| sort_key(m, &list.root) <= after)
            }
        };
        let end = (start + limit).min(order.len());
        let reads = order[start..end]
            .iter()
            .map(|(m, _)| view::record_of(client, &targets.queues, m));
        let records = futures::future::try_join_all(reads).await?;
        reads_left -= 1;
        match members_of(client, targets, chain).await? {
            Some(again) if again.follow.len() != list.follow.len() && reads_left > 0 => {
                list = again;
            }
            Some(again) if again.follow.len() != list.follow.len() => {
                break (order, start, records, false);
            }
            _ => break (order, start, records, true),
        }
    };
    let end = start + records.len();
    let root = match start {
        0 => records.first().cloned().flatten(),
        _ => view::record_of(client, &targets.queues, &list.root).await?,
    };
    let since = view::made_at(chain, root.as_ref()).map(String::from);
    let tasks = view::tasks_of(chain, since.as_deref(), order[start..end].to_vec(), records);
    let mut seen = cursor.map_or_else(Summary::default, |c| c.seen.clone());
    seen.add(&tasks);
    if end < order.len() {
        let after = order[end - 1].0.clone();
        return Ok(Some(ChainPage {
            id: chain.to_string(),
            tasks,
            state: None,
            failed: None,
            next: Some(PageCursor { after, seen }),
        }));
    }
    let (state, failed) = seen.state();
    let failed = match failed {
        Some(m) => {
            let shown = tasks
                .iter()
                .find(|t| t.member == m)
                .map(|t| t.record.clone());
            let record = match shown {
                Some(r) => r,
                None => view::record_of(client, &targets.queues, &m).await?,
            };
            Some((m, record.and_then(|r| r.error)))
        }
        None => None,
    };
    Ok(Some(ChainPage {
        id: chain.to_string(),
        tasks,
        state: Some(view::as_read(state, settled)),
        failed,
        next: None,
    }))
}

/// A chain's tasks in the order its view shows them: the global task, then the
/// follow-ups (sorted, as [`members_of`] gives them), each with its parent.
fn ordered(list: &Members) -> Vec<(Member, Option<Member>)> {
    std::iter::once((list.root.clone(), None))
        .chain(
            list.follow
                .iter()
                .map(|(c, p)| (c.clone(), Some(p.clone()))),
        )
        .collect()
}

/// Where a task sorts in its chain's view: the global task first, then by id as
/// [`members_of`] sorts the follow-ups.
fn sort_key<'a>(m: &'a Member, root: &Member) -> (bool, Vec<(u64, String)>, &'a Member) {
    (m != root, natural(&m.id), m)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote_and_nothing_else_reads() {
        let c = PageCursor {
            after: Member::new("parse", "~cfetch.17~1~3"),
            seen: Summary {
                failed: Some(Member::new("store", "x~2")),
                cancelled: false,
                all_done: false,
                started: true,
            },
        };
        let text = c.encode();
        assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
        assert_eq!(PageCursor::decode(&text), Some(c));
        for bad in [
            "",
            "k",
            "k000..",
            "k000.zz.",
            "k0a0.61.",
            "k000.6.",
            "x000.611f62.",
        ] {
            assert_eq!(PageCursor::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_global_task_sorts_first_then_ids_by_their_numbers() {
        let root = Member::new("q", "g");
        let mut ms = [
            Member::new("q", "g~10"),
            Member::new("q", "g~2"),
            root.clone(),
            Member::new("r", "g~1"),
        ];
        ms.sort_by(|a, b| sort_key(a, &root).cmp(&sort_key(b, &root)));
        assert_eq!(ms.map(|m| m.id), ["g", "g~1", "g~2", "g~10"]);
    }
}
