//! How many listings each key has under way, against `[api].max_listings_per_key`: a
//! listing is a few bounded script calls, each holding Redis for about a millisecond, and
//! a key that runs many at once (or loops on them from many connections) would still
//! keep Redis busy for everyone else. Over the limit a listing is refused at once (429),
//! before it reaches Redis; nothing waits for a turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::error::ApiError;

/// The listings under way in this api instance, by key name. Shared by every config the
/// instance adopts, so a new config's limit counts the listings the old one started.
#[derive(Debug, Default)]
pub(super) struct Listings {
    under_way: Mutex<HashMap<String, usize>>,
}

/// A listing under way: it counts against its key's limit until dropped.
#[derive(Debug)]
pub(super) struct Listing {
    listings: Arc<Listings>,
    key: String,
}

impl Listings {
    /// Starts a listing for `key`, or refuses it (429) when the key has `limit` under way.
    pub(super) fn start(self: &Arc<Self>, key: &str, limit: usize) -> Result<Listing, ApiError> {
        let mut under_way = self.under_way.lock().expect("listings lock");
        let n = under_way.entry(key.to_string()).or_default();
        if *n >= limit {
            return Err(ApiError::too_many_requests(format!(
                "key {key} already has {n} listings under way, the limit of \
                 [api].max_listings_per_key: retry once one has answered"
            )));
        }
        *n += 1;
        Ok(Listing {
            listings: self.clone(),
            key: key.to_string(),
        })
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        let mut under_way = self.listings.under_way.lock().expect("listings lock");
        if let Some(n) = under_way.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                under_way.remove(&self.key);
            }
        }
    }
}

/// A listing's `limit`: a number from 1 to `max`, or a refusal naming the range.
pub(super) fn parse_limit(value: &str, max: usize) -> Result<usize, ApiError> {
    value
        .parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "limit must be a number from 1 to {max}, got {value:?}"
            ))
        })
}

/// The query of a cursor-paged listing that takes only `limit` (1 to `max`, `default`
/// when absent) and `cursor` (what `decode` makes of one this api returned).
pub(super) fn page_query<C>(
    query: Option<&str>,
    default: usize,
    max: usize,
    decode: impl Fn(&str) -> Option<C>,
) -> Result<(usize, Option<C>), ApiError> {
    let (mut limit, mut cursor) = (default, None);
    for (name, value) in super::routes::query_pairs(query.unwrap_or(""))? {
        match name.as_str() {
            "limit" => limit = parse_limit(&value, max)?,
            "cursor" => {
                cursor = Some(decode(&value).ok_or_else(|| {
                    ApiError::bad_request(format!("cursor {value:?} is not one this api returned"))
                })?)
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?}: expected limit or cursor"
                )));
            }
        }
    }
    Ok((limit, cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gets_its_limit_and_a_place_again_once_one_ends() {
        let listings = Arc::new(Listings::default());
        let first = listings.start("shop", 2).unwrap();
        let _second = listings.start("shop", 2).unwrap();
        let refused = listings.start("shop", 2).unwrap_err();
        assert_eq!(refused.status, hyper::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            refused.message,
            "key shop already has 2 listings under way, the limit of \
             [api].max_listings_per_key: retry once one has answered"
        );
        // (another key counts on its own)
        let _ops = listings.start("ops", 2).unwrap();
        drop(first);
        let _third = listings.start("shop", 2).unwrap();
    }

    #[test]
    fn ended_listings_leave_no_entry() {
        let listings = Arc::new(Listings::default());
        drop(listings.start("shop", 1).unwrap());
        assert!(listings.under_way.lock().unwrap().is_empty());
    }
}
