//! Readings from `/proc` and the cgroup v2 filesystem that size the host and watch slots.
//!
//! Each reading is a plain function so the master's tick decides how often to pay for it,
//! and a slot reads its own memory with the same code. Neutral ground: the master and the
//! slots both use it, and it uses neither.
//! The text formats are parsed here rather than through `procfs`, whose smaps parser yields
//! a map of untyped fields: the handful of `Key: N kB` lines needed are simpler to read
//! directly, and the pure parsers can be tested on fixtures. The process tree
//! ([`ProcTree`]) is read through `procfs`: one `stat` per process, of which only the
//! parent is kept.
//!
//! Besides the single readings (PSS, Private_Dirty, MemAvailable, load, descriptors, the
//! host name, cgroup v2 limits): [`ProcTree`], one scan of `/proc/*/stat` kept as pid →
//! parent, which answers a pid's descendants and the union of several trees; and
//! [`Rollups`], each process's `smaps_rollup` read once and summed over any subset, the
//! processes that vanished meanwhile skipped. Public as `gaffer::master::sysinfo`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Why a reading failed.
#[derive(Debug, thiserror::Error)]
pub enum SysinfoError {
    /// The file could not be read (the process may have exited).
    #[error("reading {path}: {source}")]
    Read {
        /// The file read.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// The file was read but did not hold what was expected.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file read.
        path: PathBuf,
        /// What was wrong with its text.
        source: ParseError,
    },
    /// The CPU count was unavailable.
    #[error("counting cpus: {0}")]
    Cpus(io::Error),
    /// `/proc` could not be listed.
    #[error("listing the processes in /proc: {0}")]
    Scan(#[source] procfs::ProcError),
}

impl SysinfoError {
    /// Whether the reading failed because its process is gone (exited, or a zombie whose
    /// memory is already freed): normal for a process of a tree read a moment earlier.
    pub fn is_gone(&self) -> bool {
        match self {
            SysinfoError::Read { source, .. } => {
                source.kind() == io::ErrorKind::NotFound
                    || source.raw_os_error() == Some(libc::ESRCH)
            }
            _ => false,
        }
    }
}

/// What was wrong with a file's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

/// Memory of one process from `/proc/PID/smaps_rollup`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rollup {
    /// Proportional set size: private pages plus each shared page divided by its sharers.
    pub pss: u64,
    /// The anonymous part of `pss` (0 on kernels before 5.8, which lack the line).
    pub pss_anon: u64,
    /// Pages only this process maps and has written: what it costs beyond the zygote.
    pub private_dirty: u64,
    /// Pages only this process maps, unmodified.
    pub private_clean: u64,
    /// Pages shared with other processes, unmodified.
    pub shared_clean: u64,
    /// Pages shared with other processes and written.
    pub shared_dirty: u64,
    /// Resident set size, shared pages counted in full.
    pub rss: u64,
}

impl Rollup {
    /// Adds `other`'s figures to these (saturating): the memory of two sets of pages
    /// counted as one.
    pub fn add(&mut self, other: &Rollup) {
        let fields = [
            (&mut self.pss, other.pss),
            (&mut self.pss_anon, other.pss_anon),
            (&mut self.private_dirty, other.private_dirty),
            (&mut self.private_clean, other.private_clean),
            (&mut self.shared_clean, other.shared_clean),
            (&mut self.shared_dirty, other.shared_dirty),
            (&mut self.rss, other.rss),
        ];
        for (mine, theirs) in fields {
            *mine = mine.saturating_add(theirs);
        }
    }
}

