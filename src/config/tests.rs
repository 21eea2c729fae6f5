use std::time::Duration;

use chrono::{TimeZone, Weekday};

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
    assert_eq!(c.manager.forget_hosts_after, Duration::from_secs(24 * 3600));
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
            command: vec!["python3".into(), "handlers/resize.py".into()],
            start: Start::Spawn,
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
            max: Duration::from_secs(3600),
            intervals: vec![],
            priority: None,
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
    assert_eq!(c.schedules[0].rule.text(), "0 3 * * *");
    assert_eq!(c.schedules[0].name, "resize_photo.0", "unnamed: QUEUE.N");
    assert_eq!(c.schedules[0].payload, r#"{"kind":"nightly"}"#);
    assert_eq!(
        c.summary(),
        "ok: 1 queue, 1 system, 1 schedule (design.toml)"
    );

    assert!(q.track);
    assert_eq!(q.dedup, Dedup::Active);
    assert_eq!(q.intake, Intake::Open);
    assert_eq!(c.api.listen.to_string(), "127.0.0.1:9480");
    assert_eq!(c.api.max_body, 4 << 20);
    assert_eq!(c.api.max_wait, Duration::from_secs(60));
    assert_eq!(c.api.read_timeout, Duration::from_secs(30));
    let shop = &c.api.keys["shop"];
    assert_eq!(shop.name, "shop");
    assert_eq!(&shop.token_sha256[..2], &[0x9f, 0x86]);
    assert_eq!(
        shop.queues,
        KeyQueues::Only(["resize_photo".to_string()].into())
    );
    assert!(!shop.admin);
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
    assert_eq!(
        c.queues["a"],
        QueueConfig::new("a", Handler::named(Handler::NOOP))
    );
    assert_eq!(
        c.queues["b"].handler,
        Handler::with_options("flaky", serde_json::json!({"fail_rate": 0.1}))
    );
    assert_eq!(
        c.queues["c"].handler,
        Handler::with_options("memhog", serde_json::json!({"grow_per_task": 4 << 20}))
    );
    assert_eq!(
        c.queues["d"].handler,
        Handler::with_options("preload_demo", serde_json::json!({"preload": 1u64 << 30}))
    );
    assert_eq!(
        c.queues["e"].handler,
        Handler::with_options("flaky", serde_json::json!({"fail_rate": 1.0}))
    );
    assert_eq!(c.schedules[0].payload, "{}");
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
        r#"{"at":"1979-05-27T07:32:00Z","list":[1,2]}"#
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
    // Nor a route to it; nor the checks of keys that depend on a value refused already.
    let e = errors(
        "[queues.a]\nhandler = 3\n[queues.b]\nhandler = \"noop\"\nnext = [{queue = \"a\"}]\n\
         [queues.c]\nhandler = \"noop\"\nordered = true\nbatch_size = 0\n\
         [queues.d]\nhandler = \"noop\"\nkind = \"lon\"\ncancel_grace = \"1s\"\n",
    );
    assert_eq!(
        e,
        [
            "t.toml:2:11: queues.a.handler: expected a string, found integer `3`",
            "t.toml:9:14: queues.c.batch_size: must be greater than zero, found 0",
            "t.toml:12:8: queues.d.kind: unknown kind `lon`, expected `batch` or `long`",
        ]
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
fn retry_intervals_and_linear_backoff() {
    let s = Duration::from_secs;
    let r = RetryPolicy {
        intervals: vec![s(60), s(300), s(3600)],
        ..RetryPolicy::default()
    };
    let got: Vec<Duration> = (1..=5).map(|a| r.delay(a)).collect();
    assert_eq!(
        got,
        [s(60), s(300), s(3600), s(3600), s(3600)],
        "the last repeats"
    );
    assert_eq!(r.delay(u32::MAX), s(3600));
    let l = RetryPolicy {
        backoff: Backoff::Linear,
        base: s(10),
        max: s(35),
        ..RetryPolicy::default()
    };
    let got: Vec<Duration> = (1..=5).map(|a| l.delay(a)).collect();
    assert_eq!(got, [s(10), s(20), s(30), s(35), s(35)]);
    assert_eq!(l.delay(u32::MAX), s(35));
}

#[test]
fn a_retry_table_with_intervals_and_priority_and_unlimited_attempts() {
    let c = parse(
        "[queues.a]\nhandler = \"noop\"\nmax_attempts = 0\n\
         retry = { intervals = [\"1s\", \"3s\"], priority = 1000 }\n\
         [queues.b]\nhandler = \"noop\"\nretry = { backoff = \"linear\", base = \"2s\" }\n",
        "t.toml",
    )
    .unwrap();
    let a = &c.queues["a"];
    assert_eq!(a.max_attempts, 0, "0: no limit");
    assert_eq!(
        a.retry.intervals,
        [Duration::from_secs(1), Duration::from_secs(3)]
    );
    assert_eq!(a.retry.priority, Some(1000));
    assert_eq!(c.queues["b"].retry.backoff, Backoff::Linear);
    assert_eq!(c.queues["b"].retry.delay(3), Duration::from_secs(6));
}

#[test]
fn a_bad_retry_table_names_each_mistake() {
    assert_eq!(
        errors(
            "[queues.a]\nhandler = \"noop\"\nmax_attempts = -1\n\
             retry = { intervals = [\"1s\", \"soon\"], base = \"1s\", priority = 3000000000 }\n\
             [queues.b]\nhandler = \"noop\"\nretry = { intervals = [], backoff = \"steep\" }\n"
        ),
        [
            "t.toml:3:16: queues.a.max_attempts: must be at least 0, found -1",
            "t.toml:4:23: queues.a.retry.intervals: intervals replaces backoff, base and max: remove base",
            "t.toml:4:30: queues.a.retry.intervals[1]: invalid duration `soon`, expected a number and a unit like \"10s\", \"5m\" or \"1h\"",
            "t.toml:4:63: queues.a.retry.priority: must be at most 2147483647, found 3000000000",
            "t.toml:7:23: queues.b.retry.intervals: intervals replaces backoff, base and max: remove backoff",
            "t.toml:7:23: queues.b.retry.intervals: must list at least one delay, e.g. [\"1m\", \"5m\", \"1h\"]",
            "t.toml:7:37: queues.b.retry.backoff: unknown backoff `steep`, expected `fixed`, `linear` or `exponential`",
        ]
    );
}

#[test]
fn an_ordered_queue_refuses_a_retry_priority() {
    assert_eq!(
        errors("[queues.a]\nhandler = \"noop\"\nordered = true\nretry = { priority = 5 }\n"),
        [
            "t.toml:3:11: queues.a.ordered: ordered = true cannot be combined with retry.priority: an ordered queue has one order, creation, and a retry keeps its place at the head"
        ]
    );
}

#[test]
fn a_system_s_work_periods_and_a_long_queue_s_window_end() {
    let c = parse(
        "[systems.partner]\nwork_periods = [\"MON-FRI 09:00-17:00\"]\n\
         [queues.sync]\nhandler = \"noop\"\nsystem = \"partner\"\nkind = \"long\"\n\
         work_periods_long = \"hand_back\"\n\
         [queues.watch]\nhandler = \"noop\"\nsystem = \"partner\"\nkind = \"long\"\n",
        "t.toml",
    )
    .unwrap();
    let (sync, watch) = (&c.queues["sync"], &c.queues["watch"]);
    assert_eq!(
        watch.work_periods_long,
        LongAtWindowEnd::Finish,
        "the default"
    );
    // Tuesday 10:00 UTC (the manager's default zone) is inside; 18:00 is not.
    let at = |h| chrono::Utc.with_ymd_and_hms(2026, 12, 1, h, 0, 0).unwrap();
    assert!(c.queue_works_at(sync, Weekday::Tue, 10 * 60));
    assert!(!c.queue_works_at(sync, Weekday::Tue, 18 * 60));
    assert!(!c.hands_back_at(sync, at(10)) && c.hands_back_at(sync, at(18)));
    assert!(
        !c.hands_back_at(watch, at(18)),
        "finish keeps its tasks running"
    );
    assert_eq!(
        errors(
            "[queues.a]\nhandler = \"noop\"\nwork_periods_long = \"finish\"\n\
             [queues.b]\nhandler = \"noop\"\nkind = \"long\"\nwork_periods_long = \"stop\"\n\
             [systems.s]\nwork_periods = [\"someday\"]\n"
        ),
        [
            "t.toml:3:21: queues.a.work_periods_long: work_periods_long only applies to kind = \"long\"",
            "t.toml:7:21: queues.b.work_periods_long: unknown work_periods_long `stop`, expected `finish` or `hand_back`",
            "t.toml:9:17: systems.s.work_periods[0]: invalid work period `someday`, expected days and a time range like \"MON-FRI 08:00-18:00\"",
        ]
    );
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
            "t.toml:11:1: schedules[0]: missing required key `cron` or `every`: a cron expression like \"0 3 * * *\", or a period like \"30s\"",
        ]
    );
}

