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
/// fails the chain, naming that task, and its queue's failed route runs.
async fn fan_out_and_fail(rig: &Rig) {
    let (id, want) = a_fan_out_ends_done(rig).await;
    a_taken_chain_id_is_refused_or_renamed(rig, &id, &want).await;
    a_part_failing_fails_the_chain(rig).await;
    a_part_retried_past_its_attempts_fails_the_chain(rig).await;
    a_part_lost_at_its_last_attempt_runs_its_failed_route(rig).await;
    an_unknown_follow_up_queue_fails_its_task(rig).await;
    same_ids_never_share_children(rig).await;
    a_list_from_before_runs_keeps_its_ids(rig).await;
    a_later_run_under_an_id_sees_only_its_own_chain(rig).await;
    a_route_chain_writes_no_list_unless_it_has_one(rig).await;
}

/// On one server a route queue's global task writes no member list: its chain is named
/// `QUEUE:ID`, its route's follow-up is found from the records, its handler's is listed
/// as an added member. A task whose unlisted chain's name a list already holds (an
/// earlier run's, listed) is listed itself: its follow-ups take its chain's name.
async fn a_route_chain_writes_no_list_unless_it_has_one(rig: &Rig) {
    if matches!(
        rig.client.connection(),
        gaffer::queue_client::RedisConn::Cluster(_)
    ) {
        return;
    }
    let first = rig.q("first");
    let bare = format!("{first}:bare");
    assert_eq!(done_in(rig, "first", "bare").await, bare);
    let kids = route_kids(rig, "first", "bare", 2).await;
    let mut want = vec!["bare".to_string()];
    want.extend(kids.iter().cloned());
    assert_eq!(chain_ids(rig, &bare).await, want);
    let mut conn = rig.client.connection();
    let raw: Option<String> = redis::cmd("GET")
        .arg(gaffer::chain::key(&rig.namespace, &bare))
        .query_async(&mut conn)
        .await
        .unwrap();
    let raw = raw.expect("the handler's follow-up is listed");
    assert!(!raw.starts_with('^'), "no global task: {raw}");
    assert!(!raw.contains(&kids[0]), "the route's follow-up: {raw}");
    assert!(raw.contains(&kids[1]), "the handler's follow-up: {raw}");
    let list = chain_list((&first, "pre"), Some("1.1"), &[]);
    let _: () = redis::cmd("SET")
        .arg(gaffer::chain::key(&rig.namespace, &format!("{first}:pre")))
        .arg(list)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(done_in(rig, "first", "pre").await, "pre");
    assert_eq!(chain_ids(rig, "pre").await, ["pre", "pre~1", "pre~2"]);
    // An id whose follow-ups' ids could be over the limit once named from its queue and
    // run keeps its chain listed, under its id: its follow-ups are `ID~N`.
    let long = "l".repeat(gaffer::queue_client::MAX_ID_LEN - 16);
    assert_eq!(done_in(rig, "first", &long).await, long);
    assert_eq!(
        chain_ids(rig, &long).await,
        [long.clone(), format!("{long}~1"), format!("{long}~2")]
    );
    // Another queue's task whose id is such a chain's name (`QUEUE:ID`) cannot take it.
    let fetch = format!("/v1/queues/{}/tasks", rig.q("fetch"));
    // (an admin key is told which task keeps it; any other key only that it is kept)
    let body = format!(r#"{{"payload": {{}}, "id": "{bare}", "chain": true}}"#);
    let (status, refused) = rig.call_as(ADMIN_TOKEN, "POST", &fetch, Some(&body)).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        refused["error"],
        format!(
            "chain {bare} is kept for the chain of task bare of queue {first}: submit the \
             global task under another id"
        )
    );
}

