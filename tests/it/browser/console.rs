//! The web console's acceptance in a real headless Chromium, against a real cluster: a
//! redis-server, a `gaffer manager`, a `gaffer master` (host `h1`) and a `gaffer api`
//! serving `/ui/`, all real processes. The browser logs in with a limited key and with
//! an admin key and does what a person would: finds a task and watches it finish without
//! reloading, cancels a waiting one, requeues a dead letter, opens a chain, pauses an
//! external system. What it sees is checked against the API's own answers.

use std::net::SocketAddr;
use std::time::Duration;

use gaffer::api::hash_token;
use gaffer::redis_server::free_port;
use serde_json::{Value, json};

use super::webdriver::Browser;
use crate::api::request;
use crate::harness::poll_some;
use crate::manager::Cluster;

/// The admin key's token.
pub(crate) const OPS: &str = "console-ops-token";
/// The limited key's token: queues `work` and `emails`.
pub(crate) const SHOP: &str = "console-shop-token";

/// The cluster's queues, system and keys, its api on `port`.
pub(crate) fn tables(port: u16) -> String {
    format!("{QUEUES}{}", keys(port))
}

/// The queues and the system of the acceptance tests.
const QUEUES: &str = r#"
[queues.work]
handler = "sleep"
max_slots = 2

[queues.emails]
handler = "noop"
system = "partner"

[queues.flaky]
handler = "flaky"
fail_rate = 1.0
max_attempts = 1

[queues.fetch]
handler = "noop"
next = [{ queue = "parse" }]

[queues.parse]
handler = "noop"

[systems.partner]
max_concurrency = 4
"#;

/// The api's table and its two keys: `ops` (admin) and `shop` (queues `work` and
/// `emails`).
pub(crate) fn keys(port: u16) -> String {
    format!(
        r#"
[api]
listen = "127.0.0.1:{port}"

[api.keys.shop]
token_sha256 = "{shop}"
queues = ["work", "emails"]

[api.keys.ops]
token_sha256 = "{ops}"
admin = true
"#,
        shop = hash_token(SHOP),
        ops = hash_token(OPS),
    )
}

/// A running cluster with its api.
pub(crate) struct Console {
    /// Its processes, killed on drop.
    pub(crate) cluster: Cluster,
    addr: SocketAddr,
}

impl Console {
    /// Redis, a manager, a master for host `h1` and an api, each its own process.
    pub(crate) async fn start() -> Console {
        let port = free_port().unwrap();
        Self::start_with(&tables(port), port, &["h1"]).await
    }

    /// A cluster of `tables` (whose api listens on `port`) with a master per host.
    pub(crate) async fn start_with(tables: &str, port: u16, hosts: &[&str]) -> Console {
        let mut cluster = Cluster::start(tables).await;
        cluster.manager(0);
        for host in hosts {
            cluster.master(host);
        }
        let api = cluster.gaffer(&["api"], "api.log").spawn().unwrap();
        cluster.procs.0.push(api);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !(tokio::net::TcpStream::connect(addr).await.is_ok()
            && request(addr, "GET", "/healthz", None, None).await.0 == 200)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the api does not answer; its log:\n{}",
                cluster.log("api.log")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Console { cluster, addr }
    }

    /// The URL of `path` on the api.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A request to the api with `token`: its status and JSON.
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let (status, raw) = request(
            self.addr,
            method,
            path,
            Some(token),
            body.as_deref().map(str::as_bytes),
        )
        .await;
        (status, serde_json::from_slice(&raw).unwrap_or(Value::Null))
    }

    /// Submits `task` to `queue` with `token`; answers the submit's JSON.
    pub(crate) async fn submit(&self, queue: &str, token: &str, task: Value) -> Value {
        let (status, body) = self
            .call(
                "POST",
                &format!("/v1/queues/{queue}/tasks"),
                token,
                Some(task),
            )
            .await;
        assert_eq!(status, 202, "submit to {queue}: {body}");
        body
    }

    /// Task `id`'s record as the admin key reads it.
    pub(crate) async fn record(&self, queue: &str, id: &str) -> Value {
        let (status, body) = self
            .call("GET", &format!("/v1/queues/{queue}/tasks/{id}"), OPS, None)
            .await;
        assert_eq!(status, 200, "record of {queue}/{id}: {body}");
        body
    }

    /// Whether queue `queue` is paused, as `GET /v1/queues` says.
    pub(crate) async fn paused(&self, queue: &str) -> bool {
        let (status, all) = self.call("GET", "/v1/queues", OPS, None).await;
        assert_eq!(status, 200, "{all}");
        all[queue]["paused"].as_bool().unwrap()
    }

    /// Logs `browser` in with `token` through the login page, and waits for the first
    /// page to load.
    pub(crate) async fn login(&self, browser: &Browser, token: &str) {
        browser.goto(&self.url("/ui/login")).await;
        browser.type_into("#token", token).await;
        browser.click("#login-submit").await;
        browser
            .wait_script(
                "const v = document.querySelector('#view'); return !!v && v.dataset.loaded === '1';",
                json!([]),
                "the console's first page after the login",
            )
            .await;
    }
}