const TWO_QUEUES: &str = "[manager]\ntimezone = \"Europe/Moscow\"\n[queues.a]\nhandler = \"noop\"\n[queues.b]\nhandler = \"noop\"\n";

#[test]
fn schedules_have_names_rules_zones_and_ends() {
    let c = parse(
        &format!(
            "{TWO_QUEUES}[[schedules]]\nqueue = \"a\"\ncron = \"0 3 * * *\"\n\
             [[schedules]]\nname = \"ping\"\nqueue = \"b\"\nevery = \"30s\"\ntimezone = \"UTC\"\n\
             until = 2026-12-31T00:00:00Z\n\
             [[schedules]]\nname = \"later\"\nqueue = \"b\"\nevery = \"1h\"\nuntil = \"2027-01-01T03:00:00+03:00\"\n"
        ),
        "t.toml",
    )
    .unwrap();
    let [unnamed, ping, later] = &c.schedules[..] else {
        panic!("three schedules")
    };
    assert_eq!(unnamed.name, "a.0");
    assert_eq!(unnamed.timezone, None, "[manager].timezone, when it fires");
    assert_eq!(unnamed.zone(c.manager.timezone), chrono_tz::Europe::Moscow);
    assert_eq!(
        unnamed.claim_key(),
        "0:a:0 3 * * *",
        "the claim field of before names"
    );
    assert_eq!(
        ping.rule,
        crate::schedule::Rule::Every(Duration::from_secs(30))
    );
    assert_eq!(ping.timezone, Some(chrono_tz::UTC));
    assert_eq!(ping.until_ms, Some(1_798_675_200_000));
    assert_eq!(ping.claim_key(), "name:ping");
    assert_eq!(later.until_ms, Some(1_798_761_600_000));
}

