//! The slot's view of its own memory, for recycling.

/// Private_Dirty of this process in bytes, from `/proc/self/smaps_rollup`: the memory
/// that is this slot's alone, which recycling the slot gives back.
pub fn self_private_dirty() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup")?;
    text.lines()
        .find_map(|l| l.strip_prefix("Private_Dirty:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no Private_Dirty line in /proc/self/smaps_rollup",
            )
        })
}