/// Parses the text of `/proc/PID/smaps_rollup`.
///
/// `Rss`, `Pss` and `Private_Dirty` are required; the other fields are 0 when missing, since
/// older kernels omit some and nothing decides on them.
pub fn parse_smaps_rollup(text: &str) -> Result<Rollup, ParseError> {
    let mut rollup = Rollup::default();
    let (mut rss, mut pss, mut private_dirty) = (false, false, false);
    for (key, bytes) in kb_lines(text) {
        let bytes = bytes?;
        match key {
            "Rss" => (rollup.rss, rss) = (bytes, true),
            "Pss" => (rollup.pss, pss) = (bytes, true),
            "Pss_Anon" => rollup.pss_anon = bytes,
            "Private_Dirty" => (rollup.private_dirty, private_dirty) = (bytes, true),
            "Private_Clean" => rollup.private_clean = bytes,
            "Shared_Clean" => rollup.shared_clean = bytes,
            "Shared_Dirty" => rollup.shared_dirty = bytes,
            _ => {}
        }
    }
    for (found, key) in [(rss, "Rss"), (pss, "Pss"), (private_dirty, "Private_Dirty")] {
        if !found {
            return Err(ParseError(format!("no {key} line")));
        }
    }
    Ok(rollup)
}

/// `(key, bytes)` for every `Key:   N kB` line; other lines (the rollup's address header)
/// are skipped. A line with a `kB` unit and a bad number is an error, not skipped.
fn kb_lines(text: &str) -> impl Iterator<Item = (&str, Result<u64, ParseError>)> {
    text.lines().filter_map(|line| {
        let (key, value) = line.split_once(':')?;
        let number = value.trim().strip_suffix("kB")?.trim();
        let bytes = number
            .parse::<u64>()
            .map(|kb| kb.saturating_mul(1024))
            .map_err(|e| ParseError(format!("{key}: {number:?}: {e}")));
        Some((key.trim(), bytes))
    })
}

/// Reads a whole file, naming it in the error.
fn read(path: impl Into<PathBuf>) -> Result<String, SysinfoError> {
    let path = path.into();
    fs::read_to_string(&path).map_err(|source| SysinfoError::Read { path, source })
}

/// Reads and parses a file, naming it in either error.
fn read_parsed<T>(
    path: impl Into<PathBuf>,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, SysinfoError> {
    let path = path.into();
    let text = read(&path)?;
    parse(&text).map_err(|source| SysinfoError::Parse { path, source })
}

/// The memory rollup of process `pid`.
pub fn rollup(pid: u32) -> Result<Rollup, SysinfoError> {
    read_parsed(format!("/proc/{pid}/smaps_rollup"), parse_smaps_rollup)
}

/// The PSS of process `pid`, in bytes.
pub fn pss(pid: u32) -> Result<u64, SysinfoError> {
    rollup(pid).map(|r| r.pss)
}

/// The Private_Dirty of process `pid`, in bytes.
pub fn private_dirty(pid: u32) -> Result<u64, SysinfoError> {
    rollup(pid).map(|r| r.private_dirty)
}

/// The Private_Dirty of the calling process, for a slot deciding whether to recycle itself.
pub fn self_private_dirty() -> Result<u64, SysinfoError> {
    read_parsed("/proc/self/smaps_rollup", parse_smaps_rollup).map(|r| r.private_dirty)
}

/// Which process is whose child, as `/proc` said when it was read: what a process's
/// memory is summed over (its descendants: an exec child, and whatever that started).
///
/// The scan is not atomic: a process started after it is missing, and one that exited
/// meanwhile may still be listed. Readings over the tree skip the latter ([`Rollups`]);
/// the former is counted by the next scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcTree {
    /// Parent → its children.
    children: BTreeMap<u32, Vec<u32>>,
}