#[test]
fn schedule_names_are_checked_and_unique() {
    let e = errors(&format!(
        "{TWO_QUEUES}[[schedules]]\nname = \"x\"\nqueue = \"a\"\nevery = \"1m\"\n\
         [[schedules]]\nname = \"x\"\nqueue = \"b\"\nevery = \"1m\"\n\
         [[schedules]]\nqueue = \"a\"\nevery = \"1m\"\n\
         [[schedules]]\nname = \"a.2\"\nqueue = \"a\"\nevery = \"1m\"\n\
         [[schedules]]\nname = \"no way\"\nqueue = \"a\"\nevery = \"1m\"\n"
    ));
    assert_eq!(
        e,
        [
            "t.toml:12:8: schedules[1].name: duplicate schedule name `x`: schedules[0] has it already",
            "t.toml:19:8: schedules[3].name: duplicate schedule name `a.2`: it is the name of schedules[2], which has none of its own (QUEUE.N)",
            "t.toml:23:8: schedules[4].name: invalid schedule name, use 1 to 128 characters from A-Z a-z 0-9 _ . -",
        ]
    );
}

#[test]
fn a_schedule_has_one_rule_a_known_zone_and_a_time_to_end() {
    let e = errors(&format!(
        "{TWO_QUEUES}[[schedules]]\nqueue = \"a\"\ncron = \"* * * * *\"\nevery = \"1m\"\n\
         [[schedules]]\nqueue = \"a\"\nevery = \"500ms\"\ntimezone = \"Mars/Olympus\"\n\
         [[schedules]]\nqueue = \"a\"\nevery = \"1m\"\nuntil = \"tomorrow\"\n\
         [[schedules]]\nqueue = \"a\"\nevery = \"1m\"\nuntil = 2026-12-31\n"
    ));
    assert_eq!(
        e,
        [
            "t.toml:10:9: schedules[0].every: give cron or every, not both",
            "t.toml:13:9: schedules[1].every: every 500ms is shorter than the limit of 1s",
            "t.toml:14:12: schedules[1].timezone: unknown time zone `Mars/Olympus`, expected an IANA name like \"Europe/Moscow\" or \"UTC\"",
            "t.toml:18:9: schedules[2].until: invalid time `tomorrow`, expected an RFC 3339 time with its offset like 2026-12-31T00:00:00Z",
            "t.toml:22:9: schedules[3].until: invalid time `2026-12-31`, expected an RFC 3339 time with its offset like 2026-12-31T00:00:00Z",
        ]
    );
}

