use std::time::Duration;

use chrono::Weekday;

use super::*;

const DESIGN: &str = include_str!("../../tests/configs/valid/design.toml");

fn errors(source: &str) -> Vec<String> {
    match parse(source, "t.toml") {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.iter().map(ToString::to_string).collect(),
        Err(e) => panic!("unexpected {e}"),
    }
}

#[test]
fn design_example_parses() {
    let c = parse(DESIGN, "design.toml").unwrap();
    assert_eq!(c.cluster.redis.as_deref(), Some("redis://127.0.0.1:6379/0"));
    assert_eq!(c.cluster.namespace, "gaffer");
    assert_eq!(c.manager.tick, Duration::from_secs(2));
    assert_eq!(c.manager.timezone, chrono_tz::Europe::Moscow);
    assert_eq!(c.manager.heartbeat_timeout, Duration::from_secs(10));
    assert_eq!(c.master.memory_reserve, 512 << 20);
    assert_eq!(c.master.slot_estimate, 64 << 20);
    assert_eq!(c.master.drain_timeout, Duration::from_secs(60));
    assert_eq!(c.master.http.to_string(), "127.0.0.1:9464");
    assert_eq!(c.master.max_slots, None);

    let q = &c.queues["resize_photo"];
    assert_eq!(q.name, "resize_photo");
    assert_eq!(
        q.handler,
        Handler::Exec {
            command: vec!["python3".into(), "handlers/resize.py".into()]
        }
    );
    assert_eq!(q.priority, 10);
    assert_eq!((q.min_slots, q.max_slots, q.batch_size), (2, 200, 50));
    assert_eq!(q.lease, Duration::from_secs(7200));
    assert_eq!(q.max_attempts, 5);
    assert_eq!(
        q.retry,
        RetryPolicy {
            backoff: Backoff::Exponential,
            base: Duration::from_secs(10),
            max: Duration::from_secs(3600)
        }
    );
    assert_eq!(q.private_dirty_limit, Some(256 << 20));
    assert_eq!(q.max_batch_time, Duration::from_secs(600));
    assert_eq!(q.work_periods.len(), 2);
    assert!(q.is_working_at(Weekday::Tue, 5 * 60));
    assert!(!q.is_working_at(Weekday::Tue, 7 * 60));
    assert!(q.is_working_at(Weekday::Sun, 12 * 60));
    assert_eq!(q.system.as_deref(), Some("partner_api"));
    assert_eq!(q.max_payload, 1 << 20);
    assert_eq!(q.user, None);

    let s = &c.systems["partner_api"];
    assert_eq!(s.max_concurrency, Some(10));
    assert_eq!(s.rate, Some(Rate { per_second: 50.0 }));
    assert!(!s.paused);

    assert_eq!(c.schedules.len(), 1);
    assert_eq!(c.schedules[0].queue, "resize_photo");
    assert_eq!(c.schedules[0].cron_source, "0 3 * * *");
    assert_eq!(
        c.schedules[0].payload,
        serde_json::json!({"kind": "nightly"})
    );
    assert_eq!(
        c.summary(),
        "ok: 1 queue, 1 system, 1 schedule (design.toml)"
    );
}

#[test]
fn empty_file_gives_defaults() {
    let c = parse("", "empty.toml").unwrap();
    assert_eq!(
        c,
        Config {
            origin: "empty.toml".into(),
            ..Config::default()
        }
    );
    assert_eq!(
        c.summary(),
        "ok: 0 queues, 0 systems, 0 schedules (empty.toml)"
    );
}

#[test]
fn queue_defaults_and_builtin_handlers() {
    let c = parse(
        r#"
        [queues.a]
        handler = "noop"
        [queues.b]
        handler = "flaky"
        [queues.c]
        handler = "memhog"
        [queues.d]
        handler = "preload_demo"
        preload = "1GiB"
        [queues.e]
        handler = "flaky"
        fail_rate = 1
        [[schedules]]
        queue = "a"
        cron = "*/5 * * * *"
        "#,
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.queues["a"], QueueConfig::new("a", Handler::Noop));
    assert_eq!(c.queues["b"].handler, Handler::Flaky { fail_rate: 0.1 });
    assert_eq!(
        c.queues["c"].handler,
        Handler::Memhog {
            grow_per_task: 4 << 20
        }
    );
    assert_eq!(
        c.queues["d"].handler,
        Handler::PreloadDemo { preload: 1 << 30 }
    );
    assert_eq!(c.queues["e"].handler, Handler::Flaky { fail_rate: 1.0 });
    assert_eq!(c.schedules[0].payload, serde_json::json!({}));
    assert_eq!(c.queues["a"].handler.name(), "noop");
}

#[test]
fn payload_datetimes_become_strings() {
    let c = parse(
        "[queues.a]\nhandler = \"noop\"\n[[schedules]]\nqueue = \"a\"\ncron = \"0 0 * * *\"\npayload = { at = 1979-05-27T07:32:00Z, list = [1, 2] }\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(
        c.schedules[0].payload,
        serde_json::json!({"at": "1979-05-27T07:32:00Z", "list": [1, 2]})
    );
}

#[test]
fn every_error_is_reported_with_location_and_key() {
    let e = errors(
        "[queues.a]\nhandler = \"noop\"\nmin_slots = 5\nmax_slots = 2\nlease = \"0s\"\n\n[queues.b]\nhandler = \"nope\"\nbatch_size = 0\n",
    );
    assert_eq!(
        e,
        [
            "t.toml:3:13: queues.a.min_slots: min_slots (5) is greater than max_slots (2)",
            "t.toml:5:9: queues.a.lease: must be greater than zero",
            "t.toml:8:11: queues.b.handler: unknown handler `nope`, expected one of `exec`, `noop`, `sleep`, `flaky`, `memhog` or `preload_demo`",
            "t.toml:9:14: queues.b.batch_size: must be greater than zero, found 0",
        ]
    );
}

