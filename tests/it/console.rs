//! The web console's HTTP layer (docs/API.md, "The web console"): a real api instance and
//! a real redis-server, over real HTTP. Logins and their cookies, the session document,
//! the cookie on the API with the key's rights and the CSRF token on writes, revocation,
//! instances sharing a secret, auth-proxy mode from trusted and untrusted addresses,
//! failed logins limited per address, and the security headers of every `/ui/` answer.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use gaffer::api::hash_token;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::api::{OPS, Reply, SHOP, config_text, start_api, test_config};
use crate::harness::{TestRedis, eventually};

/// The address the tests' requests come from unless they say; a second loopback address
/// (`127.0.0.2`) stands for a client that is not the trusted proxy.
const LOCAL: &str = "127.0.0.1";
const ELSEWHERE: &str = "127.0.0.2";

/// Its header lookups (names in lower case).
impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `gaffer_session=VALUE` of its `Set-Cookie`, for the next request's `Cookie`.
    fn cookie(&self) -> String {
        let line = self.header("set-cookie").expect("a set-cookie header");
        line.split(';').next().unwrap().to_string()
    }

    /// Panics unless the answer carries every security header of a `/ui/` answer.
    fn assert_secure(&self, what: &str) {
        let csp = self.header("content-security-policy").unwrap_or_default();
        for part in [
            "default-src 'self'",
            "script-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(part), "{what}: csp {csp:?} lacks {part}");
        }
        assert!(!csp.contains("unsafe-inline"), "{what}: {csp}");
        assert_eq!(self.header("x-frame-options"), Some("DENY"), "{what}");
        assert_eq!(
            self.header("referrer-policy"),
            Some("no-referrer"),
            "{what}"
        );
        assert_eq!(
            self.header("x-content-type-options"),
            Some("nosniff"),
            "{what}"
        );
    }
}

/// One HTTP/1.1 exchange on a fresh connection from `from`.
async fn send(
    addr: SocketAddr,
    from: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let from: IpAddr = from.parse().unwrap();
    crate::api::exchange(addr, Some(from), method, path, headers, body.as_bytes()).await
}

