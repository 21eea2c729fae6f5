//! A task's meta: what the scripts keep of a task beside its payload, at the head of its
//! stored value (`pack_meta` and `parse_meta` in lua/lib/tasks.lua), and the one place
//! Rust reads it.
//!
//! The form is `priority:max_attempts[tTIMEOUT]:enqueued_ms[.SEQ][:CHAIN]`: TIMEOUT is the
//! task's own time limit in ms (a submit's `timeout`, at most its queue's), SEQ is a tracked task's
//! record number (its score in the listing index), CHAIN is present for a tracked task:
//! `''` in no chain, `g` and the chain's id for its global task, `c` and the chain's id for
//! a follow-up in it.

/// A task's meta, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Priority, max_attempts (0: no limit) and enqueue time (ms since the epoch); `None`
    /// when they do not parse.
    pub(crate) head: Option<MetaHead>,
    /// Its record's number, handed back with its ack so that a whole batch's ack writes
    /// no record (`K_DONE` in lua/lib/records.lua); `None` for an untracked task.
    pub(crate) seq: Option<u64>,
    /// Its chain.
    pub(crate) chain: MetaChain,
}

/// The fields every meta starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetaHead {
    /// Its priority.
    pub(crate) priority: i32,
    /// Its max_attempts as enqueued (0: no limit).
    pub(crate) max_attempts: u32,
    /// When it was enqueued (ms since the epoch).
    pub(crate) enqueued_ms: i64,
    /// Its own time limit (ms), when its submit gave one.
    pub(crate) timeout_ms: Option<u64>,
}

/// A task's chain as its meta says it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum MetaChain {
    /// The meta does not say: an untracked task.
    #[default]
    Unknown,
    /// In no chain.
    None,
    /// The global task of this chain (its enqueue minted the chain's id).
    Global(String),
    /// A follow-up in this chain.
    Of(String),
}

impl Meta {
    /// Reads a meta; what does not parse reads as unknown (see the fields).
    pub(crate) fn parse(meta: &[u8]) -> Meta {
        let Ok(meta) = std::str::from_utf8(meta) else {
            return Meta::default();
        };
        let mut it = meta.splitn(4, ':');
        let (priority, max_attempts, enqueued) = (it.next(), it.next(), it.next());
        let (at, seq) = match enqueued.map(|e| e.split_once('.')) {
            Some(Some((at, seq))) => (Some(at), seq.parse().ok()),
            _ => (enqueued, None),
        };
        let head = (|| {
            let (max_attempts, timeout_ms) = match max_attempts?.split_once('t') {
                Some((ma, t)) => (ma, Some(t.parse().ok()?)),
                None => (max_attempts?, None),
            };
            Some(MetaHead {
                priority: priority?.parse().ok()?,
                max_attempts: max_attempts.parse().ok()?,
                enqueued_ms: at?.parse().ok()?,
                timeout_ms,
            })
        })();
        let chain = match (enqueued, it.next()) {
            (Some(_), Some("")) => MetaChain::None,
            (Some(_), Some(c)) if c.starts_with('g') => MetaChain::Global(c[1..].to_string()),
            (Some(_), Some(c)) if c.starts_with('c') => MetaChain::Of(c[1..].to_string()),
            _ => MetaChain::Unknown,
        };
        Meta { head, seq, chain }
    }

    /// Its own time limit, when its submit gave one.
    pub(crate) fn timeout(&self) -> Option<std::time::Duration> {
        self.head
            .and_then(|h| h.timeout_ms)
            .map(std::time::Duration::from_millis)
    }

    /// When it was enqueued (ms since the epoch, Redis's clock); `None` when the meta did
    /// not parse.
    pub(crate) fn enqueued_ms(&self) -> Option<i64> {
        self.head.map(|h| h.enqueued_ms)
    }

    /// Its max_attempts as enqueued (0: no limit); `None` when the meta did not parse.
    pub(crate) fn max_attempts(&self) -> Option<u32> {
        self.head.map(|h| h.max_attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(priority: i32, max_attempts: u32, enqueued_ms: i64) -> Option<MetaHead> {
        Some(MetaHead {
            priority,
            max_attempts,
            enqueued_ms,
            timeout_ms: None,
        })
    }

    #[test]
    fn a_meta_reads_with_or_without_its_record_number_and_chain() {
        let m = Meta::parse(b"-2:5:1700");
        assert_eq!(
            (m.head, m.seq, m.chain),
            (head(-2, 5, 1700), None, MetaChain::Unknown)
        );
        let m = Meta::parse(b"0:3:1700.42:cQ:G.1");
        assert_eq!(
            (m.head, m.seq, m.chain),
            (head(0, 3, 1700), Some(42), MetaChain::Of("Q:G.1".into()))
        );
        let m = Meta::parse(b"0:3:1.7:g~cQ.7");
        assert_eq!(
            (m.seq, m.chain),
            (Some(7), MetaChain::Global("~cQ.7".into()))
        );
        assert_eq!(Meta::parse(b"0:3:1:").chain, MetaChain::None);
        // A task's own time limit follows its max_attempts.
        let m = Meta::parse(b"4:2t1500:1700.8:");
        assert_eq!(
            (m.max_attempts(), m.timeout(), m.seq),
            (
                Some(2),
                Some(std::time::Duration::from_millis(1500)),
                Some(8)
            )
        );
        assert_eq!(Meta::parse(b"4:2:1700").timeout(), None);
        assert_eq!(Meta::parse(b"4:2tx:1700").head, None);
    }

    #[test]
    fn a_meta_that_does_not_parse_says_so_field_by_field() {
        let m = Meta::parse(b"0:x:1700.9:");
        assert_eq!((m.head, m.max_attempts(), m.seq), (None, None, Some(9)));
        assert_eq!(m.chain, MetaChain::None);
        assert_eq!(Meta::parse(b"0:3:17x0.42:").head, None);
        assert_eq!(Meta::parse(b"\xff"), Meta::default());
        assert_eq!(Meta::parse(b""), Meta::default());
    }
}
