//! Arbitrary text as a config file: parsing never panics, and every error it reports
//! points at a real place in the text (file, 1-based line and column inside it).
#![no_main]

use gaffer::config::{self, ConfigError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Config files are read as UTF-8 before parsing; other bytes never reach the parser.
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    check(source, config::parse(source, "fuzz.toml"));
    // A team binary's handler names open the `options` table path (TOML to JSON).
    if source.contains("custom") {
        let custom = ["custom".to_owned()];
        check(source, config::parse_with(source, "fuzz.toml", &custom));
    }
});

fn check(source: &str, result: Result<config::Config, ConfigError>) {
    let diagnostics = match result {
        Ok(config) => {
            let _ = config.summary();
            return;
        }
        Err(ConfigError::Invalid(diagnostics)) => diagnostics,
        Err(e @ ConfigError::Io { .. }) => panic!("parsing text did I/O: {e}"),
    };
    assert!(!diagnostics.is_empty(), "an error without diagnostics");
    let lines: Vec<&str> = source.split('\n').collect();
    for d in &diagnostics {
        assert_eq!(d.file, "fuzz.toml", "{d}");
        assert!(!d.message.is_empty(), "{d:?}");
        assert!(
            d.line >= 1 && d.line <= lines.len(),
            "line out of the text: {d}"
        );
        let width = lines[d.line - 1].chars().count();
        assert!(
            d.column >= 1 && d.column <= width + 1,
            "column out of the line: {d}"
        );
        let _ = d.to_string();
    }
    let _ = diagnostics.to_string();
}