/// The `data-state` of the element `css` selects, or null.
async fn state_of(browser: &Browser, css: &str) -> Value {
    browser
        .exec(
            "const e = document.querySelector(arguments[0]); return e ? e.dataset.state : null;",
            json!([css]),
        )
        .await
}

/// Waits until the element `css` selects has `data-state` `state`.
async fn wait_state(browser: &Browser, css: &str, state: &str) {
    browser
        .wait_script(
            "const e = document.querySelector(arguments[0]); return !!e && e.dataset.state === arguments[1];",
            json!([css, state]),
            &format!("{css} in state {state}"),
        )
        .await;
}

/// Waits until the error banner shows and answers its text.
async fn error_banner(browser: &Browser) -> String {
    browser
        .wait_script(
            "return !document.querySelector('#error').hidden;",
            json!([]),
            "the error banner",
        )
        .await;
    browser.text("#error").await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_key_follows_its_task_live_and_sees_nothing_else() {
    let console = Console::start().await;
    let browser = Browser::start("a_limited_key_follows_its_task_live_and_sees_nothing_else").await;
    console.login(&browser, SHOP).await;
    let who = browser.text("#session-key").await.unwrap();
    assert!(who.contains("shop"), "the session names the key: {who}");
    let admin_badge = "return document.querySelector('#session-admin').hidden;";
    assert_eq!(browser.exec(admin_badge, json!([])).await, json!(true));

    // The overview lists its queues and no other.
    browser
        .wait_for("#queues-table tr[data-queue='work']", "queue work")
        .await;
    browser
        .wait_for("#queues-table tr[data-queue='emails']", "queue emails")
        .await;
    assert_eq!(
        browser.count("#queues-table tr[data-queue='flaky']").await,
        0
    );

    // Another key's task, and this key's own, which runs for 4 s.
    console
        .submit(
            "work",
            OPS,
            json!({"payload": {"ms": 1}, "id": "ops-secret"}),
        )
        .await;
    console
        .submit(
            "work",
            SHOP,
            json!({"payload": {"ms": 4000}, "id": "live-1"}),
        )
        .await;

    // Found by search, opened, followed to its end without a reload.
    browser.type_into("#search-input", "live-1").await;
    browser.click("#search-submit").await;
    browser.click("#search-results a[data-found='work']").await;
    browser.wait_for("#task-state", "the task's page").await;
    browser
        .exec("window.stillThisPage = true; return null;", json!([]))
        .await;
    let before = state_of(&browser, "#task-state").await;
    assert!(
        before == json!("waiting") || before == json!("running"),
        "the task had not ended when its page opened: {before}"
    );
    wait_state(&browser, "#task-state", "done").await;
    assert_eq!(
        browser
            .exec("return window.stillThisPage === true;", json!([]))
            .await,
        json!(true),
        "the page followed the task without reloading"
    );
    let running = browser
        .wait_text(
            "#task-history li[data-history-state='running']",
            "the running entry",
            |t| t.contains("h1/"),
        )
        .await;
    assert!(running.contains("attempt 1"), "{running}");
    assert_eq!(console.record("work", "live-1").await["state"], "done");

    // Another key's task by its URL: as if there were none.
    browser
        .goto(&console.url("/ui/#/tasks/work/ops-secret"))
        .await;
    let refused = error_banner(&browser).await;
    assert!(
        refused.contains("no task ops-secret in queue work"),
        "{refused}"
    );
    assert_eq!(browser.count("#task-state").await, 0);
    browser.type_into("#search-input", "ops-secret").await;
    browser.click("#search-submit").await;
    browser.wait_for("#search-none", "an empty search").await;

    // No admin controls anywhere.
    browser.goto(&console.url("/ui/#/queues/work")).await;
    browser
        .wait_for(
            "#queue-figures [data-figure='ready']",
            "the queue's figures",
        )
        .await;
    assert_eq!(
        browser
            .count("#pause-btn, #resume-btn, #intake-apply")
            .await,
        0
    );
    assert_eq!(browser.count("#dead-section:not([hidden])").await, 0);
    // The config its manager runs: the manager's own file, as nothing is published.
    browser
        .wait_text("#queue-config-origin", "the config's origin", |t| {
            t.starts_with("the leading manager's own file")
        })
        .await;
    let table = browser.text("#queue-config-json").await.unwrap_or_default();
    assert!(table.contains("\"max_slots\": 2"), "{table}");
    browser.goto(&console.url("/ui/#/hosts")).await;
    browser.wait_for("#slotmap thead", "the slot map").await;
    assert_eq!(browser.count("[data-drain], [data-undrain]").await, 0);
    browser.goto(&console.url("/ui/#/systems")).await;
    browser
        .wait_for("#systems-table tr[data-system='partner']", "system partner")
        .await;
    assert_eq!(browser.count("[data-system-action]").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_cancels_requeues_opens_a_chain_and_pauses_a_system() {
    let console = Console::start().await;
    let browser =
        Browser::start("an_admin_cancels_requeues_opens_a_chain_and_pauses_a_system").await;
    console.login(&browser, OPS).await;
    browser
        .wait_script(
            "return !document.querySelector('#session-admin').hidden;",
            json!([]),
            "the admin badge",
        )
        .await;

    // The overview: every queue, the host, the manager's lease.
    browser
        .wait_for("#queues-table tr[data-queue='flaky']", "queue flaky")
        .await;
    browser
        .wait_for("#hosts-table tr[data-host='h1']", "host h1")
        .await;
    browser
        .wait_text("#lease-leader", "a leader", |t| {
            !t.is_empty() && t != "none"
        })
        .await;

    // A waiting task, cancelled from its page after a confirmation.
    console
        .submit(
            "work",
            OPS,
            json!({"payload": {"ms": 1}, "id": "later-1", "delay": "1h"}),
        )
        .await;
    browser.goto(&console.url("/ui/#/tasks/work/later-1")).await;
    wait_state(&browser, "#task-state", "waiting").await;
    browser.click("#task-cancel").await;
    browser.click("#confirm-ok").await;
    wait_state(&browser, "#task-state", "cancelled").await;
    browser
        .wait_text(
            "#task-history li[data-history-state='cancelled']",
            "the cancel's note",
            |t| t.contains("cancelled by key ops"),
        )
        .await;
    assert_eq!(
        browser.count("#task-cancel").await,
        0,
        "nothing left to cancel"
    );
    assert_eq!(
        console.record("work", "later-1").await["state"],
        "cancelled"
    );

    // A dead letter, requeued from its queue's page.
    console
        .submit("flaky", OPS, json!({"payload": 1, "id": "doomed-1"}))
        .await;
    poll_some(Duration::from_secs(30), "doomed-1 failed", || async {
        (console.record("flaky", "doomed-1").await["state"] == "failed").then_some(())
    })
    .await;
    browser.goto(&console.url("/ui/#/queues/flaky")).await;
    browser.click("input[data-dead-select='doomed-1']").await;
    browser.click("#dead-requeue-selected").await;
    browser.click("#confirm-ok").await;
    browser
        .wait_text("#flash", "the requeue's count", |t| t == "requeued 1")
        .await;
    let history = console.record("flaky", "doomed-1").await["history"].to_string();
    assert!(
        history.contains("requeued from the dead letters by key ops"),
        "{history}"
    );

    // A chain, as a tree: the follow-up under its parent.
    let chain = console
        .submit("fetch", OPS, json!({"payload": 1, "id": "import-1"}))
        .await["chain"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/ui/#/chains/{}", urlencode(&chain));
    browser.goto(&console.url(&path)).await;
    wait_state(&browser, "#chain-state", "done").await;
    let child =
        "#chain-tree > li[data-chain-task='fetch/import-1'] > ul > li[data-chain-task^='parse/']";
    wait_state(&browser, child, "done").await;
    assert_eq!(
        state_of(&browser, "li[data-chain-task='fetch/import-1']").await,
        "done"
    );

    // An external system, paused.
    browser.goto(&console.url("/ui/#/systems")).await;
    browser
        .click("button[data-system-action='pause'][data-system='partner']")
        .await;
    wait_state(
        &browser,
        "tr[data-system='partner'] [data-col='state'] .badge",
        "paused",
    )
    .await;
    let (_, cluster) = console.call("GET", "/v1/cluster", OPS, None).await;
    assert_eq!(
        cluster["systems"]["partner"]["state"], "paused",
        "{cluster}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_a_wrong_token_and_forged_writes() {
    let console = Console::start().await;
    let browser = Browser::start("the_console_refuses_a_wrong_token_and_forged_writes").await;

    // No session: the console sends the browser to its login page.
    browser.goto(&console.url("/ui/")).await;
    browser.wait_for("#login-form", "the login page").await;
    // A wrong token: back to the login page, which says so.
    browser.type_into("#token", "not-a-token").await;
    browser.click("#login-submit").await;
    browser
        .wait_script(
            "return location.search.includes('failed=1') && !document.querySelector('#login-failed').hidden;",
            json!([]),
            "the failed login's message",
        )
        .await;

    console.login(&browser, OPS).await;
    // A write from the page without the CSRF token is refused, and changes nothing.
    let forged = "const done = arguments[arguments.length - 1]; \
        fetch('/v1/queues/work/pause', {method: 'POST', credentials: 'same-origin'}) \
        .then(async (r) => done([r.status, await r.text()]));";
    let answer = browser.exec_async(forged, json!([])).await;
    assert_eq!(answer[0], 403, "{answer}");
    assert!(answer[1].as_str().unwrap().contains("csrf"), "{answer}");
    assert!(!console.paused("work").await);

    // With the session's token, the same write goes through: it was the token.
    let honest = "const done = arguments[arguments.length - 1]; \
        fetch('/ui/session', {credentials: 'same-origin'}).then((r) => r.json()).then((s) => \
        fetch('/v1/queues/work/pause', {method: 'POST', credentials: 'same-origin', \
          headers: {'X-CSRF-Token': s.csrf}})).then((r) => done(r.status));";
    assert_eq!(browser.exec_async(honest, json!([])).await, 200);
    assert!(console.paused("work").await);
    console
        .call("POST", "/v1/queues/work/resume", OPS, None)
        .await;

    // Logging out ends the session: the console is the login page again.
    browser.goto(&console.url("/ui/#/")).await;
    browser.click("#logout").await;
    browser
        .wait_for("#login-form", "the login page after the logout")
        .await;
    browser.goto(&console.url("/ui/#/systems")).await;
    browser
        .wait_for("#login-form", "the login page for a logged out browser")
        .await;
    console.login(&browser, OPS).await;

    // A form on another site posting to the api: the session cookie is not sent with
    // it (SameSite=Strict), so it acts as nobody.
    let target = console.url("/v1/queues/work/pause");
    let page = format!(
        "data:text/html,<form id=f method=post action='{target}'></form>\
         <script>document.getElementById('f').submit()</script>"
    );
    browser.goto(&page).await;
    browser
        .wait_script(
            "return location.href === arguments[0] && document.readyState === 'complete';",
            json!([target]),
            "the forged form's answer",
        )
        .await;
    let shown = browser.text("body").await.unwrap_or_default();
    assert!(shown.contains("error"), "the api refused it: {shown}");
    assert!(!console.paused("work").await);
}

/// `s` percent-encoded for a URL's fragment part (as the console's links encode ids).
pub(crate) fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Reports of 40 hosts (`host-00`…`host-39`), each running a slot of four of the
/// queues `q-000`…`q-149`: what the overview shows of a cluster that size, no master
/// needed.
async fn forty_hosts(console: &Console) {
    let client = console.cluster.client.clone();
    for i in 0..40u32 {
        let queues = (0..4)
            .map(|k| {
                let q = format!("q-{:03}", (i * 4 + k) % 150);
                (
                    q,
                    gaffer::cluster::QueueReport {
                        slots: 1,
                        ..Default::default()
                    },
                )
            })
            .collect();
        let report = gaffer::cluster::HostReport {
            host: format!("host-{i:02}"),
            ts_ms: gaffer::cluster::now_ms(),
            capacity: 8,
            slots: 4,
            cpus: 8,
            load1: 1.5,
            pss_bytes: 900 << 20,
            memory_budget_bytes: 4 << 30,
            queues,
            ..Default::default()
        };
        let keys = gaffer::cluster::Keys::new("test");
        gaffer::cluster::publish_host(&mut client.connection(), &keys, &report)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_filters_and_sorts_150_queues_and_40_hosts() {
    let port = free_port().unwrap();
    let mut tables: String = (0..150)
        .map(|i| format!("[queues.q-{i:03}]\nhandler = \"noop\"\n\n"))
        .collect();
    // The limited key's queues, which `keys` names.
    tables.push_str("[queues.work]\nhandler = \"noop\"\n\n[queues.emails]\nhandler = \"noop\"\n");
    tables.push_str(&keys(port));
    // No master: what is submitted stays ready.
    let console = Console::start_with(&tables, port, &[]).await;
    forty_hosts(&console).await;
    for (queue, n) in [("q-007", 3), ("q-123", 9), ("q-042", 5)] {
        let tasks: Vec<Value> = (0..n).map(|_| json!({"payload": 1})).collect();
        console.submit(queue, OPS, json!({ "tasks": tasks })).await;
    }
    let browser = Browser::start("the_overview_filters_and_sorts_150_queues_and_40_hosts").await;
    console.login(&browser, OPS).await;
    browser
        .wait_script(
            "return document.querySelectorAll('#queues-table tbody tr[data-queue]').length === 152 \
             && document.querySelectorAll('#hosts-table tbody tr[data-host]').length === 40;",
            json!([]),
            "152 queues and 40 hosts",
        )
        .await;
    // The first page of a freshly loaded document: its time to first render.
    browser.goto("about:blank").await;
    browser.goto(&console.url("/ui/#/")).await;
    browser
        .wait_script(
            "return document.querySelectorAll('#queues-table tbody tr[data-queue]').length === 152 \
             && document.querySelectorAll('#hosts-table tbody tr[data-host]').length === 40;",
            json!([]),
            "the overview again",
        )
        .await;
    let figures = browser
        .exec(
            "const v = document.querySelector('#view').dataset; \
             const n = performance.getEntriesByType('navigation')[0]; \
             return [Math.round(n.domContentLoadedEventEnd), Number(v.shownAtMs), Number(v.refreshMs)];",
            json!([]),
        )
        .await;
    eprintln!(
        "overview of 152 queues and 40 hosts: [DOM ready, first shown, one refresh] = {figures} ms"
    );
    assert!(
        figures[1].as_u64().unwrap() >= figures[0].as_u64().unwrap(),
        "{figures}"
    );

    // The filter keeps the matching rows, live.
    browser.type_into("#filter", "q-01").await;
    let rows = "return [...document.querySelectorAll('#queues-table tbody tr[data-queue]')] \
                .map((r) => r.dataset.queue);";
    browser
        .wait_script(
            "return document.querySelectorAll('#queues-table tbody tr[data-queue]').length === 10;",
            json!([]),
            "the filtered rows",
        )
        .await;
    let shown = browser.exec(rows, json!([])).await;
    let expected: Vec<String> = (10..20).map(|i| format!("q-{i:03}")).collect();
    assert_eq!(shown, json!(expected));
    assert_eq!(
        browser.text("#queue-count").await.as_deref(),
        Some("10 of 152 queues")
    );
    browser.type_into("#filter", "host-1").await;
    let hosts = "return [...document.querySelectorAll('#hosts-table tbody tr[data-host]')] \
                 .map((r) => r.dataset.host);";
    browser
        .wait_script(
            "return document.querySelectorAll('#hosts-table tbody tr[data-host]').length === 10;",
            json!([]),
            "the filtered hosts",
        )
        .await;
    let expected: Vec<String> = (10..20).map(|i| format!("host-{i}")).collect();
    assert_eq!(browser.exec(hosts, json!([])).await, json!(expected));

    // Sorted by ready, most first; a second click reverses.
    browser.type_into("#filter", "").await;
    browser.click("#queues-table th[data-sort='ready']").await;
    browser
        .wait_script(
            "const r = document.querySelectorAll('#queues-table tbody tr[data-queue]'); \
             return r.length === 152 && r[0].dataset.queue === 'q-123';",
            json!([]),
            "q-123 first",
        )
        .await;
    let top: Vec<String> = serde_json::from_value(browser.exec(rows, json!([])).await).unwrap();
    assert_eq!(top[..3], ["q-123", "q-042", "q-007"]);
    browser.click("#queues-table th[data-sort='ready']").await;
    browser
        .wait_script(
            "const r = document.querySelectorAll('#queues-table tbody tr[data-queue]'); \
             return r[r.length - 1].dataset.queue === 'q-123';",
            json!([]),
            "q-123 last",
        )
        .await;
    // A refresh keeps the order and the filter (the page polls every 2 s).
    let refreshes = "return Number(document.querySelector('#view').dataset.refreshes);";
    let before = browser.exec(refreshes, json!([])).await.as_u64().unwrap();
    browser
        .wait_script(
            "return Number(document.querySelector('#view').dataset.refreshes) > arguments[0];",
            json!([before]),
            "a refresh",
        )
        .await;
    let last = browser
        .exec(
            "const r = document.querySelectorAll('#queues-table tbody tr[data-queue]'); \
             return r[r.length - 1].dataset.queue;",
            json!([]),
        )
        .await;
    assert_eq!(last, "q-123");
}
