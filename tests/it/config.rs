//! Config loading as operators meet it: every file under `tests/configs/valid` loads, and
//! every file under `tests/configs/invalid` fails with the messages in its snapshot.

use std::path::Path;

use gaffer::config::{self, ConfigError};

/// Parses with the bare file name as origin so snapshots do not depend on the checkout path.
fn check(path: &Path) -> Result<config::Config, ConfigError> {
    let source = std::fs::read_to_string(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy();
    config::parse(&source, &name)
}

#[test]
fn invalid_configs_report_every_error() {
    insta::glob!("../configs/invalid", "*.toml", |path| {
        let rendered = match check(path) {
            Ok(c) => panic!(
                "{} should be invalid but gave {}",
                path.display(),
                c.summary()
            ),
            Err(e @ ConfigError::Io { .. }) => panic!("{e}"),
            Err(ConfigError::Invalid(diagnostics)) => {
                assert!(!diagnostics.is_empty());
                for d in &diagnostics {
                    assert!(!d.message.ends_with('.'), "trailing dot: {d}");
                    assert!(
                        !d.message.starts_with(|c: char| c.is_uppercase()),
                        "capitalised: {d}"
                    );
                }
                diagnostics.to_string()
            }
        };
        insta::assert_snapshot!(rendered);
    });
}

#[test]
fn invalid_configs_are_numerous_enough() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/invalid");
    let count = std::fs::read_dir(dir).unwrap().count();
    assert!(count >= 24, "only {count} invalid configs");
}

#[test]
fn valid_configs_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/valid");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            if let Err(e) = check(&path) {
                panic!("{} should be valid:\n{e}", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen > 0, "no valid configs found");
}

#[test]
fn load_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[queues.a]\nhandler = \"noop\"\nlease = 5\n").unwrap();
    let e = config::load(&path).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{}:3:9: queues.a.lease: ", path.display())),
        "{text}"
    );

    std::fs::write(&path, "[queues.a]\nhandler = \"noop\"\n").unwrap();
    let c = config::load(&path).unwrap();
    assert_eq!(
        c.summary(),
        format!("ok: 1 queue, 0 systems, 0 schedules ({})", path.display())
    );
}
