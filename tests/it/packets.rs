//! Packets (docs/plans/chain-packets.md): a slot's follow-ups to a tracked queue kept as
//! one packet per enqueue call. Each case checks that readers find a packet's tasks as
//! they find tasks enqueued one by one, on a single server and on the 3-master cluster.

use gaffer::queue_client::{
    Enqueued, ListQuery, NewTask, Queue, QueueClient, QueueLimits, RecordState, TakenBy, TaskChain,
    TaskRecord,
};

crate::harness::on_both!(
    a_packets_tasks_have_the_records_one_by_one_enqueues_write,
    a_packets_tasks_dedup_like_any_follow_ups,
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
    let taken = q.enqueue_many(&[kid("G~2", "X", "{}")]).await.unwrap();
    assert_eq!(taken[0].taken, Some(TakenBy::OtherChain), "{taken:?}");
    assert!(!taken[0].created);
    assert_eq!(q.stats().await.unwrap().ready, 4);
}
