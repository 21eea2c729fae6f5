//! Packets (ARCHITECTURE.md, invariant 36): a slot's follow-ups to a tracked queue kept as
//! one packet per enqueue call. Each case checks that readers find a packet's tasks as
//! they find tasks enqueued one by one, on a single server and on the 3-master cluster.

use std::time::Duration;

use gaffer::queue_client::{
    Enqueued, LeasedTask, ListQuery, NewTask, Queue, QueueClient, QueueLimits, RecordState,
    SettleResult, TakenBy, TaskChain, TaskRecord, TaskState,
};

use crate::harness::poll_some;

crate::harness::on_both!(
    a_packets_tasks_have_the_records_one_by_one_enqueues_write,
    a_packets_tasks_dedup_like_any_follow_ups,
    a_packet_is_taken_whole_and_acked_without_a_write_per_task,
    a_packet_is_taken_in_parts_behind_the_tasks_before_it,
    a_retried_task_of_a_packet_runs_again_with_its_payload,
    an_expired_take_of_a_packet_comes_back,
    a_packets_tasks_are_found_cancelled_and_frozen_one_by_one,
    a_packets_tasks_know_their_chains_and_come_back_when_released,
    a_packet_goes_with_its_last_record_and_with_its_queue,
    a_leased_task_is_found_whatever_the_payloads_waiting_beside_it_hold,
);

/// Queue `name` with follow-ups kept as packets (`packets`) or one by one.
fn queue(client: &QueueClient, name: &str, packets: bool) -> Queue {
    let limits = QueueLimits {
        packets,
        ..Default::default()
    };
    client.queue_with(name, limits).unwrap()
}

/// Follow-up `id` of chain `chain`.
fn kid(id: &str, chain: &str, payload: &str) -> NewTask {
    NewTask::new(payload.as_bytes().to_vec())
        .id(id)
        .chain(TaskChain::FollowUp(chain.into()))
}