proptest::proptest! {
    /// A computed delay never passes `max` and never shrinks as failures add up; one from
    /// `intervals` is always one of them.
    #[test]
    fn retry_delays_grow_within_their_bounds(
        base_s in 0u64..100,
        extra_s in 0u64..10_000,
        a in 1u32..200,
        intervals in proptest::collection::vec(0u64..10_000, 1..5),
        shape in 0usize..3,
    ) {
        let backoff = [Backoff::Fixed, Backoff::Linear, Backoff::Exponential][shape];
        let r = RetryPolicy {
            backoff,
            base: Duration::from_secs(base_s),
            max: Duration::from_secs(base_s + extra_s),
            ..RetryPolicy::default()
        };
        proptest::prop_assert!(r.delay(a) <= r.max);
        proptest::prop_assert!(r.delay(a) <= r.delay(a + 1));
        let listed: Vec<Duration> = intervals.iter().map(|&s| Duration::from_secs(s)).collect();
        let i = RetryPolicy { intervals: listed.clone(), ..r };
        proptest::prop_assert!(listed.contains(&i.delay(a)));
    }

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
        Handler::Named { name, options } => {
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

// ---------------------------------------------------------------------------------------
// Task service: per-queue record keys and [api]

/// SHA-256 of the token `test`, as `gaffer api hash-token` prints it.
const TEST_SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A file with queue `a` on lines 1-2, then `rest` from line 3.
fn with_queue(rest: &str) -> Vec<String> {
    errors(&format!("[queues.a]\nhandler = \"noop\"\n{rest}"))
}

#[test]
fn task_service_defaults() {
    let c = parse("[queues.a]\nhandler = \"noop\"\n", "t.toml").unwrap();
    let q = &c.queues["a"];
    assert!(q.track);
    assert_eq!(q.history_ttl, DEFAULT_HISTORY_TTL);
    assert_eq!(q.history_ttl, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(q.max_result, DEFAULT_MAX_RESULT);
    assert_eq!(q.max_result, 64 * 1024);
    assert_eq!(q.dedup, Dedup::Active);
    assert_eq!(q.intake, Intake::Open);

    assert_eq!(c.api, ApiConfig::default());
    assert_eq!(c.api.listen.to_string(), "127.0.0.1:9480");
    assert_eq!(c.api.max_body, 4 << 20);
    assert_eq!(c.api.max_wait, Duration::from_secs(60));
    assert!(c.api.keys.is_empty());

    // An empty [api] table is the defaults too.
    let c = parse("[api]\n", "t.toml").unwrap();
    assert_eq!(c.api, ApiConfig::default());
}

#[test]
fn task_service_full_example() {
    let src = format!(
        r#"
[queues.resize_photo]
handler = "noop"
track = true
history_ttl = "30d"
max_result = "1MiB"
dedup = "record"
intake = "closed"

[queues.emails]
handler = "noop"
track = false
intake = "cancel"

[api]
listen = "0.0.0.0:8080"
max_body = "1KiB"
max_wait = "1h"
read_timeout = "5s"

[api.keys.shop]
token_sha256 = "{TEST_SHA}"
queues = ["resize_photo", "emails"]
admin = false

[api.keys.ops]
token_sha256 = "{upper}"
admin = true

[api.keys.everything]
token_sha256 = "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa"
queues = ["*"]
"#,
        upper = "AB".repeat(32),
    );
    let c = parse(&src, "t.toml").unwrap();
    let q = &c.queues["resize_photo"];
    assert!(q.track);
    assert_eq!(q.history_ttl, Duration::from_secs(30 * 24 * 3600));
    assert_eq!(q.max_result, 1 << 20);
    assert_eq!(q.dedup, Dedup::Record);
    assert_eq!(q.intake, Intake::Closed);
    let e = &c.queues["emails"];
    assert!(!e.track);
    assert_eq!(e.dedup, Dedup::Active);
    assert_eq!(e.intake, Intake::Cancel);

    assert_eq!(c.api.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.api.max_body, 1024);
    assert_eq!(c.api.max_wait, Duration::from_secs(3600));
    assert_eq!(c.api.read_timeout, Duration::from_secs(5));
    assert_eq!(c.api.keys.len(), 3);

    let shop = &c.api.keys["shop"];
    assert_eq!(shop.name, "shop");
    assert_eq!(
        &shop.token_sha256[..4],
        &[0x9f, 0x86, 0xd0, 0x81],
        "decoded big-endian, two digits a byte"
    );
    assert_eq!(shop.token_sha256[31], 0x08);
    assert_eq!(
        shop.queues,
        KeyQueues::Only(["emails".to_string(), "resize_photo".to_string()].into())
    );
    assert!(!shop.admin);
    assert!(shop.allows("emails") && !shop.allows("other"));

    let ops = &c.api.keys["ops"];
    assert_eq!(ops.token_sha256, [0xab; 32], "upper-case hex is accepted");
    assert_eq!(
        ops.queues,
        KeyQueues::All,
        "an admin key without queues has all"
    );
    assert!(ops.admin);

    assert_eq!(c.api.keys["everything"].queues, KeyQueues::All);
    assert!(!c.api.keys["everything"].admin);
}

#[test]
fn loopback_listen_needs_no_key() {
    let c = parse("[api]\nlisten = \"[::1]:9480\"\n", "t.toml").unwrap();
    assert_eq!(c.api.listen.to_string(), "[::1]:9480");
}

#[test]
fn history_ttl_must_be_positive() {
    assert_eq!(
        with_queue("history_ttl = \"0s\"\n"),
        ["t.toml:3:15: queues.a.history_ttl: must be greater than zero"]
    );
}

#[test]
fn max_result_must_be_positive() {
    assert_eq!(
        with_queue("max_result = \"0B\"\n"),
        ["t.toml:3:14: queues.a.max_result: must be greater than zero"]
    );
}

#[test]
fn max_result_is_at_most_512mib() {
    assert_eq!(
        with_queue("max_result = \"513MiB\"\n"),
        ["t.toml:3:14: queues.a.max_result: must be at most 512MiB: Redis refuses larger values"]
    );
    assert!(with_queue("max_result = \"512MiB\"\n").is_empty());
    assert!(with_queue("max_result = \"1B\"\n").is_empty());
}

#[test]
fn dedup_is_active_or_record() {
    assert_eq!(
        with_queue("dedup = \"forever\"\n"),
        ["t.toml:3:9: queues.a.dedup: unknown dedup `forever`, expected `active` or `record`"]
    );
}

#[test]
fn dedup_record_needs_track() {
    assert_eq!(
        with_queue("track = false\ndedup = \"record\"\n"),
        [
            "t.toml:4:9: queues.a.dedup: dedup = \"record\" needs track = true: an untracked queue keeps no record to deduplicate against"
        ]
    );
    assert!(with_queue("track = false\ndedup = \"active\"\n").is_empty());
}

#[test]
fn intake_is_one_of_its_names() {
    assert_eq!(
        with_queue("intake = \"paused\"\n"),
        [
            "t.toml:3:10: queues.a.intake: unknown intake `paused`, expected `open`, `closed` or `cancel`"
        ]
    );
}

#[test]
fn track_is_a_bool() {
    assert_eq!(
        with_queue("track = \"yes\"\n"),
        ["t.toml:3:9: queues.a.track: expected a boolean, found string \"yes\""]
    );
}

#[test]
fn api_listen_must_be_an_address() {
    assert_eq!(
        errors("[api]\nlisten = \"localhost\"\n"),
        [
            "t.toml:2:10: api.listen: invalid listen address `localhost`, expected IP:PORT like \"127.0.0.1:9480\""
        ]
    );
}

#[test]
fn api_listen_beyond_loopback_needs_a_key() {
    assert_eq!(
        errors("[api]\nlisten = \"0.0.0.0:9480\"\n"),
        [
            "t.toml:2:10: api.listen: `0.0.0.0:9480` is not a loopback address, declare at least one [api.keys.NAME] to serve it"
        ]
    );
    // A key that is itself wrong still counts, so its own error is the only one.
    assert_eq!(
        errors("[api]\nlisten = \"0.0.0.0:9480\"\n[api.keys.shop]\nadmin = true\n"),
        [
            "t.toml:3:1: api.keys.shop: missing required key `token_sha256`, the token's SHA-256 as 64 hex digits: `gaffer api hash-token` prints it for a token on stdin"
        ]
    );
}

#[test]
fn api_read_timeout_is_between_zero_and_10m() {
    assert_eq!(
        errors("[api]\nread_timeout = \"11m\"\n"),
        ["t.toml:2:16: api.read_timeout: must be at most 10m"]
    );
    assert_eq!(errors("[api]\nread_timeout = \"0s\"\n").len(), 1);
    assert!(errors("[api]\nread_timeout = \"10m\"\n").is_empty());
}

#[test]
fn api_max_body_is_between_1kib_and_512mib() {
    assert_eq!(
        errors("[api]\nmax_body = \"1000B\"\n"),
        ["t.toml:2:12: api.max_body: must be between 1KiB and 512MiB"]
    );
    assert_eq!(
        errors("[api]\nmax_body = \"1GiB\"\n"),
        ["t.toml:2:12: api.max_body: must be between 1KiB and 512MiB"]
    );
    assert!(errors("[api]\nmax_body = \"512MiB\"\n").is_empty());
}

#[test]
fn api_max_wait_must_be_positive() {
    assert_eq!(
        errors("[api]\nmax_wait = \"0s\"\n"),
        ["t.toml:2:12: api.max_wait: must be greater than zero"]
    );
}

#[test]
fn api_max_listings_per_key_defaults_to_four_and_must_be_positive() {
    let c = parse("", "t.toml").unwrap();
    assert_eq!(c.api.max_listings_per_key, 4);
    let c = parse("[api]\nmax_listings_per_key = 1\n", "t.toml").unwrap();
    assert_eq!(c.api.max_listings_per_key, 1);
    assert_eq!(
        errors("[api]\nmax_listings_per_key = 0\n"),
        ["t.toml:2:24: api.max_listings_per_key: must be greater than zero, found 0"]
    );
}

#[test]
fn api_connection_limits_default_and_are_checked_together() {
    let c = parse("", "t.toml").unwrap();
    assert_eq!(c.api.max_connections_per_peer, 256);
    assert_eq!(c.api.auth_timeout, Duration::from_secs(10));
    let c = parse(
        "[api]\nmax_connections_per_peer = 0\nauth_timeout = \"2s\"\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.api.max_connections_per_peer, 0, "0: no limit");
    assert_eq!(c.api.auth_timeout, Duration::from_secs(2));
    assert_eq!(
        errors("[api]\nmax_connections_per_peer = -1\nauth_timeout = \"11m\"\n"),
        [
            "t.toml:2:28: api.max_connections_per_peer: must be at least 0, found -1",
            "t.toml:3:16: api.auth_timeout: must be at most 10m"
        ]
    );
}

#[test]
fn api_max_wait_is_at_most_an_hour() {
    assert_eq!(
        errors("[api]\nmax_wait = \"61m\"\n"),
        ["t.toml:2:12: api.max_wait: must be at most 1h"]
    );
}

#[test]
fn api_unknown_keys_are_named() {
    assert_eq!(
        errors("[api]\nlisen = \"127.0.0.1:9480\"\n"),
        ["t.toml:2:1: api.lisen: unknown key `lisen`, did you mean `listen`?"]
    );
    assert_eq!(
        errors(&format!(
            "[queues.a]\nhandler = \"noop\"\n[api.keys.shop]\ntoken_sha256 = \"{TEST_SHA}\"\nqueue = [\"a\"]\n"
        )),
        ["t.toml:5:1: api.keys.shop.queue: unknown key `queue`, did you mean `queues`?"]
    );
}

/// Serde stops at the first key it refuses; the table is read again without it, so every
/// refused key of a table is reported at once. Such a table is not checked for meaning:
/// its checks across keys would judge against defaults (`kind` unknown, so
/// `cancel_grace` "only applies to kind = long"; `admin` refused, so `queues` missing).
#[test]
fn every_refused_key_of_a_table_is_reported_at_once() {
    assert_eq!(
        errors(
            "[queues.a]\nhandler = \"noop\"\nbatch_sise = 5\nmax_attempts = \"x\"\nmin_slots = -1\n"
        ),
        [
            "t.toml:3:1: queues.a.batch_sise: unknown key `batch_sise`, did you mean `batch_size`?",
            "t.toml:4:16: queues.a.max_attempts: expected an integer, found string \"x\"",
        ]
    );
    assert_eq!(
        errors(
            "[queues.a]\nhandler = \"noop\"\nknd = \"long\"\ncancel_grace = \"30s\"\nmax_slots = true\n"
        ),
        [
            "t.toml:3:1: queues.a.knd: unknown key `knd`, did you mean `kind`?",
            "t.toml:5:13: queues.a.max_slots: expected an integer, found boolean `true`",
        ]
    );
    // A table opened by its own header, before its parent's keys (valid TOML).
    assert_eq!(
        errors("[queues.a.retry]\nbakoff = 1\n[queues.a]\nhandler = \"noop\"\nmax_slot = 2\n"),
        [
            "t.toml:2:1: queues.a.retry.bakoff: unknown key `bakoff`, did you mean `backoff`?",
            "t.toml:5:1: queues.a.max_slot: unknown key `max_slot`, did you mean `max_slots`?",
        ]
    );
    assert_eq!(
        errors("[queues.a]\nhandlr = \"noop\"\n[manager]\ntick = \"1s\"\nbogus = 1\n"),
        [
            "t.toml:2:1: queues.a.handlr: unknown key `handlr`, did you mean `handler`?",
            "t.toml:5:1: manager.bogus: unknown key `bogus`, expected one of `tick`, `timezone`, `heartbeat_timeout`, `forget_hosts_after` or `http`",
        ]
    );
}

#[test]
fn api_keys_must_be_tables() {
    assert_eq!(
        errors("[api]\nkeys = 3\n"),
        ["t.toml:2:8: api.keys: expected a table, found integer"]
    );
    assert_eq!(
        errors("[api.keys]\nshop = \"x\"\n"),
        ["t.toml:2:8: api.keys.shop: expected a table, found string"]
    );
}

#[test]
fn api_key_name_must_be_valid() {
    assert_eq!(
        errors(&format!(
            "[api.keys.\"my shop\"]\ntoken_sha256 = \"{TEST_SHA}\"\nadmin = true\n"
        )),
        [
            "t.toml:1:11: api.keys.\"my shop\": invalid key name, use 1 to 128 characters from A-Z a-z 0-9 _ . -"
        ]
    );
}

#[test]
fn api_key_cannot_be_named_cli() {
    assert_eq!(
        errors(&format!(
            "[api.keys.cli]\ntoken_sha256 = \"{TEST_SHA}\"\nadmin = true\n"
        )),
        [
            "t.toml:1:11: api.keys.cli: key name `cli` is reserved: records show it for tasks submitted with the CLI"
        ]
    );
}

#[test]
fn api_key_token_is_required() {
    assert_eq!(
        errors("[api.keys.shop]\nadmin = true\n"),
        [
            "t.toml:1:1: api.keys.shop: missing required key `token_sha256`, the token's SHA-256 as 64 hex digits: `gaffer api hash-token` prints it for a token on stdin"
        ]
    );
}

#[test]
fn api_key_token_has_64_digits() {
    // The value is never echoed: it may be the token itself, pasted by mistake.
    assert_eq!(
        errors("[api.keys.shop]\ntoken_sha256 = \"s3cret\"\nadmin = true\n"),
        [
            "t.toml:2:16: api.keys.shop.token_sha256: expected the token's SHA-256 as 64 hex digits, found 6 characters: `gaffer api hash-token` prints it for a token on stdin"
        ]
    );
}

#[test]
fn api_key_token_is_hex() {
    let token = format!("{}g", &TEST_SHA[..63]);
    assert_eq!(
        errors(&format!(
            "[api.keys.shop]\ntoken_sha256 = \"{token}\"\nadmin = true\n"
        )),
        [
            "t.toml:2:16: api.keys.shop.token_sha256: expected the token's SHA-256 as 64 hex digits, found a character that is not a hex digit at position 64: `gaffer api hash-token` prints it for a token on stdin"
        ]
    );
}

#[test]
fn api_keys_need_their_own_tokens() {
    // File order decides which key is blamed, whatever the names' order; case does not
    // make a token different.
    let src = format!(
        "[api.keys.zed]\ntoken_sha256 = \"{TEST_SHA}\"\nadmin = true\n[api.keys.abe]\ntoken_sha256 = \"{}\"\nadmin = true\n",
        TEST_SHA.to_uppercase()
    );
    assert_eq!(
        errors(&src),
        [
            "t.toml:5:16: api.keys.abe.token_sha256: same token as key `zed`, give each key its own token"
        ]
    );
}

#[test]
fn api_key_queues_are_required_unless_admin() {
    assert_eq!(
        errors(&format!("[api.keys.shop]\ntoken_sha256 = \"{TEST_SHA}\"\n")),
        [
            "t.toml:1:1: api.keys.shop: missing required key `queues`, the queues the key may use like [\"resize_photo\"] or [\"*\"] for every queue (or admin = true)"
        ]
    );
}

#[test]
fn api_key_queues_must_not_be_empty() {
    assert_eq!(
        errors(&format!(
            "[api.keys.shop]\ntoken_sha256 = \"{TEST_SHA}\"\nqueues = []\n"
        )),
        [
            "t.toml:3:10: api.keys.shop.queues: must not be empty, list the queues the key may use or [\"*\"] for every queue"
        ]
    );
}

#[test]
fn api_key_star_stands_alone() {
    assert_eq!(
        with_queue(&format!(
            "[api.keys.shop]\ntoken_sha256 = \"{TEST_SHA}\"\nqueues = [\"a\", \"*\"]\n"
        )),
        [
            "t.toml:5:16: api.keys.shop.queues[1]: `*` means every queue and cannot be listed with queue names"
        ]
    );
}

#[test]
fn api_key_queues_must_be_declared() {
    assert_eq!(
        with_queue(&format!(
            "[api.keys.shop]\ntoken_sha256 = \"{TEST_SHA}\"\nqueues = [\"a\", \"b\"]\n"
        )),
        ["t.toml:5:16: api.keys.shop.queues[1]: unknown queue `b`, no [queues.b] table is defined"]
    );
    // A queue with errors of its own is declared: no second, misleading error.
    assert_eq!(
        errors(&format!(
            "[queues.a]\nhandler = 3\n[api.keys.shop]\ntoken_sha256 = \"{TEST_SHA}\"\nqueues = [\"a\"]\n"
        )),
        ["t.toml:2:11: queues.a.handler: expected a string, found integer `3`"]
    );
}

#[test]
fn api_key_errors_are_all_reported() {
    let e = with_queue(&format!(
        "[api]\nmax_wait = \"2h\"\n[api.keys.one]\ntoken_sha256 = \"x\"\nqueues = [\"nope\"]\n[api.keys.two]\ntoken_sha256 = \"{TEST_SHA}\"\n"
    ));
    assert_eq!(
        e,
        [
            "t.toml:4:12: api.max_wait: must be at most 1h",
            "t.toml:6:16: api.keys.one.token_sha256: expected the token's SHA-256 as 64 hex digits, found 1 character: `gaffer api hash-token` prints it for a token on stdin",
            "t.toml:7:11: api.keys.one.queues[0]: unknown queue `nope`, no [queues.nope] table is defined",
            "t.toml:8:1: api.keys.two: missing required key `queues`, the queues the key may use like [\"resize_photo\"] or [\"*\"] for every queue (or admin = true)",
        ]
    );
}

#[test]
fn prefetch_is_off_by_default_and_on_where_a_batch_fits_its_lease() {
    let c = parse("[queues.a]\nhandler = \"noop\"\n", "t.toml").unwrap();
    assert!(!c.queues["a"].prefetch);
    let c = parse(
        "[queues.a]\nhandler = \"noop\"\nprefetch = true\nlease = \"1m\"\nmax_batch_time = \"1m\"\n",
        "t.toml",
    )
    .unwrap();
    assert!(c.queues["a"].prefetch);
}

#[test]
fn prefetch_is_refused_where_a_batch_may_outlive_its_lease() {
    assert_eq!(
        with_queue("prefetch = true\n"),
        [
            "t.toml:3:12: queues.a.prefetch: prefetch = true needs max_batch_time (10m) at most lease (5m): a prefetched batch's lease runs while the batch before it is handled"
        ]
    );
    assert!(with_queue("prefetch = false\n").is_empty());
    assert_eq!(
        with_queue("prefetch = 1\n"),
        ["t.toml:3:12: queues.a.prefetch: expected a boolean, found integer `1`"]
    );
}

#[test]
fn forget_hosts_after_stays_longer_than_the_heartbeat_timeout() {
    let src = "[manager]\nheartbeat_timeout = \"30h\"\n[queues.a]\nhandler = \"noop\"\n";
    let c = parse(src, "t.toml").unwrap();
    assert_eq!(c.manager.forget_hosts_after, Duration::from_secs(60 * 3600));
    let src = "[manager]\nheartbeat_timeout = \"30s\"\nforget_hosts_after = \"30s\"\n[queues.a]\nhandler = \"noop\"\n";
    assert_eq!(
        errors(src),
        [
            "t.toml:3:22: manager.forget_hosts_after: must be longer than heartbeat_timeout (30s), got 30s: a host is forgotten only once it is dead"
        ]
    );
}

#[test]
fn a_timeout_per_task_with_its_grace() {
    let c = parse(
        "[queues.a]\nhandler = \"noop\"\ntimeout = \"5m\"\n\
         [queues.b]\nhandler = \"noop\"\ntimeout = \"2s\"\ncancel_grace = \"3s\"\n\
         [queues.c]\nhandler = \"noop\"\n",
        "t.toml",
    )
    .unwrap();
    let (a, b, c) = (&c.queues["a"], &c.queues["b"], &c.queues["c"]);
    assert_eq!(
        (a.timeout, a.cancel_grace),
        (Some(Duration::from_secs(300)), DEFAULT_TIMEOUT_GRACE)
    );
    assert_eq!(
        (b.timeout, b.cancel_grace),
        (Some(Duration::from_secs(2)), Duration::from_secs(3))
    );
    assert_eq!(c.timeout, None);
}

#[test]
fn a_bad_timeout_names_its_mistake() {
    assert_eq!(
        errors(
            "[queues.a]\nhandler = \"noop\"\nkind = \"long\"\ntimeout = \"1m\"\n\
             [queues.b]\nhandler = \"noop\"\ntimeout = \"0s\"\n\
             [queues.c]\nhandler = \"noop\"\ntimeout = \"1h\"\nmax_batch_time = \"10m\"\n\
             [queues.d]\nhandler = \"noop\"\ncancel_grace = \"1s\"\n"
        ),
        [
            "t.toml:4:11: queues.a.timeout: timeout does not apply to kind = \"long\": a long task runs until it returns or is cancelled (`gaffer tasks cancel`), within its work periods",
            "t.toml:7:11: queues.b.timeout: must be greater than zero",
            "t.toml:10:11: queues.c.timeout: timeout (1h) exceeds max_batch_time (10m): the watchdog would kill the slot before the task's time is up",
            "t.toml:14:16: queues.d.cancel_grace: cancel_grace only applies to kind = \"long\" or with a timeout",
        ]
    );
}

// ---------------------------------------------------------------------------------------
// [api].console

#[test]
fn the_console_is_on_by_default_and_off_with_false() {
    let c = parse("", "t.toml").unwrap();
    assert_eq!(c.api.console, Some(ConsoleConfig::default()));
    let d = ConsoleConfig::default();
    assert_eq!(d.session_ttl, Duration::from_secs(12 * 3600));
    assert_eq!(
        (d.max_failed_logins, d.failed_login_window),
        (10, Duration::from_secs(300))
    );
    assert_eq!(d.secure_cookie, None);
    let c = parse("[api]\nconsole = false\n", "t.toml").unwrap();
    assert_eq!(c.api.console, None);
    let c = parse("[api]\nconsole = true\n", "t.toml").unwrap();
    assert_eq!(c.api.console, Some(ConsoleConfig::default()));
    assert_eq!(
        errors("[api]\nconsole = \"yes\"\n"),
        [
            "t.toml:2:11: api.console: expected true, false or a table of console settings, found string"
        ]
    );
}

#[test]
fn a_console_table_with_proxy_mode() {
    let src = format!(
        r#"
[api.keys.ops]
token_sha256 = "{TEST_SHA}"
admin = true

[api.console]
session_ttl = "8h"
session_secret_file = "/etc/gaffer/console.secret"
secure_cookie = true
max_failed_logins = 3
failed_login_window = "1m"
trusted_proxies = ["10.0.0.5", "fd00::/8"]
user_header = "X-Forwarded-User"
groups_header = "X-Forwarded-Groups"
default_key = "ops"

[api.console.groups]
"CN=Ops,OU=Groups" = "ops"
staff = "ops"
"#
    );
    let c = parse(&src, "t.toml").unwrap();
    let console = c.api.console.unwrap();
    assert_eq!(console.session_ttl, Duration::from_secs(8 * 3600));
    assert_eq!(
        console.session_secret_file.as_deref(),
        Some(std::path::Path::new("/etc/gaffer/console.secret"))
    );
    assert_eq!(console.secure_cookie, Some(true));
    assert_eq!(
        (console.max_failed_logins, console.failed_login_window),
        (3, Duration::from_secs(60))
    );
    assert!(console.trusts("10.0.0.5".parse().unwrap()));
    assert!(console.trusts("fd00::7".parse().unwrap()));
    assert!(!console.trusts("10.0.0.6".parse().unwrap()));
    assert_eq!(console.user_header.as_deref(), Some("x-forwarded-user"));
    assert_eq!(console.groups_header.as_deref(), Some("x-forwarded-groups"));
    assert_eq!(
        console.groups,
        [
            ("CN=Ops,OU=Groups".to_string(), "ops".to_string()),
            ("staff".into(), "ops".into())
        ],
        "in file order"
    );
    assert_eq!(console.default_key.as_deref(), Some("ops"));
}

#[test]
fn every_console_mistake_is_named_with_its_key() {
    let src = r#"[api.keys.ops]
token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
admin = true
[api.console]
session_ttl = "10s"
max_failed_logins = 0
trusted_proxies = ["10.0.0.0/40", "proxy.local"]
user_header = "X Forwarded User"
groups_header = "Cookie"
[api.console.groups]
ops = "opz"
viewers = 3
"#;
    assert_eq!(
        errors(src),
        [
            "t.toml:5:15: api.console.session_ttl: must be between 1m and 30days",
            "t.toml:6:21: api.console.max_failed_logins: must be greater than zero, found 0",
            "t.toml:7:20: api.console.trusted_proxies[0]: prefix `/40` must be 0 to 32: expected an address or a network like \"10.0.0.5\" or \"10.1.0.0/16\"",
            "t.toml:7:35: api.console.trusted_proxies[1]: `proxy.local` is not an IP address: expected an address or a network like \"10.0.0.5\" or \"10.1.0.0/16\"",
            "t.toml:8:15: api.console.user_header: expected a header name like \"X-Forwarded-User\"",
            "t.toml:8:15: api.console.user_header: needs `trusted_proxies`: from any address the header would let anyone name a user",
            "t.toml:9:17: api.console.groups_header: `Cookie` carries something else; name the header the proxy sets",
            "t.toml:11:7: api.console.groups.ops: unknown key `opz`, no [api.keys.opz] table is defined",
            "t.toml:12:11: api.console.groups.viewers: expected a key name like \"ops\", found integer",
        ]
    );
    assert_eq!(
        errors("[api.console]\ngroups_header = \"X-Groups\"\n"),
        [
            "t.toml:2:17: api.console.groups_header: needs `user_header`: it applies to users a trusted proxy names"
        ]
    );
    assert_eq!(
        errors("[api.console]\nsesion_ttl = \"1h\"\n"),
        [
            "t.toml:2:1: api.console.sesion_ttl: unknown key `sesion_ttl`, did you mean `session_ttl`?"
        ]
    );
}

#[test]
fn cpu_scheduling_is_batch_unless_set_to_normal() {
    let c = parse("[queues.a]\nhandler = \"noop\"\n", "t.toml").unwrap();
    assert_eq!(c.queues["a"].cpu_scheduling, CpuScheduling::Batch);
    let c = parse(
        "[queues.a]\nhandler = \"noop\"\ncpu_scheduling = \"normal\"\n\n\
         [queues.b]\nhandler = \"noop\"\ncpu_scheduling = \"batch\"\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.queues["a"].cpu_scheduling, CpuScheduling::Normal);
    assert_eq!(c.queues["b"].cpu_scheduling, CpuScheduling::Batch);
    assert_eq!(
        with_queue("cpu_scheduling = \"idle\"\n"),
        [
            "t.toml:3:18: queues.a.cpu_scheduling: unknown cpu_scheduling `idle`, expected `batch` or `normal`"
        ]
    );
}