/// A key that submits a task under the id of another key's ended global task (a new run)
/// sees its own run's chain, not the earlier run's, nor that chain's tasks (on one server
/// the chain keeps its name, unlisted, and shows the run the id holds now; listed, on a
/// Redis Cluster, the new run's chain is renamed).
async fn a_later_run_under_an_id_sees_only_its_own_chain(rig: &Rig) {
    let (first, after) = (rig.q("first"), rig.q("after"));
    let listed = matches!(
        rig.client.connection(),
        gaffer::queue_client::RedisConn::Cluster(_)
    );
    let mine = match listed {
        true => "mine".to_string(),
        false => format!("{first}:mine"),
    };
    assert_eq!(done_in(rig, "first", "mine").await, mine);
    let earlier = route_kids(rig, "first", "mine", 1).await.remove(0);
    let path = format!("/v1/queues/{first}/tasks");
    let body = r#"{"payload": {}, "id": "mine", "wait": "30s"}"#;
    let (status, rec) = rig.call_as(OTHER_TOKEN, "POST", &path, Some(body)).await;
    assert_eq!(
        status, 409,
        "a limited key takes no id another key's record holds: {rec}"
    );
    // (the library stands for that key's submit made once the earlier run's record was
    // gone, which a limited key may do)
    let cfg = gaffer::config::load(&rig.config_path).unwrap();
    let limits = gaffer::queue_client::QueueLimits::from(&cfg.queues[&first]);
    let q = rig.client.queue_with(&first, limits).unwrap();
    let earlier_at = q.record("mine").await.unwrap().unwrap().created_at;
    let task = gaffer::queue_client::NewTask::new("{}")
        .id("mine")
        .submitted_by("other");
    q.enqueue(task).await.unwrap();
    let rec = poll_some(Duration::from_secs(30), "the later run done", || async {
        q.record("mine")
            .await
            .unwrap()
            .filter(|r| r.created_at != earlier_at && r.state == RecordState::Done)
    })
    .await;
    let rec = json!(rec);
    // (renamed where listed, as an earlier run has the id's chain; unlisted, the run's
    // chain is the name the earlier one had, which shows the run the id holds now)
    let theirs = format!("{first}:mine");
    assert_eq!(rec["chain"], theirs, "{rec}");
    let (status, doc) = rig
        .call_as(
            OTHER_TOKEN,
            "GET",
            &format!("/v1/queues/{after}/tasks/{earlier}"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{earlier}: {doc}");
    if listed {
        let (status, doc) = rig
            .call_as(OTHER_TOKEN, "GET", &format!("/v1/chains/{mine}"), None)
            .await;
        assert_eq!(status, 404, "{doc}");
    }
    let (status, doc) = rig
        .call_as(OTHER_TOKEN, "GET", &format!("/v1/chains/{theirs}"), None)
        .await;
    assert_eq!(status, 200, "{doc}");
    let kids = route_kids(rig, "first", "mine", 1).await;
    assert_ne!(kids[0], earlier);
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
    assert_eq!(chain["state"], "done", "{chain}");
    let st = states(&chain);
    let parse = |n: usize| format!("{id}~{n}");
    let want: BTreeMap<String, String> = [
        id.clone(),
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
    assert_eq!(
        chain["tasks"][0]["id"],
        id.as_str(),
        "the global task first"
    );
    assert_eq!(chain["tasks"][1]["parent"]["id"], id.as_str(), "{chain}");
    assert_eq!(chain["tasks"][1]["submitted_by"], format!("chain:{id}"));
    assert_eq!(chain["tasks"][1]["chain"], id.as_str());

    // The global task's record shows its chain too, and the chain endpoint agrees.
    let (status, rec) = rig.call("GET", &format!("{path}/{id}"), None).await;
    assert_eq!(status, 200, "{rec}");
    assert_eq!(rec["chain"], id.as_str());
    assert_eq!(rec["chain_state"], "done");
    assert_eq!(rec["chain_tasks"].as_array().unwrap().len(), 5, "{rec}");
    let (status, again) = rig.call("GET", &format!("/v1/chains/{id}"), None).await;
    assert_eq!((status, states(&again)), (200, want.clone()));
    (id, want)
}

/// The chain's id is taken: the same id as another queue's global task is refused, and a
/// task of that id starting a chain by its follow-ups gets `QUEUE:ID` instead.
async fn a_taken_chain_id_is_refused_or_renamed(
    rig: &Rig,
    id: &str,
    want: &BTreeMap<String, String>,
) {
    let fetch = rig.q("fetch");
    let body = format!(r#"{{"payload": {{}}, "id": "{id}", "chain": true}}"#);
    let store = format!("/v1/queues/{}/tasks", rig.q("store"));
    // (an admin key is told which task holds it; any other key only that it is taken)
    let (status, refused) = rig.call_as(ADMIN_TOKEN, "POST", &store, Some(&body)).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        refused["error"],
        format!("chain {id} already exists, as the chain of task {id} of queue {fetch}")
    );
    // A task whose id is another task's chain, starting a chain by its follow-ups, gets
    // the chain `QUEUE:ID` instead: named on its record, holding its follow-up.
    let first = rig.q("first");
    let body = format!(r#"{{"payload": {{}}, "id": "{id}", "wait": "30s"}}"#);
    let (status, rec) = rig
        .call("POST", &format!("/v1/queues/{first}/tasks"), Some(&body))
        .await;
    assert_eq!((status, &rec["state"]), (200, &json!("done")), "{rec}");
    let renamed = format!("{first}:{id}");
    assert_eq!(rec["chain"], renamed.as_str(), "{rec}");
    let (status, other) = rig
        .call("GET", &format!("/v1/chains/{renamed}"), None)
        .await;
    assert_eq!(status, 200, "{other}");
    let other_ids: Vec<&str> = other["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    // (first's route and its handler each make one, their ids from the chain's name, so
    // that they can never be the other chain's children's)
    let mut kids = vec![id.to_string()];
    kids.extend(route_kids(rig, "first", id, 2).await);
    assert_eq!(other_ids, kids, "{other}");
    let (_, still) = rig.call("GET", &format!("/v1/chains/{id}"), None).await;
    assert_eq!(
        &states(&still),
        want,
        "the other chain is untouched: {still}"
    );
    let (ok, tree) = rig.cli_chain(id, false);
    assert!(ok, "{tree}");
    assert!(tree.starts_with(&format!("chain {id}: done")), "{tree}");
    assert_eq!(tree.lines().count(), 6, "{tree}");
    assert!(
        tree.contains(&format!("└─ {} {id}~2~1  done", rig.q("store"))),
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
    let id = made["id"].as_str().unwrap().to_string();
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
/// new run, as `dedup = "active"` allows), each get children of their own. A global task
/// of a queue with routes keeps its chain unlisted, its follow-ups named from its queue
/// and run (`QUEUE:ID@RUN~N`), so the same id in another queue with routes makes other
/// ids. A child's id held by a task of another chain fails the parent, saying so.
async fn same_ids_never_share_children(rig: &Rig) {
    if matches!(
        rig.client.connection(),
        gaffer::queue_client::RedisConn::Cluster(_)
    ) {
        return same_ids_never_share_children_listed(rig).await;
    }
    let (first, after) = (rig.q("first"), rig.q("after"));
    let twins = rig.q("twins");
    let ours = format!("{first}:twin");
    assert_eq!(done_in(rig, "first", "twin").await, ours);
    let run1 = route_kids(rig, "first", "twin", 2).await;
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run1.iter().cloned());
    assert_eq!(chain_ids(rig, &ours).await, in_chain);
    // Another queue's task of that id: a chain of its own name, and children of its own.
    let theirs = format!("{twins}:twin");
    assert_eq!(done_in(rig, "twins", "twin").await, theirs);
    let twin_kid = route_kids(rig, "twins", "twin", 1).await;
    assert_eq!(
        chain_ids(rig, &theirs).await,
        ["twin".to_string(), twin_kid[0].clone()]
    );
    // The same task again: a new run, whose children are named from it; the chain's view
    // is the run the id holds now, and its list of added members holds this run's only.
    assert_eq!(done_in(rig, "first", "twin").await, ours);
    let run2 = route_kids(rig, "first", "twin", 2).await;
    assert_ne!(run1, run2);
    let mut conn = rig.client.connection();
    let added: String = redis::cmd("GET")
        .arg(gaffer::chain::key(&rig.namespace, &ours))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        added.contains(&run2[1]) && !added.contains(&run1[1]),
        "{added}"
    );
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run2.iter().cloned());
    assert_eq!(chain_ids(rig, &ours).await, in_chain);
    // And a third run, which a submit asking for its chain then finds (a dedup hit on the
    // waiting task): the submit follows that run's chain.
    let path = format!("/v1/queues/{first}/tasks");
    let delayed = r#"{"payload": {}, "id": "twin", "delay": "2s"}"#;
    let (status, rec) = rig.call("POST", &path, Some(delayed)).await;
    assert_eq!(status, 202, "{rec}");
    let follow = r#"{"payload": {}, "id": "twin", "chain": true, "wait": "30s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(follow)).await;
    assert_eq!(status, 200, "{chain}");
    assert_eq!(chain["id"], ours.as_str(), "{chain}");
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
    // A submit asking for the chain of the task's ended runs starts a new run, with
    // children of its own.
    let body = r#"{"payload": {}, "id": "twin", "chain": true, "wait": "30s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(body)).await;
    assert_eq!(status, 200, "{chain}");
    let run4 = route_kids(rig, "first", "twin", 2).await;
    assert!(!kids.contains(&run4[0]), "{run4:?}");
    let mut in_chain = vec!["twin".to_string()];
    in_chain.extend(run4);
    assert_eq!(task_ids(&chain), in_chain, "{chain}");
    // A task of no chain already has the id the route gives the child: the parent fails.
    let delayed = r#"{"payload": {}, "id": "lone", "delay": "2s"}"#;
    let (status, rec) = rig.call("POST", &path, Some(delayed)).await;
    assert_eq!(status, 202, "{rec}");
    let kid = route_kids(rig, "first", "lone", 1).await.remove(0);
    a_held_child_id_fails_its_parent(rig, &kid).await;
}

/// Task `lone` of queue `first`, whose first follow-up's id `kid` a task of no chain takes
/// first, fails for good, saying so.
async fn a_held_child_id_fails_its_parent(rig: &Rig, kid: &str) {
    let after = rig.q("after");
    let rec = run_to_end(rig, "after", kid).await;
    assert_eq!(rec["state"], "done");
    let rec = run_to_end(rig, "first", "lone").await;
    assert_eq!(rec["state"], "failed", "{rec}");
    let error = rec["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "follow-up id {kid} on queue {after} is taken by a task of no chain"
        )),
        "{rec}"
    );
}

/// [`same_ids_never_share_children`] where every chain is listed (a Redis Cluster): tasks of
/// the same id in two queues routing to one queue, a task submitted again under its id after it ended (a
/// new run, as `dedup = "active"` allows), each get children of their own, in chains of
/// their own. A child's id held by a task of another chain fails the parent, saying so.
async fn same_ids_never_share_children_listed(rig: &Rig) {
    let (first, twins, after) = (rig.q("first"), rig.q("twins"), rig.q("after"));
    assert_eq!(done_in(rig, "first", "twin").await, "twin");
    // Another queue's task of that id: its chain is renamed, and its child's id with it.
    let renamed = format!("{twins}:twin");
    assert_eq!(done_in(rig, "twins", "twin").await, renamed);
    assert_eq!(
        chain_ids(rig, &renamed).await,
        ["twin".to_string(), format!("{renamed}~1")]
    );
    // The same task again: a new run, a new chain; the first chain keeps its own children.
    let again = format!("{first}:twin");
    assert_eq!(done_in(rig, "first", "twin").await, again);
    assert_eq!(
        chain_ids(rig, &again).await,
        [
            "twin".to_string(),
            format!("{again}~1"),
            format!("{again}~2")
        ]
    );
    // (an earlier run's chain, once its id holds a later run: shown to admin keys only)
    let (status, _) = rig.call("GET", "/v1/chains/twin", None).await;
    assert_eq!(status, 404);
    assert_eq!(
        chain_ids_as(rig, ADMIN_TOKEN, "twin").await,
        ["twin", "twin~1", "twin~2"]
    );
    // And a third run, which a submit asking for its chain then finds (a dedup hit on
    // the waiting task): the chain of that id is the first run's, so the submit follows
    // the run's own, whose name its claim gets once it runs (its queue's name for it is
    // taken too). A submit that took the first run's chain for it answered at once.
    let path = format!("/v1/queues/{first}/tasks");
    let delayed = r#"{"payload": {}, "id": "twin", "delay": "2s"}"#;
    let (status, rec) = rig.call("POST", &path, Some(delayed)).await;
    assert_eq!(status, 202, "{rec}");
    let follow = r#"{"payload": {}, "id": "twin", "chain": true, "wait": "30s"}"#;
    let (status, chain) = rig.call("POST", &path, Some(follow)).await;
    assert_eq!(status, 200, "{chain}");
    let third = chain["id"].as_str().unwrap_or_default().to_string();
    assert!(third.starts_with(&format!("{again}@")), "{chain}");
    assert_eq!(chain["state"], "done", "{chain}");
    assert_eq!(
        task_ids(&chain),
        [
            "twin".to_string(),
            format!("{third}~1"),
            format!("{third}~2")
        ]
    );
    assert_eq!(chain_ids(rig, &third).await.len(), 3);
    let runs = rig.runs();
    for id in [
        "twin~1",
        "twin~2",
        &format!("{renamed}~1"),
        &format!("{again}~1"),
        &format!("{third}~2"),
    ] {
        let n = runs.iter().filter(|(q, i)| *q == after && i == id).count();
        assert_eq!(n, 1, "{id} ran once: {runs:?}");
    }
    // A submit asking for the chain of the task's ended runs is refused: a new run would
    // mix its tasks with theirs. (An admin key is told why; any other key only that the
    // chain exists.)
    let body = r#"{"payload": {}, "id": "twin", "chain": true}"#;
    let path = format!("/v1/queues/{first}/tasks");
    let (status, refused) = rig.call("POST", &path, Some(body)).await;
    assert_eq!(
        (status, &refused["error"]),
        (
            409,
            &json!("chain twin already exists: submit the global task under another id")
        )
    );
    let (status, refused) = rig.call_as(ADMIN_TOKEN, "POST", &path, Some(body)).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        refused["error"],
        format!(
            "chain twin already exists, made by an earlier run of task twin of queue {first} \
             that has ended: submit the new run under another id"
        )
    );
    // A task of no chain already has the id the route gives the child: the parent fails.
    a_held_child_id_fails_its_parent(rig, "lone~1").await;
}

/// A renamed chain whose list a gaffer before runs made (members, no run), as a slot
/// killed across the upgrade leaves it: the task's run keeps the children's ids that
/// gaffer derived from the parent's, and the list is that run's from then on, so the
/// next run of the id gets a chain of its own.
async fn a_list_from_before_runs_keeps_its_ids(rig: &Rig) {
    let (first, after) = (rig.q("first"), rig.q("after"));
    let mut conn = rig.client.connection();
    let set = |chain: String, list: String| {
        let key = gaffer::chain::key(&rig.namespace, &chain);
        redis::cmd("SET").arg(key).arg(list).to_owned()
    };
    let taken = set("old".into(), chain_list(("elsewhere", "old"), None, &[]));
    let renamed = format!("{first}:old");
    let before = chain_list(
        (&first, "old"),
        None,
        &[((&after, "old~1"), (&first, "old"))],
    );
    for cmd in [taken, set(renamed.clone(), before)] {
        let () = cmd.query_async(&mut conn).await.unwrap();
    }
    assert_eq!(done_in(rig, "first", "old").await, renamed);
    assert_eq!(chain_ids(rig, &renamed).await, ["old", "old~1", "old~2"]);
    let q_after = rig.client.queue(&after).unwrap();
    assert!(
        q_after
            .record(&format!("{renamed}~1"))
            .await
            .unwrap()
            .is_none()
    );
    let next = done_in(rig, "first", "old").await;
    assert!(next.starts_with(&format!("{renamed}@")), "{next}");
    assert_eq!(chain_ids(rig, &next).await.len(), 3);
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

/// A sync chain submit whose chain lists a task not made yet (its parent's slot died
/// between adding it and making it, or its queue's intake was closed) waits on the
/// parent, listed too and not ended, instead of reading the chain again and again.
async fn a_wait_on_a_task_not_made_yet_sleeps(rig: &Rig) {
    let (first, after) = (rig.q("first"), rig.q("after"));
    let list = chain_list(
        (&first, "sleepy"),
        None,
        &[((&after, "sleepy~9"), (&first, "sleepy"))],
    );
    let key = gaffer::chain::key(&rig.namespace, "sleepy");
    let mut conn = rig.client.connection();
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(&list)
        .query_async(&mut conn)
        .await
        .unwrap();
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

/// What a follow-up step learns of its parents (`Queue::chain_facts`): from the meta an
/// enqueue wrote (a route queue's tasks are global tasks of their own chains from the
/// start, a follow-up names its chain), and from the record only where the meta does not
/// say (a task enqueued before metas kept it) or a task starts a chain its record does
/// not name yet, which is named there and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_chain_comes_from_its_meta_or_else_its_record() {
    use gaffer::queue_client::{NewTask, QueueLimits, TaskChain};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let routed = routed_queue(&client);
    let plain = client.queue_with("plain", QueueLimits::default()).unwrap();
    routed.enqueue(NewTask::new("{}").id("r1")).await.unwrap();
    routed
        .enqueue(
            NewTask::new("{}")
                .id("G~1")
                .chain(TaskChain::FollowUp("G".into())),
        )
        .await
        .unwrap();
    for id in ["p1", "p2", "old"] {
        plain.enqueue(NewTask::new("{}").id(id)).await.unwrap();
    }
    let facts = routed
        .chain_facts(&["r1", "G~1"], &[true, true])
        .await
        .unwrap();
    let chains: Vec<Option<&str>> = facts.iter().map(|f| f.chain.as_deref()).collect();
    // (on one server a route queue's global task's chain is unlisted, `QUEUE:ID`)
    assert_eq!(chains, [Some("routed:r1"), Some("G")]);
    assert_eq!(
        routed.record("r1").await.unwrap().unwrap().chain.as_deref(),
        Some("routed:r1"),
        "a route queue's task names its own chain from its enqueue"
    );
    // A meta without its chain field: priority:max_attempts:enqueued_ms.
    let raw = redis.raw().await;
    raw_cmd(
        &redis,
        "HSET",
        &["test:{plain}:payload", "old", "0:7:1\n{}"],
    )
    .await;
    let facts = plain
        .chain_facts(&["p1", "p2", "old"], &[false, true, false])
        .await
        .unwrap();
    let got = chains_and_attempts(&facts);
    assert_eq!(
        got,
        [(None, Some(5)), (Some("p2"), None), (None, Some(7))],
        "in no chain; starting one, named now; an old meta read through its record"
    );
    assert_eq!(
        plain.record("p2").await.unwrap().unwrap().chain.as_deref(),
        Some("p2")
    );
    assert_eq!(plain.record("p1").await.unwrap().unwrap().chain, None);

    // A slot learns the same from the metas its take returned, and asks Redis only for
    // what those do not say.
    let taken = routed.take(10, Duration::from_secs(30)).await.unwrap();
    let parents: Vec<_> = taken.tasks.iter().collect();
    let before = script_calls(raw.clone()).await;
    let facts = routed
        .parents_chain_facts(&parents, &[true, true])
        .await
        .unwrap();
    assert_eq!(
        script_calls(raw.clone()).await,
        before,
        "no call for what metas say"
    );
    let chains: Vec<Option<&str>> = facts.iter().map(|f| f.chain.as_deref()).collect();
    assert_eq!(chains, [Some("routed:r1"), Some("G")]);
    let taken = plain.take(10, Duration::from_secs(30)).await.unwrap();
    let parents: Vec<_> = taken.tasks.iter().collect();
    let facts = plain
        .parents_chain_facts(&parents, &[false, true, false])
        .await
        .unwrap();
    let got = chains_and_attempts(&facts);
    assert_eq!(got, [(None, Some(5)), (Some("p2"), None), (None, Some(7))]);
}

/// A queue whose tasks are global tasks of their own chains from their enqueue on, as a
/// queue with a done route's are.
fn routed_queue(client: &QueueClient) -> gaffer::queue_client::Queue {
    let limits = gaffer::queue_client::QueueLimits {
        starts_chains: true,
        ..Default::default()
    };
    client.queue_with("routed", limits).unwrap()
}

/// Each parent's chain and max_attempts, as a follow-up step learned them.
fn chains_and_attempts(
    facts: &[gaffer::queue_client::ChainFacts],
) -> Vec<(Option<&str>, Option<u32>)> {
    facts
        .iter()
        .map(|f| (f.chain.as_deref(), f.max_attempts))
        .collect()
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
    // A meta written before metas said the chain: the record says it.
    raw_cmd(&redis, "HSET", &["test:{kids}:payload", "G~1", "0:5:1\n{}"]).await;
    let made = q.enqueue_many(&[kid("G~1", "G")]).await.unwrap();
    assert_eq!((made[0].created, made[0].taken), (false, None));
    let made = q.enqueue_many(&[kid("G~1", "H")]).await.unwrap();
    assert_eq!(made[0].taken, Some(TakenBy::OtherChain));

    // Nor can a waiting follow-up become the global task of a chain of its own: a submit
    // under its id would be that task (a dedup hit), in chain G.
    let mut submit = NewTask::new("{}").id("G~2").chain(TaskChain::Global);
    let ttl = Duration::from_secs(60);
    let refused = gaffer::chain::start_global(&client, &q, vec![&mut submit], &targets(ttl))
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "task G~2 of queue kids is already a task of chain G: \
         submit the global task of a new chain under another id"
    );
}

/// Writes what the gaffer under test would not: a layout an older gaffer wrote, a chain
/// list as given.
async fn raw_cmd(redis: &TestRedis, cmd: &str, args: &[&str]) {
    let mut raw = redis.raw().await;
    let _: () = redis::cmd(cmd)
        .arg(args)
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// A task as (queue, id).
type QueueId<'a> = (&'a str, &'a str);

/// A chain list as a gaffer stores it: `^`, the global task, `@RUN@` when `run` is
/// given, then (child, parent) pairs; each member `LEN:QUEUE\x1fID`.
fn chain_list(root: QueueId, run: Option<&str>, pairs: &[(QueueId, QueueId)]) -> String {
    let m = |(q, id): QueueId| {
        let f = format!("{q}\u{1f}{id}");
        format!("{}:{f}", f.len())
    };
    let mut out = format!("^{}", m(root));
    if let Some(run) = run {
        out += &format!("@{run}@");
    }
    for (c, p) in pairs {
        out += &(m(*c) + &m(*p));
    }
    out
}

/// Claims of a chain by runs of its global task: a submit's claim leaves the run to the
/// first run's; another run is refused; a list a gaffer that did not tell runs apart gave
/// members stays as it was, its children's ids kept (`OursBefore`).
#[tokio::test]
async fn a_chain_is_claimed_by_one_run_of_its_global_task() {
    use gaffer::chain::{self, Claim, Member, NO_RUN, RootClaim};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let conn = client.connection();
    let ttl = Duration::from_secs(60);
    let root = Member::new("q", "X");
    let claim = |run: &'static str| {
        let conn = conn.clone();
        let root = root.clone();
        async move {
            let c = Claim {
                chain: "X",
                root: &root,
                run,
                members: &[],
            };
            chain::claim_many(&conn, "test", &[c], ttl)
                .await
                .unwrap()
                .pop()
                .unwrap()
        }
    };
    let raw = redis.raw().await;
    let key = chain::key("test", "X");
    let stored = |raw: redis::aio::MultiplexedConnection| {
        let key = key.clone();
        async move {
            let mut raw = raw;
            let v: String = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut raw)
                .await
                .unwrap();
            v
        }
    };
    assert_eq!(claim(NO_RUN).await, RootClaim::Ours);
    assert_eq!(stored(raw.clone()).await, chain_list(("q", "X"), None, &[]));
    assert_eq!(
        claim("10.1").await,
        RootClaim::Ours,
        "the first run takes it over"
    );
    assert_eq!(
        stored(raw.clone()).await,
        chain_list(("q", "X"), Some("10.1"), &[])
    );
    assert_eq!(claim("10.1").await, RootClaim::Ours, "the same run again");
    assert_eq!(claim(NO_RUN).await, RootClaim::Ours, "a submit finds it");
    assert_eq!(claim("20.2").await, RootClaim::EarlierRun);
    // A list with members and no run, as a gaffer before runs wrote it.
    let legacy = chain_list(("q", "X"), None, &[(("t", "X~1"), ("q", "X"))]);
    raw_cmd(&redis, "SET", &[&key, &legacy]).await;
    assert_eq!(claim("30.3").await, RootClaim::OursBefore);
    let taken_over = chain_list(("q", "X"), Some("=30.3"), &[(("t", "X~1"), ("q", "X"))]);
    assert_eq!(
        stored(raw.clone()).await,
        taken_over,
        "that run's now, nothing added"
    );
    assert_eq!(
        claim("30.3").await,
        RootClaim::OursBefore,
        "the same run again"
    );
    assert_eq!(claim("40.4").await, RootClaim::EarlierRun, "another run");
    assert_eq!(claim(NO_RUN).await, RootClaim::Ours, "a submit finds it");
    let list = chain::members(&conn, "test", "X").await.unwrap().unwrap();
    assert_eq!(
        (
            list.run.as_deref(),
            list.follow.len(),
            list.run_enqueued_ms()
        ),
        (Some("=30.3"), 1, None)
    );
}

