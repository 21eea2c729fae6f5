//! Architecture invariants that can be checked on the sources (docs/ARCHITECTURE.md).

use std::path::Path;

fn sources(dir: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push((
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                ));
            }
        }
    }
    out
}

/// Fails naming the first of `forbidden` that the source at `path` contains.
fn assert_names_none(path: &str, text: &str, forbidden: &[&str]) {
    for name in forbidden {
        assert!(!text.contains(name), "{path} uses {name}");
    }
}

/// The other roles and the balancer: what the neutral modules and the dashboard never name.
const ROLES_AND_BALANCER: [&str; 4] = [
    "crate::master",
    "crate::slot",
    "crate::manager",
    "crate::balancer",
];

/// Redis, the runtime, clocks, files and sockets: what a pure module never names. (Redis
/// as the driver and the connections that reach it: a view may show the `redis` node a
/// host report names, which is a value like any other.)
const IO_AND_CLOCK: [&str; 9] = [
    "redis::",
    "RedisConn",
    "QueueClient",
    "tokio",
    "SystemTime",
    "Instant::now",
    "Utc::now",
    "std::fs",
    "std::net",
];

/// Invariant 12: only the zygote forks.
#[test]
fn only_the_zygote_forks() {
    let forking: Vec<String> = sources("src")
        .into_iter()
        .filter(|(_, text)| text.contains("fork()"))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(forking.len(), 1, "{forking:?}");
    assert!(forking[0].ends_with("src/master/zygote.rs"), "{forking:?}");
}

/// Invariant 13: the host side and the cluster brain meet only in Redis.
#[test]
fn host_side_never_imports_manager_or_balancer() {
    for dir in ["src/slot", "src/master"] {
        for (path, text) in sources(dir) {
            assert_names_none(&path, &text, &["crate::manager", "crate::balancer"]);
        }
    }
    for dir in ["src/manager", "src/balancer"] {
        if Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).exists() {
            for (path, text) in sources(dir) {
                assert_names_none(&path, &text, &["crate::master", "crate::slot"]);
            }
        }
    }
}

/// Invariant 13: slot and master meet only on neutral ground, `src/host/` (host readings,
/// the slot protocol, the handler API). No slot source names the master; no master source
/// names `slot` except the zygote, whose forked child becomes a slot through
/// `slot::slot_main` and nothing else; the neutral modules name neither role.
#[test]
fn slot_and_master_meet_only_on_neutral_ground() {
    for (path, text) in sources("src/slot") {
        assert!(!text.contains("crate::master"), "{path} uses crate::master");
    }
    for (path, text) in sources("src/master") {
        let zygote = path.ends_with("src/master/zygote.rs");
        for (at, _) in text.match_indices("crate::slot") {
            assert!(
                zygote && text[at..].starts_with("crate::slot::slot_main"),
                "{path} uses {}: only the zygote may, for slot_main",
                text[at..]
                    .split([';', ',', '}', '\n'])
                    .next()
                    .unwrap_or_default()
            );
        }
    }
    let mut neutral = sources("src/host");
    let backoff = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backoff.rs");
    neutral.push((
        backoff.display().to_string(),
        std::fs::read_to_string(&backoff).unwrap(),
    ));
    for (path, text) in neutral {
        assert_names_none(&path, &text, &ROLES_AND_BALANCER);
    }
}

/// Invariant 16: the master's plan is pure: no clock, no I/O, no Redis, no signals.
#[test]
fn master_plan_does_no_io() {
    let plan: Vec<_> = sources("src/master")
        .into_iter()
        .filter(|(p, _)| p.ends_with("src/master/plan.rs") || p.contains("src/master/plan/"))
        .collect();
    assert!(
        plan.iter().any(|(p, _)| p.ends_with("src/master/plan.rs")),
        "{plan:?}"
    );
    for (path, text) in plan {
        for forbidden in [
            "redis",
            "tokio",
            "SystemTime",
            "Instant::now",
            "now_ms()",
            "std::fs",
            "std::net",
            "std::process",
            "nix::",
            "libc::",
            "queue_client",
            "sysinfo",
        ] {
            // The tests build their times from one reading of the clock.
            if path.ends_with("tests.rs") && forbidden == "Instant::now" {
                continue;
            }
            assert!(!text.contains(forbidden), "{path} uses {forbidden}");
        }
    }
}

/// Invariant 17: the balancer is pure: no Redis, no clock, no randomness, no I/O.
#[test]
fn balancer_does_no_io() {
    for (path, text) in sources("src/balancer") {
        assert_names_none(&path, &text, &IO_AND_CLOCK);
        assert_names_none(&path, &text, &["rand::", "queue_client"]);
    }
}

