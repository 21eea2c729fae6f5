//! The scheduling policy of a queue's slots (`cpu_scheduling`), set where each process
//! of theirs begins: a slot right after the zygote forked it (its runtime and handler
//! threads, and whatever its handler starts, inherit it), and a `start = "fork"` queue's
//! language zygote before its exec (so every child it forks has it).
//!
//! Knows nothing of Redis or of the slot's work: one system call.

use crate::config::CpuScheduling;

/// Sets the calling thread's scheduling policy to `policy` (threads and processes it
/// starts afterwards inherit it). A plain system call, nothing allocated: safe between
/// fork and exec. Moving between `SCHED_OTHER` and `SCHED_BATCH` needs no privilege.
pub fn set_cpu_scheduling(policy: CpuScheduling) -> std::io::Result<()> {
    let policy = match policy {
        CpuScheduling::Batch => libc::SCHED_BATCH,
        CpuScheduling::Normal => libc::SCHED_OTHER,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` outlives the call; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy field of `/proc/thread-self/stat` (the 41st).
    fn own_policy() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let (_, rest) = stat.rsplit_once(')').unwrap();
        rest.split_whitespace().nth(38).unwrap().parse().unwrap()
    }

    #[test]
    fn a_thread_moves_to_batch_and_back() {
        // (a thread of its own: the test harness's threads keep their policy)
        std::thread::spawn(|| {
            set_cpu_scheduling(CpuScheduling::Batch).unwrap();
            assert_eq!(own_policy(), libc::SCHED_BATCH);
            let child = std::thread::spawn(own_policy).join().unwrap();
            assert_eq!(
                child,
                libc::SCHED_BATCH,
                "a thread started later inherits it"
            );
            set_cpu_scheduling(CpuScheduling::Normal).unwrap();
            assert_eq!(own_policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