/// The three follow-ups each case enqueues: two of chain G, one of chain H.
fn kids() -> Vec<NewTask> {
    vec![
        kid("G~1", "G", r#"{"n":1}"#),
        kid("G~2", "G", ""),
        kid("H~1", "H", r#"{"n":3}"#),
    ]
}

/// Whether task `id` of `q` has a record key of its own (else it is read from a packet).
async fn has_record_key(client: &QueueClient, q: &Queue, id: &str) -> bool {
    let key = format!("{}:{{{}}}:r:{id}", client.namespace(), q.name());
    let mut conn = client.connection();
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut conn)
        .await
        .unwrap()
        == 1
}

/// A record with what differs between two queues and two moments left out.
fn comparable(mut r: TaskRecord) -> TaskRecord {
    r.queue = String::new();
    r.created_at = String::new();
    r.due_at = String::new();
    r.updated_at = String::new();
    for h in r.history.iter_mut().flatten() {
        h.at = String::new();
    }
    r
}

/// A packet's task reads (record, listing, counts) as the same follow-up enqueued one by
/// one does, though no record key of its own was written.
async fn a_packets_tasks_have_the_records_one_by_one_enqueues_write(
    client: QueueClient,
    name: &str,
) {
    let packed = queue(&client, &format!("{name}_packed"), true);
    let plain = queue(&client, &format!("{name}_plain"), false);
    let made = packed.enqueue_many(&kids()).await.unwrap();
    plain.enqueue_many(&kids()).await.unwrap();
    assert!(
        made.iter()
            .all(|e| e.created && e.state == Some(RecordState::Waiting)),
        "{made:?}"
    );
    for t in kids() {
        let id = t.id.clone().unwrap();
        assert!(
            !has_record_key(&client, &packed, &id).await,
            "{id} was made alone"
        );
        assert!(has_record_key(&client, &plain, &id).await);
        let a = packed
            .record(&id)
            .await
            .unwrap()
            .expect("a packet task's record");
        let b = plain.record(&id).await.unwrap().unwrap();
        assert_eq!(a.state, RecordState::Waiting);
        assert_eq!(a.created_at, a.updated_at);
        assert_eq!(comparable(a), comparable(b), "{id}");
    }
    let listed = |q: Queue| async move {
        let query = ListQuery {
            limit: 10,
            ..Default::default()
        };
        let page = q.list(&query).await.unwrap();
        page.tasks
            .into_iter()
            .map(|r| (r.id, r.state, r.chain))
            .collect::<Vec<_>>()
    };
    assert_eq!(listed(packed.clone()).await, listed(plain.clone()).await);
    assert_eq!(listed(packed.clone()).await.len(), 3);
    let (a, b) = (packed.stats().await.unwrap(), plain.stats().await.unwrap());
    assert_eq!((a.ready, a.enqueued_total), (3, 3));
    assert_eq!((a.ready, a.enqueued_total), (b.ready, b.enqueued_total));
}

/// A parent run again finds the children its first run made as a packet (nothing made
/// twice), and an id a packet's task holds is refused to another chain.
async fn a_packets_tasks_dedup_like_any_follow_ups(client: QueueClient, name: &str) {
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue_many(&kids()).await.unwrap();
    let again = q.enqueue_many(&kids()).await.unwrap();
    assert!(again.iter().all(|e| !e.created), "{again:?}");
    assert_eq!(q.stats().await.unwrap().ready, 3);
    // Part of a call already made, part new: the new one is made, one by one.
    let more = q
        .enqueue_many(&[kid("G~1", "G", "{}"), kid("G~3", "G", "{}")])
        .await
        .unwrap();
    let made: Vec<bool> = more.iter().map(|e: &Enqueued| e.created).collect();
    assert_eq!(made, [false, true]);
    assert!(has_record_key(&client, &q, "G~3").await);
    assert_eq!(q.stats().await.unwrap().ready, 4);
    // A task submitted under a waiting packet task's id is that task (dedup), and so is
    // one under the id of a packet task a take holds.
    let same = q.enqueue(NewTask::new("{}").id("H~1")).await.unwrap();
    assert!(!same.created, "{same:?}");
    let taken = q.enqueue_many(&[kid("G~2", "X", "{}")]).await.unwrap();
    assert_eq!(taken[0].taken, Some(TakenBy::OtherChain), "{taken:?}");
    assert!(!taken[0].created);
    assert_eq!(q.stats().await.unwrap().ready, 4);
    let b = q.take(10, LEASE).await.unwrap();
    assert_eq!(b.tasks.len(), 3, "the packet's three");
    assert!(
        !q.enqueue(NewTask::new("{}").id("G~1"))
            .await
            .unwrap()
            .created
    );
    assert_eq!(q.ack(&b.tasks).await.unwrap(), vec![SettleResult::Done; 3]);
    // Once done, its id takes a new task (the queue dedups against tasks, not records).
    assert!(
        q.enqueue(NewTask::new("{}").id("G~1"))
            .await
            .unwrap()
            .created
    );
}

/// What a take handed out, as (id, payload) pairs.
fn handed(tasks: &[LeasedTask]) -> Vec<(String, String)> {
    tasks
        .iter()
        .map(|t| {
            (
                t.id.clone(),
                String::from_utf8_lossy(&t.payload).into_owned(),
            )
        })
        .collect()
}

/// The three follow-ups of `kids` as a take hands them out.
fn kids_handed() -> Vec<(String, String)> {
    kids()
        .into_iter()
        .map(|t| {
            let payload = String::from_utf8_lossy(&t.payload).into_owned();
            (t.id.unwrap(), payload)
        })
        .collect()
}

/// Each state in a record's history.
fn states(r: &TaskRecord) -> Vec<RecordState> {
    r.history.iter().flatten().map(|e| e.state).collect()
}

const LEASE: Duration = Duration::from_secs(30);

/// A take hands out a whole packet as one batch lease, each task with its payload, chain
/// and record number (so the batch's ack writes no record, and the records read done).
async fn a_packet_is_taken_whole_and_acked_without_a_write_per_task(
    client: QueueClient,
    name: &str,
) {
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue_many(&kids()).await.unwrap();
    let b = q.take(10, LEASE).await.unwrap();
    assert_eq!(handed(&b.tasks), kids_handed());
    assert!(b.tasks.iter().all(|t| t.attempt == 1));
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased), (0, 3));
    let running = q.record("G~2").await.unwrap().unwrap();
    assert_eq!(running.state, RecordState::Running);
    assert_eq!(
        q.find("G~2").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(q.ack(&b.tasks).await.unwrap(), vec![SettleResult::Done; 3]);
    for (id, _) in kids_handed() {
        let r = q.record(&id).await.unwrap().unwrap();
        assert_eq!(r.state, RecordState::Done, "{id}");
        assert_eq!(
            states(&r),
            [
                RecordState::Waiting,
                RecordState::Running,
                RecordState::Done
            ]
        );
        assert!(
            !has_record_key(&client, &q, &id).await,
            "{id} was written alone"
        );
        assert!(q.find(&id).await.unwrap().is_none());
    }
    assert_eq!(
        q.record("H~1").await.unwrap().unwrap().chain.as_deref(),
        Some("H")
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 3));
    assert!(q.take(10, LEASE).await.unwrap().tasks.is_empty());
}

