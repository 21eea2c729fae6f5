//! Parsers for the human-readable value syntaxes of the config file.
//!
//! Each returns a message ready for a [`Diagnostic`](super::Diagnostic) (lower-case, no
//! trailing dot) so validation only has to attach a location.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::Weekday;

/// Parses a humantime duration such as `"10s"`, `"5m"` or `"1h 30m"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) && trimmed != "0" {
        return Err(format!(
            "duration `{text}` has no unit, write it like \"{trimmed}s\" or \"{trimmed}ms\""
        ));
    }
    humantime::parse_duration(trimmed).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } if !unit.is_empty() => format!(
            "invalid duration `{text}`: unknown unit `{unit}`, expected ms, s, m, h or d as in \"10s\""
        ),
        humantime::DurationError::NumberOverflow => format!("duration `{text}` is too large"),
        _ => format!(
            "invalid duration `{text}`, expected a number and a unit like \"10s\", \"5m\" or \"1h\""
        ),
    })
}

/// Parses a byte size such as `"512MiB"` or `"4GB"`; a unit is required.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        // bytesize would read this as bytes, which is almost never what was meant.
        return Err(format!(
            "size `{text}` has no unit, write it like \"{trimmed}MiB\" (or \"{trimmed}B\" for bytes)"
        ));
    }
    let starts_with_number = trimmed
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '.');
    match trimmed.parse::<bytesize::ByteSize>() {
        Ok(size) if starts_with_number => Ok(size.as_u64()),
        _ => Err(format!(
            "invalid size `{text}`, expected a number and a unit like \"512MiB\" or \"4GiB\""
        )),
    }
}

/// A throughput limit, normalised to tasks per second whatever unit it was written in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Always finite and greater than zero.
    pub per_second: f64,
}

impl FromStr for Rate {
    type Err = String;

    /// Accepts `N/s`, `N/min` and `N/h` (also `sec`, `second`, `m`, `minute`, `hour`, `d`,
    /// `day`); N may be fractional.
    fn from_str(text: &str) -> Result<Self, String> {
        let invalid = || {
            format!(
                "invalid rate `{text}`, expected a number per unit like \"50/s\", \"3000/min\" or \"10/h\""
            )
        };
        let (number, unit) = text.split_once('/').ok_or_else(invalid)?;
        let number = number.trim();
        if number.is_empty()
            || !number
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == '_')
        {
            return Err(invalid());
        }
        let count: f64 = number.replace('_', "").parse().map_err(|_| invalid())?;
        let seconds = match unit.trim().to_ascii_lowercase().as_str() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            "d" | "day" => 86400.0,
            _ => {
                return Err(format!(
                    "invalid rate `{text}`: unknown unit `{}`, expected s, min or h",
                    unit.trim()
                ));
            }
        };
        let per_second = count / seconds;
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(format!("rate `{text}` must be greater than zero"));
        }
        Ok(Rate { per_second })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.per_second)
    }
}

/// A weekly window during which a queue may run; outside all of its windows it gets 0 slots.
///
/// The end minute is inclusive (`"00:00-23:59"` is the whole day). When the end is before
/// the start (`"MON 22:00-02:00"`) the window runs past midnight: it starts on each listed
/// day and ends on the following day, so that example covers Monday 22:00 to Tuesday 02:00.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkPeriod {
    /// Days on which the window starts, Monday first.
    pub days: [bool; 7],
    /// Minutes since midnight, 0..=1439.
    pub start_minute: u16,
    /// Minutes since midnight, 0..=1439, inclusive.
    pub end_minute: u16,
}

const DAY_NAMES: [&str; 7] = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];

impl WorkPeriod {
    /// Whether a local time falls inside any of `periods`; none means always.
    pub fn any_contains(periods: &[WorkPeriod], weekday: Weekday, minute_of_day: u16) -> bool {
        periods.is_empty() || periods.iter().any(|p| p.contains(weekday, minute_of_day))
    }

    /// Whether a local time (weekday and minute since midnight, in the manager's time zone)
    /// falls inside this window.
    pub fn contains(&self, weekday: Weekday, minute_of_day: u16) -> bool {
        let day = weekday.num_days_from_monday() as usize;
        if self.start_minute <= self.end_minute {
            self.days[day] && (self.start_minute..=self.end_minute).contains(&minute_of_day)
        } else {
            let previous = (day + 6) % 7;
            (self.days[day] && minute_of_day >= self.start_minute)
                || (self.days[previous] && minute_of_day <= self.end_minute)
        }
    }
}

impl FromStr for WorkPeriod {
    type Err = String;

