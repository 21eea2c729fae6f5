//! Chains end to end: a real master whose exec slots create follow-ups, the api over real
//! HTTP, on one Redis and on a three-master Redis Cluster (where a parent, its children
//! and its chain live in different hash slots).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gaffer::api::{ApiOptions, hash_token};
use gaffer::cluster::{self, Keys, SlotMap};
use gaffer::queue_client::{ConnectOptions, QueueClient, RecordState, TaskRecord};
use gaffer::redis_server::free_port;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::request;
use crate::harness::{
    ANY_LOAD, TestRedis, eventually, held_after_follow_ups, kid_ids, poll_some, script_calls,
    shared_cluster_url,
};
use crate::host::{gone, http_get};

const TOKEN: &str = "chain-token";
/// Another key's, with the same queues.
const OTHER_TOKEN: &str = "other-token";
/// An admin key's.
const ADMIN_TOKEN: &str = "admin-token";
const HOST: &str = "chain-host";

/// The handler of every queue of these tests, told apart by the queue's name (its last
/// five letters; the rest is the test's prefix). Each run is logged as "QUEUE ID".
const HANDLER: &str = r#"
import json, os, sys, time
queue = os.environ["GAFFER_QUEUE"]
prefix, kind = queue[:-5], queue[-5:]
log = os.environ["CHAIN_TEST_LOG"]
for line in sys.stdin:
    out = []
    for t in json.loads(line)["batch"]:
        p = t["payload"] if isinstance(t["payload"], dict) else {}
        if p.get("slow"):
            time.sleep(0.05)
        while p.get("gate") and not os.path.exists(p["gate"]):
            time.sleep(0.02)
        with open(log, "a") as f:
            f.write(queue + " " + t["id"] + "\n")
        r = {"id": t["id"], "status": "ok"}
        if kind == "fetch":
            r["result"] = {"parts": 3}
            r["next"] = [{"queue": prefix + "parse", "payload": {"part": i, "fail": p.get("fail_part") == i}}
                         for i in (1, 2, 3)]
            for f in r["next"]:
                for flag in ("retry", "hang"):
                    if p.get(flag + "_part") == f["payload"]["part"]:
                        f["payload"][flag] = True
        elif kind == "parse":
            if p.get("hang"):
                # (the test kills this slot, named by the file, and this child goes too)
                ppid = os.getppid()
                with open(log + ".hang", "w") as f:
                    f.write(str(ppid))
                while os.getppid() == ppid:
                    time.sleep(0.05)
                sys.exit(0)
            if p.get("retry"):
                r = {"id": t["id"], "status": "retry", "delay_ms": 0}
            elif p.get("fail"):
                r = {"id": t["id"], "status": "fail", "error": "part %d is unreadable" % p["part"]}
            else:
                r["result"] = {"rows": p["part"] * 10}
                if p["part"] == 2:
                    r["next"] = [{"queue": prefix + "store", "payload": {"rows": 20}}]
        elif kind == "first":
            r["result"] = {"from": "first"}
            r["next"] = [{"queue": prefix + "after", "payload": {"from": "handler"}}]
            if p.get("child_gate"):
                r["result"]["gate"] = p["child_gate"]
                r["next"][0]["payload"]["gate"] = p["child_gate"]
        elif kind in ("after", "clean"):
            r["result"] = {"given": t["payload"]}
        elif kind == "store" and p.get("bad_next"):
            r["next"] = [{"queue": "nowhere", "payload": 1}]
        out.append(r)
    print(json.dumps({"results": out}), flush=True)
"#;

/// The queues of a test, named with `prefix`.
fn queues(prefix: &str, script: &Path) -> String {
    let exec = |name: &str, extra: &str| {
        format!(
            "[queues.{prefix}{name}]\nhandler = \"exec\"\ncommand = [\"python3\", \"{}\"]\n\
             batch_size = 5\nlease = \"2s\"\n\
             retry = {{ backoff = \"fixed\", base = \"100ms\", max = \"100ms\" }}\n{extra}\n",
            script.display()
        )
    };
    [
        exec("fetch", ""),
        exec(
            "parse",
            &format!("max_attempts = 1\nnext = [{{ queue = \"{prefix}clean\", on = \"failed\" }}]"),
        ),
        exec("store", ""),
        exec("clean", ""),
        exec(
            "first",
            &format!("next = [{{ queue = \"{prefix}after\", on = \"done\" }}]"),
        ),
        exec("after", ""),
        exec(
            "twins",
            &format!("next = [{{ queue = \"{prefix}after\", on = \"done\" }}]"),
        ),
    ]
    .concat()
}

/// A master process, an api instance and a client, on a Redis the test names.
struct Rig {
    prefix: String,
    namespace: String,
    master: Child,
    master_http: u16,
    api: SocketAddr,
    api_stop: CancellationToken,
    client: QueueClient,
    config_path: PathBuf,
    dir: tempfile::TempDir,
}

impl Rig {
    /// Starts it all on `redis_url` under `namespace`, queues named with `prefix`, one
    /// slot per queue; `env` goes to the master (and so to its slots).
    async fn start(redis_url: &str, namespace: &str, prefix: &str, env: &[(&str, String)]) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("handler.py");
        std::fs::write(&script, HANDLER).unwrap();
        let master_http = free_port().unwrap();
        let text = format!(
            "[cluster]\nredis = \"{redis_url}\"\nnamespace = \"{namespace}\"\n\n\
             [master]\nhttp = \"127.0.0.1:{master_http}\"\ndrain_timeout = \"5s\"\n\
             memory_reserve = \"64MiB\"\n\n[api]\nmax_wait = \"60s\"\n\n\
             [api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"*\"]\n\n\
             [api.keys.other]\ntoken_sha256 = \"{}\"\nqueues = [\"*\"]\n\n\
             [api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n\n{}",
            hash_token(TOKEN),
            hash_token(OTHER_TOKEN),
            hash_token(ADMIN_TOKEN),
            queues(prefix, &script)
        );
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, &text).unwrap();
        let config = gaffer::config::parse(&text, "chains.toml").unwrap();
        let client = QueueClient::connect(redis_url, namespace, &ConnectOptions::default())
            .await
            .unwrap();
        let names: Vec<String> = config.queues.keys().cloned().collect();
        publish(&client, namespace, &names).await;
        let log = std::fs::File::create(dir.path().join("master.log")).unwrap();
        let master = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(&config_path)
            .args(["master", "--host", HOST])
            .env("GAFFER_LOG", "info")
            .env("CHAIN_TEST_LOG", dir.path().join("runs.log"))
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut opts = ApiOptions::new(config, redis_url.to_string());
        opts.listen = Some("127.0.0.1:0".parse().unwrap());
        let api_stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(gaffer::api::run(opts, api_stop.clone(), Some(tx)));
        let api = rx.await.expect("the api binds");
        let rig = Rig {
            prefix: prefix.to_string(),
            namespace: namespace.to_string(),
            master,
            master_http,
            api,
            api_stop,
            client,
            config_path,
            dir,
        };
        rig.wait_idle_slots(names.len()).await;
        rig
    }

    async fn wait_idle_slots(&self, n: usize) {
        eventually(
            Duration::from_secs(30),
            "every queue's slot idle",
            || async {
                let idle = http_get(self.master_http, "/status")
                    .and_then(|b| serde_json::from_str::<Value>(&b).ok())
                    .map(|s| {
                        s["slots"]
                            .as_array()
                            .map(|a| a.iter().filter(|s| s["state"] == "idle").count())
                            .unwrap_or(0)
                    })
                    .unwrap_or(0);
                idle >= n
            },
        )
        .await;
    }

    fn q(&self, kind: &str) -> String {
        format!("{}{kind}", self.prefix)
    }

    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        self.call_as(TOKEN, method, path, body).await
    }

    async fn call_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, Value) {
        let (status, body) =
            request(self.api, method, path, Some(token), body.map(str::as_bytes)).await;
        let json = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
        (status, json)
    }

    /// Every handler run so far, as (queue, id).
    fn runs(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(self.dir.path().join("runs.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(q, id)| (q.to_string(), id.to_string()))
            .collect()
    }

    fn master_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("master.log")).unwrap_or_default()
    }

    /// `gaffer tasks chain ID` against this rig's Redis.
    fn cli_chain(&self, id: &str, json: bool) -> (bool, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gaffer"));
        cmd.arg("--config")
            .arg(&self.config_path)
            .args(["tasks", "chain", id]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.api_stop.cancel();
        let _ = self.master.kill();
        let _ = self.master.wait();
    }
}

