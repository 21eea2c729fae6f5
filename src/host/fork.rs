//! The fork start's line between a slot and gaffer's zygote: a slot of a `start = "fork"`
//! exec queue asks for its child here, and the zygote has the queue's language zygote
//! fork it (README, "Handlers": the fork protocol).
//!
//! Neutral ground: the slot asks, the zygote answers; each imports this, neither the
//! other. The slot makes the child's three FIFOs itself, so the language side only opens
//! paths (no descriptor passing, which Perl's core cannot do); their directory is named
//! with the slot's pid, so gaffer's zygote can sweep what a slot killed mid-start left.
//!
//! The exchange: the zygote makes a socketpair per such slot when it forks it
//! (`SlotSpec::fork_line`). The slot writes a [`ForkAsk`] (the three FIFO paths it made,
//! the child's environment, a `seq`) and reads a [`ForkAnswer`] with the `seq` echoed, so a
//! late answer is dropped ([`ForkLine::ask`]). The zygote relays the ask to the queue's
//! language zygote as `{"fork": {"id", …}}` on its stdin and answers from its `{"forked":
//! {"id", "pid"}}` or `{"failed": …}` line. Both sides watch the child through a pidfd,
//! with the calls defined here.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The environment variable naming how an exec child came to be (`spawn` or `fork`).
pub const START_ENV: &str = "GAFFER_START";

/// Longest a slot waits for its child to be forked: a language zygote restarting after a
/// crash loads the handler again first, which may take a while for a large preload.
pub const FORK_WAIT: Duration = Duration::from_secs(120);

/// A slot's request for a child.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkAsk {
    /// The slot's number for this request, echoed in the answer: an answer that came too
    /// late for the request before is told apart and dropped.
    pub seq: u64,
    /// The FIFO the child reads its requests from.
    pub stdin: PathBuf,
    /// The FIFO the child writes its replies to.
    pub stdout: PathBuf,
    /// The FIFO the child writes its log to.
    pub stderr: PathBuf,
    /// Set in the child's environment (`GAFFER_SLOT`, …).
    pub env: BTreeMap<String, String>,
}

/// The zygote's answer to the request numbered `seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkAnswer {
    /// The request's [`ForkAsk::seq`].
    pub seq: u64,
    /// What came of it.
    pub outcome: ForkOutcome,
}

/// What came of a request: the child's pid, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkOutcome {
    /// Forked: the child's pid (its process group's id too).
    Forked(u32),
    /// Not forked: the language zygote could not start (its stderr's last lines), or
    /// fork failed.
    Failed(String),
}

/// Why a fork could not be asked for or answered.
#[derive(Debug, thiserror::Error)]
pub enum ForkLineError {
    /// Writing the request or reading the answer failed.
    #[error("the line to gaffer's zygote: {0}")]
    Io(#[from] std::io::Error),
    /// The zygote closed the line (it is gone: the slot dies with it).
    #[error("gaffer's zygote closed the fork line")]
    Closed,
    /// No answer within [`FORK_WAIT`].
    #[error("no child forked within {}", humantime::format_duration(FORK_WAIT))]
    TimedOut,
    /// An answer that is not one.
    #[error("an unreadable answer from gaffer's zygote: {0}")]
    Garbled(serde_json::Error),
}

/// A slot's end of its fork line: one request at a time, each a JSON line answered by one.
#[derive(Debug)]
pub struct ForkLine(Mutex<(BufReader<UnixStream>, u64)>);

impl ForkLine {
    /// The slot's end, as the zygote handed it over.
    pub fn new(stream: UnixStream) -> Self {
        ForkLine(Mutex::new((BufReader::new(stream), 0)))
    }

