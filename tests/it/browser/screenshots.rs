//! The console's pictures in `docs/img/`, taken from a real run: a small cluster (two
//! masters) under a steady load, the overview once its sparklines have a minute of
//! history, and the page of a task that was retried before it was done.
//! `scripts/console-screenshots` runs it with `GAFFER_SCREENSHOT_DIR=docs/img` for the
//! docs; a plain test run takes the same pictures after a few refreshes, into
//! `target/tmp`, so the script cannot rot unnoticed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gaffer::redis_server::free_port;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::console::{Console, OPS, keys};
use super::webdriver::Browser;
use crate::harness::poll_some;

/// A cluster like the example config's: queues on two external systems, a flaky partner,
/// a chain (`fetch` → `parse`).
const DEMO: &str = r#"
[queues.resize_photo]
handler = "sleep"
max_slots = 4
system = "photo_store"

[queues.thumbnails]
handler = "noop"
system = "photo_store"

[queues.nightly_report]
handler = "sleep"
max_slots = 2

[queues.partner_sync]
handler = "flaky"
fail_rate = 0.2
max_attempts = 3
retry = { backoff = "fixed", base = "300ms", max = "300ms" }
system = "partner_api"

[queues.work]
handler = "sleep"

[queues.emails]
handler = "noop"

[queues.fetch]
handler = "sleep"
next = [{ queue = "parse" }]

[queues.parse]
handler = "noop"

[systems.photo_store]
max_concurrency = 16

[systems.partner_api]
max_concurrency = 4
rate = "50/s"
"#;

/// Where the pictures go and how many refreshes of history the overview shows first:
/// `GAFFER_SCREENSHOT_DIR` and a minute (30 refreshes at 2 s) for the docs, else
/// `target/tmp/console-demo` and 3.
fn out_dir_and_refreshes() -> (PathBuf, u32) {
    match std::env::var_os("GAFFER_SCREENSHOT_DIR") {
        Some(dir) => (PathBuf::from(dir), 30),
        None => (
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tmp/console-demo"),
            3,
        ),
    }
}

/// Submits a wave of tasks to every queue every second until `stop`.
fn load(console: Arc<Console>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let waves: [(&str, usize, u64); 7] = [
            ("resize_photo", 12, 250),
            ("thumbnails", 30, 0),
            ("nightly_report", 3, 900),
            ("partner_sync", 10, 0),
            ("work", 4, 400),
            ("emails", 20, 0),
            ("fetch", 2, 300),
        ];
        let mut round = 0u64;
        while !stop.is_cancelled() {
            for (queue, n, ms) in waves {
                // Each queue's wave swells and ebbs, so the sparklines move.
                let n = n * (1 + (round % 4) as usize) / 2 + 1;
                let tasks: Vec<Value> = (0..n)
                    .map(|i| json!({"payload": {"ms": ms + (i as u64 * 37) % 200}}))
                    .collect();
                let path = format!("/v1/queues/{queue}/tasks");
                console
                    .call("POST", &path, OPS, Some(json!({ "tasks": tasks })))
                    .await;
            }
            round += 1;
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    })
}

/// A task of partner_sync that failed once and then was done: its page shows a retry.
async fn retried_task(console: &Console) -> String {
    poll_some(
        Duration::from_secs(60),
        "a retried task that was done",
        || async {
            let (_, page) = console
                .call(
                    "GET",
                    "/v1/queues/partner_sync/tasks?state=done&limit=200",
                    OPS,
                    None,
                )
                .await;
            page["tasks"].as_array()?.iter().find_map(|t| {
                (t["attempt"].as_u64()? >= 2).then(|| t["id"].as_str().unwrap().to_string())
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_screenshots() {
    let (dir, refreshes) = out_dir_and_refreshes();
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port().unwrap();
    let tables = format!("{DEMO}{}", keys(port));
    let console = Arc::new(Console::start_with(&tables, port, &["node-a", "node-b"]).await);
    let stop = CancellationToken::new();
    let loader = load(console.clone(), stop.clone());
    let browser = Browser::start("console_screenshots").await;
    browser.window_size(1280, 900).await;
    console.login(&browser, OPS).await;

    // History for the sparklines.
    browser
        .wait_script_for(
            "return Number(document.querySelector('#view').dataset.refreshes) >= arguments[0] \
             && document.querySelectorAll('#hosts-table tr[data-host]').length === 2;",
            json!([refreshes]),
            "refreshes of the overview",
            Duration::from_secs(120),
        )
        .await;
    browser
        .save_screenshot(&dir.join("console-overview.png"))
        .await;

    let id = retried_task(&console).await;
    let path = format!(
        "/ui/#/tasks/partner_sync/{}",
        super::console::urlencode(&id)
    );
    browser.goto(&console.url(&path)).await;
    browser
        .wait_for(
            "#task-history li[data-history-state='done']",
            "the task's history",
        )
        .await;
    browser.save_screenshot(&dir.join("console-task.png")).await;
    stop.cancel();
    loader.await.unwrap();
    for name in ["console-overview.png", "console-task.png"] {
        let png = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(&png[..4], b"\x89PNG", "{name} is a PNG");
    }
}