/// A take of fewer tasks than a packet holds hands out its first ones and leaves the rest
/// waiting at the head; tasks queued before the packet go first, and a take stops at it.
async fn a_packet_is_taken_in_parts_behind_the_tasks_before_it(client: QueueClient, name: &str) {
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue(NewTask::new("first").id("before")).await.unwrap();
    let five: Vec<NewTask> = (1..=5)
        .map(|i| kid(&format!("P~{i}"), "P", &format!("p{i}")))
        .collect();
    q.enqueue_many(&five).await.unwrap();
    q.enqueue(NewTask::new("last").id("after")).await.unwrap();
    assert_eq!(q.stats().await.unwrap().ready, 7);
    let ids = |b: &gaffer::queue_client::Batch| -> Vec<String> {
        b.tasks.iter().map(|t| t.id.clone()).collect()
    };
    let mut taken = Vec::new();
    for (want, ready_after) in [
        (vec!["before"], 6),
        (vec!["P~1", "P~2"], 4),
        (vec!["P~3", "P~4"], 2),
        (vec!["P~5"], 1),
        (vec!["after"], 0),
    ] {
        let b = q.take(2, LEASE).await.unwrap();
        assert_eq!(ids(&b), want);
        assert_eq!(
            q.stats().await.unwrap().ready,
            ready_after,
            "after {want:?}"
        );
        taken.push(b);
    }
    let payloads: Vec<String> = taken[1..4]
        .iter()
        .flat_map(|b| handed(&b.tasks))
        .map(|(_, p)| p)
        .collect();
    assert_eq!(payloads, ["p1", "p2", "p3", "p4", "p5"]);
    for b in &taken {
        assert!(
            q.ack(&b.tasks)
                .await
                .unwrap()
                .iter()
                .all(|r| *r == SettleResult::Done)
        );
    }
    for i in 1..=5 {
        let r = q.record(&format!("P~{i}")).await.unwrap().unwrap();
        assert_eq!(r.state, RecordState::Done);
    }
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 7));
}