    /// Asks for a child (`ask.seq` is set here) and waits for the answer, [`FORK_WAIT`]
    /// at most.
    pub fn ask(&self, mut ask: ForkAsk) -> Result<ForkOutcome, ForkLineError> {
        let mut line = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (reader, seq) = &mut *line;
        *seq += 1;
        ask.seq = *seq;
        let mut text = serde_json::to_vec(&ask).map_err(ForkLineError::Garbled)?;
        text.push(b'\n');
        reader.get_mut().write_all(&text)?;
        let deadline = Instant::now() + FORK_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ForkLineError::TimedOut);
            }
            reader.get_ref().set_read_timeout(Some(left))?;
            let mut answer = Vec::new();
            match reader.read_until(b'\n', &mut answer) {
                Ok(0) => return Err(ForkLineError::Closed),
                Ok(_) => {
                    let answer: ForkAnswer =
                        serde_json::from_slice(&answer).map_err(ForkLineError::Garbled)?;
                    if answer.seq == ask.seq {
                        return Ok(answer.outcome);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ForkLineError::TimedOut);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Sets or clears O_NONBLOCK on `fd`: gaffer's zygote polls its language zygotes'
/// pipes, a slot talks to its forked child blocking, as on a pipe.
pub fn set_nonblocking(fd: std::os::fd::BorrowedFd, on: bool) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    let flags = if on {
        flags | OFlag::O_NONBLOCK
    } else {
        flags - OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// The start of the name of the directory holding one fork's three FIFOs; the asking
/// slot's pid follows, then `-` and a random part (see [`fifo_dir_prefix`]).
const FIFO_DIR: &str = "gaffer-fork-";

/// The prefix of the FIFO directories slot `pid` makes: its pid in the name lets
/// [`sweep_fifo_dirs`] tell whose a directory is once the slot is gone.
pub fn fifo_dir_prefix(pid: u32) -> String {
    format!("{FIFO_DIR}{pid}-")
}

/// Removes the FIFO directories under `tmp` whose slot no longer runs. A slot removes its
/// own as soon as the child has its ends open, but one killed while it waited for them
/// (SIGKILL, its zygote gone: no destructor runs) leaves it behind; gaffer's zygote sweeps
/// at its start and after it reaps slots. Another master's live slots keep theirs.
/// Returns how many went.
pub fn sweep_fifo_dirs(tmp: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(FIFO_DIR))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        });
        if !alive && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A pidfd for `pid` (Linux 5.3 and later): it turns readable when the process ends,
/// whoever its parent is, and names that process alone even once its pid is reused.
pub fn pidfd_open(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor (close-on-exec, as every pidfd), owned by no one else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `sig` to the process `pidfd` names, and to its process group while that exists:
/// the process itself even before it made its group, never another one that reused its
/// pid (the group is signalled only while the process still runs, so its id is its own).
pub fn pidfd_kill(pid: u32, pidfd: std::os::fd::BorrowedFd, sig: nix::sys::signal::Signal) {
    use std::os::fd::AsRawFd;
    if pidfd_ended(pidfd, Some(Duration::ZERO)) {
        return;
    }
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), sig);
    // SAFETY: a plain syscall with integer arguments over a descriptor we hold.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// Whether the process `pidfd` names ends within `wait` (`None`: waits for its end). A
/// pidfd that cannot be polled has no process to wait for.
pub fn pidfd_ended(pidfd: std::os::fd::BorrowedFd, wait: Option<Duration>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let deadline = wait.and_then(|w| Instant::now().checked_add(w));
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let timeout = match left {
            None => PollTimeout::NONE,
            Some(left) => PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) if left.is_some_and(|l| l.is_zero()) => return false,
            Ok(0) => {}
            Ok(_) => return true,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_the_fifo_dirs_of_gone_slots_only() {
        let tmp = tempfile::tempdir().unwrap();
        // A pid that ran and is gone (reaped), and one that runs: this process.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let dead_dir = tmp.path().join(format!("{}abc123", fifo_dir_prefix(gone)));
        let live_dir = tmp
            .path()
            .join(format!("{}def456", fifo_dir_prefix(std::process::id())));
        let other = tmp.path().join("gaffer-fork-notapid-x");
        for dir in [&dead_dir, &live_dir, &other] {
            std::fs::create_dir(dir).unwrap();
            nix::unistd::mkfifo(&dir.join("stdin"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        }
        assert_eq!(sweep_fifo_dirs(tmp.path()), 1);
        assert!(!dead_dir.exists(), "a gone slot's directory is removed");
        assert!(live_dir.join("stdin").exists(), "a live slot's stays");
        assert!(other.exists(), "a name not of this form is left alone");
        assert_eq!(sweep_fifo_dirs(tmp.path()), 0);
    }
}