/// A running api instance over a fresh Redis, with the api tests' keys and queues and
/// `extra` config after them.
struct Console {
    redis: TestRedis,
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Console {
    async fn start(extra: &str) -> Console {
        Console::start_text(&config_text(extra)).await
    }

    async fn start_text(text: &str) -> Console {
        let redis = TestRedis::start();
        let (addr, stop, task) = start_api(test_config(text), redis.url()).await;
        Console {
            redis,
            addr,
            stop,
            task,
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        send(self.addr, LOCAL, "GET", path, headers, "").await
    }

    /// A login post of `token` from `from`, as the login form sends it.
    async fn login_from(&self, from: &str, token: &str) -> Reply {
        let headers = [
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Sec-Fetch-Site", "same-origin"),
        ];
        send(
            self.addr,
            from,
            "POST",
            "/ui/login",
            &headers,
            &format!("token={token}"),
        )
        .await
    }

    /// The cookie of a good login with `token`.
    async fn login(&self, token: &str) -> String {
        let r = self.login_from(LOCAL, token).await;
        assert_eq!(
            (r.status, r.header("location")),
            (303, Some("/ui/")),
            "{}",
            r.text()
        );
        r.cookie()
    }

    /// `/ui/session` with `cookie`.
    async fn session(&self, cookie: &str) -> Reply {
        self.get("/ui/session", &[("Cookie", cookie)]).await
    }

    /// A `/metrics` counter's value, summed over its series whose labels hold `labels`.
    async fn counter(&self, name: &str, labels: &str) -> f64 {
        let auth = format!("Bearer {OPS}");
        let r = self.get("/metrics", &[("Authorization", &auth)]).await;
        r.text()
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A submit of task `id` to queue emails with `token`'s key.
async fn submit(addr: SocketAddr, token: &str, id: &str) {
    let auth = format!("Bearer {token}");
    let body = format!(r#"{{"payload": 1, "id": "{id}", "delay": "1h"}}"#);
    let r = send(
        addr,
        LOCAL,
        "POST",
        "/v1/queues/emails/tasks",
        &[("Authorization", &auth)],
        &body,
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_gives_a_strict_http_only_cookie_and_the_session_names_the_key() {
    let c = Console::start("").await;
    let r = c.get("/ui/", &[]).await;
    assert_eq!((r.status, r.header("location")), (303, Some("/ui/login")));
    r.assert_secure("/ui/ without a session");
    let r = c.get("/ui", &[]).await;
    assert_eq!((r.status, r.header("location")), (308, Some("/ui/")));
    let r = c.get("/ui/login", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r.text().contains("<form"), "{}", r.text());
    r.assert_secure("the login page");

    let bad = c.login_from(LOCAL, "not-a-token").await;
    assert_eq!(
        (bad.status, bad.header("location")),
        (303, Some("/ui/login?failed=1"))
    );
    assert!(bad.header("set-cookie").is_none());
    bad.assert_secure("a failed login");
    // (an https claim from an address that is not a trusted proxy changes nothing)
    let headers = [
        ("Sec-Fetch-Site", "same-origin"),
        ("X-Forwarded-Proto", "https"),
    ];
    let good = send(
        c.addr,
        LOCAL,
        "POST",
        "/ui/login",
        &headers,
        &format!("token={SHOP}"),
    )
    .await;
    assert_eq!((good.status, good.header("location")), (303, Some("/ui/")));
    let set = good.header("set-cookie").unwrap();
    assert!(set.starts_with("gaffer_session="), "{set}");
    for flag in [
        "; HttpOnly",
        "; SameSite=Strict",
        "; Path=/",
        "; Max-Age=43200",
    ] {
        assert!(set.contains(flag), "{set} lacks {flag}");
    }
    assert!(!set.contains("Secure"), "plain http: no Secure flag: {set}");
    assert!(!set.contains(SHOP), "the token is not in the cookie");
    let cookie = good.cookie();

    let r = c.session(&cookie).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.assert_secure("the session");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let s = r.json();
    assert_eq!(s["key"], "shop");
    assert_eq!(s["user"], Value::Null);
    assert_eq!(s["admin"], false);
    assert_eq!(s["queues"], serde_json::json!(["bulk", "emails"]));
    assert_eq!(s["via"], "session");
    assert_eq!(s["csrf"].as_str().unwrap().len(), 64);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ends = s["expires_ms"].as_u64().unwrap();
    assert!(
        ends > now_ms + 43_100_000 && ends <= now_ms + 43_200_000,
        "{ends}"
    );
    let admin = c.session(&c.login(OPS).await).await.json();
    assert_eq!(
        (admin["key"].as_str(), admin["admin"].as_bool()),
        (Some("ops"), Some(true))
    );
    assert_eq!(admin["queues"], serde_json::json!(["*"]));

    let r = c.get("/ui/", &[("Cookie", &cookie)]).await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("app.js"));
    let r = c.get("/ui/session", &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"], "not logged in: log in at /ui/login");
    r.assert_secure("a session refused");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_have_their_type_and_etag_and_unknown_paths_404() {
    let c = Console::start("").await;
    for (path, kind) in [
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
    ] {
        let r = c.get(path, &[]).await;
        assert_eq!(
            (r.status, r.header("content-type")),
            (200, Some(kind)),
            "{path}"
        );
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        r.assert_secure(path);
        let tag = r.header("etag").unwrap().to_string();
        let again = c.get(path, &[("If-None-Match", &tag)]).await;
        assert_eq!(again.status, 304, "{path}");
        assert!(again.body.is_empty());
        again.assert_secure("a 304");
    }
    for path in [
        "/ui/nope",
        "/ui/index.html",
        "/ui/../Cargo.toml",
        "/ui/app.js/x",
    ] {
        let r = c.get(path, &[]).await;
        assert_eq!(r.status, 404, "{path}");
        r.assert_secure(path);
    }
    let r = send(c.addr, LOCAL, "POST", "/ui/app.js", &[], "").await;
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    r.assert_secure("a 405");
    let r = send(c.addr, LOCAL, "DELETE", "/ui/login", &[], "").await;
    assert_eq!(
        (r.status, r.header("allow")),
        (405, Some("GET, HEAD, POST"))
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_has_its_keys_rights_on_the_api_and_writes_need_the_csrf_token() {
    let c = Console::start("").await;
    submit(c.addr, SHOP, "mine").await;
    submit(c.addr, OPS, "theirs").await;
    let cookie = c.login(SHOP).await;
    let csrf = c.session(&cookie).await.json()["csrf"]
        .as_str()
        .unwrap()
        .to_string();
    let with_cookie = [("Cookie", cookie.as_str())];

    let r = c.get("/v1/queues/emails/tasks/mine", &with_cookie).await;
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("waiting"))
    );
    assert_eq!(c.get("/status", &with_cookie).await.status, 200);
    let r = c.get("/v1/queues/emails/tasks/theirs", &with_cookie).await;
    assert_eq!(
        r.status,
        404,
        "another key's task, as with the bearer token: {}",
        r.text()
    );
    let r = c.get("/v1/queues/reports/tasks", &with_cookie).await;
    assert_eq!(r.status, 403, "a queue outside the key's");

    let delete = |headers: Vec<(&'static str, String)>| {
        let addr = c.addr;
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            send(
                addr,
                LOCAL,
                "DELETE",
                "/v1/queues/emails/tasks/mine",
                &h,
                "",
            )
            .await
        }
    };
    let r = delete(vec![("Cookie", cookie.clone())]).await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("missing or wrong csrf token"),
        "{}",
        r.text()
    );
    let wrong = "0".repeat(64);
    let r = delete(vec![("Cookie", cookie.clone()), ("X-CSRF-Token", wrong)]).await;
    assert_eq!(r.status, 403);
    let r = c.get("/v1/queues/emails/tasks/mine", &with_cookie).await;
    assert_eq!(
        r.json()["state"],
        "waiting",
        "the refused cancel changed nothing"
    );
    let r = delete(vec![
        ("Cookie", cookie.clone()),
        ("X-CSRF-Token", csrf.clone()),
    ])
    .await;
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("cancelled")),
        "{}",
        r.text()
    );

    let h = [("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str())];
    let r = send(c.addr, LOCAL, "POST", "/v1/queues/emails/pause", &h, "").await;
    assert_eq!(
        r.status,
        403,
        "an admin action, refused to a limited key: {}",
        r.text()
    );
    let r = send(
        c.addr,
        LOCAL,
        "POST",
        "/v1/queues/emails/tasks",
        &h,
        r#"{"payload": 2}"#,
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());

    // A token wins over a cookie; a cookie tampered with is refused.
    let auth = format!("Bearer {OPS}");
    let both = [
        ("Cookie", cookie.as_str()),
        ("Authorization", auth.as_str()),
    ];
    assert_eq!(
        c.get("/v1/queues/emails/tasks/theirs", &both).await.status,
        200
    );
    let forged = cookie.replacen("shop", "ops", 1);
    let r = c.get("/v1/queues", &[("Cookie", &forged)]).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json()["error"],
        "session expired or revoked: log in again at /ui/login"
    );
    let r = c.get("/v1/queues", &[]).await;
    assert_eq!(
        r.json()["error"],
        "missing token: send Authorization: Bearer TOKEN"
    );
    c.stop().await;
}

/// The shop key's table as `config_text` writes it.
fn shop_table() -> String {
    format!(
        "[api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"emails\", \"bulk\"]\n",
        hash_token(SHOP)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_for_the_key_ends_its_sessions_at_the_next_apply() {
    let c = Console::start("").await;
    let cookie = c.login(SHOP).await;
    assert_eq!(
        c.get("/v1/queues", &[("Cookie", &cookie)]).await.status,
        200
    );
    let text = format!("[cluster]\nnamespace = \"test\"\n{}", config_text(""));
    let rotated = text.replace(
        &shop_table(),
        &shop_table().replace(&hash_token(SHOP), &hash_token("shop-token-2")),
    );
    assert_ne!(rotated, text);
    let client = c.redis.client().await;
    let keys = gaffer::cluster::Keys::new("test");
    gaffer::cluster::publish_config(&mut client.connection(), &keys, &rotated)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(15),
        "the session is refused",
        || async { c.get("/v1/queues", &[("Cookie", &cookie)]).await.status == 401 },
    )
    .await;
    let r = c.get("/ui/", &[("Cookie", &cookie)]).await;
    assert_eq!((r.status, r.header("location")), (303, Some("/ui/login")));
    assert_eq!(c.session(&cookie).await.status, 401);
    let fresh = c.login("shop-token-2").await;
    assert_eq!(c.session(&fresh).await.json()["key"], "shop");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_a_secret_file_accept_each_others_cookies_until_the_key_changes() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("console.secret");
    std::fs::write(&secret, "a shared console secret, long enough to sign\n").unwrap();
    let extra = format!(
        "[api.console]\nsession_secret_file = \"{}\"\n",
        secret.display()
    );
    let redis = TestRedis::start();
    let config = test_config(&config_text(&extra));
    let (a, stop_a, task_a) = start_api(config.clone(), redis.url()).await;
    let (b, stop_b, task_b) = start_api(config.clone(), redis.url()).await;
    let (alone, stop_alone, task_alone) =
        start_api(test_config(&config_text("")), redis.url()).await;

    let r = send(a, LOCAL, "POST", "/ui/login", &[], &format!("token={SHOP}")).await;
    let cookie = r.cookie();
    let on = |addr| {
        let cookie = cookie.clone();
        async move {
            send(addr, LOCAL, "GET", "/v1/queues", &[("Cookie", &cookie)], "")
                .await
                .status
        }
    };
    assert_eq!(on(a).await, 200);
    assert_eq!(on(b).await, 200, "another instance with the same secret");
    assert_eq!(
        on(alone).await,
        401,
        "an instance with its own random secret"
    );

    // B restarts with shop's token changed: its sessions end there, not on A.
    stop_b.cancel();
    task_b.await.unwrap().unwrap();
    let text = config_text(&extra);
    let rotated = text.replace(&hash_token(SHOP), &hash_token("shop-token-2"));
    let (b, stop_b, task_b) = start_api(test_config(&rotated), redis.url()).await;
    assert_eq!(on(b).await, 401, "restarted with the key's token changed");
    assert_eq!(on(a).await, 200);
    for (stop, task) in [(stop_a, task_a), (stop_b, task_b), (stop_alone, task_alone)] {
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}

/// Proxy mode trusting 127.0.0.1 only: admins map to ops, listed before shop-team.
fn proxy_config() -> &'static str {
    r#"
[api.console]
trusted_proxies = ["127.0.0.1"]
user_header = "X-Forwarded-User"
groups_header = "X-Forwarded-Groups"

[api.console.groups]
admins = "ops"
shop-team = "shop"
"#
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_user_is_believed_only_from_a_trusted_address_and_mapped_to_a_key() {
    let c = Console::start(proxy_config()).await;
    submit(c.addr, OPS, "theirs").await;
    let as_user = |user: &'static str, groups: &'static str| {
        [("X-Forwarded-User", user), ("X-Forwarded-Groups", groups)]
    };
    let alice = as_user("alice", "shop-team, admins");
    let r = c.get("/ui/session", &alice).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let s = r.json();
    assert_eq!(
        (s["key"].as_str(), s["user"].as_str()),
        (Some("ops"), Some("alice"))
    );
    assert_eq!(
        s["via"], "proxy",
        "the first mapped group in the config's order wins"
    );
    let bob = c
        .get("/ui/session", &as_user("bob", "staff,shop-team"))
        .await
        .json();
    assert_eq!(
        (bob["key"].as_str(), bob["admin"].as_bool()),
        (Some("shop"), Some(false))
    );
    let r = c.get("/ui/session", &as_user("carol", "staff")).await;
    assert_eq!(r.status, 403);
    assert!(r.text().contains("user carol has no key"), "{}", r.text());
    let r = c.get("/ui/login", &alice).await;
    assert_eq!((r.status, r.header("location")), (303, Some("/ui/")));
    assert_eq!(c.get("/ui/", &alice).await.status, 200);

    // The user's key on the API, writes with the csrf token /ui/session gave.
    assert_eq!(
        c.get("/v1/queues/emails/tasks/theirs", &alice).await.status,
        200
    );
    let bob_reads = c
        .get(
            "/v1/queues/emails/tasks/theirs",
            &as_user("bob", "shop-team"),
        )
        .await;
    assert_eq!(bob_reads.status, 404);
    let csrf = s["csrf"].as_str().unwrap();
    let pause = |headers: Vec<(&'static str, &'static str)>, csrf: Option<String>| {
        let addr = c.addr;
        async move {
            let mut h: Vec<(&str, &str)> = headers;
            let token = csrf.unwrap_or_default();
            if !token.is_empty() {
                h.push(("X-CSRF-Token", &token));
            }
            send(addr, LOCAL, "POST", "/v1/queues/emails/pause", &h, "").await
        }
    };
    assert_eq!(
        pause(alice.to_vec(), None).await.status,
        403,
        "no csrf token"
    );
    let r = pause(alice.to_vec(), Some(csrf.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let bob_token = bob["csrf"].as_str().unwrap().to_string();
    let r = pause(alice.to_vec(), Some(bob_token)).await;
    assert_eq!(r.status, 403, "another user's token");

    // From an address that is not the proxy's, the headers are ignored and counted.
    let ignored = "gaffer_console_proxy_header_ignored_total";
    let before = c.counter(ignored, "").await;
    let r = send(c.addr, ELSEWHERE, "GET", "/ui/session", &alice, "").await;
    assert_eq!(r.status, 401, "{}", r.text());
    r.assert_secure("an untrusted proxy's session");
    let r = send(c.addr, ELSEWHERE, "GET", "/v1/queues", &alice, "").await;
    assert_eq!(r.status, 401);
    let r = send(c.addr, ELSEWHERE, "GET", "/ui/", &alice, "").await;
    assert_eq!((r.status, r.header("location")), (303, Some("/ui/login")));
    assert!(c.counter(ignored, "").await >= before + 3.0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookie_is_secure_when_a_trusted_proxy_says_https_or_the_config_says_so() {
    let c = Console::start(proxy_config()).await;
    let post = |from: &'static str| {
        let addr = c.addr;
        async move {
            let h = [("X-Forwarded-Proto", "https")];
            send(
                addr,
                from,
                "POST",
                "/ui/login",
                &h,
                &format!("token={SHOP}"),
            )
            .await
        }
    };
    let trusted = post(LOCAL).await;
    assert!(trusted.header("set-cookie").unwrap().ends_with("; Secure"));
    let untrusted = post(ELSEWHERE).await;
    assert!(!untrusted.header("set-cookie").unwrap().contains("Secure"));
    let h = [("Cookie", trusted.cookie())];
    let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let csrf = c.get("/ui/session", &h).await.json()["csrf"]
        .as_str()
        .unwrap()
        .to_string();
    let mut out = h.clone();
    out.extend([
        ("X-CSRF-Token", csrf.as_str()),
        ("X-Forwarded-Proto", "https"),
    ]);
    let r = send(c.addr, LOCAL, "POST", "/ui/logout", &out, "").await;
    assert_eq!(r.status, 204);
    let cleared = r.header("set-cookie").unwrap();
    assert!(
        cleared.starts_with("gaffer_session=; Path=/; Max-Age=0"),
        "{cleared}"
    );
    assert!(cleared.ends_with("; Secure"), "{cleared}");
    c.stop().await;

    let always = Console::start("[api.console]\nsecure_cookie = true\n").await;
    let r = always.login_from(LOCAL, SHOP).await;
    assert!(r.header("set-cookie").unwrap().ends_with("; Secure"));
    always.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_needs_the_csrf_token_and_drops_the_cookie() {
    let c = Console::start("").await;
    let cookie = c.login(SHOP).await;
    let csrf = c.session(&cookie).await.json()["csrf"]
        .as_str()
        .unwrap()
        .to_string();
    let r = send(
        c.addr,
        LOCAL,
        "POST",
        "/ui/logout",
        &[("Cookie", &cookie)],
        "",
    )
    .await;
    assert_eq!(r.status, 403, "another site must not log the user out");
    assert!(r.header("set-cookie").is_none());
    let h = [("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str())];
    let r = send(c.addr, LOCAL, "POST", "/ui/logout", &h, "").await;
    assert_eq!(r.status, 204);
    r.assert_secure("logout");
    let cleared = r.header("set-cookie").unwrap();
    assert!(
        cleared.starts_with("gaffer_session=; Path=/; Max-Age=0; HttpOnly"),
        "{cleared}"
    );
    let r = send(c.addr, LOCAL, "POST", "/ui/logout", &[], "").await;
    assert_eq!(
        r.status, 204,
        "without a session there is nothing to protect"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_limited_per_address_counted_and_cross_site_posts_refused() {
    let c = Console::start("[api.console]\nmax_failed_logins = 3\nfailed_login_window = \"1h\"\n")
        .await;
    let failed = c
        .counter("gaffer_console_logins_total", "outcome=\"failed\"")
        .await;
    let limited = c
        .counter("gaffer_console_logins_total", "outcome=\"limited\"")
        .await;
    for _ in 0..3 {
        let r = c.login_from(LOCAL, "guess").await;
        assert_eq!(r.header("location"), Some("/ui/login?failed=1"));
    }
    let r = c.login_from(LOCAL, SHOP).await;
    assert_eq!(
        (r.status, r.header("location")),
        (303, Some("/ui/login?failed=wait"))
    );
    assert!(
        r.header("set-cookie").is_none(),
        "not even the right token is looked at"
    );
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(wait > 3000 && wait <= 3600, "{wait}");
    let r = c.login_from(ELSEWHERE, SHOP).await;
    assert_eq!(
        r.header("location"),
        Some("/ui/"),
        "another address logs in"
    );
    let now = c
        .counter("gaffer_console_logins_total", "outcome=\"failed\"")
        .await;
    assert!(now >= failed + 3.0, "{failed} then {now}");
    let now = c
        .counter("gaffer_console_logins_total", "outcome=\"limited\"")
        .await;
    assert!(now > limited, "{limited} then {now}");

    // Another site's form cannot log the browser in (to a key of the attacker's).
    let body = format!("token={OPS}");
    let from_elsewhere = [("Sec-Fetch-Site", "cross-site")];
    let r = send(
        c.addr,
        ELSEWHERE,
        "POST",
        "/ui/login",
        &from_elsewhere,
        &body,
    )
    .await;
    assert_eq!(r.status, 403);
    r.assert_secure("a cross-site login");
    let r = send(
        c.addr,
        ELSEWHERE,
        "POST",
        "/ui/login",
        &[("Origin", "http://evil.example")],
        &body,
    )
    .await;
    assert_eq!(r.status, 403, "an old browser's origin of another host");
    let own = format!("http://{}", c.addr);
    let r = send(
        c.addr,
        ELSEWHERE,
        "POST",
        "/ui/login",
        &[("Origin", &own)],
        &body,
    )
    .await;
    assert_eq!(
        r.header("location"),
        Some("/ui/"),
        "its own origin: {}",
        r.text()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_console_false_there_is_no_console_and_no_cookie_counts() {
    let c = Console::start("").await;
    let cookie = c.login(SHOP).await;
    c.stop().await;
    let text = config_text("").replace("[api]\n", "[api]\nconsole = false\n");
    let off = Console::start_text(&text).await;
    let r = off.get("/ui/", &[]).await;
    assert_eq!(r.status, 404);
    assert!(
        r.text().contains("no such endpoint GET /ui/"),
        "{}",
        r.text()
    );
    let r = off.get("/v1/queues", &[("Cookie", &cookie)]).await;
    assert_eq!(
        r.json()["error"],
        "missing token: send Authorization: Bearer TOKEN"
    );
    off.stop().await;
}