/// A chain kept without a member list (the global task of a queue with routes, on one
/// server) is read from its records: the global task's route follow-ups, named from its
/// queue and run and each counted when its record names the chain, whatever the global
/// task's state (it makes them before it ends), then what
/// the list of added members holds below them (a handler's follow-up of the global task
/// named from the run, a member's follow-ups); an earlier run's tasks, listed there too,
/// are not this run's.
#[tokio::test]
async fn an_unlisted_chain_is_read_from_its_records_and_its_run() {
    use gaffer::chain::{self, ChainTargets, Member};
    use gaffer::config::{Route, RouteOn};
    use gaffer::queue_client::{NewTask, QueueLimits};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let routed = routed_queue(&client);
    let kids = client.queue_with("kids", QueueLimits::default()).unwrap();
    let route = || Route {
        queue: "kids".into(),
        on: RouteOn::Done,
    };
    let targets = ChainTargets {
        queues: [
            ("routed".to_string(), routed.limits()),
            ("kids".to_string(), kids.limits()),
        ]
        .into(),
        routes: [
            ("routed".to_string(), vec![route(), route(), route()]),
            ("kids".to_string(), Vec::new()),
        ]
        .into(),
        ttl: Duration::from_secs(60),
    };
    let ids = |m: chain::Members| -> Vec<(String, String)> {
        m.follow.into_iter().map(|(c, p)| (c.id, p.id)).collect()
    };
    routed.enqueue(NewTask::new("{}").id("g")).await.unwrap();
    let waiting = chain::members_of(&client, &targets, "routed:g")
        .await
        .unwrap();
    let waiting = waiting.expect("a route queue's task is its chain's global task");
    assert_eq!(waiting.root, Member::new("routed", "g"));
    assert!(waiting.follow.is_empty());
    // (its follow-ups are made while it runs: a view then, or of a task run again after
    // its slot died, shows them)
    let taken = routed.take(1, Duration::from_secs(30)).await.unwrap();
    let rec = routed.record("g").await.unwrap().unwrap();
    let base = kid_ids(&client, &routed, &rec, 1).await[0]
        .trim_end_matches("~1")
        .to_string();
    assert!(base.starts_with("routed:g@"), "{base}");
    // The first two routes' follow-ups exist (the third's does not), and an earlier
    // run's, in the same chain.
    let earlier = "routed:g@1.1";
    let made = [
        format!("{base}~1"),
        format!("{base}~2"),
        format!("{earlier}~1"),
    ];
    let made: Vec<NewTask> = made.iter().map(|id| kid(id, "routed:g")).collect();
    kids.enqueue_many(&made).await.unwrap();
    let m = |q: &str, id: &str| Member::new(q, id);
    let added = [
        (
            m("kids", &format!("{base}~2~1")),
            m("kids", &format!("{base}~2")),
        ),
        (m("kids", &format!("{base}~4")), m("routed", "g")),
        (
            m("kids", &format!("{earlier}~1~1")),
            m("kids", &format!("{earlier}~1")),
        ),
        (m("kids", &format!("{earlier}~4")), m("routed", "g")),
    ];
    let conn = client.connection();
    chain::add_many(&conn, "test", &[("routed:g", &added[..])], targets.ttl)
        .await
        .unwrap();
    let raw: String = redis::cmd("GET")
        .arg(chain::key("test", "routed:g"))
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert!(!raw.starts_with('^'), "a list of added members only: {raw}");
    let g = "g".to_string();
    let want = [
        (format!("{base}~1"), g.clone()),
        (format!("{base}~2"), g.clone()),
        (format!("{base}~2~1"), format!("{base}~2")),
        (format!("{base}~4"), g.clone()),
    ];
    let running = chain::members_of(&client, &targets, "routed:g")
        .await
        .unwrap();
    assert_eq!(ids(running.unwrap()), want, "while it runs");
    routed.ack(&taken.tasks).await.unwrap();
    let done = chain::members_of(&client, &targets, "routed:g")
        .await
        .unwrap();
    assert_eq!(ids(done.unwrap()), want, "once it is done");
    // Unknown: no list, and no such task of a queue with routes.
    assert!(
        chain::members_of(&client, &targets, "routed:h")
            .await
            .unwrap()
            .is_none()
    );
}