#[test]
fn bare_numbers_are_refused_for_durations_and_sizes() {
    let e = errors("[manager]\ntick = 2\n[master]\nslot_estimate = 64\n");
    assert_eq!(
        e,
        [
            "t.toml:2:8: manager.tick: bare number 2 is not a duration, write a string with a unit like \"10s\"",
            "t.toml:4:17: master.slot_estimate: bare number 64 is not a size, write a string with a unit like \"64MiB\"",
        ]
    );
}

#[test]
fn dotted_queue_names_are_quoted_in_key_paths() {
    let e = errors("[queues.\"a.b\"]\nhandler = \"noop\"\nlease = \"x\"\n");
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("t.toml:3:9: queues.\"a.b\".lease: invalid duration `x`"),
        "{e:?}"
    );
}

#[test]
fn references_to_broken_tables_do_not_cascade() {
    // Queue `a` fails to deserialize; the schedule naming it must not add "unknown queue".
    let e = errors("[queues.a]\nhandler = 3\n[[schedules]]\nqueue = \"a\"\ncron = \"0 0 * * *\"\n");
    assert_eq!(
        e,
        ["t.toml:2:11: queues.a.handler: expected a string, found integer `3`"]
    );
}

#[test]
fn retry_policy_delays() {
    let r = RetryPolicy::default();
    assert_eq!(r.delay(1), Duration::from_secs(10));
    assert_eq!(r.delay(2), Duration::from_secs(20));
    assert_eq!(r.delay(10), Duration::from_secs(3600));
    assert_eq!(r.delay(u32::MAX), Duration::from_secs(3600));
    let f = RetryPolicy {
        backoff: Backoff::Fixed,
        ..r
    };
    assert_eq!(f.delay(7), Duration::from_secs(10));
}

#[test]
fn load_reports_io_errors() {
    let e = load(Path::new("/nonexistent/gaffer.toml")).unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(
        e.to_string()
            .starts_with("cannot read /nonexistent/gaffer.toml: ")
    );
}

#[test]
fn odd_shapes_are_reported() {
    let e = errors(
        "queues.a = 3\n[queues.b]\nhandler = \"exec\"\ncommand = []\n[queues.c]\nhandler = \"exec\"\ncommand = [\"\", \"x\"]\nlease = 1979-05-27\n[queues.c.retry]\nbase = \"2h\"\n[[schedules]]\npayload = 1\n",
    );
    assert_eq!(
        e,
        [
            "t.toml:1:12: queues.a: expected a table, found integer",
            "t.toml:4:11: queues.b.command: must not be empty, give the program and its arguments like [\"python3\", \"worker.py\"]",
            "t.toml:7:12: queues.c.command[0]: must not be an empty string",
            "t.toml:8:9: queues.c.lease: expected a duration string like \"10s\", found datetime `1979-05-27`",
            "t.toml:10:8: queues.c.retry.base: retry max (1h) is shorter than base (2h)",
            "t.toml:11:1: schedules[0]: missing required key `queue`",
            "t.toml:11:1: schedules[0]: missing required key `cron`, a five-field cron expression like \"0 3 * * *\"",
        ]
    );
}

proptest::proptest! {
    #[test]
    fn parse_never_panics(source in "(\\PC|\n){0,200}") {
        let _ = parse(&source, "p.toml");
    }

    #[test]
    fn queue_values_never_panic(key in "[a-z_]{1,20}", value in "\\PC{0,30}") {
        let source = format!("[queues.q]\nhandler = \"noop\"\n{key} = {value:?}\n");
        if let Err(ConfigError::Invalid(d)) = parse(&source, "p.toml") {
            for d in &d {
                proptest::prop_assert!(d.line >= 1 && d.line <= 4, "{d}");
            }
        }
    }

    #[test]
    fn work_period_display_round_trips(
        days in proptest::array::uniform7(proptest::bool::ANY),
        start in 0u16..1440,
        end in 0u16..1440,
    ) {
        proptest::prop_assume!(days.iter().any(|d| *d));
        let p = WorkPeriod { days, start_minute: start, end_minute: end };
        proptest::prop_assert_eq!(p.to_string().parse::<WorkPeriod>(), Ok(p));
    }
}

#[test]
fn custom_handlers_are_named_by_the_binary_and_take_options() {
    let src = "[queues.geo]\nhandler = \"geocode\"\noptions = { endpoint = \"http://x\", n = 3 }\n";
    // The stock binary does not know the name, and says which ones it knows.
    let errs = errors(src);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("unknown handler `geocode`"), "{errs:?}");

    let c = parse_with(src, "t.toml", &["geocode".to_string()]).unwrap();
    match &c.queues["geo"].handler {
        Handler::Custom { name, options } => {
            assert_eq!(name, "geocode");
            assert_eq!(options["endpoint"], "http://x");
            assert_eq!(options["n"], 3);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.queues["geo"].handler.name(), "geocode");
}

#[test]
fn options_belong_to_custom_handlers_only() {
    let errs = errors("[queues.a]\nhandler = \"noop\"\noptions = { x = 1 }\n");
    assert_eq!(
        errs,
        [
            "t.toml:3:1: queues.a.options: `options` is only valid with a handler built into your own binary"
        ]
    );
}