/// A retry of one task of a packet's batch (which splits it) makes that task an ordinary
/// one: it comes back with its payload, its record keeps its history, and the others'
/// acks stand.
async fn a_retried_task_of_a_packet_runs_again_with_its_payload(client: QueueClient, name: &str) {
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue_many(&kids()).await.unwrap();
    let b = q.take(10, LEASE).await.unwrap();
    let ops = crate::harness::retry_one_ack_rest(&b.tasks, "H~1");
    assert_eq!(q.settle(&ops).await.unwrap(), vec![SettleResult::Done; 3]);
    let again = q.take(10, LEASE).await.unwrap();
    let got: Vec<_> = again
        .tasks
        .iter()
        .map(|t| {
            (
                t.id.as_str(),
                t.attempt,
                String::from_utf8_lossy(&t.payload).into_owned(),
            )
        })
        .collect();
    assert_eq!(got, [("H~1", 2, r#"{"n":3}"#.to_string())]);
    let r = q.record("H~1").await.unwrap().unwrap();
    assert_eq!(
        states(&r),
        [
            RecordState::Waiting,
            RecordState::Running,
            RecordState::Waiting,
            RecordState::Running
        ]
    );
    assert_eq!(r.chain.as_deref(), Some("H"));
    assert_eq!(
        q.record("G~2").await.unwrap().unwrap().state,
        RecordState::Done
    );
    assert_eq!(q.ack(&again.tasks).await.unwrap(), vec![SettleResult::Done]);
    assert_eq!(
        q.record("H~1").await.unwrap().unwrap().state,
        RecordState::Done
    );
    assert_eq!(q.stats().await.unwrap().leased, 0);
}

/// A take of a packet whose lease runs out comes back as ordinary tasks, each with its
/// payload, one attempt counted; the first holder's ack is stale.
async fn an_expired_take_of_a_packet_comes_back(client: QueueClient, name: &str) {
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue_many(&kids()).await.unwrap();
    let first = q.take(10, Duration::from_millis(100)).await.unwrap();
    assert_eq!(first.tasks.len(), 3);
    let second = poll_some(
        Duration::from_secs(5),
        "the packet back after its lease",
        || {
            let q = q.clone();
            async move {
                let b = q.take(10, LEASE).await.unwrap();
                (!b.tasks.is_empty()).then_some(b)
            }
        },
    )
    .await;
    assert_eq!(handed(&second.tasks), kids_handed());
    assert!(second.tasks.iter().all(|t| t.attempt == 2));
    assert_eq!(
        q.ack(&first.tasks).await.unwrap(),
        vec![SettleResult::Stale; 3]
    );
    assert_eq!(
        q.ack(&second.tasks).await.unwrap(),
        vec![SettleResult::Done; 3]
    );
    let r = q.record("G~1").await.unwrap().unwrap();
    assert_eq!(r.state, RecordState::Done);
    assert_eq!(r.attempt, 2);
}

/// A packet's waiting task is found with its payload, cancelled or frozen alone (the
/// others still run), and a frozen one thawed runs with its payload.
async fn a_packets_tasks_are_found_cancelled_and_frozen_one_by_one(
    client: QueueClient,
    name: &str,
) {
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue_many(&kids()).await.unwrap();
    let found = q.find("G~1").await.unwrap().unwrap();
    assert_eq!(found.state, TaskState::Ready);
    assert_eq!(found.payload, br#"{"n":1}"#.to_vec());
    assert!(
        !has_record_key(&client, &q, "G~1").await,
        "a find writes nothing"
    );
    let cancelled = q.cancel("G~2").await.unwrap().unwrap();
    assert_eq!(cancelled.state, TaskState::Ready);
    assert_eq!(
        q.record("G~2").await.unwrap().unwrap().state,
        RecordState::Cancelled
    );
    assert_eq!(q.stats().await.unwrap().ready, 2);
    q.freeze("H~1", "hold").await.unwrap();
    assert_eq!(q.stats().await.unwrap().ready, 1);
    let b = q.take(10, LEASE).await.unwrap();
    assert_eq!(
        handed(&b.tasks),
        [("G~1".to_string(), r#"{"n":1}"#.to_string())]
    );
    q.ack(&b.tasks).await.unwrap();
    q.thaw("H~1", "go").await.unwrap();
    let b = q.take(10, LEASE).await.unwrap();
    assert_eq!(
        handed(&b.tasks),
        [("H~1".to_string(), r#"{"n":3}"#.to_string())]
    );
    q.ack(&b.tasks).await.unwrap();
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.frozen, s.acked_total), (0, 0, 0, 2));
    assert_eq!(
        q.record("G~2").await.unwrap().unwrap().state,
        RecordState::Cancelled
    );
}

/// What a follow-up step asks of its parents (`chain_facts`) comes with the take of a
/// packet's tasks, which have no field of their own, and the packet's enqueue listed each
/// task in its chain's list; a released take of a packet comes back in take order at the
/// same attempt, each task with its payload.
async fn a_packets_tasks_know_their_chains_and_come_back_when_released(
    client: QueueClient,
    name: &str,
) {
    use gaffer::queue_client::ChainPlace;
    let q = queue(&client, &format!("{name}_kids"), true);
    q.enqueue_many(&kids()).await.unwrap();
    let b = q.take(10, LEASE).await.unwrap();
    let ma = Some(QueueLimits::default().max_attempts);
    for (id, chain) in [("G~1", "G"), ("H~1", "H")] {
        let t = b.tasks.iter().find(|t| t.id == id).expect("taken");
        let facts = t.chain_facts();
        assert_eq!(
            (facts.place, facts.max_attempts),
            (ChainPlace::FollowUp(chain.into()), ma)
        );
    }
    let mut listed = q.chain_members("G").await.unwrap();
    listed.sort();
    assert_eq!(listed, ["G~1", "G~2"]);
    assert_eq!(q.chain_members("H").await.unwrap(), ["H~1"]);
    assert_eq!(
        q.release(&b.tasks).await.unwrap(),
        vec![SettleResult::Done; 3]
    );
    let again = q.take(10, LEASE).await.unwrap();
    assert_eq!(handed(&again.tasks), kids_handed());
    assert!(again.tasks.iter().all(|t| t.attempt == 1));
    assert_eq!(
        q.ack(&again.tasks).await.unwrap(),
        vec![SettleResult::Done; 3]
    );
}

/// The keys of `q` left in Redis, by their names after the queue's own part.
async fn keys_left(client: &QueueClient, q: &Queue) -> Vec<String> {
    let prefix = format!("{}:{{{}}}:", client.namespace(), q.name());
    let mut conn = client.connection();
    let mut out = Vec::new();
    // (on the cluster, the queue's keys share its slot: KEYS there is one node's)
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    for k in keys {
        out.push(k[prefix.len()..].to_string());
    }
    out.sort();
    out
}

/// A packet's store lives as long as a record read from it: once every record of it has
/// expired, the store goes too; and deleting the queue deletes its packets.
async fn a_packet_goes_with_its_last_record_and_with_its_queue(client: QueueClient, name: &str) {
    let limits = QueueLimits {
        packets: true,
        history_ttl: Duration::from_millis(50),
        ..Default::default()
    };
    let q = client.queue_with(&format!("{name}_kids"), limits).unwrap();
    q.enqueue_many(&kids()).await.unwrap();
    assert!(
        keys_left(&client, &q)
            .await
            .iter()
            .any(|k| k.starts_with("r:#p"))
    );
    let b = q.take(10, LEASE).await.unwrap();
    q.ack(&b.tasks).await.unwrap();
    poll_some(
        Duration::from_secs(10),
        "the packet's records expired",
        || {
            let q = q.clone();
            async move {
                q.housekeep(100).await.unwrap();
                q.record("G~1").await.unwrap().is_none().then_some(())
            }
        },
    )
    .await;
    for (id, _) in kids_handed() {
        assert!(q.record(&id).await.unwrap().is_none(), "{id}");
    }
    let left = keys_left(&client, &q).await;
    assert!(!left.iter().any(|k| k.starts_with("r:")), "{left:?}");
    // Every id of a packet used again by a new task: the packet goes with the sweep.
    q.enqueue_many(&kids()).await.unwrap();
    let b = q.take(10, LEASE).await.unwrap();
    q.ack(&b.tasks).await.unwrap();
    for (id, _) in kids_handed() {
        assert!(q.enqueue(NewTask::new("{}").id(&id)).await.unwrap().created);
    }
    q.housekeep(100).await.unwrap();
    let left = keys_left(&client, &q).await;
    assert!(!left.iter().any(|k| k.starts_with("r:#p")), "{left:?}");
    assert_eq!(
        q.record("G~1").await.unwrap().unwrap().state,
        RecordState::Waiting
    );
    let b = q.take(10, LEASE).await.unwrap();
    assert_eq!(b.tasks.len(), 3);
    q.ack(&b.tasks).await.unwrap();
    // A packet waiting and one taken, then the queue deleted: nothing of it is left.
    let three: Vec<NewTask> = (1..=3).map(|i| kid(&format!("M~{i}"), "M", "{}")).collect();
    q.enqueue_many(&three).await.unwrap();
    q.enqueue_many(&[kid("K~1", "K", "{}"), kid("K~2", "K", "{}")])
        .await
        .unwrap();
    assert_eq!(q.take(10, LEASE).await.unwrap().tasks.len(), 3);
    q.delete_all().await.unwrap();
    // (the rosters of chains whose records are gone go with their own time, twice the
    // queue's history_ttl: those of the chains the queue's records named go at once)
    let left = keys_left(&client, &q).await;
    assert!(
        left.iter()
            .all(|k| k.starts_with("chains:") && !k.contains('M') && !k.contains('K')),
        "{left:?}"
    );
    poll_some(Duration::from_secs(10), "nothing left", || async {
        keys_left(&client, &q).await.is_empty().then_some(())
    })
    .await;
}

/// A task of a packet that a take holds is found leased (and can be cancelled) even when
/// a payload still waiting in the packet holds its id between separators.
async fn a_leased_task_is_found_whatever_the_payloads_waiting_beside_it_hold(
    client: QueueClient,
    name: &str,
) {
    let q = queue(&client, &format!("{name}_kids"), true);
    let odd = "x\u{1f}A~1\u{1f}y";
    q.enqueue_many(&[kid("A~1", "A", "{}"), kid("A~2", "A", odd)])
        .await
        .unwrap();
    let b = q.take(1, LEASE).await.unwrap();
    assert_eq!(handed(&b.tasks), [("A~1".to_string(), "{}".to_string())]);
    assert_eq!(
        q.find("A~1").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(
        q.cancel("A~1").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(
        q.record("A~1").await.unwrap().unwrap().state,
        RecordState::Cancelled
    );
    let rest = q.take(10, LEASE).await.unwrap();
    assert_eq!(handed(&rest.tasks), [("A~2".to_string(), odd.to_string())]);
}