/// A slot map giving this host one slot of each queue.
async fn publish(client: &QueueClient, namespace: &str, queues: &[String]) {
    let mut hosts = BTreeMap::new();
    hosts.insert(
        HOST.to_string(),
        queues.iter().map(|q| (q.clone(), 1)).collect(),
    );
    let map = SlotMap {
        epoch: 1,
        version: 1,
        hosts,
    };
    cluster::write_map_unfenced(&mut client.connection(), &Keys::new(namespace), &map)
        .await
        .unwrap();
}

/// The states of a chain document's tasks by id.
fn states(chain: &Value) -> BTreeMap<String, String> {
    chain["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_string(),
                t["state"].as_str().unwrap_or("none").to_string(),
            )
        })
        .collect()
}

/// Fetch fans out to three parse tasks, the second of which leads to a store task: the
/// sync submit answers once all five are done, and only then; one part failing for good
/// fails the chain, naming that task, and its queue's failed route runs. Every chain's id
/// has the same form on one server and on a Redis Cluster.
async fn fan_out_and_fail(rig: &Rig) {
    let (chain, want) = a_fan_out_ends_done(rig).await;
    chain_ids_are_minted_and_no_client_takes_one(rig, &chain, &want).await;
    a_part_failing_fails_the_chain(rig).await;
    a_part_retried_past_its_attempts_fails_the_chain(rig).await;
    a_part_lost_at_its_last_attempt_runs_its_failed_route(rig).await;
    an_unknown_follow_up_queue_fails_its_task(rig).await;
    same_ids_never_share_children(rig).await;
    a_later_run_under_an_id_sees_only_its_own_chain(rig).await;
    each_queue_lists_the_members_it_holds(rig).await;
}

/// Whether `chain` is an id a queue `queue` minted: `~cQUEUE.N`.
fn minted_by(chain: &str, queue: &str) -> bool {
    chain
        .strip_prefix(&format!("~c{queue}."))
        .is_some_and(|n| n.parse::<u64>().is_ok())
}

/// Each queue lists the members of a chain it holds, written with their enqueue, in the
/// roster its chain shares with those of the 127 numbers next to it (entries `CHAIN FS ID
/// RS`), which lives twice its `history_ttl`; the global task is found by its number, in
/// no list. The same on one server and on a Redis Cluster.
async fn each_queue_lists_the_members_it_holds(rig: &Rig) {
    let first = rig.q("first");
    let chain = done_in(rig, "first", "bare").await;
    assert!(minted_by(&chain, &first), "{chain}");
    let kids = route_kids(rig, "first", "bare", 2).await;
    let mut want = vec!["bare".to_string()];
    want.extend(kids.iter().cloned());
    assert_eq!(chain_ids(rig, &chain).await, want);
    let mut conn = rig.client.connection();
    let (origin, n) = chain.rsplit_once('.').unwrap();
    let roster = format!("{origin}.{}", n.parse::<u64>().unwrap() / 128);
    let set = |queue: &str| format!("{}:{{{queue}}}:chains:{roster}", rig.namespace);
    let listed: String = redis::cmd("GET")
        .arg(set(&rig.q("after")))
        .query_async(&mut conn)
        .await
        .unwrap();
    let entries: Vec<(&str, &str)> = listed
        .split_terminator('\u{1e}')
        .map(|e| e.split_once('\u{1f}').unwrap())
        .collect();
    for (g, id) in &entries {
        let (o, k) = g.rsplit_once('.').unwrap();
        assert_eq!(format!("{o}.{}", k.parse::<u64>().unwrap() / 128), roster);
        assert!(id.starts_with(&format!("{g}~")), "{g} {id}");
    }
    let mine: Vec<&str> = entries
        .iter()
        .filter(|(g, _)| *g == chain)
        .map(|e| e.1)
        .collect();
    assert_eq!(
        mine, kids,
        "the route's follow-up and the handler's, in the chain's roster"
    );
    let own: Option<String> = redis::cmd("GET")
        .arg(set(&first))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(own, None, "the global task is in no list");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(set(&rig.q("after")))
        .query_async(&mut conn)
        .await
        .unwrap();
    // (the test config's history_ttl is the default, 7 days)
    let week = 7 * 24 * 3600 * 1000;
    assert!(ttl > 2 * week - 60_000 && ttl <= 2 * week, "{ttl}");
    // An id as long as ids may be: its chain's id, and so its follow-ups', are short.
    let long = "l".repeat(gaffer::queue_client::MAX_ID_LEN);
    let chain = done_in(rig, "first", &long).await;
    assert!(minted_by(&chain, &first), "{chain}");
    let mut want = vec![long.clone()];
    want.extend(route_kids(rig, "first", &long, 2).await);
    assert_eq!(chain_ids(rig, &chain).await, want);
}