impl ProcTree {
    /// The tree of `(pid, parent pid)` pairs.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u32, u32)>) -> Self {
        let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (pid, ppid) in pairs {
            if pid != ppid {
                children.entry(ppid).or_default().push(pid);
            }
        }
        ProcTree { children }
    }

    /// The tree of every process now, from one scan of `/proc/*/stat`. A process that
    /// exits during the scan is left out.
    pub fn read() -> Result<Self, SysinfoError> {
        let all = procfs::process::all_processes().map_err(SysinfoError::Scan)?;
        Ok(Self::from_pairs(all.filter_map(|p| {
            let stat = p.ok()?.stat().ok()?;
            Some((
                u32::try_from(stat.pid).ok()?,
                u32::try_from(stat.ppid).ok()?,
            ))
        })))
    }

    /// Every descendant of `pid` (children, their children, …), not `pid` itself.
    pub fn descendants(&self, pid: u32) -> Vec<u32> {
        let mut seen = BTreeSet::from([pid]);
        let mut out = Vec::new();
        let mut next = vec![pid];
        while let Some(p) = next.pop() {
            for &c in self.children.get(&p).into_iter().flatten() {
                // (a pid reused during the scan could close a loop)
                if seen.insert(c) {
                    out.push(c);
                    next.push(c);
                }
            }
        }
        out
    }

    /// `roots` and all their descendants, each process once, in first-seen order: the
    /// processes a slot's memory is summed over (its own tree and its outside process's).
    pub fn trees(&self, roots: impl IntoIterator<Item = u32>) -> Vec<u32> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for root in roots {
            for p in std::iter::once(root).chain(self.descendants(root)) {
                if seen.insert(p) {
                    out.push(p);
                }
            }
        }
        out
    }
}

/// The memory rollups of a set of processes, each read once, so that overlapping subsets
/// (the host, each slot) are summed from the same readings.
#[derive(Debug, Default)]
pub struct Rollups {
    /// What was read, by pid.
    by_pid: BTreeMap<u32, Rollup>,
    /// Processes that could not be read for another reason than being gone (another
    /// user's process without CAP_SYS_PTRACE), with why.
    pub unreadable: Vec<(u32, SysinfoError)>,
}

impl Rollups {
    /// Reads the rollup of every pid in `pids`, once each; processes gone meanwhile are
    /// left out silently, others that cannot be read are kept in `unreadable`.
    pub fn read(pids: impl IntoIterator<Item = u32>) -> Self {
        let mut out = Rollups::default();
        for pid in pids {
            if out.by_pid.contains_key(&pid) {
                continue;
            }
            match rollup(pid) {
                Ok(r) => {
                    out.by_pid.insert(pid, r);
                }
                Err(e) if e.is_gone() => {}
                Err(e) => out.unreadable.push((pid, e)),
            }
        }
        out
    }

    /// Rollups given rather than read (for tests).
    pub fn from_readings(readings: impl IntoIterator<Item = (u32, Rollup)>) -> Self {
        Rollups {
            by_pid: readings.into_iter().collect(),
            unreadable: Vec::new(),
        }
    }

    /// Σ over every process read.
    pub fn total(&self) -> Rollup {
        self.sum(self.by_pid.keys().copied())
    }

    /// Σ over `pids` (each once, those not read left out).
    pub fn sum(&self, pids: impl IntoIterator<Item = u32>) -> Rollup {
        let pids: BTreeSet<u32> = pids.into_iter().collect();
        let mut sum = Rollup::default();
        for r in pids.iter().filter_map(|p| self.by_pid.get(p)) {
            sum.add(r);
        }
        sum
    }
}

/// Parses `MemAvailable` out of `/proc/meminfo` text, in bytes.
pub fn parse_meminfo_available(text: &str) -> Result<u64, ParseError> {
    kb_lines(text)
        .find(|(key, _)| *key == "MemAvailable")
        .map(|(_, bytes)| bytes)
        .unwrap_or_else(|| Err(ParseError("no MemAvailable line".into())))
}

/// `MemAvailable` from `/proc/meminfo`, in bytes: what can be allocated without swapping.
pub fn mem_available() -> Result<u64, SysinfoError> {
    read_parsed("/proc/meminfo", parse_meminfo_available)
}