    /// `"DAYS HH:MM-HH:MM"` where DAYS is a comma list of days or day ranges
    /// (`MON-FRI`, `MON,WED,FRI`, `FRI-MON` wraps over the weekend), case-insensitive;
    /// without DAYS the window applies every day.
    fn from_str(text: &str) -> Result<Self, String> {
        let shape = || {
            format!(
                "invalid work period `{text}`, expected days and a time range like \"MON-FRI 08:00-18:00\""
            )
        };
        let parts: Vec<&str> = text.split_whitespace().collect();
        let (days, times) = match parts.as_slice() {
            [days, times] => (parse_days(days, text)?, *times),
            [only] if only.contains(':') => ([true; 7], *only),
            [only] if parse_days(only, text).is_ok() => {
                return Err(format!(
                    "work period `{text}` has no time range, add one like \"{only} 08:00-18:00\""
                ));
            }
            _ => return Err(shape()),
        };
        let Some((start, end)) = times.split_once('-') else {
            return Err(format!(
                "work period `{text}` needs a time range like 08:00-18:00, found `{times}`"
            ));
        };
        let start_minute = parse_time(start, text)?;
        let end_minute = parse_time(end, text)?;
        Ok(WorkPeriod {
            days,
            start_minute,
            end_minute,
        })
    }
}

impl fmt::Display for WorkPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = (0..7)
            .filter(|&i| self.days[i])
            .map(|i| DAY_NAMES[i])
            .collect();
        write!(
            f,
            "{} {:02}:{:02}-{:02}:{:02}",
            names.join(","),
            self.start_minute / 60,
            self.start_minute % 60,
            self.end_minute / 60,
            self.end_minute % 60
        )
    }
}

fn parse_day(name: &str, whole: &str) -> Result<usize, String> {
    DAY_NAMES
        .iter()
        .position(|d| d.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            format!(
                "work period `{whole}`: unknown day `{name}`, expected MON, TUE, WED, THU, FRI, SAT or SUN"
            )
        })
}

fn parse_days(list: &str, whole: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    for item in list.split(',') {
        match item.split_once('-') {
            Some((from, to)) => {
                let from = parse_day(from, whole)?;
                let to = parse_day(to, whole)?;
                let mut day = from;
                loop {
                    days[day] = true;
                    if day == to {
                        break;
                    }
                    day = (day + 1) % 7;
                }
            }
            None => days[parse_day(item, whole)?] = true,
        }
    }
    Ok(days)
}

fn parse_time(text: &str, whole: &str) -> Result<u16, String> {
    let invalid = || {
        format!("work period `{whole}`: invalid time `{text}`, expected HH:MM from 00:00 to 23:59")
    };
    let (h, m) = text.split_once(':').ok_or_else(invalid)?;
    let digits = |s: &str, max_len| {
        !s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(h, 2) || m.len() != 2 || !digits(m, 2) {
        return Err(invalid());
    }
    let (h, m): (u16, u16) = (
        h.parse().map_err(|_| invalid())?,
        m.parse().map_err(|_| invalid())?,
    );
    if h > 23 || m > 59 {
        return Err(invalid());
    }
    Ok(h * 60 + m)
}

/// Parses a standard five-field cron expression (minute hour day-of-month month
/// day-of-week); seconds, years and `@` nicknames are refused so every entry reads the same.
pub fn parse_cron(text: &str) -> Result<croner::Cron, String> {
    let fields = text.split_whitespace().count();
    if fields != 5 && fields != 6 {
        return Err(format!(
            "cron `{text}` has {fields} field{}, expected five (minute hour day-of-month month day-of-week), or six with seconds first",
            if fields == 1 { "" } else { "s" }
        ));
    }
    // Six fields put seconds first: for schedules finer than a minute.
    let seconds = if fields == 6 {
        croner::parser::Seconds::Required
    } else {
        croner::parser::Seconds::Disallowed
    };
    let parser = croner::parser::CronParser::builder()
        .seconds(seconds)
        .year(croner::parser::Year::Disallowed)
        .build();
    parser.parse(text).map_err(|e| {
        let detail = match e {
            croner::errors::CronError::InvalidPattern(m)
            | croner::errors::CronError::IllegalCharacters(m)
            | croner::errors::CronError::ComponentError(m) => m,
            other => other.to_string(),
        };
        format!("invalid cron `{text}`: {}", sentence_fragment(&detail))
    })
}

/// Lower-cases the first letter and drops a trailing dot, to fit third-party messages into
/// ours.
fn sentence_fragment(text: &str) -> String {
    let text = text.trim().trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Checks a Redis URL the way the client will read it, without ever echoing it back: it may
/// hold a password.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(
            "invalid redis URL, expected redis://HOST[:PORT][/DB], rediss://…, redis+unix:///PATH or redis+sentinel://HOST:PORT,…/NAME"
                .into(),
        );
    };
    if let Some(parsed) = crate::queue_client::SentinelUrl::parse(url) {
        return parsed
            .map(|_| ())
            .map_err(|e| format!("invalid redis URL: {e}"));
    }
    match scheme {
        "redis" | "rediss" => {
            let (rest, fragment) = match rest.split_once('#') {
                Some((r, f)) => (r, Some(f)),
                None => (rest, None),
            };
            if let Some(f) = fragment
                && (scheme != "rediss" || f != "insecure")
            {
                return Err("invalid redis URL: only rediss:// URLs may end in #insecure".into());
            }
            let (rest, query) = match rest.split_once('?') {
                Some((r, q)) => (r, Some(q)),
                None => (rest, None),
            };
            check_query(query)?;
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, ""),
            };
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
                match v6.split_once(']') {
                    Some((h, tail)) => (h, tail.strip_prefix(':')),
                    None => return Err("invalid redis URL: unclosed [ in the host".into()),
                }
            } else {
                match host_port.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (host_port, None),
                }
            };
            if host.is_empty() {
                return Err("invalid redis URL: the host is missing".into());
            }
            if host == "0.0.0.0" || host == "::" {
                return Err("invalid redis URL: cannot connect to a wildcard address".into());
            }
            if let Some(port) = port
                && port.parse::<u16>().is_err()
            {
                return Err("invalid redis URL: the port must be a number from 0 to 65535".into());
            }
            let db = path.trim_matches('/');
            if !db.is_empty() && db.parse::<u32>().is_err() {
                return Err("invalid redis URL: the path must be a database number like /0".into());
            }
            Ok(())
        }
        "redis+unix" | "unix" => {
            let (path, query) = match rest.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (rest, None),
            };
            if !path.starts_with('/') || path.len() < 2 {
                return Err(
                    "invalid redis URL: redis+unix needs an absolute socket path, like redis+unix:///run/redis.sock"
                        .into(),
                );
            }
            check_query(query)
        }
        _ => Err(
            "invalid redis URL scheme, expected redis://, rediss://, redis+unix:// or redis+sentinel://"
                .into(),
        ),
    }
}