/// A key that submits a task under the id of another key's ended global task (a new
/// task, which `dedup = "active"` allows) starts a chain of its own, and sees neither the
/// earlier chain nor its tasks.
async fn a_later_run_under_an_id_sees_only_its_own_chain(rig: &Rig) {
    let (first, after) = (rig.q("first"), rig.q("after"));
    let mine = done_in(rig, "first", "mine").await;
    let earlier = route_kids(rig, "first", "mine", 1).await.remove(0);
    let path = format!("/v1/queues/{first}/tasks");
    let body = r#"{"payload": {}, "id": "mine", "wait": "30s"}"#;
    let (status, rec) = rig.call_as(OTHER_TOKEN, "POST", &path, Some(body)).await;
    assert_eq!(
        status, 409,
        "a limited key takes no id another key's record holds: {rec}"
    );
    // (the library stands for that key's submit made once the earlier record was gone,
    // which a limited key may do)
    let cfg = gaffer::config::load(&rig.config_path).unwrap();
    let limits = gaffer::queue_client::QueueLimits::from(&cfg.queues[&first]);
    let q = rig.client.queue_with(&first, limits).unwrap();
    let earlier_at = q.record("mine").await.unwrap().unwrap().created_at;
    let task = gaffer::queue_client::NewTask::new("{}")
        .id("mine")
        .submitted_by("other");
    let made = q.enqueue(task).await.unwrap();
    let theirs = made.chain.expect("a route queue's task starts a chain");
    assert_ne!(theirs, mine);
    let rec = poll_some(Duration::from_secs(30), "the later task done", || async {
        q.record("mine")
            .await
            .unwrap()
            .filter(|r| r.created_at != earlier_at && r.state == RecordState::Done)
    })
    .await;
    assert_eq!(rec.chain.as_deref(), Some(theirs.as_str()));
    let (status, doc) = rig
        .call_as(
            OTHER_TOKEN,
            "GET",
            &format!("/v1/queues/{after}/tasks/{earlier}"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{earlier}: {doc}");
    // (the earlier chain is gone with its global task's record, for every key)
    for token in [OTHER_TOKEN, ADMIN_TOKEN] {
        let (status, doc) = rig
            .call_as(token, "GET", &format!("/v1/chains/{mine}"), None)
            .await;
        assert_eq!(status, 404, "{doc}");
    }
    let (status, doc) = rig
        .call_as(OTHER_TOKEN, "GET", &format!("/v1/chains/{theirs}"), None)
        .await;
    assert_eq!(status, 200, "{doc}");
    let kids = route_kids(rig, "first", "mine", 1).await;
    assert_eq!(kids[0], format!("{theirs}~1"));
    assert!(task_ids(&doc).contains(&kids[0].as_str()), "{doc}");
    assert!(!task_ids(&doc).contains(&earlier.as_str()), "{doc}");
    let (status, doc) = rig
        .call_as(
            OTHER_TOKEN,
            "GET",
            &format!("/v1/queues/{after}/tasks/{}", kids[0]),
            None,
        )
        .await;
    assert_eq!(status, 200, "{doc}");
}

/// The sync submit answers once all five are done; the record and the chain endpoint
/// agree. Returns the chain's id and its tasks' states.
async fn a_fan_out_ends_done(rig: &Rig) -> (String, BTreeMap<String, String>) {
    let path = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    let (status, chain) = rig
        .call(
            "POST",
            &path,
            Some(r#"{"payload": {}, "chain": true, "wait": "40s"}"#),
        )
        .await;
    assert_eq!(status, 200, "{chain}\n{}", rig.master_log());
    let id = chain["id"].as_str().unwrap().to_string();
    assert!(minted_by(&id, &rig.q("fetch")), "{chain}");
    assert_eq!(chain["state"], "done", "{chain}");
    let global = chain["tasks"][0]["id"].as_str().unwrap().to_string();
    assert!(global.starts_with("~g"), "a generated id: {chain}");
    let st = states(&chain);
    let parse = |n: usize| format!("{id}~{n}");
    let want: BTreeMap<String, String> = [
        global.clone(),
        parse(1),
        parse(2),
        parse(3),
        format!("{}~1", parse(2)),
    ]
    .into_iter()
    .map(|i| (i, "done".to_string()))
    .collect();
    assert_eq!(
        st, want,
        "every task of the chain is done when it is: {chain}"
    );
    assert_eq!(chain["tasks"][0]["chain"], id.as_str(), "{chain}");
    assert_eq!(
        chain["tasks"][1]["parent"]["id"],
        global.as_str(),
        "{chain}"
    );
    assert_eq!(chain["tasks"][1]["submitted_by"], format!("chain:{id}"));
    assert_eq!(chain["tasks"][1]["chain"], id.as_str());

    // The global task's record shows its chain too, and the chain endpoint agrees.
    let (status, rec) = rig.call("GET", &format!("{path}/{global}"), None).await;
    assert_eq!(status, 200, "{rec}");
    assert_eq!(rec["chain"], id.as_str());
    assert_eq!(rec["chain_state"], "done");
    assert_eq!(rec["chain_tasks"].as_array().unwrap().len(), 5, "{rec}");
    let (status, again) = rig.call("GET", &format!("/v1/chains/{id}"), None).await;
    assert_eq!((status, states(&again)), (200, want.clone()));
    (id, want)
}

/// A chain's id is minted, never a client's: an id of that form is refused, the same
/// global id in two queues starts two chains, and a submit answers the chain it starts.
async fn chain_ids_are_minted_and_no_client_takes_one(
    rig: &Rig,
    chain: &str,
    want: &BTreeMap<String, String>,
) {
    let store = format!("/v1/queues/{}/tasks", rig.q("store"));
    for id in [chain.to_string(), format!("{chain}~1"), "~cx".into()] {
        let body = json!({"payload": {}, "id": id, "chain": true}).to_string();
        let (status, refused) = rig.call_as(ADMIN_TOKEN, "POST", &store, Some(&body)).await;
        assert_eq!(status, 400, "{refused}");
        assert_eq!(
            refused["error"],
            format!(
                "task id {id:?} is invalid: ids starting with '~c' are reserved for chains and their follow-ups"
            )
        );
    }
    // The same id in two queues: two chains, each with its own follow-ups.
    let fetch = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    let body = r#"{"payload": {}, "id": "same", "chain": true}"#;
    let (status, made) = rig.call("POST", &fetch, Some(body)).await;
    assert_eq!(status, 202, "{made}");
    let in_fetch = made["chain"].as_str().unwrap().to_string();
    assert!(minted_by(&in_fetch, &rig.q("fetch")), "{made}");
    let first = rig.q("first");
    let body = r#"{"payload": {}, "id": "same", "wait": "30s"}"#;
    let (status, rec) = rig
        .call("POST", &format!("/v1/queues/{first}/tasks"), Some(body))
        .await;
    assert_eq!((status, &rec["state"]), (200, &json!("done")), "{rec}");
    let in_first = rec["chain"].as_str().unwrap().to_string();
    assert!(minted_by(&in_first, &first), "{rec}");
    let mut kids = vec!["same".to_string()];
    kids.extend(route_kids(rig, "first", "same", 2).await);
    assert_eq!(chain_ids(rig, &in_first).await, kids);
    assert_eq!(chain_ids(rig, &in_fetch).await.len(), 5);
    let (_, still) = rig.call("GET", &format!("/v1/chains/{chain}"), None).await;
    assert_eq!(
        &states(&still),
        want,
        "the other chain is untouched: {still}"
    );
    let (ok, tree) = rig.cli_chain(chain, false);
    assert!(ok, "{tree}");
    assert!(tree.starts_with(&format!("chain {chain}: done")), "{tree}");
    assert_eq!(tree.lines().count(), 6, "{tree}");
    assert!(
        tree.contains(&format!("└─ {} {chain}~2~1  done", rig.q("store"))),
        "{tree}"
    );
}

/// Part 1 fails for good (parse has max_attempts = 1): the chain fails, naming it, and
/// parse's failed route makes a cleanup task in the same chain.
async fn a_part_failing_fails_the_chain(rig: &Rig) {
    let path = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    let (status, chain) = rig
        .call(
            "POST",
            &path,
            Some(r#"{"payload": {"fail_part": 1}, "chain": true, "wait": "40s"}"#),
        )
        .await;
    assert_eq!(status, 200, "{chain}");
    let id = chain["id"].as_str().unwrap().to_string();
    assert_eq!(chain["state"], "failed", "{chain}");
    assert_eq!(chain["failed"]["id"], format!("{id}~1"), "{chain}");
    assert_eq!(chain["failed"]["queue"], rig.q("parse"));
    let error = chain["failed"]["error"].as_str().unwrap_or_default();
    assert!(error.ends_with("part 1 is unreadable"), "{chain}");
    // parse's failed route made a cleanup task for the failed part, in the same chain.
    let (cleanup, rec) = cleanup_done(rig, &format!("{id}~1")).await;
    assert_eq!(rec.chain.as_deref(), Some(id.as_str()));
    // Its payload names the failed task and carries what that task was given.
    let given = &rec.result.as_ref().unwrap()["given"];
    assert_eq!(given["task"], format!("{id}~1"), "{given}");
    assert_eq!(
        given["payload"],
        serde_json::json!({"part": 1, "fail": true}),
        "{given}"
    );
    let (_, chain) = rig.call("GET", &format!("/v1/chains/{id}"), None).await;
    assert!(states(&chain).contains_key(&cleanup), "{chain}");
}

/// The cleanup task parse's failed route made for part `failed`, once done: its id and
/// its record.
async fn cleanup_done(rig: &Rig, failed: &str) -> (String, TaskRecord) {
    let cleanup = format!("{failed}~1");
    let clean = rig.client.queue(&rig.q("clean")).unwrap();
    let rec = poll_some(Duration::from_secs(20), "the cleanup task done", || async {
        clean
            .record(&cleanup)
            .await
            .unwrap()
            .filter(|r| r.state == RecordState::Done)
    })
    .await;
    (cleanup, rec)
}

/// A part whose handler asks for a retry at its last attempt fails for good too, and its
/// queue's failed route runs for it as for a failure.
async fn a_part_retried_past_its_attempts_fails_the_chain(rig: &Rig) {
    let path = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    let body = r#"{"payload": {"retry_part": 2}, "chain": true, "wait": "40s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(body)).await;
    assert_eq!(status, 200, "{chain}");
    let id = chain["id"].as_str().unwrap().to_string();
    assert_eq!(chain["state"], "failed", "{chain}");
    assert_eq!(chain["failed"]["id"], format!("{id}~2"), "{chain}");
    let error = chain["failed"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("attempt 1 of 1 failed (max_attempts reached)"),
        "{chain}"
    );
    let (_, rec) = cleanup_done(rig, &format!("{id}~2")).await;
    let given = &rec.result.as_ref().unwrap()["given"];
    assert_eq!(given["task"], format!("{id}~2"), "{given}");
    assert_eq!(given["error"], error, "{given}");
}

/// A part whose slot dies at its last attempt (its lease runs out) fails for good with its
/// queue's failed route, as a failure does: the take hands it out once more, past its
/// max_attempts, and the next slot fails it without running it.
async fn a_part_lost_at_its_last_attempt_runs_its_failed_route(rig: &Rig) {
    let path = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    let body = r#"{"payload": {"hang_part": 3}, "chain": true}"#;
    let (status, made) = rig.call("POST", &path, Some(body)).await;
    assert_eq!(status, 202, "{made}");
    let id = made["chain"].as_str().unwrap().to_string();
    let marker = rig.dir.path().join("runs.log.hang");
    let pid: i32 = poll_some(Duration::from_secs(30), "a part's handler hung", || async {
        std::fs::read_to_string(&marker)
            .ok()
            .and_then(|p| p.trim().parse().ok())
    })
    .await;
    std::fs::remove_file(&marker).unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let chain = poll_some(Duration::from_secs(40), "the chain failed", || async {
        let (status, doc) = rig.call("GET", &format!("/v1/chains/{id}"), None).await;
        (status == 200 && doc["state"] == "failed").then_some(doc)
    })
    .await;
    let lost = format!("{id}~3");
    let reason = "lease expired on attempt 1 of 1 (max_attempts reached)";
    let failed = chain["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == lost.as_str())
        .unwrap_or_else(|| panic!("{lost} in {chain}"));
    assert_eq!(failed["state"], "failed", "{chain}");
    assert_eq!(failed["error"], reason, "{chain}");
    let (_, rec) = cleanup_done(rig, &lost).await;
    let given = &rec.result.as_ref().unwrap()["given"];
    assert_eq!(
        (&given["task"], &given["error"]),
        (&Value::from(lost.clone()), &Value::from(reason))
    );
    let parse = rig.q("parse");
    let runs = rig
        .runs()
        .into_iter()
        .filter(|(q, i)| *q == parse && *i == lost)
        .count();
    assert_eq!(runs, 1, "not run past its max_attempts");
}

/// A follow-up to a queue the config does not name fails its task for good, saying so.
async fn an_unknown_follow_up_queue_fails_its_task(rig: &Rig) {
    let store = format!("/v1/queues/{}/tasks", rig.q("store"));
    let (status, rec) = rig
        .call(
            "POST",
            &store,
            Some(r#"{"payload": {"bad_next": true}, "wait": "30s"}"#),
        )
        .await;
    assert_eq!(status, 200, "{rec}");
    assert_eq!(rec["state"], "failed", "{rec}");
    let error = rec["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("follow-up to unknown queue \"nowhere\""),
        "{rec}"
    );
    // A handler's follow-ups of a task whose id would cut its chain's records (its
    // follow-ups are known only once it ran). No submit takes such an id now; one an
    // older build took (written here as it did, delayed so that no slot takes it before)
    // still fails rather than cut them.
    let fetch = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    let (status, rec) = rig
        .call(
            "POST",
            &fetch,
            Some(r#"{"payload": {}, "id": "cut\u001fid"}"#),
        )
        .await;
    assert_eq!(status, 400, "{rec}");
    let old = gaffer::queue_client::NewTask::new("{}")
        .id("cut-id")
        .submitted_by("shop")
        .delay(Duration::from_secs(3600));
    let q = rig.client.queue(&rig.q("fetch")).unwrap();
    q.enqueue(old).await.unwrap();
    crate::hardening_ids::rename_waiting_task(
        &rig.client,
        &rig.q("fetch"),
        ("cut-id", "cut\u{1f}id"),
        Some("shop"),
    )
    .await;
    let rec = poll_some(
        Duration::from_secs(30),
        "the old id's task failed",
        || async {
            let (status, rec) = rig.call("GET", &format!("{fetch}/cut%1Fid"), None).await;
            (status == 200 && rec["state"] == "failed").then_some(rec)
        },
    )
    .await;
    let error = rec["error"].as_str().unwrap_or_default();
    assert!(error.contains("cannot start a chain"), "{rec}");
}

/// Submits a task with `id` to queue `kind` and waits for it to end; returns its record.
async fn run_to_end(rig: &Rig, kind: &str, id: &str) -> Value {
    let path = format!("/v1/queues/{}/tasks", rig.q(kind));
    let body = format!(r#"{{"payload": {{}}, "id": "{id}", "wait": "30s"}}"#);
    let (status, rec) = rig.call("POST", &path, Some(&body)).await;
    assert_eq!(status, 200, "{rec}\n{}", rig.master_log());
    rec
}

/// Runs task `id` on queue `kind` to its end, which must be done; returns its chain.
async fn done_in(rig: &Rig, kind: &str, id: &str) -> String {
    let rec = run_to_end(rig, kind, id).await;
    assert_eq!(rec["state"], "done", "{rec}");
    rec["chain"].as_str().unwrap_or_default().to_string()
}

/// The chain task `id` of queue `kind` is in, as its record names it.
async fn chain_of(rig: &Rig, kind: &str, id: &str) -> String {
    let q = rig.client.queue(&rig.q(kind)).unwrap();
    let rec = q.record(id).await.unwrap().expect("the task's record");
    rec.chain.expect("a route queue's task names its chain")
}

/// The ids the global task `id` of queue `kind` gives its first `n` follow-ups.
async fn route_kids(rig: &Rig, kind: &str, id: &str, n: usize) -> Vec<String> {
    let q = rig.client.queue(&rig.q(kind)).unwrap();
    let rec = q
        .record(id)
        .await
        .unwrap()
        .expect("the global task's record");
    kid_ids(&rig.client, &q, &rec, n).await
}

/// The ids of a chain document's tasks, in its order.
fn task_ids(doc: &Value) -> Vec<&str> {
    doc["tasks"]
        .as_array()
        .expect("a chain document lists its tasks")
        .iter()
        .map(|t| t["id"].as_str().expect("each task has an id"))
        .collect()
}

/// The ids of a chain's tasks, as its endpoint lists them once it has ended.
async fn chain_ids(rig: &Rig, chain: &str) -> Vec<String> {
    chain_ids_as(rig, TOKEN, chain).await
}

/// The same, asked with `token`.
async fn chain_ids_as(rig: &Rig, token: &str, chain: &str) -> Vec<String> {
    let path = format!("/v1/chains/{}", chain.replace('#', "%23"));
    let doc = poll_some(Duration::from_secs(30), "the chain ended", || async {
        let (status, doc) = rig.call_as(token, "GET", &path, None).await;
        (status == 200 && doc["state"] != "running").then_some(doc)
    })
    .await;
    assert_eq!(doc["state"], "done", "{doc}");
    task_ids(&doc).into_iter().map(String::from).collect()
}

/// Two parents with one id never make one child between them: tasks of the same id in two
/// queues routing to one queue, a task submitted again under its id after it ended (a
/// new task, as `dedup = "active"` allows), each start a chain of their own, whose id
/// their follow-ups' ids derive from. The same on one server and on a Redis Cluster.
async fn same_ids_never_share_children(rig: &Rig) {
    let (first, twins, after) = (rig.q("first"), rig.q("twins"), rig.q("after"));
    let ours = done_in(rig, "first", "twin").await;
    let run1 = route_kids(rig, "first", "twin", 2).await;
    assert_eq!(run1, [format!("{ours}~1"), format!("{ours}~2")]);
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run1.iter().cloned());
    assert_eq!(chain_ids(rig, &ours).await, in_chain);
    // Another queue's task of that id: a chain of its own, and children of its own.
    let theirs = done_in(rig, "twins", "twin").await;
    assert!(minted_by(&theirs, &twins), "{theirs}");
    let twin_kid = route_kids(rig, "twins", "twin", 1).await;
    assert_eq!(
        chain_ids(rig, &theirs).await,
        ["twin".to_string(), twin_kid[0].clone()]
    );
    // The same task again: a new chain, whose children are named from it.
    let second = done_in(rig, "first", "twin").await;
    assert_ne!(second, ours);
    let run2 = route_kids(rig, "first", "twin", 2).await;
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run2.iter().cloned());
    assert_eq!(chain_ids(rig, &second).await, in_chain);
    // And a third, which a submit asking for its chain then finds (a dedup hit on the
    // waiting task): the submit follows that task's chain.
    let path = format!("/v1/queues/{first}/tasks");
    let delayed = r#"{"payload": {}, "id": "twin", "delay": "2s"}"#;
    let (status, rec) = rig.call("POST", &path, Some(delayed)).await;
    assert_eq!(status, 202, "{rec}");
    let third = rec["chain"].as_str().unwrap().to_string();
    let follow = r#"{"payload": {}, "id": "twin", "chain": true, "wait": "30s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(follow)).await;
    assert_eq!(status, 200, "{chain}");
    assert_eq!(chain["id"], third.as_str(), "{chain}");
    assert_eq!(chain["state"], "done", "{chain}");
    let run3 = route_kids(rig, "first", "twin", 2).await;
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run3.iter().cloned());
    assert_eq!(task_ids(&chain), in_chain);
    let runs = rig.runs();
    let kids: Vec<String> = [run1, run2, run3, twin_kid].concat();
    for id in &kids {
        let n = runs.iter().filter(|(q, i)| *q == after && i == id).count();
        assert_eq!(n, 1, "{id} ran once: {runs:?}");
    }
    // A submit of the ended task's id asking for a chain starts a new one, with
    // children of its own.
    let body = r#"{"payload": {}, "id": "twin", "chain": true, "wait": "30s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(body)).await;
    assert_eq!(status, 200, "{chain}");
    let run4 = route_kids(rig, "first", "twin", 2).await;
    assert!(!kids.contains(&run4[0]), "{run4:?}");
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run4);
    assert_eq!(task_ids(&chain), in_chain, "{chain}");
}

#[tokio::test]
async fn a_chain_with_a_fan_out_ends_when_all_its_tasks_do() {
    let redis = TestRedis::start();
    let rig = Rig::start(&redis.url(), "test", "a", &[]).await;
    fan_out_and_fail(&rig).await;
    a_wait_on_a_task_not_made_yet_sleeps(&rig).await;
    a_chain_wait_never_answers_with_another_keys_task(&rig).await;
}

/// A sync chain submit whose global task ended while its chain runs on, and whose id
/// another key then submitted a task under (`dedup = "active"`), answers 410 as a plain
/// wait does, never that key's task as its chain.
async fn a_chain_wait_never_answers_with_another_keys_task(rig: &Rig) {
    let first = rig.q("first");
    let path = format!("/v1/queues/{first}/tasks");
    let gate = rig.dir.path().join("reused-gate");
    let body =
        json!({"id": "reused", "payload": {"child_gate": gate}, "chain": true, "wait": "60s"})
            .to_string();
    let waiting = {
        let (addr, path) = (rig.api, path.clone());
        tokio::spawn(async move {
            let (status, body) =
                request(addr, "POST", &path, Some(TOKEN), Some(body.as_bytes())).await;
            (status, String::from_utf8_lossy(&body).to_string())
        })
    };
    let q = rig.client.queue(&first).unwrap();
    let record = || async { q.record("reused").await.unwrap() };
    let ours = poll_some(Duration::from_secs(30), "the global task done", || async {
        record().await.filter(|r| r.state == RecordState::Done)
    })
    .await;
    // (an admin key's submit: a limited one may not take an id another key's record holds)
    let (status, theirs) = rig
        .call_as(
            ADMIN_TOKEN,
            "POST",
            &path,
            Some(r#"{"id": "reused", "payload": {}}"#),
        )
        .await;
    assert_eq!(status, 202, "{theirs}");
    eventually(
        Duration::from_secs(30),
        "the other key's task ended",
        || async {
            record()
                .await
                .is_some_and(|r| r.created_at != ours.created_at && r.state.is_end())
        },
    )
    .await;
    std::fs::write(&gate, "").unwrap();
    let (status, answer) = waiting.await.unwrap();
    assert_eq!(status, 410, "{answer}");
    assert!(answer.contains("another key"), "{answer}");
}

/// A sync chain submit whose chain has a task not ended (here its global task, delayed)
/// waits on it, instead of reading the chain again and again.
async fn a_wait_on_a_task_not_made_yet_sleeps(rig: &Rig) {
    let first = rig.q("first");
    let scripts = || script_calls(rig.client.connection());
    let before = scripts().await;
    let path = format!("/v1/queues/{first}/tasks");
    let body = r#"{"payload": {}, "id": "sleepy", "delay": "5s", "chain": true, "wait": "1s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(body)).await;
    assert_eq!(status, 202, "{chain}");
    assert_eq!(chain["state"], "waiting", "{chain}");
    // (the submit's own calls, and the master's idle slots' few takes meanwhile; a loop
    // without a sleep makes thousands in that second)
    let calls = scripts().await - before;
    assert!(calls < 200, "{calls} script calls in a one-second wait");
}

#[tokio::test]
async fn a_chain_with_a_fan_out_on_a_redis_cluster() {
    let rig = Rig::start(&shared_cluster_url(), "chains1", "cl", &[]).await;
    fan_out_and_fail(&rig).await;
}

/// The slot creating `first`'s follow-ups (one from its queue's route, one from its
/// handler) is killed right after they are enqueued, before its task is acked: the task
/// runs again, and every follow-up exists and runs exactly once.
async fn killed_between_follow_ups_and_ack(redis_url: &str, namespace: &str, prefix: &str) {
    let probe = tempfile::tempdir().unwrap();
    let hold = probe.path().join("held");
    let env = [(
        "GAFFER_TEST_HOLD_AFTER_FOLLOW_UPS",
        hold.display().to_string(),
    )];
    let rig = Rig::start(redis_url, namespace, prefix, &env).await;
    let first = rig.q("first");
    let (status, made) = rig
        .call(
            "POST",
            &format!("/v1/queues/{first}/tasks"),
            Some(r#"{"payload": {}, "id": "job-1"}"#),
        )
        .await;
    assert_eq!(status, 202, "{made}");
    let pid: u32 = held_after_follow_ups(&hold).await.trim().parse().unwrap();
    // (The master may have killed it as hung already: either way it dies right here.)
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    eventually(Duration::from_secs(10), "the held slot gone", || async {
        gone(pid)
    })
    .await;

    let after = rig.client.queue(&rig.q("after")).unwrap();
    let q_first = rig.client.queue(&first).unwrap();
    eventually(
        Duration::from_secs(40),
        "job-1 done after running again",
        || async {
            q_first
                .record("job-1")
                .await
                .unwrap()
                .is_some_and(|r| r.state == RecordState::Done)
        },
    )
    .await;
    let kids = route_kids(&rig, "first", "job-1", 2).await;
    for child in &kids {
        eventually(Duration::from_secs(20), "each follow-up done", || async {
            after
                .record(child)
                .await
                .unwrap()
                .is_some_and(|r| r.state == RecordState::Done)
        })
        .await;
    }
    let runs = rig.runs();
    let count = |q: &str, id: &str| runs.iter().filter(|(rq, rid)| rq == q && rid == id).count();
    assert_eq!(count(&first, "job-1"), 2, "the parent ran again: {runs:?}");
    assert_eq!(count(&rig.q("after"), &kids[0]), 1, "{runs:?}");
    assert_eq!(count(&rig.q("after"), &kids[1]), 1, "{runs:?}");
    assert_eq!(
        runs.iter().filter(|(q, _)| *q == rig.q("after")).count(),
        2,
        "no other follow-up: {runs:?}"
    );
    assert_eq!(
        after.stats().await.unwrap().enqueued_total,
        2,
        "each child enqueued once"
    );
    // The route's child got the parent's result; the handler's its own payload.
    let given = |id: &str| {
        let after = after.clone();
        let id = id.to_string();
        async move { after.record(&id).await.unwrap().unwrap().result.unwrap()["given"].clone() }
    };
    assert_eq!(given(&kids[0]).await, serde_json::json!({"from": "first"}));
    assert_eq!(
        given(&kids[1]).await,
        serde_json::json!({"from": "handler"})
    );
    let name = chain_of(&rig, "first", "job-1").await;
    let (_, chain) = rig.call("GET", &format!("/v1/chains/{name}"), None).await;
    assert_eq!(chain["state"], "done", "{chain}");
    assert_eq!(chain["tasks"].as_array().unwrap().len(), 3, "{chain}");
    let (ok, json) = rig.cli_chain(&name, true);
    assert!(ok, "{json}");
    let doc: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["id"], name.as_str());
    generated_parent_ids_lead_to_derived_ones(&rig, &first).await;
}

/// A parent with a generated id (~gN) has follow-ups ~gN~1, ~gN~2, in chain ~gN (its
/// name goes into the chain's URL as it is).
async fn generated_parent_ids_lead_to_derived_ones(rig: &Rig, first: &str) {
    let (status, made) = rig
        .call(
            "POST",
            &format!("/v1/queues/{first}/tasks"),
            Some(r#"{"payload": {}}"#),
        )
        .await;
    assert_eq!(status, 202, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("~g"), "{made}");
    let name = chain_of(rig, "first", &id).await;
    let chain = format!("/v1/chains/{name}");
    let doc = poll_some(
        Duration::from_secs(30),
        "the generated id's chain done",
        || async {
            let (status, doc) = rig.call("GET", &chain, None).await;
            (status == 200 && doc["state"] == "done").then_some(doc)
        },
    )
    .await;
    let mut want = vec![id.clone()];
    want.extend(route_kids(rig, "first", &id, 2).await);
    assert_eq!(task_ids(&doc), want, "{doc}");
}

#[tokio::test]
async fn a_slot_killed_between_follow_ups_and_ack_makes_each_child_once() {
    let redis = TestRedis::start();
    killed_between_follow_ups_and_ack(&redis.url(), "test", "k").await;
}

#[tokio::test]
async fn a_slot_killed_between_follow_ups_and_ack_on_a_redis_cluster() {
    killed_between_follow_ups_and_ack(&shared_cluster_url(), "chains2", "ck").await;
}

/// A task cancelled while it runs stops its chain: cancelled before its handler returns,
/// it makes no follow-up; cancelled after its follow-ups were made (in the window before
/// its settle, held open by a test hook), they are cancelled with a note naming it.
async fn cancelled_while_running(redis_url: &str, namespace: &str, prefix: &str) {
    let probe = tempfile::tempdir().unwrap();
    let pause = probe.path().join("pause");
    let env = [(
        "GAFFER_TEST_PAUSE_AFTER_FOLLOW_UPS",
        pause.display().to_string(),
    )];
    let rig = Rig::start(redis_url, namespace, prefix, &env).await;
    let first = rig.q("first");
    let q_first = rig.client.queue(&first).unwrap();
    let after = rig.client.queue(&rig.q("after")).unwrap();
    let submit = |id: &'static str, payload: Value| {
        let body = json!({"id": id, "payload": payload}).to_string();
        let path = format!("/v1/queues/{first}/tasks");
        let rig = &rig;
        async move {
            let (status, made) = rig.call("POST", &path, Some(&body)).await;
            assert_eq!(status, 202, "{made}");
        }
    };
    let cancel = |id: &'static str| {
        let path = format!("/v1/queues/{first}/tasks/{id}");
        let rig = &rig;
        async move {
            let (status, done) = rig.call("DELETE", &path, None).await;
            assert_eq!(status, 200, "{done}");
        }
    };
    let state_is = |id: &'static str, state: RecordState| {
        let q = q_first.clone();
        async move {
            q.record(id)
                .await
                .unwrap()
                .is_some_and(|r| r.state == state)
        }
    };

    // Cancelled while its handler runs: no follow-up is made.
    let gate = probe.path().join("gate");
    submit("early", json!({"gate": gate})).await;
    eventually(Duration::from_secs(30), "early running", || {
        state_is("early", RecordState::Running)
    })
    .await;
    cancel("early").await;
    std::fs::write(&gate, "").unwrap();

    // Cancelled after its follow-ups are made (held there, their handler held too).
    let child_gate = probe.path().join("child-gate");
    submit("late", json!({"child_gate": child_gate})).await;
    held_after_follow_ups(&pause).await;
    // (the slot settled early before it took late)
    for child in &route_kids(&rig, "first", "early", 2).await {
        assert!(after.find(child).await.unwrap().is_none(), "{child} made");
        assert!(after.record(child).await.unwrap().is_none(), "{child} made");
    }
    assert!(state_is("early", RecordState::Cancelled).await);
    cancel("late").await;
    std::fs::write(probe.path().join("pause.go"), "").unwrap();
    let late_kids = route_kids(&rig, "first", "late", 2).await;
    for child in &late_kids {
        let rec = poll_some(
            Duration::from_secs(30),
            "the follow-up cancelled",
            || async {
                after
                    .record(child)
                    .await
                    .unwrap()
                    .filter(|r| r.state == RecordState::Cancelled)
            },
        )
        .await;
        let note = rec
            .history
            .unwrap()
            .last()
            .unwrap()
            .note
            .clone()
            .unwrap_or_default();
        assert!(note.contains("task late of queue"), "{child}: {note}");
    }
    std::fs::write(&child_gate, "").unwrap();
    let late = chain_of(&rig, "first", "late").await;
    let (_, chain) = rig.call("GET", &format!("/v1/chains/{late}"), None).await;
    assert_eq!(chain["state"], "cancelled", "{chain}");
    // The steps go on: a task after them runs with its follow-ups, and nothing of the
    // cancelled ones changed since.
    submit("next", json!({})).await;
    let next = format!("/v1/chains/{}", chain_of(&rig, "first", "next").await);
    poll_some(Duration::from_secs(30), "next's chain done", || async {
        let (status, doc) = rig.call("GET", &next, None).await;
        (status == 200 && doc["state"] == "done").then_some(())
    })
    .await;
    for child in &late_kids {
        let rec = after.record(child).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Cancelled, "{child}");
    }
    assert_eq!(
        after.stats().await.unwrap().enqueued_total,
        4,
        "late's and next's follow-ups only"
    );
}

#[tokio::test]
async fn a_task_cancelled_while_it_runs_stops_its_chain() {
    let redis = TestRedis::start();
    cancelled_while_running(&redis.url(), "test", "x").await;
}

#[tokio::test]
async fn a_task_cancelled_while_it_runs_stops_its_chain_on_a_redis_cluster() {
    cancelled_while_running(&shared_cluster_url(), "chains3", "cx").await;
}

fn routed_queue(client: &QueueClient) -> gaffer::queue_client::Queue {
    let limits = gaffer::queue_client::QueueLimits {
        starts_chains: true,
        ..Default::default()
    };
    client.queue_with("routed", limits).unwrap()
}

/// An enqueue of follow-ups counts a task already holding a follow-up's id as made before
/// only when it is in the follow-up's chain (a parent run again finds its children);
/// a task of another chain, or of none, makes the whole call create nothing and say so.
#[tokio::test]
async fn a_follow_up_id_held_outside_its_chain_is_refused() {
    use gaffer::queue_client::{Enqueued, NewTask, QueueLimits, TakenBy, TaskChain};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue_with("kids", QueueLimits::default()).unwrap();
    let kid = |id: &str, chain: &str| {
        NewTask::new("{}")
            .id(id)
            .chain(TaskChain::FollowUp(chain.into()))
    };
    let taken = |made: &[Enqueued]| made.iter().map(|e| e.taken).collect::<Vec<_>>();
    q.enqueue(kid("G~1", "G")).await.unwrap();
    q.enqueue(NewTask::new("{}").id("P~1")).await.unwrap();
    q.enqueue(NewTask::new("{}").id("S~1").chain(TaskChain::Global))
        .await
        .unwrap();
    // The same chain's child: found, kept.
    let made = q
        .enqueue_many(&[kid("G~1", "G"), kid("G~2", "G")])
        .await
        .unwrap();
    assert_eq!(taken(&made), [None, None]);
    assert_eq!(
        made.iter().map(|e| e.created).collect::<Vec<_>>(),
        [false, true]
    );
    // Held by a task of no chain, and by the global task of a chain of its own.
    for (id, by) in [("P~1", TakenBy::NoChain), ("S~1", TakenBy::OtherChain)] {
        let made = q
            .enqueue_many(&[kid("G~3", "G"), kid(id, "P")])
            .await
            .unwrap();
        assert_eq!(taken(&made), [None, Some(by)], "{id}");
        assert!(made.iter().all(|e| !e.created), "{id}: nothing created");
        assert!(q.record("G~3").await.unwrap().is_none(), "{id}");
    }
    // Nor can a waiting follow-up become the global task of a chain of its own: a submit
    // under its id would be that task (a dedup hit), in chain G.
    let mut submit = NewTask::new("{}").id("G~2").chain(TaskChain::Global);
    let refused = gaffer::chain::start_global(&q, vec![&mut submit])
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "task G~2 of queue kids is already a task of chain G: \
         submit the global task of a new chain under another id"
    );
}

