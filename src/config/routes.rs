//! `next = [{ queue, on }]`: the follow-up routes of chains, checked across queues once
//! every queue is known: each route names a queue of the config, `on` is `done` or
//! `failed`, both ends keep records (a chain is followed through its tasks' records), and
//! no route leads back to where it started (a chain of routes alone would never end).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::Collector;
use super::raw::RawRoute;
use super::validate::{deserialize, find, join, table_of, unknown_queue};
use super::{QueueConfig, Route, RouteOn};

/// A checked route with where it was written, for the cycle check's message.
struct Written {
    route: Route,
    path: String,
    span: Range<usize>,
}

/// Checks every queue's `next` and stores the routes in `queues`.
pub(super) fn routes(
    c: &mut Collector,
    root: &DeTable,
    queues: &mut BTreeMap<String, QueueConfig>,
) {
    let Some(DeValue::Table(tables)) = find(root, "queues").map(Spanned::get_ref) else {
        return;
    };
    // A queue whose table had errors of its own is missing from `queues`: a route to it is
    // not a second error.
    let declared: BTreeSet<String> = tables
        .iter()
        .map(|(n, _)| n.get_ref().to_string())
        .collect();
    let mut written: BTreeMap<String, Vec<Written>> = BTreeMap::new();
    for (name, value) in tables.iter() {
        let name: &str = name.get_ref();
        let DeValue::Table(table) = value.get_ref() else {
            continue;
        };
        let Some(next) = find(table, "next") else {
            continue;
        };
        let path = join(&join("queues", name), "next");
        let routes = queue_routes(c, &path, next, queues, &declared);
        if let Some(q) = queues.get_mut(name) {
            if !routes.is_empty() && !q.track {
                c.error(
                    next.span(),
                    &path,
                    "next needs track = true: a chain is followed through its tasks' records",
                );
            }
            q.next = routes.iter().map(|w| w.route.clone()).collect();
        }
        written.insert(name.to_string(), routes);
    }
    cycles(c, &written);
}

/// One queue's `next` array, each entry checked on its own.
fn queue_routes(
    c: &mut Collector,
    path: &str,
    next: &Spanned<DeValue>,
    queues: &BTreeMap<String, QueueConfig>,
    declared: &BTreeSet<String>,
) -> Vec<Written> {
    let DeValue::Array(items) = next.get_ref() else {
        c.error(
            next.span(),
            path,
            format!(
                "expected an array of {{ queue = \"…\", on = \"done\" | \"failed\" }}, found {}",
                next.get_ref().type_str()
            ),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if table_of(c, item, &at).is_none() {
            continue;
        }
        let Some(raw) = deserialize::<RawRoute>(c, item, &at) else {
            continue;
        };
        if let Some(w) = route(c, &at, item.span(), raw, queues, declared) {
            out.push(w);
        }
    }
    out
}

fn route(
    c: &mut Collector,
    at: &str,
    span: Range<usize>,
    raw: RawRoute,
    queues: &BTreeMap<String, QueueConfig>,
    declared: &BTreeSet<String>,
) -> Option<Written> {
    let on = match raw.on.as_ref().map(|o| (o.get_ref().as_str(), o.span())) {
        None | Some(("done", _)) => Some(RouteOn::Done),
        Some(("failed", _)) => Some(RouteOn::Failed),
        Some((other, span)) => {
            c.error(
                span,
                &join(at, "on"),
                format!("unknown on `{other}`, expected `done` or `failed`"),
            );
            None
        }
    };
    let Some(queue) = raw.queue else {
        c.error(
            span,
            &join(at, "queue"),
            "missing key `queue`: the queue the follow-up goes to",
        );
        return None;
    };
    let (name, qspan) = (queue.get_ref().clone(), queue.span());
    match queues.get(&name) {
        None if declared.contains(&name) => return None,
        None => {
            c.error(qspan.clone(), &join(at, "queue"), unknown_queue(&name));
            return None;
        }
        Some(target) if !target.track => {
            c.error(
                qspan.clone(),
                &join(at, "queue"),
                format!(
                    "queue `{name}` has track = false: a chain is followed through its tasks' records"
                ),
            );
            return None;
        }
        Some(_) => {}
    }
    Some(Written {
        route: Route {
            queue: name,
            on: on?,
        },
        path: join(at, "queue"),
        span: qspan,
    })
}

/// Reports each route that closes a cycle (a → b → a, or a → a), once per cycle.
fn cycles(c: &mut Collector, written: &BTreeMap<String, Vec<Written>>) {
    let mut done: BTreeMap<&str, bool> = BTreeMap::new();
    for start in written.keys() {
        let mut path = Vec::new();
        visit(c, written, start, &mut path, &mut done);
    }
}

/// Depth-first: `path` holds the queues on the way here; `done` the queues whose every
/// route has been followed (true) or is being followed (false).
fn visit<'a>(
    c: &mut Collector,
    written: &'a BTreeMap<String, Vec<Written>>,
    queue: &'a str,
    path: &mut Vec<&'a str>,
    done: &mut BTreeMap<&'a str, bool>,
) {
    if done.contains_key(queue) {
        return;
    }
    done.insert(queue, false);
    path.push(queue);
    for w in written.get(queue).into_iter().flatten() {
        let to = w.route.queue.as_str();
        match done.get(to) {
            Some(false) => {
                let from = path.iter().position(|q| *q == to).unwrap_or(0);
                let mut ring: Vec<&str> = path[from..].to_vec();
                ring.push(to);
                c.error(
                    w.span.clone(),
                    &w.path,
                    format!(
                        "a cycle of next routes: {} (a chain of routes alone would never end)",
                        ring.join(" → ")
                    ),
                );
            }
            Some(true) => {}
            None => visit(c, written, to, path, done),
        }
    }
    path.pop();
    done.insert(queue, true);
}
