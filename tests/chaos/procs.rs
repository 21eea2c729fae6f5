//! What the harness reads from `/proc` and sends to processes: liveness, parents, CPU
//! time, environments, signals, and the masters' `/status` over plain HTTP.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::time::Duration;

use nix::sys::signal::Signal;

/// The fields of `/proc/PID/stat` after the command name: (state, ppid, utime + stime).
fn stat(pid: u32) -> Option<(char, u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((state, ppid, utime + stime))
}

/// Whether a process is gone (or a zombie, which no longer runs anything).
pub fn gone(pid: u32) -> bool {
    stat(pid).is_none_or(|(state, _, _)| state == 'Z' || state == 'X')
}

/// Every pid on the machine.
pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The living descendants of `root` (not `root` itself), from one scan of `/proc`.
pub fn descendants(root: u32) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for pid in all_pids() {
        if let Some((state, ppid, _)) = stat(pid)
            && state != 'Z'
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map_or(&[][..], Vec::as_slice) {
            if out.insert(c) {
                todo.push(c);
            }
        }
    }
    out
}

/// CPU time (user + system) a process has used, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, _, t)| t)
}

/// Clock ticks per second, for [`cpu_ticks`].
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 { n as f64 } else { 100.0 }
}

/// The command line, arguments joined by spaces ("" when unreadable).
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// The process's working directory.
pub fn cwd(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

/// Whether the process's environment holds exactly `entry` (`KEY=value`).
pub fn has_env(pid: u32, entry: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| b.split(|&c| c == 0).any(|e| e == entry.as_bytes()))
        .unwrap_or(false)
}

/// Sends `sig` to `pid`; an error names the process.
pub fn signal(pid: u32, sig: Signal) -> Result<(), String> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
        .map_err(|e| format!("{sig} to {pid}: {e}"))
}

/// A minimal HTTP/1.0 GET of our own endpoints: the body, or None when nobody answers.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}