/// Invariant 21: the dashboard's state, update and views do no I/O and read no clock, and
/// know the cluster only through the snapshot (not the manager, master, balancer or slots).
#[test]
fn dashboard_update_and_views_are_pure() {
    for (path, text) in sources("src/tui") {
        let file = path.rsplit('/').next().unwrap_or_default();
        assert_names_none(&path, &text, &ROLES_AND_BALANCER);
        // src/tui/mod.rs runs the loop and its I/O, tests.rs builds fixtures; every other
        // file (state, input, each screen's view) is pure.
        let pure = !path.ends_with("src/tui/mod.rs") && file != "tests.rs";
        if pure {
            assert_names_none(&path, &text, &IO_AND_CLOCK);
            assert_names_none(&path, &text, &["now_ms()"]);
        }
    }
}

/// Invariant 13, in general: a role's folder imports no other role's folder (the roles
/// meet in Redis or on neutral ground: `host`, `queue_client`, `cluster`, `config`). The
/// one exception is the zygote's `slot::slot_main`, checked above.
#[test]
fn no_role_imports_another_roles_folder() {
    let roles = ["manager", "master", "slot", "api"];
    for role in roles {
        for (path, text) in sources(&format!("src/{role}")) {
            for other in roles.iter().filter(|o| **o != role) {
                let forbidden = format!("crate::{other}");
                for (at, _) in text.match_indices(&forbidden) {
                    let next = text[at + forbidden.len()..].chars().next();
                    if next.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue; // another name that starts the same, like `crate::slots`
                    }
                    assert!(
                        path.ends_with("src/master/zygote.rs")
                            && text[at..].starts_with("crate::slot::slot_main"),
                        "{path} uses crate::{other}: roles meet only in Redis or on neutral ground"
                    );
                }
            }
        }
    }
}

/// The modules of the roles, which neutral ground must not import.
const ROLES: [&str; 7] = [
    "crate::manager",
    "crate::master",
    "crate::slot",
    "crate::api",
    "crate::tui",
    "crate::cli",
    "crate::balancer",
];

/// Invariant 32: chains are neutral ground the slot, the api, the CLI and the dashboard
/// share; they know queues only through `queue_client` and import no role.
#[test]
fn chains_are_neutral_ground() {
    for (path, text) in sources("src/chain") {
        assert_names_none(&path, &text, &ROLES);
    }
}

/// Schedules are neutral ground the manager, the api and the CLI share (invariant 13):
/// `src/schedule/` imports no role.
#[test]
fn schedules_are_neutral_ground() {
    for (path, text) in sources("src/schedule") {
        assert_names_none(&path, &text, &ROLES);
    }
}

/// Invariant 29: signal handlers are installed in one place, `src/signals.rs`.
#[test]
fn signal_handlers_are_installed_only_in_signals_rs() {
    for (path, text) in sources("src") {
        if !path.ends_with("src/signals.rs") {
            assert_names_none(&path, &text, &["SignalKind"]);
        }
    }
}

/// Invariant 41: test hooks are not in release builds. Every function that reads a
/// `GAFFER_TEST_` variable is compiled only with debug assertions (the test profile's).
#[test]
fn test_hooks_are_compiled_out_of_release_builds() {
    let mut hooks = 0;
    for (path, text) in sources("src") {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !(line.contains("var_os(\"GAFFER_TEST_") || line.contains("var(\"GAFFER_TEST_")) {
                continue;
            }
            hooks += 1;
            // The function around the read, and the attributes right above it.
            let start = (0..i)
                .rev()
                .find(|&j| {
                    let l = lines[j].trim_start();
                    l.starts_with("fn ")
                        || l.starts_with("pub fn ")
                        || l.starts_with("pub(crate) fn ")
                })
                .unwrap_or_else(|| panic!("{path}:{}: a test hook outside a function", i + 1));
            let gated = (0..start)
                .rev()
                .take_while(|&j| {
                    let l = lines[j].trim_start();
                    l.starts_with("#[") || l.starts_with("///")
                })
                .any(|j| lines[j].contains("#[cfg(debug_assertions)]"));
            assert!(gated, "{path}:{}: a test hook in release builds", i + 1);
        }
    }
    assert!(hooks >= 2, "the hooks this test guards were not found");
}

/// Invariant 43: the console has no rights of its own. Its module reaches neither Redis
/// nor the cluster, nor the API's endpoints' handlers: it can only say which key a
/// browser's request acts as, and the request then passes the API's checks like any.
#[test]
fn the_console_has_no_rights_of_its_own() {
    let console = sources("src/api/console");
    assert!(
        console
            .iter()
            .any(|(p, _)| p.ends_with("src/api/console/mod.rs")),
        "{console:?}"
    );
    for (path, text) in console {
        assert_names_none(
            &path,
            &text,
            &[
                "redis::",
                "QueueClient",
                "queue_client",
                "crate::cluster",
                "api.client",
                "api.queues",
                "api.ended",
                "dispatch(",
            ],
        );
    }
}
