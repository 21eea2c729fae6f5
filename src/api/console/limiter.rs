//! Failed logins per client address: past `max_failed_logins` within
//! `failed_login_window`, an address's logins are refused without a look at the token
//! until its window ends, so guessing tokens through the form is slow. IPv6 addresses
//! count by their /64, which one client usually holds whole.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most addresses tracked at once; past it the oldest spell is forgotten, so a flood
/// from many addresses cannot grow the table without bound.
const MAX_TRACKED: usize = 65_536;

/// An address's failures since its window began.
#[derive(Debug, Clone, Copy)]
struct Spell {
    since: Instant,
    failures: u32,
}

/// The failed logins of an instance, by address; kept across the configs it adopts.
#[derive(Debug, Default)]
pub(super) struct FailedLogins {
    by_addr: Mutex<HashMap<IpAddr, Spell>>,
}

/// The address an IPv6 client is counted under: its /64.
fn counted(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

impl FailedLogins {
    /// How long `ip` must still wait, when it has used up its failures in its window.
    pub fn blocked(
        &self,
        ip: IpAddr,
        now: Instant,
        max: u32,
        window: Duration,
    ) -> Option<Duration> {
        let map = self.by_addr.lock().expect("failed logins lock");
        let spell = map.get(&counted(ip))?;
        let ends = spell.since + window;
        (spell.failures >= max && now < ends).then(|| ends - now)
    }

    /// Counts a failure of `ip`; true when it used up the address's last one.
    pub fn failed(&self, ip: IpAddr, now: Instant, max: u32, window: Duration) -> bool {
        let mut map = self.by_addr.lock().expect("failed logins lock");
        if map.len() >= MAX_TRACKED {
            map.retain(|_, s| now.duration_since(s.since) < window);
            if map.len() >= MAX_TRACKED
                && let Some(oldest) = map.iter().min_by_key(|(_, s)| s.since).map(|(ip, _)| *ip)
            {
                map.remove(&oldest);
            }
        }
        let spell = map.entry(counted(ip)).or_insert(Spell {
            since: now,
            failures: 0,
        });
        if now.duration_since(spell.since) >= window {
            *spell = Spell {
                since: now,
                failures: 0,
            };
        }
        spell.failures += 1;
        spell.failures == max
    }

    /// Forgets `ip`'s failures: it logged in.
    pub fn succeeded(&self, ip: IpAddr) {
        self.by_addr
            .lock()
            .expect("failed logins lock")
            .remove(&counted(ip));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn an_address_is_blocked_after_its_failures_until_its_window_ends() {
        let f = FailedLogins::default();
        let t0 = Instant::now();
        let a: IpAddr = "203.0.113.9".parse().unwrap();
        let b: IpAddr = "203.0.113.10".parse().unwrap();
        assert!(!f.failed(a, t0, 3, MINUTE));
        assert!(!f.failed(a, t0, 3, MINUTE));
        assert_eq!(f.blocked(a, t0, 3, MINUTE), None, "two of three");
        assert!(
            f.failed(a, t0 + Duration::from_secs(10), 3, MINUTE),
            "the third"
        );
        assert_eq!(
            f.blocked(a, t0 + Duration::from_secs(20), 3, MINUTE),
            Some(Duration::from_secs(40))
        );
        assert_eq!(f.blocked(b, t0, 3, MINUTE), None, "another address");
        assert_eq!(
            f.blocked(a, t0 + MINUTE, 3, MINUTE),
            None,
            "the window ended"
        );
        assert!(!f.failed(a, t0 + MINUTE, 3, MINUTE), "a new window");
    }

    #[test]
    fn a_login_forgets_the_failures_and_v6_counts_by_its_64() {
        let f = FailedLogins::default();
        let t0 = Instant::now();
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        f.failed(one, t0, 2, MINUTE);
        assert!(f.failed(same_64, t0, 2, MINUTE));
        assert!(f.blocked(one, t0, 2, MINUTE).is_some());
        assert!(f.blocked(other_64, t0, 2, MINUTE).is_none());
        f.succeeded(same_64);
        assert!(f.blocked(one, t0, 2, MINUTE).is_none());
    }

    #[test]
    fn the_table_stays_bounded() {
        let f = FailedLogins::default();
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            f.failed(IpAddr::V4(i.into()), t0, 5, MINUTE);
        }
        assert!(f.by_addr.lock().unwrap().len() <= MAX_TRACKED);
    }
}