/// Slots killed again and again (SIGKILL, by the test) while two route queues, whose
/// parents share their ids, make follow-ups into one queue: afterwards every done
/// parent's chain has each of its children exactly once, under ids from its chain (minted
/// from its queue and record number), every child done, and no child was enqueued twice or made for
/// nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_under_slot_kills_make_each_child_once() {
    use gaffer::queue_client::{NewTask, QueueLimits};
    let redis = TestRedis::start();
    let rig = Rig::start(&redis.url(), "test", "k", &[]).await;
    let cfg = gaffer::config::parse(
        &std::fs::read_to_string(&rig.config_path).unwrap(),
        "chains.toml",
    )
    .unwrap();
    let handle = |kind: &str| {
        let name = rig.q(kind);
        rig.client
            .queue_with(&name, QueueLimits::from(&cfg.queues[&name]))
            .unwrap()
    };
    let (first, twins, after) = (handle("first"), handle("twins"), handle("after"));
    const PARENTS: usize = 120;
    let ids: Vec<String> = (0..PARENTS).map(|i| format!("p-{i}")).collect();
    for q in [&first, &twins] {
        // (slow enough that the kills land in batches being handled)
        let tasks: Vec<NewTask> = ids
            .iter()
            .map(|id| NewTask::new(r#"{"slow": true}"#).id(id))
            .collect();
        q.enqueue_many(&tasks).await.unwrap();
    }

    // Kill a slot of the three queues every 250 ms while there is work.
    let mut kills = 0;
    for round in 0..40 {
        let slots: Vec<u32> = http_get(rig.master_http, "/status")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .and_then(|s| s["slots"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|s| {
                let q = s["queue"].as_str().unwrap_or_default();
                [first.name(), twins.name(), after.name()].contains(&q)
            })
            .filter_map(|s| s["pid"].as_u64().map(|p| p as u32))
            .collect();
        if let Some(&pid) = slots.get(round % slots.len().max(1)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            kills += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(kills > 10, "slots were killed: {kills}");

    // Every parent ends (done, or dead after its attempts ran out), then every child.
    let ended = |q: gaffer::queue_client::Queue, ids: Vec<String>| async move {
        let mut out = Vec::new();
        for id in &ids {
            match q.record(id).await.unwrap() {
                Some(r) if r.state.is_end() => out.push(r),
                _ => return None,
            }
        }
        Some(out)
    };
    let parents = poll_some(Duration::from_secs(120), "every parent ended", || async {
        let a = ended(first.clone(), ids.clone()).await?;
        let b = ended(twins.clone(), ids.clone()).await?;
        Some([a, b].concat())
    })
    .await;
    let mut want = Vec::new();
    for p in parents.iter().filter(|p| p.state == RecordState::Done) {
        let (q, kids) = if p.queue == first.name() {
            (&first, 2)
        } else {
            (&twins, 1)
        };
        want.extend(kid_ids(&rig.client, q, p, kids).await);
    }
    let children = poll_some(Duration::from_secs(120), "every child done", || {
        ended(after.clone(), want.clone())
    })
    .await;
    assert!(
        children.iter().all(|r| r.state == RecordState::Done),
        "{children:?}"
    );
    let distinct: std::collections::BTreeSet<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(distinct.len(), want.len(), "no two parents share a child");
    // A parent that ran out of attempts made all its children or none (one call per
    // queue), and only then may the queue hold more than `want`.
    let dead = parents
        .iter()
        .filter(|p| p.state != RecordState::Done)
        .count();
    let enqueued = after.stats().await.unwrap().enqueued_total as usize;
    assert!(
        enqueued >= want.len() && enqueued <= want.len() + 2 * dead,
        "each child enqueued once: {enqueued} for {} wanted, {dead} parents not done",
        want.len()
    );
    if dead == 0 {
        assert_eq!(enqueued, want.len());
    }
    // (both queues' tasks of an id have chains of their own: their children's ids are
    // named from them)
    let distinct: std::collections::BTreeSet<&String> = want.iter().collect();
    assert_eq!(
        distinct.len(),
        want.len(),
        "no child id made twice: {want:?}"
    );
    let runs = rig.runs();
    let again = ids
        .iter()
        .filter(|id| runs.iter().filter(|(_, r)| r == *id).count() > 2)
        .count();
    eprintln!("{kills} kills, {again} of {PARENTS} ids run again, {dead} parents not done");
}

/// A chain's name is written into its tasks' records, whose fields the bytes 0x1e and
/// 0x1f separate: an id holding one is refused where it would name a chain (a queue with
/// routes, a global task, a follow-up), with the reason; as control characters they are
/// refused in any id now (`check_id`), elsewhere too.
#[tokio::test]
async fn an_id_that_would_cut_its_chains_records_is_refused() {
    use gaffer::queue_client::{NewTask, QueueError, QueueLimits, TaskChain};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let routed = routed_queue(&client);
    let plain = client.queue_with("plain", QueueLimits::default()).unwrap();
    for id in ["a\u{1f}b", "a\u{1e}b"] {
        let refusals = [
            routed.enqueue(NewTask::new("{}").id(id)).await,
            plain
                .enqueue(NewTask::new("{}").id(id).chain(TaskChain::Global))
                .await,
            plain
                .enqueue(
                    NewTask::new("{}")
                        .id(format!("{id}~1"))
                        .chain(TaskChain::FollowUp(id.into())),
                )
                .await,
        ];
        for r in refusals {
            let err = r.expect_err("refused");
            assert!(matches!(err, QueueError::Invalid(_)), "{err}");
            assert!(err.to_string().contains("control character"), "{err}");
        }
        let err = plain.enqueue(NewTask::new("{}").id(id)).await.unwrap_err();
        assert!(err.to_string().contains("control character"), "{err}");
    }
    assert_eq!(plain.stats().await.unwrap().enqueued_total, 0);
    assert_eq!(routed.stats().await.unwrap().enqueued_total, 0);
}

/// On one server a slot's follow-ups cost one call with the check of their parents'
/// leases (`Queue::enqueue_follow_ups`), which lists them in their chains' lists in the
/// same step; a parent whose lease is gone (cancelled while it ran) makes the call write
/// nothing and name it.
#[tokio::test]
async fn follow_ups_and_the_lease_check_take_one_call_on_one_server() {
    use gaffer::queue_client::{FollowUpsEnqueued, NewTask, QueueLimits, TaskChain};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let steps = client.queue_with("steps", QueueLimits::default()).unwrap();
    let kids = client.queue_with("kids", QueueLimits::default()).unwrap();
    let kid = |id: &str| {
        NewTask::new("{}")
            .id(id)
            .chain(TaskChain::FollowUp("~csteps.1".into()))
    };
    steps
        .enqueue_many(&[NewTask::new("{}").id("a"), NewTask::new("{}").id("b")])
        .await
        .unwrap();
    let batch = steps.take(10, Duration::from_secs(60)).await.unwrap();
    let parents: Vec<&gaffer::queue_client::LeasedTask> = batch.tasks.iter().collect();
    // (the first call loads the script: measured from the second)
    kids.enqueue_follow_ups(&[kid("~csteps.1~1")], &steps, &parents)
        .await
        .unwrap();
    let before = script_calls(client.connection()).await;
    let made = kids
        .enqueue_follow_ups(&[kid("~csteps.1~2")], &steps, &parents)
        .await
        .unwrap();
    assert_eq!(script_calls(client.connection()).await - before, 1);
    let FollowUpsEnqueued::Enqueued(made) = made else {
        panic!("the leases stand: {made:?}")
    };
    assert!(made.iter().all(|e| e.created), "{made:?}");
    let mut listed = kids.chain_members("~csteps.1").await.unwrap();
    listed.sort();
    assert_eq!(listed, ["~csteps.1~1", "~csteps.1~2"]);
    // b cancelled while it ran: nothing is written, and b is named.
    steps.cancel_with("b", "test").await.unwrap();
    let made = kids
        .enqueue_follow_ups(&[kid("~csteps.1~3")], &steps, &parents)
        .await
        .unwrap();
    let at = parents.iter().position(|t| t.id == "b").unwrap();
    assert!(
        matches!(made, FollowUpsEnqueued::LeasesGone(ref gone) if gone == &[at]),
        "{made:?}"
    );
    assert!(kids.find("~csteps.1~3").await.unwrap().is_none());
    assert_eq!(kids.chain_members("~csteps.1").await.unwrap().len(), 2);
}