fn check_query(query: Option<&str>) -> Result<(), String> {
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "protocol" if !matches!(v, "2" | "3" | "resp2" | "resp3") => {
                return Err("invalid redis URL: protocol must be resp2 or resp3".into());
            }
            "db" if v.parse::<u32>().is_err() => {
                return Err("invalid redis URL: db must be a database number".into());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a name may become part of a Redis key: no braces (hash tags), no spaces.
pub fn is_valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10").unwrap_err().contains("has no unit"));
        assert!(parse_duration("ten seconds").is_err());
        assert!(parse_duration("").is_err());
        assert!(
            parse_duration("5 parsecs")
                .unwrap_err()
                .contains("unknown unit `parsecs`")
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4 MiB"), Ok(4 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("100B"), Ok(100));
        assert!(parse_size("64").unwrap_err().contains("has no unit"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 bananas").is_err());
        assert!(parse_size("-5MiB").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn rates() {
        let r = |s: &str| s.parse::<Rate>().map(|r| r.per_second);
        assert_eq!(r("50/s"), Ok(50.0));
        assert_eq!(r("3000/min"), Ok(50.0));
        assert_eq!(r("36/h"), Ok(0.01));
        assert_eq!(r("2.5/s"), Ok(2.5));
        assert_eq!(r("10 / sec"), Ok(10.0));
        assert!(r("0/s").unwrap_err().contains("greater than zero"));
        assert!(r("50").is_err());
        assert!(r("fast/s").is_err());
        assert!(r("-5/s").is_err());
        assert!(r("5/fortnight").unwrap_err().contains("unknown unit"));
        assert!(r("/s").is_err());
    }

    #[test]
    fn work_period_syntax() {
        let p: WorkPeriod = "MON-FRI 00:00-06:00".parse().unwrap();
        assert_eq!(p.days, [true, true, true, true, true, false, false]);
        assert_eq!((p.start_minute, p.end_minute), (0, 360));
        let p: WorkPeriod = "sat-Sun 00:00-23:59".parse().unwrap();
        assert_eq!(p.days, [false, false, false, false, false, true, true]);
        assert_eq!(p.end_minute, 1439);
        let p: WorkPeriod = "MON,WED,FRI 08:00-18:30".parse().unwrap();
        assert_eq!(p.days, [true, false, true, false, true, false, false]);
        assert_eq!(p.to_string(), "MON,WED,FRI 08:00-18:30");
        let p: WorkPeriod = "FRI-MON 8:00-9:00".parse().unwrap();
        assert_eq!(p.days, [true, false, false, false, true, true, true]);
        let p: WorkPeriod = "09:00-17:00".parse().unwrap();
        assert_eq!(p.days, [true; 7]);

        for bad in [
            "MOX-FRI 00:00-06:00",
            "MON-FRI 25:00-26:00",
            "MON-FRI 08:60-09:00",
            "MON-FRI 08:00",
            "MON-FRI",
            "MON-FRI 0800-0900",
            "MON FRI 08:00-09:00",
            "",
            "MON-FRI 24:00-23:59",
        ] {
            assert!(bad.parse::<WorkPeriod>().is_err(), "{bad:?} should fail");
        }
        assert!(
            "MON-FRI"
                .parse::<WorkPeriod>()
                .unwrap_err()
                .contains("no time range")
        );
    }

    #[test]
    fn work_period_contains() {
        use Weekday::*;
        let p: WorkPeriod = "MON-FRI 08:00-18:30".parse().unwrap();
        assert!(p.contains(Mon, 8 * 60));
        assert!(p.contains(Fri, 18 * 60 + 30));
        assert!(!p.contains(Fri, 18 * 60 + 31));
        assert!(!p.contains(Mon, 7 * 60 + 59));
        assert!(!p.contains(Sat, 12 * 60));

        // Past midnight: Monday 22:00 to Tuesday 02:00, not Monday 01:00.
        let p: WorkPeriod = "MON 22:00-02:00".parse().unwrap();
        assert!(p.contains(Mon, 22 * 60));
        assert!(p.contains(Mon, 23 * 60 + 59));
        assert!(p.contains(Tue, 0));
        assert!(p.contains(Tue, 2 * 60));
        assert!(!p.contains(Tue, 2 * 60 + 1));
        assert!(!p.contains(Mon, 60));
        assert!(!p.contains(Tue, 22 * 60));

        // Sunday night wraps into Monday.
        let p: WorkPeriod = "SUN 23:00-01:00".parse().unwrap();
        assert!(p.contains(Mon, 30));
        assert!(!p.contains(Sun, 30));
    }

    #[test]
    fn crons() {
        let c = parse_cron("0 3 * * *").unwrap();
        assert_eq!(c.as_str(), "0 3 * * *");
        assert!(parse_cron("*/15 8-18 * * MON-FRI").is_ok());
        // Six fields: seconds first.
        let c = parse_cron("*/5 0 3 * * *").unwrap();
        let from = chrono::DateTime::from_timestamp(0, 0).unwrap();
        let next: Vec<_> = c.iter_after(from).take(2).collect();
        assert_eq!(next[1] - next[0], chrono::Duration::seconds(5));
        assert!(
            parse_cron("* * * * * * *")
                .unwrap_err()
                .contains("has 7 fields")
        );
        assert!(parse_cron("* * * *").unwrap_err().contains("has 4 fields"));
        assert!(parse_cron("@daily").unwrap_err().contains("has 1 field,"));
        let e = parse_cron("61 3 * * *").unwrap_err();
        assert!(e.starts_with("invalid cron `61 3 * * *`: "), "{e}");
        assert!(!e.ends_with('.'), "{e}");
        assert!(parse_cron("0 3 * * BLA").is_err());
    }

    #[test]
    fn redis_urls() {
        for ok in [
            "redis://127.0.0.1:6379/0",
            "redis://localhost",
            "redis://gaffer:secret@redis.internal:6380/2",
            "rediss://redis.internal",
            "rediss://redis.internal:6380/#insecure",
            "redis://[::1]:6379/0",
            "redis://h/?protocol=resp3",
            "redis+unix:///run/redis/redis.sock",
            "redis+unix:///run/redis.sock?db=3",
            "redis+sentinel://s1:26379,s2:26379,s3/gaffer/0",
            "rediss+sentinel://app:pw@s1:26379/gaffer?sentinel_password=x",
        ] {
            assert_eq!(check_redis_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "127.0.0.1:6379",
            "http://127.0.0.1",
            "redis://",
            "redis://:6379",
            "redis://host:port",
            "redis://host:99999",
            "redis://host/db1",
            "redis+unix://relative.sock",
            "redis+sentinel://s1:26379",
            "redis+sentinel://s1:x/gaffer",
            "redis://0.0.0.0",
            "redis://host#insecure",
        ] {
            assert!(check_redis_url(bad).is_err(), "{bad}");
        }
        // Never echo a URL back: it may carry a password.
        let e = check_redis_url("redis://u:hunter2@host:port").unwrap_err();
        assert!(!e.contains("hunter2"));
    }

    #[test]
    fn names() {
        assert!(is_valid_name("resize_photo"));
        assert!(is_valid_name("a.b-c_1"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("has space"));
        assert!(!is_valid_name("{tag}"));
        assert!(!is_valid_name(&"x".repeat(129)));
        assert!(is_valid_name(&"x".repeat(128)));
    }
}