/// Parses the one-minute load average out of `/proc/loadavg` text.
pub fn parse_loadavg(text: &str) -> Result<f64, ParseError> {
    let first = text.split_whitespace().next().unwrap_or_default();
    first
        .parse()
        .map_err(|e| ParseError(format!("load average {first:?}: {e}")))
}

/// The one-minute load average from `/proc/loadavg`.
pub fn load1() -> Result<f64, SysinfoError> {
    read_parsed("/proc/loadavg", parse_loadavg)
}

/// PSI's `some avg10` of `/proc/pressure/cpu`: the percent of the last 10 s in which some
/// task waited for a CPU. `None` where the kernel has no PSI (before 4.20, or built or
/// booted without it).
pub fn cpu_pressure() -> Result<Option<f64>, SysinfoError> {
    const PATH: &str = "/proc/pressure/cpu";
    match std::fs::read_to_string(PATH) {
        Ok(text) => parse_pressure(&text)
            .map(Some)
            .map_err(|source| SysinfoError::Parse {
                path: PATH.into(),
                source,
            }),
        // (no PSI in the kernel; or built with it and booted with psi=0, which refuses the
        // read)
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || e.raw_os_error() == Some(nix::errno::Errno::EOPNOTSUPP as i32) =>
        {
            Ok(None)
        }
        Err(source) => Err(SysinfoError::Read {
            path: PATH.into(),
            source,
        }),
    }
}

/// `some avg10=6.63 avg60=… total=…` (the first line of a PSI file) → 6.63.
fn parse_pressure(text: &str) -> Result<f64, ParseError> {
    let some = text.lines().find(|l| l.starts_with("some "));
    let avg10 = some
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("avg10=")))
        .ok_or_else(|| ParseError(format!("no some avg10 in {text:?}")))?;
    avg10
        .parse()
        .map_err(|e| ParseError(format!("cpu pressure {avg10:?}: {e}")))
}

