//! The one place a gaffer process installs its signal handlers. A role's `run` takes a
//! [`CancellationToken`] (and the master a [`Reload`]) instead of listening for signals
//! itself, so tests drive roles in-process with tokens and the binary's edge decides what a
//! signal means.
//!
//! What it offers: `stop_on_term` (the first and second SIGTERM/SIGINT as two tokens: stop,
//! then hurry), `shutdown_on_term`, `shutdown_on_sigterm` (a forked slot's, which is its
//! own edge), `reload_on_hup` (the master's `Reload`) and `interrupts` (`gaffer up`'s
//! Ctrl-C presses). Only this file names tokio's `SignalKind` (ARCHITECTURE.md, invariant
//! 29); the zygote blocks signals and reads a signalfd instead, which is not a handler.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Asks a role to re-read its config file (SIGHUP for the master). A request made while
/// none is awaited is kept, so a SIGHUP during a tick is not lost.
#[derive(Clone, Debug, Default)]
pub struct Reload(Arc<Notify>);

impl Reload {
    /// Requests one reload.
    pub fn request(&self) {
        self.0.notify_one();
    }

    /// Waits for the next request.
    pub async fn requested(&self) {
        self.0.notified().await;
    }
}

/// Stop requests from the edge: the first SIGTERM or SIGINT asks for a graceful stop, a
/// second one for an immediate stop (a master kills its slots instead of waiting out
/// `drain_timeout`).
#[derive(Clone, Debug, Default)]
pub struct StopRequests {
    /// Cancelled by the first request.
    pub first: CancellationToken,
    /// Cancelled by the second request.
    pub second: CancellationToken,
}

/// [`StopRequests`] made by SIGTERM and SIGINT. Installs the handlers at once (so a signal
/// arriving before the role's loop starts is not the default "terminate"); must be called
/// inside a Tokio runtime.
pub fn stop_on_term() -> std::io::Result<StopRequests> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stop = StopRequests::default();
    let requests = stop.clone();
    tokio::spawn(async move {
        for token in [&requests.first, &requests.second] {
            tokio::select! {
                _ = term.recv() => tracing::info!(signal = "SIGTERM", "stop requested"),
                _ = int.recv() => tracing::info!(signal = "SIGINT", "stop requested"),
            }
            token.cancel();
        }
    });
    Ok(stop)
}

/// A token cancelled by the first SIGTERM or SIGINT, for roles that stop the same way
/// however often they are asked; see [`stop_on_term`].
pub fn shutdown_on_term() -> std::io::Result<CancellationToken> {
    Ok(stop_on_term()?.first)
}

/// A token cancelled by SIGTERM alone: a slot's stop. SIGINT is left alone because a
/// Ctrl-C in a terminal reaches the whole process group, and the slot's master decides.
pub fn shutdown_on_sigterm() -> std::io::Result<CancellationToken> {
    token_on(libc::SIGTERM)
}

/// A token cancelled by the first `signum` to arrive (a slot's [`RETIRE_SIGNAL`]).
/// Installs the handler at once; must be called inside a Tokio runtime.
///
/// [`RETIRE_SIGNAL`]: crate::slot::RETIRE_SIGNAL
pub fn token_on(signum: i32) -> std::io::Result<CancellationToken> {
    let mut sig = signal(SignalKind::from_raw(signum))?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        sig.recv().await;
        cancel.cancel();
    });
    Ok(token)
}

/// Every SIGINT as a stream, for an edge that gives a repeated Ctrl-C a meaning of its own
/// (`gaffer up`: a second press kills the role it is stopping).
pub fn interrupts() -> std::io::Result<tokio::signal::unix::Signal> {
    signal(SignalKind::interrupt())
}

/// A [`Reload`] requested by every SIGHUP; installs the handler at once.
pub fn reload_on_hup() -> std::io::Result<Reload> {
    let mut hup = signal(SignalKind::hangup())?;
    let reload = Reload::default();
    let r = reload.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            r.request();
        }
    });
    Ok(reload)
}
