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
            for forbidden in ["crate::manager", "crate::balancer"] {
                assert!(!text.contains(forbidden), "{path} uses {forbidden}");
            }
        }
    }
    for dir in ["src/manager", "src/balancer"] {
        if Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).exists() {
            for (path, text) in sources(dir) {
                for forbidden in ["crate::master", "crate::slot"] {
                    assert!(!text.contains(forbidden), "{path} uses {forbidden}");
                }
            }
        }
    }
}

/// Invariant 17: the balancer is pure: no Redis, no clock, no randomness, no I/O.
#[test]
fn balancer_does_no_io() {
    for (path, text) in sources("src/balancer") {
        for forbidden in [
            "redis",
            "tokio",
            "SystemTime",
            "Instant::now",
            "Utc::now",
            "rand::",
            "std::fs",
            "std::net",
            "queue_client",
        ] {
            assert!(!text.contains(forbidden), "{path} uses {forbidden}");
        }
    }
}

/// Invariant 21: the dashboard's state, update and views do no I/O and read no clock, and
/// know the cluster only through the snapshot (not the manager, master, balancer or slots).
#[test]
fn dashboard_update_and_views_are_pure() {
    for (path, text) in sources("src/tui") {
        let file = path.rsplit('/').next().unwrap_or_default();
        for forbidden in [
            "crate::manager",
            "crate::master",
            "crate::balancer",
            "crate::slot",
        ] {
            assert!(!text.contains(forbidden), "{path} uses {forbidden}");
        }
        if matches!(file, "state.rs" | "view.rs" | "input.rs" | "lookup.rs") {
            for forbidden in [
                "redis",
                "tokio",
                "SystemTime",
                "Instant::now",
                "Utc::now",
                "now_ms()",
                "std::fs",
                "std::net",
            ] {
                assert!(!text.contains(forbidden), "{path} uses {forbidden}");
            }
        }
    }
}