/// A renamed chain goes in its global task's meta, so that the task's next attempt starts
/// from that name; a submit asking for the listed chain of a task's earlier run is refused
/// where the enqueue would make a new run, and not where it would find the run there
/// (`dedup = "record"`), nor where the new run's chain is unlisted; a chain's view leaves
/// out a global task's record of another run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_stays_with_the_run_that_made_it() {
    use gaffer::chain::{self, ChainError};
    use gaffer::config::Dedup;
    use gaffer::queue_client::{NewTask, QueueLimits, TaskChain};
    let redis = TestRedis::start();
    let client = redis.client().await;
    let routed = routed_queue(&client);
    routed.enqueue(NewTask::new("{}").id("r1")).await.unwrap();
    routed.set_chains(&[("r1", "routed:r1")]).await.unwrap();
    let taken = routed.take(10, Duration::from_secs(30)).await.unwrap();
    let parents: Vec<_> = taken.tasks.iter().collect();
    let facts = routed.parents_chain_facts(&parents, &[true]).await.unwrap();
    assert_eq!(facts[0].chain.as_deref(), Some("routed:r1"));
    routed.ack(&taken.tasks).await.unwrap();

    // r1 is done; chain r1's list says a run made it.
    let rec = routed.record("r1").await.unwrap().unwrap();
    let list = chain_list(("routed", "r1"), Some("5.1"), &[]);
    raw_cmd(&redis, "SET", &[&chain::key("test", "r1"), &list]).await;
    let ttl = Duration::from_secs(60);
    let submit = |q: gaffer::queue_client::Queue| {
        let client = client.clone();
        async move {
            let mut t = NewTask::new("{}").id("r1").chain(TaskChain::Global);
            chain::start_global(&client, &q, vec![&mut t], &targets(ttl)).await
        }
    };
    // (through a handle without the done route, whose chains stay listed: one with it
    // makes its new run's chain unlisted, `routed:r1`, which the list does not hold)
    submit(routed.clone())
        .await
        .expect("an unlisted run of its own");
    let listed = |dedup| {
        let limits = QueueLimits {
            dedup,
            ..Default::default()
        };
        client.queue_with("routed", limits).unwrap()
    };
    let refused = submit(listed(Dedup::Active)).await.unwrap_err();
    assert!(matches!(refused, ChainError::Ended { .. }), "{refused}");
    submit(listed(Dedup::Record))
        .await
        .expect("a dedup hit, not a new run");

    // The list's run (enqueued at 5) is not the record's (created at rec's time).
    let queues = chain::ChainTargets {
        queues: [("routed".to_string(), routed.limits())].into(),
        ..Default::default()
    };
    let view = chain::read(&client, &queues, "r1").await.unwrap().unwrap();
    assert_eq!(view.tasks[0].record, None, "another run's record: {rec:?}");
    let at = chrono::DateTime::parse_from_rfc3339(&rec.created_at)
        .unwrap()
        .timestamp_millis();
    let list = chain_list(("routed", "r1"), Some(&format!("{at}.9")), &[]);
    raw_cmd(&redis, "SET", &[&chain::key("test", "r1"), &list]).await;
    let view = chain::read(&client, &queues, "r1").await.unwrap().unwrap();
    assert_eq!(
        view.tasks[0].record.as_ref().map(|r| r.state),
        Some(RecordState::Done)
    );
}