/// CPUs this process may run on (affinity and cgroup CPU quota considered), which is what
/// the slots it starts can use, rather than every CPU the machine has.
pub fn cpus() -> Result<u32, SysinfoError> {
    let n = std::thread::available_parallelism().map_err(SysinfoError::Cpus)?;
    Ok(u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// The memory limit and usage of the calling process's cgroup v2, as `(memory.max,
/// memory.current)` in bytes.
///
/// `None` when there is no limit: no cgroup v2, no memory controller, `memory.max` is
/// `max` all the way up, or a file is missing. Limits set on an ancestor (a systemd slice)
/// bind too, so every level from the process's cgroup up is read and the one with the least
/// headroom is returned.
pub fn cgroup_memory() -> Result<Option<(u64, u64)>, SysinfoError> {
    let cgroup = read("/proc/self/cgroup")?;
    cgroup_memory_at(&cgroup, Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory`] with the `/proc/self/cgroup` text and the cgroup2 mount given, so it
/// can be tested on a directory tree.
fn cgroup_memory_at(
    proc_self_cgroup: &str,
    root: &Path,
) -> Result<Option<(u64, u64)>, SysinfoError> {
    let Some(path) = proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
    else {
        return Ok(None);
    };
    let mut tightest: Option<(u64, u64)> = None;
    let mut dir = root.join(path.trim().trim_start_matches('/'));
    loop {
        if let Some((limit, usage)) = cgroup_level(&dir)? {
            let headroom = limit.saturating_sub(usage);
            if tightest.is_none_or(|(l, u)| headroom < l.saturating_sub(u)) {
                tightest = Some((limit, usage));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    Ok(tightest)
}

/// One cgroup directory's `(memory.max, memory.current)`; `None` when unlimited or missing.
fn cgroup_level(dir: &Path) -> Result<Option<(u64, u64)>, SysinfoError> {
    let Some(max) = read_optional(dir.join("memory.max"))? else {
        return Ok(None);
    };
    let max = max.trim();
    if max == "max" {
        return Ok(None);
    }
    let Some(current) = read_optional(dir.join("memory.current"))? else {
        return Ok(None);
    };
    let number = |path: PathBuf, text: &str| {
        text.trim().parse::<u64>().map_err(|e| SysinfoError::Parse {
            source: ParseError(format!("{:?}: {e}", text.trim())),
            path,
        })
    };
    Ok(Some((
        number(dir.join("memory.max"), max)?,
        number(dir.join("memory.current"), &current)?,
    )))
}

/// A file's text, `None` when it does not exist.
fn read_optional(path: PathBuf) -> Result<Option<String>, SysinfoError> {
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysinfoError::Read { path, source }),
    }
}

/// Open file descriptors of process `pid`, counted from `/proc/PID/fd`. For the calling
/// process the count includes the descriptor used to list the directory.
pub fn open_fds(pid: u32) -> Result<usize, SysinfoError> {
    let path = PathBuf::from(format!("/proc/{pid}/fd"));
    let entries = fs::read_dir(&path).map_err(|source| SysinfoError::Read {
        path: path.clone(),
        source,
    })?;
    let mut n = 0;
    for entry in entries {
        entry.map_err(|source| SysinfoError::Read {
            path: path.clone(),
            source,
        })?;
        n += 1;
    }
    Ok(n)
}

/// This machine's host name, the name slots are placed by.
///
/// Falls back to `localhost` if the name is unreadable, which gethostname(2) only is with
/// a buffer too small, and this one holds the longest name Linux allows.
pub fn host_name() -> String {
    // nix's gethostname needs its "hostname" feature, which this crate does not enable.
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::from("localhost");
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    const ROLLUP: &str = "\
565384730000-7ffe08595000 ---p 00000000 00:00 0                          [rollup]
Rss:                1676 kB
Pss:                 537 kB
Pss_Dirty:           112 kB
Pss_Anon:            112 kB
Pss_File:            425 kB
Pss_Shmem:             0 kB
Shared_Clean:       1476 kB
Shared_Dirty:          4 kB
Private_Clean:        88 kB
Private_Dirty:       108 kB
Referenced:         1676 kB
Anonymous:           112 kB
KSM:                   0 kB
LazyFree:              0 kB
AnonHugePages:         0 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
";

    #[test]
    fn parses_smaps_rollup_fixture() {
        assert_eq!(
            parse_smaps_rollup(ROLLUP),
            Ok(Rollup {
                pss: 537 * 1024,
                pss_anon: 112 * 1024,
                private_dirty: 108 * 1024,
                private_clean: 88 * 1024,
                shared_clean: 1476 * 1024,
                shared_dirty: 4 * 1024,
                rss: 1676 * 1024,
            })
        );
    }

    #[test]
    fn smaps_rollup_without_pss_is_an_error() {
        let text = ROLLUP.replace("Pss:", "Xss:");
        assert_eq!(
            parse_smaps_rollup(&text).unwrap_err().to_string(),
            "no Pss line"
        );
        let text = ROLLUP.replace("1676 kB", "lots kB");
        assert_eq!(
            parse_smaps_rollup(&text).unwrap_err().to_string(),
            "Rss: \"lots\": invalid digit found in string"
        );
    }

    #[test]
    fn parses_meminfo_and_loadavg() {
        let meminfo =
            "MemTotal:       32768000 kB\nMemFree:  100 kB\nMemAvailable:   24268612 kB\n";
        assert_eq!(parse_meminfo_available(meminfo), Ok(24_268_612 * 1024));
        assert!(parse_meminfo_available("MemTotal: 1 kB\n").is_err());
        assert_eq!(parse_loadavg("1.05 1.22 0.91 1/82 18302\n"), Ok(1.05));
        assert!(parse_loadavg("").is_err());
    }

    #[test]
    fn error_names_the_file() {
        let err = pss(u32::MAX).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("reading /proc/{}/smaps_rollup: ", u32::MAX)),
            "{err}"
        );
    }

    #[test]
    fn cgroup_takes_the_tightest_level_and_ignores_max() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("system.slice/gaffer.service");
        fs::create_dir_all(&leaf).unwrap();
        let write = |dir: &Path, max: &str, current: &str| {
            fs::write(dir.join("memory.max"), max).unwrap();
            fs::write(dir.join("memory.current"), current).unwrap();
        };
        let cgroup = "0::/system.slice/gaffer.service\n";

        assert_eq!(cgroup_memory_at(cgroup, root.path()).unwrap(), None);

        write(&leaf, "max\n", "1000\n");
        assert_eq!(cgroup_memory_at(cgroup, root.path()).unwrap(), None);

        write(&root.path().join("system.slice"), "5000\n", "4500\n");
        write(&leaf, "3000\n", "1000\n");
        assert_eq!(
            cgroup_memory_at(cgroup, root.path()).unwrap(),
            Some((5000, 4500))
        );

        write(&leaf, "3000\n", "2900\n");
        assert_eq!(
            cgroup_memory_at(cgroup, root.path()).unwrap(),
            Some((3000, 2900))
        );

        // cgroup v1 only: no "0::" line.
        assert_eq!(
            cgroup_memory_at("4:memory:/x\n", root.path()).unwrap(),
            None
        );

        write(&leaf, "lots\n", "1\n");
        let err = cgroup_memory_at(cgroup, root.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("parsing ")
                && err.ends_with("memory.max: \"lots\": invalid digit found in string"),
            "{err}"
        );
    }

    #[test]
    fn live_pss_is_positive_and_within_rss() {
        let r = rollup(std::process::id()).unwrap();
        assert!(r.pss > 0, "{r:?}");
        assert!(r.pss <= r.rss, "{r:?}");
    }

    /// A `python3 -c script` with piped stdin and stdout, and the first line it printed.
    fn python_saying(script: &str) -> (std::process::Child, String) {
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        (child, line)
    }

    #[test]
    fn live_private_dirty_counts_64_mib_written_by_a_process() {
        // A process of its own: in this one, other tests allocate and free meanwhile.
        // Non-zero fill so every page is written, not just mapped.
        let (mut child, line) = python_saying(
            "b = bytearray(b'\\x01') * (64 << 20)\nprint('ready', flush=True)\ninput()",
        );
        assert_eq!(line, "ready\n");
        let dirty = private_dirty(child.id()).unwrap();
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(dirty >= 64 * MIB, "private dirty {dirty}");
    }

    /// 1 ─ 10 ─┬ 11
    ///         └ 12 ─ 13 ─ 14
    /// 1 ─ 20 ─ 21
    fn fixture_tree() -> ProcTree {
        ProcTree::from_pairs([
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 12),
            (14, 13),
            (20, 1),
            (21, 20),
            (1, 0),
        ])
    }

    #[test]
    fn descendants_are_the_whole_subtree_and_nothing_else() {
        let tree = fixture_tree();
        let sorted = |mut v: Vec<u32>| {
            v.sort_unstable();
            v
        };
        assert_eq!(sorted(tree.descendants(10)), vec![11, 12, 13, 14]);
        assert_eq!(sorted(tree.descendants(12)), vec![13, 14]);
        assert_eq!(tree.descendants(14), Vec::<u32>::new());
        assert_eq!(tree.descendants(99), Vec::<u32>::new(), "an unknown pid");
        assert_eq!(sorted(tree.descendants(1)).len(), 7);
    }

    #[test]
    fn trees_union_counts_each_process_once() {
        let tree = fixture_tree();
        // A slot (12) whose outside process is 20, and a root listed twice.
        assert_eq!(tree.trees([12, 20, 12]), vec![12, 13, 14, 20, 21]);
        // An outside process inside the slot's own tree adds nothing.
        assert_eq!(tree.trees([10, 13]).len(), 5);
        // A process gone since the scan still names itself.
        assert_eq!(tree.trees([99]), vec![99]);
    }

    #[test]
    fn a_loop_from_reused_pids_ends() {
        // (30's parent 31 exited and its pid went to 30's child during the scan)
        let tree = ProcTree::from_pairs([(30, 31), (31, 30), (32, 31)]);
        let mut d = tree.descendants(30);
        d.sort_unstable();
        assert_eq!(d, vec![31, 32]);
        assert_eq!(
            ProcTree::from_pairs([(5, 5)]).descendants(5),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn rollups_sum_subsets_once_each() {
        let r = |pss, private_dirty| Rollup {
            pss,
            private_dirty,
            ..Rollup::default()
        };
        let rollups = Rollups::from_readings([(1, r(100, 10)), (2, r(20, 2)), (3, r(3, 1))]);
        assert_eq!(rollups.total(), r(123, 13));
        assert_eq!(rollups.sum([2, 3, 2, 9]), r(23, 3), "9 was not read");
        assert_eq!(rollups.sum([]), Rollup::default());
    }

    #[test]
    fn live_tree_holds_a_grandchild_and_its_memory() {
        // A child that starts a grandchild writing 32 MiB, then says so.
        let (mut child, line) = python_saying(
            r#"
import subprocess, sys
grow = "import sys\nb = bytearray(b'\\x01') * (32 << 20)\nprint('ready', flush=True)\nsys.stdin.read()"
g = subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
print(g.pid, g.stdout.readline().decode().strip(), flush=True)
sys.stdin.read()
g.stdin.close()
g.wait()
"#,
        );
        let (grandchild, ready) = line.trim().split_once(' ').unwrap();
        assert_eq!(ready, "ready", "{line}");
        let grandchild: u32 = grandchild.parse().unwrap();
        let tree = ProcTree::read().unwrap();
        let mine = tree.descendants(std::process::id());
        let theirs = tree.trees([child.id()]);
        let rollups = Rollups::read(theirs.clone());
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(
            mine.contains(&child.id()) && mine.contains(&grandchild),
            "{mine:?}"
        );
        assert_eq!(theirs, vec![child.id(), grandchild]);
        assert!(rollups.unreadable.is_empty(), "{:?}", rollups.unreadable);
        let dirty = rollups.total().private_dirty;
        assert!(dirty >= 32 * MIB, "private dirty of the tree {dirty}");
        assert!(rollups.sum([grandchild]).private_dirty >= 32 * MIB);
    }

    #[test]
    fn a_process_gone_is_left_out_not_unreadable() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let rollups = Rollups::read([pid, std::process::id()]);
        assert!(rollups.unreadable.is_empty(), "{:?}", rollups.unreadable);
        assert_eq!(rollups.sum([pid]), Rollup::default());
        assert!(rollups.total().pss > 0);
    }

    #[test]
    fn live_readings_are_sane() {
        assert!(mem_available().unwrap() > 0);
        assert!(load1().unwrap() >= 0.0);
        assert!(cpus().unwrap() >= 1);
        if let Some((limit, _usage)) = cgroup_memory().unwrap() {
            assert!(limit > 0);
        }
        assert!(open_fds(std::process::id()).unwrap() >= 3);
        assert!(!host_name().is_empty());
    }

    #[test]
    fn cpu_pressure_reads_some_avg10() {
        let text = "some avg10=6.63 avg60=7.27 avg300=7.73 total=12896412197\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_pressure(text).unwrap(), 6.63);
        assert!(parse_pressure("full avg10=1.00\n").is_err());
        // This machine's, where it has one: a percentage.
        if let Some(p) = cpu_pressure().unwrap() {
            assert!((0.0..=100.0).contains(&p), "{p}");
        }
    }
}
