//! A `start = "fork"` exec child, as its slot holds it: forked by the queue's language
//! zygote (not by the slot), reached through three FIFOs the slot made, watched through a
//! pidfd.
//!
//! The child is not the slot's own, so the slot can neither wait for it nor learn its
//! exit status: its end is the pidfd turning readable (the language zygote reaps it).
//! Signals go to its process group, which it made its own before opening its input, and
//! only while the pidfd says it lives, so that a pid reused after its end is never hit.
//!
//! `Forked::start` makes the three FIFOs in a private temporary directory, opens its ends
//! of stdout and stderr without waiting, asks on the fork line, then opens stdin once the
//! child has: the protocol orders that after the child's stdout and stderr, so no read
//! meets an early end of file. `child.rs`'s `Proc` holds either kind of child, spawned or
//! forked, behind one set of calls.
//!
//! The child belongs to its slot, not to the language zygote that forked it
//! (ARCHITECTURE.md, invariant 40): only the slot speaks to it, signals it and ends it.
//! With the whole host's gaffer gone, the child ends its own group once its stdin hangs up,
//! which the fork protocol asks of every library.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::host::fork::{
    ForkAsk, ForkLine, ForkLineError, ForkOutcome, pidfd_ended, pidfd_kill, pidfd_open,
    set_nonblocking,
};

/// Longest a forked child may take to open its input once forked: it has nothing to load
/// (its zygote did), so this is only a bound on a child that died or hangs before it.
const OPEN_WAIT: Duration = Duration::from_secs(30);

/// Why a child could not be forked.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The slot runs outside gaffer's zygote (a test, a tool): there is no language
    /// zygote to ask.
    #[error("start = \"fork\" needs gaffer's zygote; this slot runs outside a master")]
    NoLine,
    /// Making the FIFOs or opening them failed.
    #[error("preparing the child's pipes: {0}")]
    Pipes(io::Error),
    /// The line to gaffer's zygote failed.
    #[error(transparent)]
    Line(#[from] ForkLineError),
    /// The language zygote could not fork a child: why, with its log's last lines.
    #[error("{0}")]
    Refused(String),
    /// The child ended, or never opened its input, before it could be spoken to.
    #[error("the forked child {pid} {why}")]
    Lost {
        /// Its pid.
        pid: u32,
        /// What became of it.
        why: &'static str,
    },
}

/// A forked child: its pid and a pidfd that turns readable at its end.
#[derive(Debug)]
pub struct Forked {
    pid: u32,
    pidfd: OwnedFd,
}

/// A child's three streams, as the slot holds them (its ends of a spawned child's pipes, or
/// of a forked child's FIFOs).
pub struct Streams {
    /// Where the slot writes requests.
    pub stdin: File,
    /// Where the slot reads replies.
    pub stdout: File,
    /// The child's log.
    pub stderr: File,
}

impl Forked {
    /// Asks for a child on `line` with `env` set in it, and opens its three streams.
    pub fn start(
        line: &ForkLine,
        env: BTreeMap<String, String>,
    ) -> Result<(Forked, Streams), ForkError> {
        let dir = tempfile::Builder::new()
            .prefix(&crate::host::fork::fifo_dir_prefix(std::process::id()))
            .tempdir()
            .map_err(ForkError::Pipes)?;
        let path = |name: &str| dir.path().join(name);
        for name in ["stdin", "stdout", "stderr"] {
            nix::unistd::mkfifo(&path(name), nix::sys::stat::Mode::S_IRWXU)
                .map_err(|e| ForkError::Pipes(e.into()))?;
        }
        // Ours opened first, without waiting for a writer: the child's opens of these two
        // then succeed at once, and come before its open of stdin (the protocol's order),
        // so no read here can meet an end of file before the child's writers exist.
        let stdout = open_nonblocking(&path("stdout"), false).map_err(ForkError::Pipes)?;
        let stderr = open_nonblocking(&path("stderr"), false).map_err(ForkError::Pipes)?;
        let ask = ForkAsk {
            seq: 0,
            stdin: path("stdin"),
            stdout: path("stdout"),
            stderr: path("stderr"),
            env,
        };
        let pid = match line.ask(ask)? {
            ForkOutcome::Forked(pid) => pid,
            ForkOutcome::Failed(why) => return Err(ForkError::Refused(why)),
        };
        let forked = Forked {
            pid,
            pidfd: pidfd_open(pid).map_err(|_| ForkError::Lost {
                pid,
                why: "ended before it could be watched",
            })?,
        };
        // A child that never opens its input (it hangs, or died) is ended, not left.
        let stdin = forked.open_input(&path("stdin")).inspect_err(|_| {
            pidfd_kill(forked.pid, forked.pidfd.as_fd(), Signal::SIGKILL);
        })?;
        for file in [&stdin, &stdout, &stderr] {
            set_nonblocking(file.as_fd(), false).map_err(ForkError::Pipes)?;
        }
        // (the FIFOs' names go with the directory; the opened ends stay)
        drop(dir);
        Ok((
            forked,
            Streams {
                stdin,
                stdout,
                stderr,
            },
        ))
    }

    /// Opens the child's input for writing, once the child opened it for reading.
    fn open_input(&self, path: &Path) -> Result<File, ForkError> {
        let deadline = Instant::now() + OPEN_WAIT;
        let mut pause = Duration::from_micros(200);
        loop {
            match open_nonblocking(path, true) {
                Ok(file) => return Ok(file),
                // No reader yet: the child has not come this far.
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
                Err(e) => return Err(ForkError::Pipes(e)),
            }
            if !self.is_alive() {
                return Err(ForkError::Lost {
                    pid: self.pid,
                    why: "ended before it opened its input",
                });
            }
            if Instant::now() >= deadline {
                return Err(ForkError::Lost {
                    pid: self.pid,
                    why: "did not open its input in time",
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Another handle on the same child, for a thread that signals it.
    pub fn try_clone(&self) -> io::Result<Forked> {
        Ok(Forked {
            pid: self.pid,
            pidfd: self.pidfd.try_clone()?,
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the child still runs.
    pub fn is_alive(&self) -> bool {
        !self.exited_within(Duration::ZERO)
    }

    /// Whether the child ends within `wait` (`Duration::MAX`: waits for its end).
    pub fn exited_within(&self, wait: Duration) -> bool {
        pidfd_ended(self.pidfd.as_fd(), (wait != Duration::MAX).then_some(wait))
    }

    /// Sends `sig` to the child's process group (the child and what it started), while
    /// the child lives: its group's id is its pid, which cannot be reused before its end.
    pub fn signal(&self, sig: Signal) {
        if !self.is_alive() {
            return;
        }
        if let Err(e) = killpg(Pid::from_raw(self.pid as i32), sig) {
            tracing::debug!(target: "gaffer::exec", pid = self.pid, "cannot send {sig}: {e}");
        }
    }
}

/// Opens a FIFO without waiting for its other end: for writing, ENXIO says there is no
/// reader yet.
fn open_nonblocking(path: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}