/// Slots killed again and again (SIGKILL, by the test) while two route queues, whose
/// parents share their ids, make follow-ups into one queue: afterwards every done
/// parent's chain has each of its children exactly once, under ids from its queue and
/// run (unlisted chains), every child done, and no child was enqueued twice or made for
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
    // (on one server both queues' tasks of an id keep their unlisted chains: their
    // children's ids are named from their queues)
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

/// On one server a slot writes its follow-ups' chains and enqueues them in one call
/// (`Queue::enqueue_after_chains`): chains its parents start are claimed, others added
/// to, and the children enqueued. A claim another task holds enqueues nothing (the slot
/// then renames, the slow way), and an intake closed refuses as a plain enqueue does.
#[tokio::test]
async fn follow_ups_and_their_chains_take_one_call_on_one_server() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let one = OneCall {
        ns: client.namespace().to_string(),
        kids: client
            .queue_with("kids", gaffer::queue_client::QueueLimits::default())
            .unwrap(),
        conn: client.connection(),
        redis,
    };
    one.claims_adds_and_children_go_in_one_call().await;
    one.a_claim_held_elsewhere_enqueues_nothing().await;
    one.tasks_of_any_mode_or_none_still_write_the_chains().await;
    one.a_closed_intake_leaves_the_claims().await;
}

/// What the steps of `follow_ups_and_their_chains_take_one_call_on_one_server` share:
/// queue `kids` and its chains, parents in queue `steps`.
struct OneCall {
    redis: TestRedis,
    ns: String,
    kids: gaffer::queue_client::Queue,
    conn: gaffer::queue_client::RedisConn,
}

/// The claim of the chain named as its global task `root`'s id.
fn claim<'a>(
    root: &'a gaffer::chain::Member,
    run: &'a str,
    members: &'a [(gaffer::chain::Member, gaffer::chain::Member)],
) -> gaffer::chain::Claim<'a> {
    gaffer::chain::Claim {
        chain: &root.id,
        root,
        run,
        members,
    }
}

/// A follow-up in chain `chain`.
fn kid(id: &str, chain: &str) -> gaffer::queue_client::NewTask {
    gaffer::queue_client::NewTask::new("{}")
        .id(id)
        .chain(gaffer::queue_client::TaskChain::FollowUp(chain.into()))
}

impl OneCall {
    const TTL: Duration = Duration::from_secs(60);

    fn writes(
        &self,
        claims: &[gaffer::chain::Claim<'_>],
        adds: &[(&str, &[(gaffer::chain::Member, gaffer::chain::Member)])],
    ) -> gaffer::queue_client::ChainWrites {
        gaffer::chain::writes(&self.ns, claims, adds, Self::TTL)
    }

    async fn members(&self, chain: &str) -> Option<gaffer::chain::Members> {
        gaffer::chain::members(&self.conn, &self.ns, chain)
            .await
            .unwrap()
    }

    async fn ready(&self) -> u64 {
        self.kids.stats().await.unwrap().ready
    }

    /// Two parents start chains a and b, a third is in chain g already: one call.
    async fn claims_adds_and_children_go_in_one_call(&self) {
        use gaffer::chain::Member;
        use gaffer::queue_client::AfterChains;
        let (a, b, p) = (
            Member::new("steps", "a"),
            Member::new("steps", "b"),
            Member::new("steps", "p"),
        );
        let a_kids = [(Member::new("kids", "a~1"), a.clone())];
        let b_kids = [(Member::new("kids", "b~1"), b.clone())];
        let p_kids = [(Member::new("kids", "p~1"), p.clone())];
        let claims = [claim(&a, "5.1", &a_kids), claim(&b, "5.2", &b_kids)];
        let adds: [(&str, &[(Member, Member)]); 1] = [("g", &p_kids)];
        let tasks = [kid("a~1", "a"), kid("b~1", "b"), kid("p~1", "g")];
        // (a first call loads the script: a call Redis answers NOSCRIPT counts too)
        let w = Member::new("steps", "w");
        let warm = self.writes(&[claim(&w, "5.0", &[])], &[]);
        self.kids
            .enqueue_after_chains(&[kid("w~1", "w")], &warm)
            .await
            .unwrap();
        let before = script_calls(self.redis.raw().await).await;
        let writes = self.writes(&claims, &adds);
        let AfterChains::Enqueued(made) = self
            .kids
            .enqueue_after_chains(&tasks, &writes)
            .await
            .unwrap()
        else {
            panic!("every claim was the parents'")
        };
        assert_eq!(
            script_calls(self.redis.raw().await).await - before,
            1,
            "one call for the chains and the children"
        );
        assert!(made.iter().all(|e| e.created), "{made:?}");
        assert_eq!(self.ready().await, 4);
        for (chain, root, pairs) in [("a", &a, &a_kids), ("b", &b, &b_kids)] {
            let m = self.members(chain).await.unwrap();
            assert_eq!(&m.root, root);
            assert_eq!(m.follow, pairs.to_vec());
        }
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(gaffer::chain::key(&self.ns, "g"))
            .query_async(&mut self.redis.raw().await)
            .await
            .unwrap();
        let raw = String::from_utf8_lossy(&raw);
        assert_eq!(
            raw, "8:kids\u{1f}p~17:steps\u{1f}p",
            "added to, not claimed"
        );
    }

    /// Chain c is another task's: nothing is enqueued, and the answer says who holds it.
    async fn a_claim_held_elsewhere_enqueues_nothing(&self) {
        use gaffer::chain::{Member, RootClaim};
        use gaffer::queue_client::AfterChains;
        let (c, d, other) = (
            Member::new("steps", "c"),
            Member::new("steps", "d"),
            Member::new("elsewhere", "c"),
        );
        let held = chain_list(("elsewhere", "c"), None, &[]);
        raw_cmd(
            &self.redis,
            "SET",
            &[&gaffer::chain::key(&self.ns, "c"), &held],
        )
        .await;
        let c_kids = [(Member::new("kids", "c~1"), c.clone())];
        let claims = [claim(&d, "5.3", &[]), claim(&c, "5.4", &c_kids)];
        let writes = self.writes(&claims, &[]);
        let AfterChains::Refused(refused) = self
            .kids
            .enqueue_after_chains(&[kid("c~1", "c")], &writes)
            .await
            .unwrap()
        else {
            panic!("chain c is another task's")
        };
        let answers = gaffer::chain::answers(&claims, refused).unwrap();
        assert_eq!(answers, [RootClaim::Ours, RootClaim::Taken(other)]);
        assert_eq!(self.ready().await, 4, "nothing enqueued");
        assert!(self.kids.record("c~1").await.unwrap().is_none());
        assert_eq!(
            self.members("d").await.unwrap().root,
            d,
            "the claim before it stands"
        );
    }

    /// Tasks of any enqueue mode (here ids generated) find the lists' arguments after
    /// their own, and no tasks at all still writes the lists.
    async fn tasks_of_any_mode_or_none_still_write_the_chains(&self) {
        use gaffer::chain::Member;
        use gaffer::queue_client::{AfterChains, NewTask};
        let f = Member::new("steps", "f");
        let f_kids = [(Member::new("kids", "f~1"), f.clone())];
        let writes = self.writes(&[claim(&f, "5.6", &f_kids)], &[]);
        let made = self
            .kids
            .enqueue_after_chains(&[NewTask::new("{}")], &writes)
            .await
            .unwrap();
        assert!(
            matches!(made, AfterChains::Enqueued(ref m) if m.len() == 1),
            "{made:?}"
        );
        let m = self.members("f").await.unwrap();
        assert_eq!(
            (m.root, m.run.as_deref(), m.follow),
            (f, Some("5.6"), f_kids.to_vec())
        );
        let h = Member::new("steps", "h");
        let writes = self.writes(&[claim(&h, "5.7", &[])], &[]);
        let made = self.kids.enqueue_after_chains(&[], &writes).await.unwrap();
        assert!(
            matches!(made, AfterChains::Enqueued(ref m) if m.is_empty()),
            "{made:?}"
        );
        assert!(self.members("h").await.is_some());
        assert_eq!(self.ready().await, 5);
    }

    /// A closed intake refuses the children; the claims stand, as before an enqueue.
    async fn a_closed_intake_leaves_the_claims(&self) {
        use gaffer::config::Intake;
        self.kids.set_intake(Some(Intake::Closed)).await.unwrap();
        let e = gaffer::chain::Member::new("steps", "e");
        let writes = self.writes(&[claim(&e, "5.5", &[])], &[]);
        let err = self
            .kids
            .enqueue_after_chains(&[kid("e~1", "e")], &writes)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("intake"), "{err}");
        assert!(self.members("e").await.is_some());
        assert_eq!(self.ready().await, 5);
    }
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

/// Chain targets that know no queue, whose lists live `ttl`.
fn targets(ttl: Duration) -> gaffer::chain::ChainTargets {
    gaffer::chain::ChainTargets {
        ttl,
        ..Default::default()
    }
}
